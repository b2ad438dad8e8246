"""Seconds per schedule step of an allreduce on the ranks as they run: α as a collective pays
it (every rank taking part, with its own CPU's share of the work), not a two-host ping-pong."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from gradwire.collectives.api import all_reduce
from gradwire.schedules import registry
from gradwire.transport import Transport


def step_alpha(t: Transport, algo: str = "rd", **params: object) -> float:
    """Seconds per step of gradwire's ``algo`` allreduce on P elements (``"builtin"``:
    torch.distributed's, per step of a ring), every rank of ``t`` taking part (5 runs of 40
    calls after 20, median; rank 0's value on every rank). With
    ``t.check_calls`` on, each call's header exchange is in it too."""
    return step_times(t, algo, **params)[0]


def step_times(t: Transport, algo: str = "rd", **params: object) -> tuple[float, float]:
    """(wall, CPU) seconds per step of :func:`step_alpha`'s runs, the same on every rank:
    wall per step of the schedule; CPU (what one rank's process spent, all its threads, the
    mean over ranks) per step a rank takes part in, the mean over ranks, as
    :func:`gradwire.perf.comm.cpu_seconds` charges it back. The two counts differ where ranks
    sit steps out: recursive doubling at P = 3 has 3 steps, a rank takes part in 2."""
    p = t.world_size
    # "builtin": torch.distributed's allreduce (gloo's ring, which the hooks' allreduces run)
    s = registry.schedule("allreduce", "ring" if algo == "builtin" else algo, p, p, **params)
    steps = len(s.steps)
    # (gradwire.perf.comm.steps counts the same, a layer above)
    taking_part = sum(len({r for x in st.transfers for r in (x.src, x.dst)})
                      for st in s.steps) / p
    run = {k: v for k, v in params.items() if k != "itemsize"}
    dev = t.device  # NCCL takes tensors on its device only
    buf = torch.ones(p, device=dev)

    def call() -> None:
        if algo == "builtin":
            dist.all_reduce(buf, group=t.group)
        else:
            all_reduce(buf, algo=algo, transport=t, **run)

    for _ in range(20):
        call()
    runs, cpus = [], []
    for _ in range(5):
        dist.barrier(group=t.group)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(40):
            call()
        if dev.type == "cuda":  # the calls' kernels are done, not only launched
            torch.cuda.synchronize(dev)
        runs.append((time.perf_counter() - t0) / 40 / max(steps, 1))
        cpus.append((time.process_time() - c0) / 40 / max(taking_part, 1))
    per = torch.tensor([statistics.median(runs)], dtype=torch.float64, device=dev)
    first = 0 if t.group is None else dist.get_global_rank(t.group, 0)
    dist.broadcast(per, first, group=t.group)
    cpu = torch.tensor([statistics.median(cpus) / p], dtype=torch.float64, device=dev)
    dist.all_reduce(cpu, group=t.group)
    t.reset_counters()
    return float(per), float(cpu)
