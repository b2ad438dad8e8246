"""Binomial trees (minimum spanning tree, MST; Thakur, Rabenseifner & Gropp 2005, Chan et al.
2007): broadcast, reduce, and allreduce as a reduce to rank 0 followed by a broadcast from it.

Ranks are numbered relative to the root, v = (r − root) mod p, and the tree has ⌈lg p⌉ levels:

1. broadcast: at step k (k = 0 … ⌈lg p⌉−1) every v < 2^k that has the buffer sends it to
   v + 2^k (if that rank exists). Everyone ends with the root's buffer.
2. reduce: the same tree walked leaves first: at step k every v ≡ 2^k (mod 2^(k+1)) adds its
   partial sum into v − 2^k. The root ends with the sum; other buffers hold partial sums.
3. allreduce ("tree"): reduce to rank 0, then broadcast from rank 0. Everyone has the sum.

``op`` names the combine of reduce and allreduce ("sum" by default). Any other name is looked
up by the executor's ``combine=`` table, so the same tree carries gTop-k's merge ("gtopk",
gradwire.sparse), which is not an element-wise sum and so has no other place to run.

In every step a rank sends at most one message and receives at most one, so each step costs
one whole-buffer message. Cost, n bytes, any p: broadcast ⌈lg p⌉(α + nβ); reduce
⌈lg p⌉(α + nβ + nγ); allreduce 2⌈lg p⌉(α + nβ) + ⌈lg p⌉nγ. Latency-optimal, but every level
moves the whole buffer, so for large n the ring or Rabenseifner's algorithm wins.
"""

from __future__ import annotations

from gradwire.schedules.ir import Algorithm, Schedule, Transfer, build, combine_op


def _levels(p: int) -> list[int]:
    """2^k for k = 0 … ⌈lg p⌉−1: the distance spanned at each level of the tree."""
    return [1 << k for k in range((p - 1).bit_length())]


def broadcast_steps(p: int, count: int, root: int) -> list[list[Transfer]]:
    """At step k, relative rank v < 2^k sends the whole buffer to v + 2^k."""
    def rank(v: int) -> int:
        return (v + root) % p
    return [[Transfer(rank(v), rank(v + d), 0, count) for v in range(d) if v + d < p]
            for d in _levels(p)]


def reduce_steps(p: int, count: int, root: int, op: str = "sum") -> list[list[Transfer]]:
    """At step k, relative rank v ≡ 2^k (mod 2^(k+1)) combines its buffer into v − 2^k."""
    def rank(v: int) -> int:
        return (v + root) % p
    return [[Transfer(rank(v), rank(v - d), 0, count, op) for v in range(d, p, 2 * d)]
            for d in _levels(p)]


def broadcast(p: int, count: int, *, root: int = 0, **_: object) -> Schedule:
    """Binomial tree from the root; everyone ends with the root's buffer."""
    return build("binomial", "broadcast", p, count, broadcast_steps(p, count, root), root=root)


def reduce(p: int, count: int, *, root: int = 0, op: str = "sum", **_: object) -> Schedule:
    """Binomial tree towards the root, summing; the root ends with the sum."""
    steps = reduce_steps(p, count, root, combine_op("binomial", op))
    return build("binomial", "reduce", p, count, steps, root=root)


def allreduce(p: int, count: int, *, op: str = "sum", **_: object) -> Schedule:
    """Binomial reduce to rank 0, then binomial broadcast from it; everyone has the sum."""
    steps = reduce_steps(p, count, 0, combine_op("tree", op))
    return build("tree", "allreduce", p, count, steps + broadcast_steps(p, count, 0))


ALGORITHMS = (
    Algorithm("broadcast", "binomial", broadcast, rooted=True),
    Algorithm("reduce", "binomial", reduce, rooted=True),
    Algorithm("allreduce", "tree", allreduce),
)
