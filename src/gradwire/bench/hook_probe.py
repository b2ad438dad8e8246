"""Point 7 of :mod:`gradwire.bench.calibrate`: the CPU and wall time each aggregation method's
hook spends per iteration on a cluster, every rank at once (``--hook-buckets``,
``--hook-methods``; ``--hooks-only`` measures this alone, in seconds, to measure it again
later on the same cluster: the machine's speed drifts)."""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from gradwire.transport import Transport

HOOK_ITERATIONS = 15  # hook_cpu's iterations per method, after one


def hook_cpu(t: Transport, numels: list[int], methods: list[str]) -> dict[str, dict]:
    """CPU and wall seconds per iteration of each method's hook on ``t``'s ranks (torch's
    default group, which the hooks use): its own path (error feedback, encode, the call
    header, the collectives, decode, writing the bucket back; :func:`gradwire.bench.
    codec_probe.hook_path`) on one iteration's buckets of ``numels`` elements, in order, each
    refilled with this rank's gradient and out of the caches (``codec_probe.EVICT_BYTES``
    written after it), as backward leaves it. CPU is the rank's process CPU over the bucket
    calls (the hook's thread and gloo's), the median of ``HOOK_ITERATIONS`` iterations after
    one, each after a barrier, the methods in turn; then the mean over ranks. What a rank
    spends waiting inside a call is in it, about 0.5 % of the wait here."""
    from gradwire.bench import codec_probe

    gen = torch.Generator().manual_seed(1000 + t.rank)
    grads = [torch.randn(n, generator=gen) for n in numels]
    evict = torch.zeros(codec_probe.EVICT_BYTES, dtype=torch.uint8)
    runs = {}
    for name in methods:
        state, plan = codec_probe.hook_path(name)
        params = [torch.empty(n) for n in numels]  # kept: the layout keys them by id()
        keys = [state.positions.layout([q]) for q in params]
        runs[name] = (state, plan, params, keys, [torch.empty(n) for n in numels], [], [])
    # Round-robin, an iteration of every method in turn, so that a slow spell of the machine
    # lands on every method alike.
    for _ in range(HOOK_ITERATIONS + 1):
        for state, plan, _, keys, bufs, cpus, walls in runs.values():
            dist.barrier(group=t.group)
            cpu = wall = 0.0
            for i, (buf, key, g) in enumerate(zip(bufs, keys, grads, strict=True)):
                buf.copy_(g)
                evict.add_(1)
                w0, c0 = time.perf_counter(), time.process_time()
                state._bucket(buf, key, plan, i, i == len(bufs) - 1)  # noqa: SLF001
                cpu += time.process_time() - c0
                wall += time.perf_counter() - w0
            cpus.append(cpu)
            walls.append(wall)
    out = {}
    for name, (*_, cpus, walls) in runs.items():
        got = torch.tensor([statistics.median(cpus[1:]), statistics.median(walls[1:])],
                           dtype=torch.float64) / t.world_size
        dist.all_reduce(got, group=t.group)
        out[name] = {"cpu_s": float(got[0]), "wall_s": float(got[1])}
    return out


def bucket_sizes(text: str) -> list[int]:
    """--hook-buckets: whole numbers >= 1, comma-separated."""
    try:
        sizes = [int(n) for n in text.split(",") if n]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected bucket sizes in elements (whole numbers "
                                         f">= 1), comma-separated, got {text!r}")
    return sizes


def method_names(text: str) -> list[str]:
    """--hook-methods: names of gradwire.hooks methods, comma-separated."""
    from gradwire.catalogue import METHODS

    names = [m for m in text.split(",") if m]
    bad = [m for m in names if m not in METHODS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected methods from {', '.join(METHODS)}, "
                                         f"comma-separated, got {text!r}")
    return names
