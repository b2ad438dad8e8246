"""Recursive doubling (the butterfly; Thakur, Rabenseifner & Gropp 2005): allreduce and
allgather, and the power-of-two machinery that Rabenseifner's algorithm (``rhd.py``) shares.

The p' = 2^⌊lg p⌋ *core* ranks run the power-of-two algorithm. For other p, the e = p − p'
excess ranks fold in first and are unfolded at the end (the standard fold): each odd rank
2i+1 < 2e hands its data to rank 2i, sits the algorithm out and gets the result back. The core
ranks are 0, 2, …, 2e−2, 2e, 2e+1, …, p−1 in rank order, so core rank j speaks for the ranks
from its own up to the next core rank, and an aligned group of core ranks speaks for a
contiguous run of ranks: every transfer below is one range of the buffer.

1. allreduce: fold (2i+1 adds its buffer into 2i); at step k core rank j adds its whole buffer
   into core rank j xor 2^k, both directions at once; unfold (2i sends the sum back to 2i+1).
2. allgather: rank r starts with block r of ``blocks(n, p)``; fold (2i+1 gives its block to 2i);
   at step k core rank j sends the blocks of its aligned group of 2^k core ranks (their own
   and their folded partners') to core rank j xor 2^k, doubling what both hold; unfold (2i
   sends the whole buffer to 2i+1 in one message). Everyone ends with every block.

Cost, n bytes (allgather: n gathered in all, divisible by p), p a power of two: allreduce
lg p·(α + nβ + nγ); allgather lg p·α + ((p−1)/p)nβ. Otherwise, with L = ⌊lg p⌋ and e = p − p':
allreduce (L+2)(α + nβ) + (L+1)nγ; allgather (L+2)α + (1 + (p' + S)/p)nβ, where
S = Σ_{k<L} min(2^k, e) counts the folded blocks that the largest group carries.
"""

from __future__ import annotations

from collections.abc import Callable

from gradwire.schedules.ir import Algorithm, Schedule, Transfer, blocks, build, combine_op

Range = tuple[int, int]  # (start, count) of elements


def core(p: int) -> list[int]:
    """The p' = 2^⌊lg p⌋ ranks that run the power-of-two algorithm, in rank order."""
    e = p - (1 << (p.bit_length() - 1))
    return [*range(0, 2 * e, 2), *range(2 * e, p)]


def _excess(p: int) -> range:
    """The p − p' ranks 1, 3, …, 2(p − p')−1 that fold into their left neighbour."""
    return range(1, 2 * (p - len(core(p))), 2)


def fold(p: int, part: Callable[[int], Range], op: str) -> list[Transfer]:
    """The step before: each excess rank r hands ``part(r)`` to core rank r − 1."""
    return [Transfer(r, r - 1, *part(r), op) for r in _excess(p)]


def unfold(p: int, part: Callable[[int], Range]) -> list[Transfer]:
    """The step after: core rank r − 1 copies ``part(r)`` back to each excess rank r."""
    return [Transfer(r - 1, r, *part(r)) for r in _excess(p)]


def span(count: int, bounds: list[int]) -> Callable[[int, int], Range]:
    """Map a group [a, b) of core ranks to its elements: blocks ``bounds[a] … bounds[b]−1`` of
    ``blocks(count, bounds[-1])``, core rank j owning blocks ``bounds[j] … bounds[j+1]−1``."""
    starts = [s for s, _ in blocks(count, bounds[-1])] + [count]
    return lambda a, b: (starts[bounds[a]], starts[bounds[b]] - starts[bounds[a]])


def distances(ranks: list[int]) -> list[int]:
    """1, 2, …, p'/2: the partner distances of a butterfly over p' (a power of two) ranks."""
    return [1 << k for k in range(len(ranks).bit_length() - 1)]


def _group(j: int, d: int) -> tuple[int, int]:
    """The aligned group of d core ranks that contains j, as [a, b)."""
    return j - j % d, j - j % d + d


def butterfly(ranks: list[int], count: int, op: str = "sum") -> list[list[Transfer]]:
    """At distance d = 1, 2, …, core rank j combines its whole buffer into core rank j xor d."""
    return [[Transfer(ranks[j], ranks[j ^ d], 0, count, op) for j in range(len(ranks))]
            for d in distances(ranks)]


def halving(ranks: list[int], part: Callable[[int, int], Range]) -> list[list[Transfer]]:
    """Recursive halving: at distance d = p'/2, …, 2, 1 core rank j adds the data of its
    partner's group of d into the partner j xor d and keeps its own group's. Core rank j ends
    with the sum of ``part(j, j+1)``."""
    return [[Transfer(ranks[j], ranks[j ^ d], *part(*_group(j ^ d, d)), "sum")
             for j in range(len(ranks))] for d in reversed(distances(ranks))]


def doubling(ranks: list[int], part: Callable[[int, int], Range]) -> list[list[Transfer]]:
    """Recursive doubling: at distance d = 1, 2, …, p'/2 core rank j copies what its group of
    d holds to core rank j xor d. Core rank j starts holding ``part(j, j+1)``, ends with all."""
    return [[Transfer(ranks[j], ranks[j ^ d], *part(*_group(j, d))) for j in range(len(ranks))]
            for d in distances(ranks)]


def allreduce(p: int, count: int, *, op: str = "sum", **_: object) -> Schedule:
    """Butterfly: lg p' whole-buffer exchanges, summing (or combining with ``op``, e.g. the
    gTop-k merge); everyone ends with the result."""
    op = combine_op("rd", op)
    steps = [fold(p, lambda r: (0, count), op), *butterfly(core(p), count, op),
             unfold(p, lambda r: (0, count))]
    return build("rd", "allreduce", p, count, steps)


def allgather(p: int, count: int, **_: object) -> Schedule:
    """Rank r starts with block r valid; each step doubles the blocks held; everyone ends with
    every block."""
    ranks, own = core(p), blocks(count, p)
    steps = [fold(p, lambda r: own[r], "copy"), *doubling(ranks, span(count, [*ranks, p])),
             unfold(p, lambda r: (0, count))]
    return build("rd", "allgather", p, count, steps)


ALGORITHMS = (
    Algorithm("allreduce", "rd", allreduce),
    Algorithm("allgather", "rd", allgather),
)
