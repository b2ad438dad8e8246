"""Ring algorithms (Patarasuk & Yuan; the ring paper, Ueno 2018): reduce-scatter, allgather,
and allreduce as the two back to back.

Each rank r sends to r+1 and receives from r-1. Chunks are the ``blocks`` of the buffer; with
``pipeline=k`` every chunk moves as k sub-chunks, so the executor can forward sub-chunk j while
sub-chunk j+1 is still arriving (the ring paper's sub-chunk software pipelining). Without
``pipeline`` the builders cut chunks into sub-chunks of at least ``SUBCHUNK_BYTES``, at most
``MAX_PIPELINE`` of them: on the emulated 1 Gbit/s cluster 64 MiB at P=4 and P=8 ran 2–8 % faster
with 1–2 MiB sub-chunks than unpipelined, and slower again with 32 sub-chunks (per-message
overhead); see benchmarks/results/collectives_1gbit.json. The α-β model does not see this
gain (it comes from smoothing out per-step stragglers), so it charges each sub-chunk an α.

Cost (pipeline=1), n bytes: reduce-scatter (p−1)α + ((p−1)/p)n(β+γ); allgather
(p−1)α + ((p−1)/p)nβ; allreduce 2(p−1)α + 2((p−1)/p)nβ + ((p−1)/p)nγ. Each rank sends
2n(p−1)/p bytes in an allreduce.
"""

from __future__ import annotations

from gradwire.errors import GradwireError
from gradwire.schedules.ir import Algorithm, Schedule, Transfer, blocks, build, split

SUBCHUNK_BYTES = 2**20
MAX_PIPELINE = 8


def pick_pipeline(p: int, count: int, pipeline: int | None, itemsize: int) -> int:
    """Sub-chunks per chunk: ``pipeline`` if given, else chunk bytes / SUBCHUNK_BYTES in
    [1, MAX_PIPELINE]."""
    if pipeline is None:
        chunk = -(-count // max(p, 1)) * itemsize
        return max(1, min(MAX_PIPELINE, chunk // SUBCHUNK_BYTES))
    if isinstance(pipeline, bool) or not isinstance(pipeline, int) or pipeline < 1:
        raise GradwireError(f"pipeline must be an int >= 1 (sub-chunks per chunk), "
                            f"got {pipeline!r}")
    return pipeline


def ring_steps(p: int, count: int, first: int, op: str, pipeline: int) -> list[list[Transfer]]:
    """p−1 steps; at step i rank r sends chunk (r + first − i) mod p to r+1."""
    pieces = [split(c0, cn, pipeline) for c0, cn in blocks(count, p)]  # once, not p² times
    steps = []
    for i in range(p - 1):
        step = []
        for r in range(p):
            step += [Transfer(r, (r + 1) % p, s0, sn, op) for s0, sn in pieces[(r + first - i) % p]]
        steps.append(step)
    return steps


def reducescatter(p: int, count: int, pipeline: int | None = None, itemsize: int = 4,
                  **_: object) -> Schedule:
    """Rank r ends with block r of the sum."""
    pipeline = pick_pipeline(p, count, pipeline, itemsize)
    return build("ring", "reducescatter", p, count, ring_steps(p, count, -1, "sum", pipeline),
                 pipeline=pipeline)


def allgather(p: int, count: int, pipeline: int | None = None, itemsize: int = 4,
              **_: object) -> Schedule:
    """Rank r starts with block r valid; everyone ends with every block."""
    pipeline = pick_pipeline(p, count, pipeline, itemsize)
    return build("ring", "allgather", p, count, ring_steps(p, count, 0, "copy", pipeline),
                 pipeline=pipeline)


def allreduce(p: int, count: int, pipeline: int | None = None, itemsize: int = 4,
              **_: object) -> Schedule:
    """Reduce-scatter (rank r ends owning block r+1) then allgather of the owned blocks."""
    pipeline = pick_pipeline(p, count, pipeline, itemsize)
    steps = ring_steps(p, count, 0, "sum", pipeline) + ring_steps(p, count, 1, "copy",
                                                                     pipeline)
    return build("ring", "allreduce", p, count, steps, pipeline=pipeline)


ALGORITHMS = (
    Algorithm("allreduce", "ring", allreduce),
    Algorithm("reducescatter", "ring", reducescatter),
    Algorithm("allgather", "ring", allgather),
)
