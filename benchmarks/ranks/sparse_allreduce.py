"""Rank side of benchmarks/sparse_allreduce.py: time gTopKAllReduce, TopKAllReduce and dense
allreduce of M fp32 gradient elements at density DENSITY; rank 0 writes JSON to OUT.

WARMUP + ITERS rounds; each round runs every method in turn (so that their ratios are of
calls made under the same conditions): after a barrier, one untimed lead-in call, then the
timed call (so that it finds the links as its own calls leave them, not as a 100 MB dense
allreduce just left them); a call's time is the slowest rank's.
The sparse aggregations start from entries selected beforehand (what Table I prices); the
end-to-end row adds error feedback, selection and the dense average (sparse_allreduce);
gtopk_unchecked is gtopk without the call header (``check_calls=False``).
"""
import datetime
import json
import math
import os
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist

import gradwire.collectives as gc
from gradwire.bench.rank import taking_turns
from gradwire.sparse import gtopk_allreduce, select, sparse_allreduce, topk_allreduce
from gradwire.transport import Transport

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
rank, p = dist.get_rank(), dist.get_world_size()
m = int(float(os.environ.get("M", "25e6")))
density = float(os.environ.get("DENSITY", "0.001"))
iters, warmup = int(os.environ.get("ITERS", "5")), int(os.environ.get("WARMUP", "1"))
skip = set(filter(None, os.environ.get("SKIP", "").split(",")))
# P ranks share the machine's cores: one intra-op thread per rank's share, so selection and
# merges do not oversubscribe the cores (8 ranks × 2 threads on 2 cores ran slower).
torch.set_num_threads(max(1, (os.cpu_count() or 1) // p))
k = max(1, math.ceil(density * m))

grad = torch.randn(m, generator=torch.Generator().manual_seed(rank))
picked = select(grad, k)
values = grad[picked]


def same_everywhere(x: torch.Tensor) -> bool:
    s = torch.tensor([float(x.double().sum()), float(x.double().abs().sum())],
                     dtype=torch.float64)
    lo, hi = s.clone(), s.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return bool(torch.equal(lo, hi))


methods: dict[str, tuple[Callable[[], object], Transport | None]] = {}
scratch = torch.zeros(m)  # gtopk's drops land here; the timing does not depend on it
t = Transport()
methods["gtopk"] = (lambda tr=t: gtopk_allreduce(values, picked, m, scratch, transport=tr), t)
if "gtopk_unchecked" not in skip:  # the same call without the header exchange before it
    t = Transport(check_calls=False)
    methods["gtopk_unchecked"] = (lambda tr=t: gtopk_allreduce(values, picked, m, scratch,
                                                               transport=tr), t)
t = Transport()
methods["gtopk_rd"] = (lambda tr=t: gtopk_allreduce(values, picked, m, scratch, algo="rd",
                                                    transport=tr), t)
t = Transport()  # the paper's binomial tree: P − 1 merges in all, where the butterfly makes P·lg P
methods["gtopk_tree"] = (lambda tr=t: gtopk_allreduce(values, picked, m, scratch, algo="tree",
                                                      transport=tr), t)
for algo in ("rd", "ring"):
    t = Transport()
    methods[f"topk_{algo}"] = (lambda a=algo, tr=t: topk_allreduce(values, picked, m, algo=a,
                                                                     transport=tr), t)
residual, work = torch.zeros(m), torch.empty(m)
for sel in ("threshold", "exact"):
    if f"gtopk_end_to_end_{sel}" in skip:
        continue
    t = Transport()

    def step(s: str = sel, tr: Transport = t) -> None:
        work.copy_(grad)  # a fresh gradient each step; the average is written over it
        sparse_allreduce(work, residual, k, "gtopk", selector=s, transport=tr, out=work)

    methods[f"gtopk_end_to_end_{sel}"] = (step, t)
dense = torch.ones(m)
if "dense_ring" not in skip:
    t = Transport()
    methods["dense_ring"] = (lambda tr=t: gc.all_reduce(dense, algo="ring", transport=tr), t)
if "dense_builtin" not in skip:
    methods["dense_builtin"] = (lambda: dist.all_reduce(dense), None)


def reset(i: int) -> None:
    """Each transport's counters from the first timed round on: bytes per timed call."""
    if i == warmup:
        for _, tr in methods.values():
            if tr is not None:
                tr.reset_counters()


rows: dict[str, dict] = {}
# every method once a round, in turn: the ratios between them are of calls made alike
for (name, (_, tr)), times in zip(methods.items(), taking_turns(
        [fn for fn, _ in methods.values()], iters, warmup, reset, lead_in=True), strict=True):
    row = {"time_s": statistics.median(times), "mean_time_s": statistics.fmean(times),
           "times_s": times}
    if tr is not None:
        # each round makes an untimed lead-in call and the timed one: 2·iters calls counted
        sent = torch.tensor([sum(tr.bytes_sent) / (2 * iters)], dtype=torch.float64)
        dist.all_reduce(sent, op=dist.ReduceOp.MAX)
        row["max_bytes_sent_per_rank"] = sent.item()
    rows[name] = row
rows["gtopk"]["identical_on_all_ranks"] = same_everywhere(
    gtopk_allreduce(values, picked, m, scratch).total())
if rank == 0:
    with open(os.environ["OUT"], "w") as f:
        json.dump({"world_size": p, "m": m, "density": density, "k": k, "iters": iters,
                   "warmup": warmup, "threads_per_rank": torch.get_num_threads(),
                   "rows": rows}, f)
dist.destroy_process_group()
