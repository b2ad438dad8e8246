"""The shared-CPU terms of a calibration (:func:`cpu_terms`), on CPU ranks: the CPU a rank
spends per schedule step and per byte moved, and how the ranks share their machines' cores
(ranks and cores per machine, the share of the cores they keep busy, the wait per collective
call, and how much more CPU memory-bound work takes with every rank running than alone). The
performance model charges them where ranks share cores (point 5 of :mod:`gradwire.perf.model`),
as every rank of an emulated cluster shares this machine's."""

from __future__ import annotations

import itertools
import os
import socket
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from gradwire.collectives.probe import step_times
from gradwire.perf.calibration import CpuTerms
from gradwire.transport import Transport

SHARING_BURSTS_MS = (0.0, 1.0, 2.0, 5.0, 10.0)
SHARING_ROUNDS = 4  # sweeps of every burst; share and sync are the medians of their fits
BYTE_CPU_ELEMENTS, BYTE_CPU_CALLS = 2**18, 5  # 1 MiB: 84 ms a call at P = 2, 100 Mbit/s
CALL_CPU_ELEMENTS, CALL_CPU_CALLS = 4096, 40  # 16 KiB: a compressed call (PowerSGD's P, Q)
CPU_ROUNDS = 15
MEMORY_PASSES = 20  # timed passes of the memory slowdown per round, each on data not cached
MEMORY_PASS_ELEMENTS = 2**20  # float32 elements of each pass's a and of its b


def cpu_terms(t: Transport, gamma: float) -> CpuTerms:
    """Every shared-CPU term on ``t``'s ranks (``t`` without call headers, which the model
    charges apart; ``gamma``: the reduction speed, the same on every rank). The CPU per step
    comes from a P-element recursive-doubling allreduce on gradwire's executor, 5 runs of 40
    calls (:func:`gradwire.collectives.probe.step_times`); per call of the backend's own
    collectives and per byte from :func:`backend_cpu`; the rest from :func:`cpu_sharing`."""
    _, step = step_times(t)
    call, byte = backend_cpu(t, gamma)
    s = cpu_sharing(t)
    return CpuTerms(s["ranks"], s["cores"], step, byte, s["share"], s["sync"], s["sync_step"],
                    s["slowdown"], call)


def backend_cpu(t: Transport, gamma: float) -> tuple[float, float]:
    """(CPU seconds per call of the backend's own collectives, CPU seconds per byte moved:
    its sender's and receiver's together, as :func:`gradwire.perf.comm.cpu_seconds` charges
    it), from torch.distributed's allreduce (gloo's ring, which the hooks' dense, fp16 and
    PowerSGD allreduces run) of float32 over ``t``'s ranks, issued asynchronously and waited
    for, as the hooks issue theirs, every rank at once.

    ``CPU_ROUNDS`` rounds, each a run of ``CALL_CPU_CALLS`` calls of ``CALL_CPU_ELEMENTS`` and
    one of ``BYTE_CPU_CALLS`` calls of ``BYTE_CPU_ELEMENTS``, each run after a barrier: a
    rank's process CPU per call (every thread: gloo's wake up for each call), the mean over
    ranks, less the reductions (``gamma``). Each round's two calls give a line in the bytes
    moved; the CPU per byte is the median of the slopes, the CPU per call the median of what
    is left of the small call beyond its bytes. Interleaved rounds and medians: one run in a
    few costs half as much again as the others, on loopback and on shaped links alike.

    The per-call term holds the call's steps at this P: the model charges it, not the
    executor's CPU per step, for every backend call. That per-step term, measured on
    gradwire's executor, does not cover one: on the emulated clusters of
    ``benchmarks/results/perf_validation/latest.json`` a backend call took 0.9–1.2 ms at
    P = 2 and 2.1 ms at P = 4, an executor's step 0.26–0.44 ms."""
    from gradwire.perf import comm

    p = t.world_size
    sizes = ((CALL_CPU_ELEMENTS, CALL_CPU_CALLS), (BYTE_CPU_ELEMENTS, BYTE_CPU_CALLS))
    bufs = [torch.ones(n) for n, _ in sizes]
    for buf in bufs:
        for _ in range(3):
            dist.all_reduce(buf, group=t.group, async_op=True).wait()
    spent = torch.zeros(CPU_ROUNDS, 2, dtype=torch.float64)
    for r in range(CPU_ROUNDS):
        for i, (buf, (_, calls)) in enumerate(zip(bufs, sizes, strict=True)):
            dist.barrier(group=t.group)
            c0 = time.process_time()
            for _ in range(calls):
                dist.all_reduce(buf, group=t.group, async_op=True).wait()
            spent[r, i] = (time.process_time() - c0) / calls / p
    dist.all_reduce(spent, group=t.group)  # the mean over ranks of each run
    moved, known = [], []
    for n, _ in sizes:
        args = ("allreduce", "ring", p, n, 4)
        moved.append(comm.cpu_seconds(*args, 0.0, 1.0, 0.0, pipeline=1))
        known.append(comm.cpu_seconds(*args, 0.0, 0.0, gamma, pipeline=1))
    small = spent[:, 0] - known[0]
    slopes = (spent[:, 1] - known[1] - small) / (moved[1] - moved[0])
    byte = max(float(slopes.median()), 0.0)
    return max(float((small - moved[0] * byte).median()), 0.0), byte


def cpu_sharing(t: Transport) -> dict:
    """How the ranks share their machines' cores when they alternate compute with
    collectives, as training does.

    ``ranks``: the most ranks on one machine (ranks with the same host name: every rank of an
    emulated cluster); ``cores``: its cores. Then, for bursts of ``SHARING_BURSTS_MS`` of CPU
    (matrix products, one thread) each followed by a P-element allreduce, 30 iterations after
    5: wall seconds per iteration W against L·D, D the CPU a rank's process spent per
    iteration (the mean over ranks) and L = max(1, ranks/cores). A least-squares line
    W = L·D/share + sync gives ``share`` (at most 1), the share of the cores the ranks keep
    busy, and ``sync`` (at least 0), the seconds each collective call waits for ranks that
    the scheduler has not run yet; ``sync_step`` is that per step of the probe's allreduce
    (recursive doubling: ⌈log2 P⌉ steps at powers of two), what
    :class:`gradwire.perf.model.ClusterModel` charges per schedule step.
    ``SHARING_ROUNDS`` sweeps, one line each, give the medians: sync is where the line meets
    L·D = 0, and single sweeps of three bursts from 2 ms put it anywhere from 0.1 to 2.3 ms on
    one cluster (P = 2 and 8 at 1 Gbit/s); the bursts of 0 and 1 ms pin that end and the
    median of four sweeps keeps one slow sweep out (0.46–1.15 ms per sweep, same probe).
    """
    import gradwire.collectives as gc

    rows: list = [None] * t.world_size
    dist.all_gather_object(rows, (socket.gethostname(), usable_cores()), group=t.group)
    hosts: dict[str, list[int]] = {}
    for host, n in rows:
        hosts.setdefault(host, []).append(n)
    ranks = max(len(v) for v in hosts.values())
    cores = min(n for v in hosts.values() for n in v)
    load = max(1.0, ranks / cores)
    a, buf = torch.randn(192, 192, generator=torch.Generator().manual_seed(0)), torch.ones(
        t.world_size)

    def iteration(ms: float) -> None:
        c0 = time.thread_time()
        while time.thread_time() - c0 < ms / 1e3:
            a @ a
        gc.all_reduce(buf, algo="rd", transport=t)

    shares, syncs = [], []
    for _ in range(SHARING_ROUNDS):
        xs, ys = [], []
        for ms in SHARING_BURSTS_MS:
            for _ in range(5):
                iteration(ms)
            dist.barrier(group=t.group)
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(30):
                iteration(ms)
            got = torch.tensor([time.process_time() - c0, time.perf_counter() - w0],
                               dtype=torch.float64) / 30 / t.world_size
            dist.all_reduce(got, group=t.group)
            xs.append(load * float(got[0]))
            ys.append(float(got[1]))
        slope, sync = np.polyfit(xs, ys, 1)
        shares.append(min(1.0, 1.0 / max(slope, 1e-9)))
        syncs.append(max(sync, 0.0))
    from gradwire.perf.whatif import sync_probe_steps

    sync = float(statistics.median(syncs))
    return {"ranks": ranks, "cores": cores, "share": float(statistics.median(shares)),
            "sync": sync, "sync_step": sync / sync_probe_steps(t.world_size),
            "slowdown": _memory_slowdown(t)}


def _memory_slowdown(t: Transport) -> float:
    """How much more CPU memory-bound work (``a.add_(b)`` over 4 MiB of float32, as encode
    and decode do) takes when every rank runs it at once than when rank 0 runs it alone, the
    others waiting (median of 5 rounds of ``MEMORY_PASSES`` passes; at least 1). Each pass
    starts from memory, as the codec table's times do, but without a cache flush before it:
    the passes take their a and b in turn from a pool twice the last-level cache's size
    (:func:`gradwire.bench.codec_probe.cache_bytes`), written once, so that a pair comes
    back only after twice the cache of other data has gone through (a flush of that size
    before each 0.4 ms pass took 80 ms on a VM whose sysfs gives 300 MiB). Each pass comes
    after a barrier, so that the ranks contend for memory bandwidth with their passes alone,
    as their hooks' encodes, which start together when the ranks leave a collective
    together, do."""
    from gradwire.bench.codec_probe import cache_bytes

    pair = 2 * MEMORY_PASS_ELEMENTS * 4  # bytes of one a and b
    pool = torch.ones(-(-2 * cache_bytes(torch.device("cpu")) // pair) + 1, 2,
                      MEMORY_PASS_ELEMENTS)
    pairs = itertools.cycle(pool)

    def work(mine: bool) -> float:
        spent = 0.0
        for _ in range(MEMORY_PASSES):
            dist.barrier(group=t.group)
            if mine:
                a, b = next(pairs)
                c0 = time.thread_time()
                a.add_(b)
                spent += time.thread_time() - c0
            dist.barrier(group=t.group)
        return spent

    work(True)
    alone, together = [], []
    for _ in range(5):
        alone.append(work(t.rank == 0))
        together.append(work(True))
    mean = torch.tensor([statistics.median(together) / t.world_size], dtype=torch.float64)
    dist.all_reduce(mean, group=t.group)
    ratio = torch.tensor([float(mean) / statistics.median(alone) if t.rank == 0 else 0.0],
                         dtype=torch.float64)
    dist.broadcast(ratio, 0, group=t.group)
    return max(1.0, float(ratio))


def usable_cores() -> int:
    """The cores this process (and so every rank it starts) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
