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
Every block is a message on each of the p − 1 links (2(p − 1) in an allreduce), so blocks are
at most ``MAX_BLOCKS``, and fewer where that would pass ``ir.MAX_TRANSFERS`` transfers (from
1025 ranks for an allreduce, 2049 for the others): b* is raised to fit, and a given ``block``
that cuts more is refused. The transfers are made as arrays (:func:`chain_rows`): the 13.6 M
of an allreduce of 4 MiB on 4096 ranks in 1–2 s and 0.7 GB (measured on 2 shared cores).

Example::

    gc.broadcast(params, src=0, algo="lp", block=65536)  # or alpha=, beta= to choose b*
"""

from __future__ import annotations

import math

import numpy as np

from gradwire.check import is_int
from gradwire.config import DEFAULT_ALPHA_S
from gradwire.errors import GradwireError
from gradwire.schedules.ir import (
    MAX_TRANSFERS,
    Algorithm,
    Rows,
    Schedule,
    Table,
    as_table,
    build,
    check_transfers,
)

ALPHA, BETA = DEFAULT_ALPHA_S, 8 / 1e9  # gradwire's default α, 1 Gbit/s
# Blocks per pipeline, each a message on every link. b* cuts k* = √(n·d·β/α) (n bytes): 9 400
# for 1 GiB over 1022 hops at 100 Gbit/s with α = 1 µs, a few hundred on Ethernet; more blocks
# than this take seconds to build and a message per few elements to run.
MAX_BLOCKS = 16384


def most_blocks(per_block: int) -> int:
    """The most blocks a pipeline may cut its buffer into when each block is ``per_block``
    transfers: :data:`MAX_BLOCKS`, fewer where they would pass ``MAX_TRANSFERS``."""
    return max(1, min(MAX_BLOCKS, MAX_TRANSFERS // max(per_block, 1)))


def pick_block(count: int, depth: float, block: int | None, alpha: float, beta: float,
               itemsize: int, sndbuf: int | None = None, of: str = "",
               most: int = MAX_BLOCKS) -> int:
    """Elements per block: ``block`` if given, else b* = √(nα/(depth·β)), at most ``sndbuf``
    bytes when that is given (the most a socket may queue); within [1, count], and cutting
    ``count`` into at most :data:`MAX_BLOCKS` (a given ``block`` that cuts more is refused).
    A chosen block also cuts at most ``most`` (:func:`most_blocks`); the caller refuses a given
    one that cuts more (:func:`~gradwire.schedules.ir.check_transfers`, naming the schedule).
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
        return max(1, -(-count // most), min(count, block))
    if not is_int(block, 1):
        raise GradwireError(f"block must be an int >= 1 (elements per block), got {block!r}")
    if count > (block := int(block)) * MAX_BLOCKS:  # a numpy int32's product wrapped
        raise GradwireError(f"block={block} cuts {count} elements{of} into {-(-count // block)} "
                            f"blocks, a message each on every link: at most {MAX_BLOCKS}, so "
                            f"block >= {-(-count // MAX_BLOCKS)} here")
    return max(1, min(count, block))


def pieces(count: int, block: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Starts and sizes of the blocks of ``block`` elements of [start, start + count); the last
    may be short."""
    starts = np.arange(start, start + count, block, dtype=np.int64)
    return starts, np.minimum(block, start + count - starts)


def chain_rows(chains: list[tuple[np.ndarray, bool, int]], starts: np.ndarray,
               sizes: np.ndarray) -> Rows:
    """Pipelines down chains of the same length, side by side: for each (chain, reduces,
    delay), block j leaves chain[i] for chain[i+1] at step delay + i + j. Within a step the
    first chain's transfers come first, each chain's in chain order: at its own step t a
    chain of L links and k blocks moves links max(0, t − k + 1) … min(L − 1, t)."""
    links, k = len(chains[0][0]) - 1, len(starts)
    if links < 1 or k == 0:
        none = np.zeros(0, dtype=np.int64)
        return Rows(none, none, none, none, none, np.zeros(0, dtype=bool))
    delay = np.array([d for *_, d in chains])
    t = np.arange(delay.max() + links + k - 1)[None, :] - delay[:, None]  # [chain, step]
    first = np.maximum(t - (k - 1), 0)
    moving = np.clip(np.minimum(t, links - 1) - first + 1, 0, None)
    before = np.cumsum(moving, axis=0) - moving  # a step's rows of the chains before
    per = moving.sum(axis=0)
    # int32 below: a schedule has at most MAX_TRANSFERS < 2**31 rows, and half the bytes to
    # write and read make the rows about twice as fast
    step = np.repeat(np.arange(len(per), dtype=np.int32), per)
    place = (np.arange(len(step), dtype=np.int32)
             - np.repeat((np.cumsum(per) - per).astype(np.int32), per))  # within its step
    which = np.zeros(len(step), dtype=np.int8)
    for b in before[1:].astype(np.int32):
        which += place >= b[step]
    at = which * np.int32(len(per)) + step
    i = place - before.astype(np.int32).ravel()[at] + first.astype(np.int32).ravel()[at]
    del place, at
    j = step - delay.astype(np.int32)[which] - i
    ranks = np.stack([c for c, *_ in chains])
    return Rows(step.astype(np.int64), ranks[which, i], ranks[which, i + 1], starts[j],
                sizes[j], np.array([r for _, r, _ in chains])[which])


def _block(collective: str, p: int, count: int, depth: int, per_block: int,
           block: int | None, alpha: float, beta: float, itemsize: int) -> int:
    """:func:`pick_block` for a pipeline of ``per_block`` transfers a block, whose transfers
    are counted (and refused past ``MAX_TRANSFERS``) before any is made."""
    most = most_blocks(per_block)
    b = pick_block(count, depth, block, alpha, beta, itemsize, most=most)
    check_transfers(collective, "lp", p, count, per_block * -(-count // b),
                    f"give block >= {-(-count // most)}, or no block (one that fits is chosen)")
    return b


def _one_way(p: int, count: int, root: int, b: int, reduces: bool) -> Table:
    """Broadcast down the chain root → root+1 → …, or (``reduces``) reduce up it."""
    chain = (root + np.arange(p)) % p
    return as_table(p, count, chain_rows([(chain[::-1] if reduces else chain, reduces, 0)],
                                         *pieces(count, b)))


def broadcast_table(p: int, count: int, *, root: int = 0, block: int | None = None,
                    alpha: float = ALPHA, beta: float = BETA, itemsize: int = 4,
                    **_: object) -> Table:
    b = _block("broadcast", p, count, p - 2, p - 1, block, alpha, beta, itemsize)
    return _one_way(p, count, root, b, False)


def reduce_table(p: int, count: int, *, root: int = 0, block: int | None = None,
                 alpha: float = ALPHA, beta: float = BETA, itemsize: int = 4,
                 **_: object) -> Table:
    b = _block("reduce", p, count, p - 2, p - 1, block, alpha, beta, itemsize)
    return _one_way(p, count, root, b, True)


def _both_ways(p: int, count: int, b: int) -> Table:
    """Reduce up p−1 → … → 0 and broadcast down 0 → … → p−1 from step p − 1, overlaid: a
    step's reduce transfers come first."""
    ranks = np.arange(p)
    return as_table(p, count, chain_rows([(ranks[::-1], True, 0), (ranks, False, p - 1)],
                                         *pieces(count, b)))


def allreduce_table(p: int, count: int, *, block: int | None = None, alpha: float = ALPHA,
                    beta: float = BETA, itemsize: int = 4, **_: object) -> Table:
    b = _block("allreduce", p, count, max(p - 2, 1), 2 * (p - 1), block, alpha, beta, itemsize)
    return _both_ways(p, count, b)


def broadcast(p: int, count: int, *, root: int = 0, block: int | None = None,
              alpha: float = ALPHA, beta: float = BETA, itemsize: int = 4,
              **_: object) -> Schedule:
    """Pipeline blocks down the chain root → root+1 → …; everyone ends with root's buffer."""
    b = _block("broadcast", p, count, p - 2, p - 1, block, alpha, beta, itemsize)
    return build("lp", "broadcast", p, count, _one_way(p, count, root, b, False).transfers_of(),
                 root=root, block=b)


def reduce(p: int, count: int, *, root: int = 0, block: int | None = None,
           alpha: float = ALPHA, beta: float = BETA, itemsize: int = 4,
           **_: object) -> Schedule:
    """Pipeline blocks up the chain root+p−1 → … → root, summing; the root ends with the sum."""
    b = _block("reduce", p, count, p - 2, p - 1, block, alpha, beta, itemsize)
    return build("lp", "reduce", p, count, _one_way(p, count, root, b, True).transfers_of(),
                 root=root, block=b)


def allreduce(p: int, count: int, *, block: int | None = None, alpha: float = ALPHA,
              beta: float = BETA, itemsize: int = 4, **_: object) -> Schedule:
    """Reduce up the chain to rank 0 and broadcast back down, overlapped; everyone has the sum."""
    b = _block("allreduce", p, count, max(p - 2, 1), 2 * (p - 1), block, alpha, beta, itemsize)
    return build("lp", "allreduce", p, count, _both_ways(p, count, b).transfers_of(), block=b)


ALGORITHMS = (
    Algorithm("broadcast", "lp", broadcast, rooted=True, table=broadcast_table),
    Algorithm("reduce", "lp", reduce, rooted=True, table=reduce_table),
    Algorithm("allreduce", "lp", allreduce, table=allreduce_table),
)
