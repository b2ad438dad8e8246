"""Rank side of benchmarks/staging.py: ring allreduces of N fp32 elements with the executor's
staging pool as it is, or with nothing kept (POOL=0); per call, the slowest rank's seconds and
each rank's minor page faults (getrusage). Rank 0 writes JSON to OUT."""
import datetime
import json
import os
import resource

import torch
import torch.distributed as dist

import gradwire.collectives as gc
from gradwire.bench.rank import slowest_rank_times
from gradwire.collectives import executor

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
if os.environ["POOL"] == "0":
    executor.STAGING.keep = 0  # every staging buffer goes back to the allocator
x = torch.ones(int(os.environ["N"]))
faults: list[int] = []


def call() -> None:
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    gc.all_reduce(x, algo="ring")
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)


times = slowest_rank_times(call, int(os.environ["ITERS"]), 1)
per_rank = [None] * dist.get_world_size()
dist.all_gather_object(per_rank, faults[1:])
if dist.get_rank() == 0:
    with open(os.environ["OUT"], "w") as f:
        json.dump({"times_s": times, "minor_faults_per_call_by_rank": per_rank}, f)
dist.destroy_process_group()
