"""Ring algorithms (Patarasuk & Yuan; the ring paper, Ueno 2018): reduce-scatter, allgather,
and allreduce as the two back to back.

Each rank r sends to r+1 and receives from r-1. Chunks are the ``blocks`` of the buffer; with
``pipeline=k`` every chunk moves as k sub-chunks, so the executor can forward sub-chunk j while
sub-chunk j+1 is still arriving (the ring paper's sub-chunk software pipelining).

Cost (pipeline=1), n bytes: reduce-scatter (p−1)α + ((p−1)/p)n(β+γ); allgather
(p−1)α + ((p−1)/p)nβ; allreduce 2(p−1)α + 2((p−1)/p)nβ + ((p−1)/p)nγ. Each rank sends
2n(p−1)/p bytes in an allreduce.
"""

from __future__ import annotations

from gradwire.schedules.ir import Algorithm, Schedule, Transfer, blocks, build, split


def ring_steps(p: int, count: int, first: int, op: str, pipeline: int) -> list[list[Transfer]]:
    """p−1 steps; at step i rank r sends chunk (r + first − i) mod p to r+1."""
    chunks = blocks(count, p)
    steps = []
    for i in range(p - 1):
        step = []
        for r in range(p):
            c0, cn = chunks[(r + first - i) % p]
            step += [Transfer(r, (r + 1) % p, s0, sn, op) for s0, sn in split(c0, cn, pipeline)]
        steps.append(step)
    return steps


def reducescatter(p: int, count: int, pipeline: int = 1, **_: object) -> Schedule:
    """Rank r ends with block r of the sum."""
    return build("ring", "reducescatter", p, count, ring_steps(p, count, -1, "sum", pipeline),
                 pipeline=pipeline)


def allgather(p: int, count: int, pipeline: int = 1, **_: object) -> Schedule:
    """Rank r starts with block r valid; everyone ends with every block."""
    return build("ring", "allgather", p, count, ring_steps(p, count, 0, "copy", pipeline),
                 pipeline=pipeline)


def allreduce(p: int, count: int, pipeline: int = 1, **_: object) -> Schedule:
    """Reduce-scatter (rank r ends owning block r+1) then allgather of the owned blocks."""
    steps = ring_steps(p, count, 0, "sum", pipeline) + ring_steps(p, count, 1, "copy",
                                                                     pipeline)
    return build("ring", "allreduce", p, count, steps, pipeline=pipeline)


ALGORITHMS = (
    Algorithm("allreduce", "ring", allreduce),
    Algorithm("reducescatter", "ring", reducescatter),
    Algorithm("allgather", "ring", allgather),
)
