"""Master allreduce (the "simple algorithm" that Ueno's "Technologies behind Distributed Deep
Learning: AllReduce", 2018, starts from):
gather and reduce at rank 0, then send the result back.

1. every rank r ≠ 0 sends its whole buffer to rank 0, which adds them all in (one step);
2. rank 0 sends the sum back to every other rank (one step). Everyone ends with the sum.

Cost, n bytes: 2(p−1)(α + nβ) + (p−1)nγ, all of it at rank 0, whose port carries every
message: linear in p, where the ring and the trees are not.
"""

from __future__ import annotations

from gradwire.schedules.ir import Algorithm, Schedule, Transfer, build


def allreduce(p: int, count: int, **_: object) -> Schedule:
    """Everyone sends to rank 0, which sums and sends the result back; all have the sum."""
    gather = [Transfer(r, 0, 0, count, "sum") for r in range(1, p)]
    back = [Transfer(0, r, 0, count) for r in range(1, p)]
    return build("master", "allreduce", p, count, [gather, back])


ALGORITHMS = (Algorithm("allreduce", "master", allreduce),)
