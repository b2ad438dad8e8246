"""Point 6 of :mod:`gradwire.bench.calibrate`: how the ranks share their machines' cores (ranks
and cores per machine, the share of the cores they keep busy, the wait per collective call,
and how much more CPU memory-bound work takes with every rank running than alone)."""

from __future__ import annotations

import os
import socket
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from gradwire.transport import Transport

SHARING_BURSTS_MS = (0.0, 1.0, 2.0, 5.0, 10.0)
SHARING_ROUNDS = 4  # sweeps of every burst; share and sync are the medians of their fits


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
    dist.all_gather_object(rows, (socket.gethostname(), _cores()), group=t.group)
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
    others waiting (median of 5 rounds; at least 1)."""
    a, b = torch.ones(2**20), torch.ones(2**20)

    def work() -> float:
        c0 = time.thread_time()
        for _ in range(20):
            a.add_(b)
        return time.thread_time() - c0

    work()
    alone, together = [], []
    for _ in range(5):
        dist.barrier(group=t.group)
        if t.rank == 0:
            alone.append(work())
        dist.barrier(group=t.group)
        together.append(work())
    mean = torch.tensor([statistics.median(together) / t.world_size], dtype=torch.float64)
    dist.all_reduce(mean, group=t.group)
    ratio = torch.tensor([float(mean) / statistics.median(alone) if t.rank == 0 else 0.0],
                         dtype=torch.float64)
    dist.broadcast(ratio, 0, group=t.group)
    return max(1.0, float(ratio))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
