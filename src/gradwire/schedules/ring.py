"""Ring algorithms (Patarasuk & Yuan; the ring paper, Ueno 2018): reduce-scatter, allgather,
and allreduce as the two back to back.

Each rank r sends to r+1 and receives from r-1. Chunks are the ``blocks`` of the buffer; with
``pipeline=k`` every chunk moves as k sub-chunks, so the executor can forward sub-chunk j while
sub-chunk j+1 is still arriving (the ring paper's sub-chunk software pipelining). Without
``pipeline`` the builders cut chunks into sub-chunks of at least ``SUBCHUNK_BYTES`` (4 MiB), at
most ``MAX_PIPELINE`` of them. On the emulated 1 Gbit/s cluster, every setting taking turns with
torch's all_reduce (benchmarks/ring_pipeline.py), 64 MiB ran fastest in 2–4 sub-chunks of
4–8 MiB at P=4 and P=8, and 16 MiB unpipelined at P=8
(benchmarks/results/ring_pipeline/latest.json); finer cuts lost most at P=8, where 8 ranks
share 2 cores and every message costs CPU. The α-β model does not see the gain over
unpipelined (it comes from smoothing out per-step stragglers), so it charges each sub-chunk
an α.

Cost (pipeline=1), n bytes: reduce-scatter (p−1)α + ((p−1)/p)n(β+γ); allgather
(p−1)α + ((p−1)/p)nβ; allreduce 2(p−1)α + 2((p−1)/p)nβ + ((p−1)/p)nγ. Each rank sends
2n(p−1)/p bytes in an allreduce.
"""

from __future__ import annotations

import numpy as np

from gradwire.check import is_int
from gradwire.errors import GradwireError
from gradwire.schedules.ir import (
    MAX_TRANSFERS,
    Algorithm,
    Schedule,
    Step,
    Table,
    Transfer,
    blocks,
    build,
    split,
)
from gradwire.schedules.lp import MAX_BLOCKS

SUBCHUNK_BYTES = 4 * 2**20
MAX_PIPELINE = 8


def max_pipeline(p: int) -> int:
    """The most sub-chunks per chunk a given ``pipeline`` may cut: the buffer in at most
    ``MAX_BLOCKS`` sub-chunks (lp.py's bound on a pipeline's blocks), or ``MAX_PIPELINE`` per
    chunk where p chunks already pass that. Every sub-chunk is a message on every link at
    each of the 2(p − 1) steps: pipeline=10**7 of 10**9 elements at P = 4 made 240 M
    transfers, and building them ran out of memory instead of failing. From 1058 ranks on,
    fewer, so that an allreduce's 2(p − 1)·p·pipeline transfers stay within
    ``ir.MAX_TRANSFERS`` (1 at p = 4096)."""
    fits = MAX_TRANSFERS // max(2 * (p - 1) * p, 1)
    return max(1, min(max(MAX_PIPELINE, MAX_BLOCKS // max(p, 1)), fits))


def pick_pipeline(p: int, count: int, pipeline: int | None, itemsize: int) -> int:
    """Sub-chunks per chunk: ``pipeline`` if given, else chunk bytes / SUBCHUNK_BYTES in
    [1, MAX_PIPELINE], and at most :func:`max_pipeline`; never more than a chunk's elements
    (more sub-chunks would be empty). A given ``pipeline`` that cuts more than
    :func:`max_pipeline` is refused."""
    elements = max(1, -(-count // max(p, 1)))
    if pipeline is None:
        return max(1, min(MAX_PIPELINE, max_pipeline(p), elements,
                          elements * itemsize // SUBCHUNK_BYTES))
    if not is_int(pipeline, 1):
        raise GradwireError(f"pipeline must be an int >= 1 (sub-chunks per chunk), "
                            f"got {pipeline!r}")
    cut, most = min(int(pipeline), elements), max_pipeline(p)
    if cut > most:
        raise GradwireError(f"pipeline={pipeline} cuts each of {p} chunks into {cut} "
                            f"sub-chunks, a message each on every link at every step: at most "
                            f"{most} at p={p} (at most {MAX_BLOCKS} sub-chunks in all, or "
                            f"{MAX_PIPELINE} a chunk, and {MAX_TRANSFERS:,} transfers in a "
                            f"schedule)")
    return cut


# A phase is (first, reduces): at its step i rank r sends chunk (r + first − i) mod p to r+1,
# which adds it in (a reduce-scatter) or keeps it (an allgather).
REDUCE_SCATTER = ((-1, True),)  # rank r ends with block r of the sum
ALLGATHER = ((0, False),)  # rank r starts with block r
ALLREDUCE = ((0, True), (1, False))  # reduce-scatter, rank r owning block r+1; allgather that


def ring_steps(p: int, count: int, phases: tuple[tuple[int, bool], ...], pipeline: int
               ) -> list[Step]:
    """The ring as it reads, one Transfer at a time: the reference that tests hold
    :func:`ring_table` to (the table builds the same steps without the per-transfer loop)."""
    chunks = [split(c0, cn, pipeline) for c0, cn in blocks(count, p)]
    steps = []
    for first, reduces in phases:
        op = "sum" if reduces else "copy"
        for i in range(p - 1):
            steps.append(Step(tuple(Transfer(r, (r + 1) % p, start, n, op)
                                    for r in range(p)
                                    for start, n in chunks[(r + first - i) % p])))
    return steps


def ring_table(p: int, count: int, phases: tuple[tuple[int, bool], ...], pipeline: int
               ) -> Table:
    """For each phase (first, reduces) in turn, p−1 steps; at step i of a phase rank r sends
    chunk (r + first − i) mod p to r+1, as its sub-chunks (``split`` into ``pipeline``)."""
    pieces = [split(c0, cn, pipeline) for c0, cn in blocks(count, p)]
    width = max((len(x) for x in pieces), default=0)
    starts = np.zeros((p, width), dtype=np.int64)
    sizes = np.zeros((p, width), dtype=np.int64)
    for c, x in enumerate(pieces):
        for j, (s0, sn) in enumerate(x):
            starts[c, j], sizes[c, j] = s0, sn
    n = max(p - 1, 0)
    step = np.arange(n * len(phases))
    first = np.repeat([f for f, _ in phases], n)
    reduces = np.repeat([red for _, red in phases], n).astype(bool)
    chunk = (np.arange(p)[None, :] + (first - step % max(n, 1))[:, None]) % p  # [step, rank]
    size = sizes[chunk].ravel()  # [step, rank, piece], flat
    keep = np.flatnonzero(size)  # 1-D: 10x faster than nonzero() on the 3-D array at P=1024
    step, src = keep // (p * width), keep // width % p
    return Table(p, count, step, src, (src + 1) % p, starts[chunk].ravel()[keep], size[keep],
                 reduces[step])


def reducescatter_table(p: int, count: int, pipeline: int | None = None, itemsize: int = 4,
                        **_: object) -> Table:
    return ring_table(p, count, REDUCE_SCATTER, pick_pipeline(p, count, pipeline, itemsize))


def allgather_table(p: int, count: int, pipeline: int | None = None, itemsize: int = 4,
                    **_: object) -> Table:
    return ring_table(p, count, ALLGATHER, pick_pipeline(p, count, pipeline, itemsize))


def allreduce_table(p: int, count: int, pipeline: int | None = None, itemsize: int = 4,
                    **_: object) -> Table:
    """Reduce-scatter (rank r ends owning block r+1) then allgather of the owned blocks."""
    return ring_table(p, count, ALLREDUCE, pick_pipeline(p, count, pipeline, itemsize))


def reducescatter(p: int, count: int, pipeline: int | None = None, itemsize: int = 4,
                  **_: object) -> Schedule:
    """Rank r ends with block r of the sum."""
    pipeline = pick_pipeline(p, count, pipeline, itemsize)
    t = reducescatter_table(p, count, pipeline)
    return build("ring", "reducescatter", p, count, t.transfers_of(), pipeline=pipeline)


def allgather(p: int, count: int, pipeline: int | None = None, itemsize: int = 4,
              **_: object) -> Schedule:
    """Rank r starts with block r valid; everyone ends with every block."""
    pipeline = pick_pipeline(p, count, pipeline, itemsize)
    t = allgather_table(p, count, pipeline)
    return build("ring", "allgather", p, count, t.transfers_of(), pipeline=pipeline)


def allreduce(p: int, count: int, pipeline: int | None = None, itemsize: int = 4,
              **_: object) -> Schedule:
    """Reduce-scatter (rank r ends owning block r+1) then allgather of the owned blocks."""
    pipeline = pick_pipeline(p, count, pipeline, itemsize)
    t = allreduce_table(p, count, pipeline)
    return build("ring", "allreduce", p, count, t.transfers_of(), pipeline=pipeline)


ALGORITHMS = (
    Algorithm("allreduce", "ring", allreduce, table=allreduce_table),
    Algorithm("reducescatter", "ring", reducescatter, table=reducescatter_table),
    Algorithm("allgather", "ring", allgather, table=allgather_table),
)
