"""Linear pipeline (LP) over a chain (Wang et al., "Efficient Communications in Training Large
Scale Neural Networks", 2016).

The buffer is cut into blocks of ``block`` elements that flow down a chain of ranks one block per
step, so every link carries a block while the next one is still upstream:

1. broadcast: the chain is root → root+1 → … → root+p−1; at step i + j, the i-th rank of the
   chain forwards block j to the next. Everyone ends with the root's buffer.
2. reduce: the same chain walked backwards towards the root, summing: the i-th rank from the far
   end adds block j into the next rank at step i + j. The root ends with the sum; the other
   ranks' buffers hold partial sums.
3. allreduce: reduce towards rank 0 along p−1 → … → 0, and broadcast back along 0 → … → p−1;
   block j leaves rank 0 at step p−1+j, the step after it is complete, so while later blocks
   still travel up, earlier ones travel down (both directions of every link busy at once).
   Everyone ends with the sum.

Cost, n bytes in k = n/b blocks of b bytes (count divisible by ``block``), p ≥ 2:
- broadcast (p − 2 + k)(α + bβ); reduce (p − 2 + k)(α + b(β + γ)) = broadcast + (n + (p−2)b)γ
  (every step sums one block into some rank).
- allreduce, p = 2: (k + 1)(α + bβ) + nγ. For p ≥ 3, one port per rank means a middle rank
  sending a block up and another down pays 2(α + bβ) in the step; with k ≥ 2p − 3 and γ ≤ β:
  2(k + p − 2)(α + bβ) + (k + p − 3)bγ, about 2nβ + nγ (twice the broadcast: a rank's
  sends up and down share its one outgoing port in this model).
The best block for T(b) ∝ (d + n/b)(α + bβ), d fill-and-drain steps, is b* = √(nα/(dβ)), giving
T* ∝ (√(dα) + √(nβ))², which tends to nβ (2nβ for allreduce) as n grows whatever p is: LP's cost
is invariant to p. d = p − 2 for all three, except d = 1 for allreduce on p = 2; with d = 0
(broadcast or reduce on p ≤ 2) one block is best. b* leaves out γ (reduce would want
√(nα/(d(β+γ))); γ ≪ β on the links this targets).
Without ``block`` the builders choose b* from ``alpha`` (s), ``beta`` (s/byte) and ``itemsize``
(bytes), defaulting to 50 µs and 1 Gbit/s, and record the block used in ``Schedule.params``.

Example::

    gc.broadcast(params, src=0, algo="lp", block=65536)  # or alpha=, beta= to choose b*
"""

from __future__ import annotations

import math

from gradwire.check import is_int
from gradwire.config import DEFAULT_ALPHA_S
from gradwire.errors import GradwireError
from gradwire.schedules.ir import Algorithm, Schedule, Transfer, build, merge_steps

ALPHA, BETA = DEFAULT_ALPHA_S, 8 / 1e9  # gradwire's default α, 1 Gbit/s
# Blocks per pipeline, each a message on every link. b* cuts k* = √(n·d·β/α) (n bytes): 9 400
# for 1 GiB over 1022 hops at 100 Gbit/s with α = 1 µs, a few hundred on Ethernet; more blocks
# than this take seconds to build and a message per few elements to run.
MAX_BLOCKS = 16384


def pick_block(count: int, depth: float, block: int | None, alpha: float, beta: float,
               itemsize: int, sndbuf: int | None = None, of: str = "") -> int:
    """Elements per block: ``block`` if given, else b* = √(nα/(depth·β)), at most ``sndbuf``
    bytes when that is given (the most a socket may queue); within [1, count], and cutting
    ``count`` into at most :data:`MAX_BLOCKS` (a given ``block`` that cuts more is refused).
    ``of`` says what ``count`` is part of, for that refusal (dbtree's " (each half of N)")."""
    if sndbuf is not None and not is_int(sndbuf, 1):
        raise GradwireError(f"sndbuf must be an int >= 1 (bytes a socket may queue), got "
                            f"{sndbuf!r}")
    if block is None:
        if not (alpha >= 0 and beta > 0 and itemsize > 0):
            raise GradwireError(f"choosing a block needs alpha >= 0, beta > 0, itemsize > 0; "
                                f"got alpha={alpha}, beta={beta}, itemsize={itemsize}")
        den = depth * beta  # may underflow to 0 for a tiny beta
        best = math.sqrt(count * itemsize * alpha / den) / itemsize if den > 0 else math.inf
        # b* beyond any float (a huge alpha or a tiny beta) is one block, as with no fill
        block = round(best) if depth > 0 and math.isfinite(best) else count
        if sndbuf is not None and depth > 0:
            block = min(block, sndbuf // itemsize)
    elif not is_int(block, 1):
        raise GradwireError(f"block must be an int >= 1 (elements per block), got {block!r}")
    elif count > (block := int(block)) * MAX_BLOCKS:  # a numpy int32's product wrapped
        raise GradwireError(f"block={block} cuts {count} elements{of} into {-(-count // block)} "
                            f"blocks, a message each on every link: at most {MAX_BLOCKS}, so "
                            f"block >= {-(-count // MAX_BLOCKS)} here")
    return max(1, -(-count // MAX_BLOCKS), min(count, block))


def pieces(count: int, block: int, start: int = 0) -> list[tuple[int, int]]:
    """(start, size) of each block of ``block`` elements of [start, start + count); the last may
    be short."""
    return [(s, min(block, start + count - s)) for s in range(start, start + count, block)]


def chain_steps(chain: list[int], parts: list[tuple[int, int]], op: str,
                delay: int = 0) -> list[list[Transfer]]:
    """Block j leaves chain[i] for chain[i+1] at step delay + i + j."""
    links = len(chain) - 1
    steps: list[list[Transfer]] = [[] for _ in range(delay + links + len(parts))]
    for i in range(links):
        for j, (start, size) in enumerate(parts):
            steps[delay + i + j].append(Transfer(chain[i], chain[i + 1], start, size, op))
    return steps


def broadcast(p: int, count: int, *, root: int = 0, block: int | None = None,
              alpha: float = ALPHA, beta: float = BETA, itemsize: int = 4,
              **_: object) -> Schedule:
    """Pipeline blocks down the chain root → root+1 → …; everyone ends with root's buffer."""
    b = pick_block(count, p - 2, block, alpha, beta, itemsize)
    chain = [(root + i) % p for i in range(p)]
    return build("lp", "broadcast", p, count, chain_steps(chain, pieces(count, b), "copy"),
                 root=root, block=b)


def reduce(p: int, count: int, *, root: int = 0, block: int | None = None,
           alpha: float = ALPHA, beta: float = BETA, itemsize: int = 4,
           **_: object) -> Schedule:
    """Pipeline blocks up the chain root+p−1 → … → root, summing; the root ends with the sum."""
    b = pick_block(count, p - 2, block, alpha, beta, itemsize)
    chain = [(root + i) % p for i in reversed(range(p))]
    return build("lp", "reduce", p, count, chain_steps(chain, pieces(count, b), "sum"),
                 root=root, block=b)


def allreduce(p: int, count: int, *, block: int | None = None, alpha: float = ALPHA,
              beta: float = BETA, itemsize: int = 4, **_: object) -> Schedule:
    """Reduce up the chain to rank 0 and broadcast back down, overlapped; everyone has the sum."""
    b = pick_block(count, max(p - 2, 1), block, alpha, beta, itemsize)
    parts = pieces(count, b)
    up = chain_steps(list(reversed(range(p))), parts, "sum")
    down = chain_steps(list(range(p)), parts, "copy", delay=p - 1)
    return build("lp", "allreduce", p, count, merge_steps(up, down), block=b)


ALGORITHMS = (
    Algorithm("broadcast", "lp", broadcast, rooted=True),
    Algorithm("reduce", "lp", reduce, rooted=True),
    Algorithm("allreduce", "lp", allreduce),
)
