"""Recursive halving and doubling (Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005):
reduce-scatter by recursive halving, and allreduce as that reduce-scatter followed by a
recursive-doubling allgather ("bidirectional exchange").

Both run over the p' = 2^⌊lg p⌋ core ranks of ``butterfly.py``; for other p the excess ranks
fold in first (2i+1 adds its whole buffer into 2i) and are unfolded at the end.

1. reducescatter: at distance d = p'/2, …, 1 core rank j sends its partner's half of what it
   still holds to the partner j xor d, which adds it in; each keeps the other half, so core
   rank j ends with the sum of the blocks of ``blocks(n, p)`` that it speaks for (its own, and
   its folded partner's, which the unfold step copies over). Rank r ends with block r.
2. allreduce: the same halving over ``blocks(n, p')`` (core rank j ends with block j of the
   sum), then recursive doubling brings every block to every core rank; the unfold step sends
   the whole sum to each folded rank. Everyone ends with the sum.

Cost, n bytes, p a power of two and n divisible by p: reducescatter lg p·α + ((p−1)/p)n(β+γ);
allreduce 2 lg p·α + 2((p−1)/p)nβ + ((p−1)/p)nγ. Otherwise, L = ⌊lg p⌋, n divisible by p':
allreduce (2L+2)α + (2(p'−1)/p' + 2)nβ + (1 + (p'−1)/p')nγ (Thakur et al. write (p−1)/p for
(p'−1)/p'); reducescatter (L+2)α + (1 + (p' + S)/p)nβ + (1 + (p' − 1 + S)/p)nγ with
S = Σ_{k<L} min(2^k, p − p'), n divisible by p.
"""

from __future__ import annotations

from gradwire.schedules.butterfly import core, doubling, fold, halving, span, unfold
from gradwire.schedules.ir import Algorithm, Schedule, blocks, build


def reducescatter(p: int, count: int, **_: object) -> Schedule:
    """Recursive halving; rank r ends with block r of the sum."""
    ranks, own = core(p), blocks(count, p)
    steps = [fold(p, lambda r: (0, count), "sum"), *halving(ranks, span(count, [*ranks, p])),
             unfold(p, lambda r: own[r])]
    return build("rhd", "reducescatter", p, count, steps)


def allreduce(p: int, count: int, **_: object) -> Schedule:
    """Recursive-halving reduce-scatter, then recursive-doubling allgather; all have the sum."""
    ranks = core(p)
    part = span(count, list(range(len(ranks) + 1)))  # core rank j owns blocks(count, p')[j]
    steps = [fold(p, lambda r: (0, count), "sum"), *halving(ranks, part),
             *doubling(ranks, part), unfold(p, lambda r: (0, count))]
    return build("rhd", "allreduce", p, count, steps)


ALGORITHMS = (
    Algorithm("allreduce", "rhd", allreduce),
    Algorithm("reducescatter", "rhd", reducescatter),
)
