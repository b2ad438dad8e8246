"""Allreduce over two complementary binary trees (Sanders, Speck & Träff 2009, "Two-tree
algorithms for full bandwidth broadcast, reduction and scan"; NCCL's double binary tree).

Tree 1 is the in-order binary tree over ids i = r + 1: an even id whose lowest set bit is 2h has
children i − h and i + h (h halved until i + h ≤ p), so its leaves are the even ranks and its
height is ⌊lg p⌋. Tree 2 is tree 1 mirrored (r → p−1−r) for even p and shifted (r → r+1 mod p)
for odd p, so its leaves are the odd ranks (and rank 0 for odd p): a rank that is a leaf in one
tree is interior in the other, except rank 0 when p is odd (p + 1 leaves cannot be disjoint).

1. The buffer is halved (``blocks(count, 2)``); tree t carries half t in blocks of ``block``
   elements.
2. reduce: block j leaves a rank of height h (leaves have 0) for its parent, summed in, at
   step h + j, after its children's copies of block j have arrived.
3. broadcast: block j leaves a rank of depth δ for its children at step H + δ + j (H the tree's
   height), so earlier blocks travel down while later ones still travel up, in both trees.
Everyone ends with the sum.

Cost, n bytes, k = n/(2b) blocks of b bytes per tree, H = ⌊lg p⌋: a rank interior (not root)
in one tree and a leaf in the other moves, in a full step, 2 blocks in and 1 out (reduce) plus
1 in and 2 out (broadcast) there, and 1 out plus 1 in as a leaf: 4(α + bβ) + 2bγ. So for p ≥ 4
T ≈ 2nβ + nγ + 2(n/b)α + fill, tending to 2nβ + nγ as n grows: each rank sends and receives
about 2n bytes, as in the ring, within p/(p−1) of the allreduce lower bound
2((p−1)/p)nβ + ((p−1)/p)nγ. A block is back after 2H steps where the ring needs 2(p−1): in the
model (α = 100 µs, 1 Gbit/s) it beats the ring below about 256 KiB at p = 32, 1 MiB at p = 64.
p = 3: both interior ranks are roots (3 blocks a step), T → 1.5nβ + nγ; p = 2: one edge each
way, T → nβ + nγ/2, the bandwidth terms of the lower bound.
The fill and drain steps are light (few ranks move 4 blocks in them): they cost about H/2 full
steps, so the best block is b* ≈ √(nα/(Hβ)) (against the cost model for p = 3…32: within 1 % of
a grid search from 4 MiB on, 6 % at 1 MiB, 17 % at 256 KiB where few blocks fit). Without
``block`` it is chosen from ``alpha``, ``beta`` and ``itemsize`` as in lp.py, and at most
``sndbuf`` bytes when that is given: the most a rank's socket may queue (TCP's send-buffer
ceiling). A rank sends into both trees at once, and a block its socket cannot take whole kept
the other send waiting: on the emulated cluster (500 kB buffers, 1 Gbit/s, P = 4) 64 MiB took
1.26–1.38 s in blocks of about 1 MiB, as b* has it there, against 1.13–1.15 s in blocks of
256–512 KiB, which the model prices at 1.13 s either way;
on 1 MB buffers the 1 MiB blocks took 1.15–1.20 s. For p ≤ 2 each half goes as one block.
Every block crosses each of the 2(p − 1) edges of the two trees twice, so from 513 ranks on
the blocks are fewer than lp.py's ``MAX_BLOCKS``, to keep within ``ir.MAX_TRANSFERS``
transfers (:func:`~gradwire.schedules.lp.most_blocks`).

Example::

    gc.all_reduce(grad, algo="dbtree", block=16384)
"""

from __future__ import annotations

import numpy as np

from gradwire.schedules.ir import (
    Algorithm,
    Rows,
    Schedule,
    Table,
    as_table,
    blocks,
    build,
    check_transfers,
    overlay,
)
from gradwire.schedules.lp import ALPHA, BETA, most_blocks, pick_block, pieces


def btree(p: int) -> list[int]:
    """Parent of each rank in tree 1 (−1 for the root)."""
    parent = [-1] * p
    for i in range(2, p + 1, 2):
        half = (i & -i) // 2
        parent[i - half - 1] = i - 1
        while i + half > p:
            half //= 2
        if half:
            parent[i + half - 1] = i - 1
    return parent


def two_trees(p: int) -> tuple[list[int], list[int]]:
    """Parents of each rank in the two complementary trees."""
    one = btree(p)
    move = (lambda r: p - 1 - r) if p % 2 == 0 else (lambda r: (r + 1) % p)
    two = [-1] * p
    for r, up in enumerate(one):
        if up >= 0:
            two[move(r)] = move(up)
    return one, two


def heights(parent: list[int]) -> tuple[list[int], list[int]]:
    """Height (leaves 0) and depth (root 0) of every rank."""
    p = len(parent)
    depth = [0] * p
    for r in range(p):
        up = r
        while parent[up] >= 0:
            up, depth[r] = parent[up], depth[r] + 1
    height = [0] * p
    for r in sorted(range(p), key=lambda r: -depth[r]):  # children before parents
        if parent[r] >= 0:
            height[parent[r]] = max(height[parent[r]], height[r] + 1)
    return height, depth


def tree_rows(parent: list[int], starts: np.ndarray, sizes: np.ndarray) -> Rows:
    """Pipelined reduce up ``parent`` then broadcast down it, block by block: block j leaves
    rank r for its parent at step height(r) + j, and the parent for r at step
    H + depth(parent) + j (H the tree's height). Listed rank by rank, block by block, a block's
    reduce before its broadcast, which :func:`~gradwire.schedules.ir.overlay` keeps within
    each step."""
    height, depth = heights(parent)
    top = max(height)
    up = np.array(parent, dtype=np.int64)
    child = np.flatnonzero(up >= 0)
    up = up[child]
    shape = (len(child), len(starts), 2)  # [edge, block, (reduce, broadcast)]

    def grid(reduce: np.ndarray, broadcast: np.ndarray) -> np.ndarray:
        both = np.stack(np.broadcast_arrays(reduce, broadcast), axis=-1)
        return np.broadcast_to(both, shape).ravel()

    j = np.arange(len(starts))
    step = grid(np.array(height)[child, None] + j, top + np.array(depth)[up, None] + j)
    return Rows(step, grid(child[:, None], up[:, None]), grid(up[:, None], child[:, None]),
                grid(starts, starts), grid(sizes, sizes), grid(True, False))


def _block(p: int, count: int, trees: tuple[list[int], list[int]], block: int | None,
           alpha: float, beta: float, sndbuf: int | None, itemsize: int) -> int:
    """Elements per block (:func:`~gradwire.schedules.lp.pick_block` on a half), the
    schedule's transfers counted (and refused past ``MAX_TRANSFERS``) before any is made."""
    halves = blocks(count, 2)
    fill = max(heights(trees[0])[0]) / 2 if p > 2 else 0  # b* = √((n/2)α/((H/2)β))
    most = most_blocks(4 * (p - 1))  # each block up and down the p − 1 edges of both trees
    b = pick_block(halves[0][1], fill, block, alpha, beta, itemsize, sndbuf,
                   of=f" (each half of {count})", most=most)
    n = 2 * (p - 1) * sum(-(-size // b) for _, size in halves)
    check_transfers("allreduce", "dbtree", p, count, n,
                    f"give block >= {-(-halves[0][1] // most)}, or no block (one that fits is "
                    "chosen)")
    return b


def _table(p: int, count: int, trees: tuple[list[int], list[int]], b: int) -> Table:
    return as_table(p, count, overlay([tree_rows(t, *pieces(n, b, start)) for t, (start, n)
                                       in zip(trees, blocks(count, 2), strict=True)]))


def allreduce_table(p: int, count: int, *, block: int | None = None, alpha: float = ALPHA,
                    beta: float = BETA, sndbuf: int | None = None, itemsize: int = 4,
                    **_: object) -> Table:
    trees = two_trees(p)
    return _table(p, count, trees, _block(p, count, trees, block, alpha, beta, sndbuf, itemsize))


def allreduce(p: int, count: int, *, block: int | None = None, alpha: float = ALPHA,
              beta: float = BETA, sndbuf: int | None = None, itemsize: int = 4,
              **_: object) -> Schedule:
    """Reduce and broadcast one half of the buffer on each of two complementary binary trees."""
    trees = two_trees(p)
    b = _block(p, count, trees, block, alpha, beta, sndbuf, itemsize)
    return build("dbtree", "allreduce", p, count, _table(p, count, trees, b).transfers_of(),
                 block=b)


ALGORITHMS = (Algorithm("allreduce", "dbtree", allreduce, table=allreduce_table),)
