"""The rank side of ``gradwire bench``: time every algorithm and the built-in collective.

Started once per host by the launcher (or by torchrun). For each size and algorithm: warm-up
calls, then timed runs. A timed run starts at a barrier, makes one untimed lead-in call, then
times ``--batch`` calls back to back, as nccl-tests times its iterations; its time per call is
the slowest rank's over the batch divided by the batch, and a row reports the median and mean
over the runs. The lead-in is there for the links: behind a barrier a shaped link has idled
and filled its token bucket (docs/cluster.md), which lets the first megabyte of a call through
faster than the rate; calls back to back, as training makes them, find their links busy (a
single call after a barrier swung both ways around them at 1 MiB, run to run). With
``--interleave`` the algorithms of a size take turns, one timed run each per round, instead
of running one after another.
Rank r's input is filled with r+1 before every timed run and before one last untimed call,
whose output is checked: the sum over P ranks is P(P+1)/2 and the average (P+1)/2, and
``wrong`` counts the elements that differ on any rank. A reduction's inputs are all 1 instead
(the sum P, the average 1) where P(P+1)/2 is past the integers the dtype holds exactly (from
P = 23 in bfloat16, 64 in float16), so that no algorithm's order of adding rounds. (The
timed calls of a batch reduce what the one before left; values that grow to inf cost the
same.)

``--device cuda``: the buffers live on this rank's GPU (LOCAL_RANK) and the process group is
NCCL's, the built-in row included; a timed call ends when the GPU has finished it.

``--op avg``: gradwire's collectives divide the sum by P after the reduction; the built-in
baseline does the same (its SUM, then one division), the way DDP's default hook averages
and on every torch version (gloo's own ReduceOp.AVG arrived only in 2025).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import gradwire.collectives as gc
from gradwire.bench.spec import BACKENDS, BUILTIN, DEVICES, OPS, REDUCING, elements
from gradwire.transport import ALL_GATHER, REDUCE_SCATTER, Transport, group_device

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}


def _buffers(collective: str, count: int, p: int, rank: int, dtype: torch.dtype,
             op: str = "sum", device: torch.device | str = "cpu"):
    """(input, output, reset() to run before every call, expected output on this rank or
    None), on ``device``."""
    new = {"dtype": dtype, "device": device}
    # every partial sum of 1..P exact in dtype (integers up to 2/eps are), or every input 1
    distinct = p * (p + 1) / 2 <= 2 / torch.finfo(dtype).eps or collective in (
        "allgather", "broadcast")
    mine = rank + 1.0 if distinct else 1.0
    total = (p * (p + 1) / 2 if distinct else p) / (p if op == "avg" else 1)
    if collective in ("allgather", "reducescatter"):
        per = count // p
        if collective == "allgather":
            inp, out = torch.full((per,), mine, **new), torch.zeros(per * p, **new)
            want = torch.arange(1, p + 1, **new).repeat_interleave(per)
        else:
            inp, out = torch.full((per * p,), mine, **new), torch.zeros(per, **new)
            want = torch.full((per,), total, **new)
        # the output starts as NaN before every call: a part an algorithm never writes counts
        # as wrong (and is not left over from another algorithm's call, with --interleave)
        return inp, out, (lambda: out.fill_(float("nan"))), want
    buf = torch.empty(count, **new)
    if collective == "allreduce":
        want = torch.full((count,), total, **new)
    elif collective == "reduce":
        want = torch.full((count,), total, **new) if rank == 0 else None
    else:  # broadcast from 0
        want = torch.full((count,), 1.0, **new)
    return buf, buf, (lambda: buf.fill_(mine)), want


def _call(collective: str, algo: str, inp: torch.Tensor, out: torch.Tensor,
          t: Transport, params: dict, op: str = "sum") -> Callable[[], None]:
    if algo == BUILTIN:
        run = {
            "allreduce": lambda: dist.all_reduce(inp),
            "broadcast": lambda: dist.broadcast(inp, 0),
            "reduce": lambda: dist.reduce(inp, 0),
            "allgather": lambda: ALL_GATHER(out, inp),
            "reducescatter": lambda: REDUCE_SCATTER(out, inp),
        }[collective]
        if op == "sum":
            return run
        p, rank = dist.get_world_size(), dist.get_rank()

        def averaged() -> None:
            run()
            if collective != "reduce" or rank == 0:
                out.div_(p)
        return averaged
    return {
        "allreduce": lambda: gc.all_reduce(inp, op=op, algo=algo, transport=t, **params),
        "broadcast": lambda: gc.broadcast(inp, 0, algo=algo, transport=t, **params),
        "reduce": lambda: gc.reduce(inp, 0, op=op, algo=algo, transport=t, **params),
        "allgather": lambda: gc.all_gather_into_tensor(out, inp, algo=algo, transport=t,
                                                       **params),
        "reducescatter": lambda: gc.reduce_scatter_tensor(out, inp, op=op, algo=algo,
                                                          transport=t, **params),
    }[collective]


def _timed(run: Callable[[], object], batch: int = 1,
           lead_in: Callable[[], object] | None = None) -> float:
    """Seconds per call of ``batch`` calls of ``run`` back to back, after a barrier and
    ``lead_in`` (untimed): the slowest rank's time over the batch (on a GPU, until the GPU has
    finished its work) divided by ``batch``."""
    dev = group_device()
    dist.barrier()
    if lead_in is not None:
        lead_in()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(batch):
        run()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = torch.tensor([(time.perf_counter() - t0) / batch], dtype=torch.float64, device=dev)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return dt.item()


def slowest_rank_times(run: Callable[[], object], iters: int, warmup: int,
                       before: Callable[[int], object] | None = None) -> list[float]:
    """Seconds of each of ``iters`` timed calls of ``run`` (after ``warmup`` untimed ones), each
    alone after a barrier: a call lasts as long as its slowest rank. ``before(i)`` runs ahead
    of call i, outside the timing. (The benchmarks' rank scripts time single calls this way;
    ``gradwire bench`` times batches after a lead-in call, :func:`bench_interleaved`.)"""
    times = []
    for i in range(warmup + iters):
        if before is not None:
            before(i)
        dt = _timed(run)
        if i >= warmup:
            times.append(dt)
    return times


def _wrong(out: torch.Tensor, want: torch.Tensor | None) -> int:
    """Elements of ``out`` that differ from ``want``, summed over ranks."""
    wrong = torch.tensor([0 if want is None else int((out != want).sum())], device=group_device())
    dist.all_reduce(wrong)
    return int(wrong.item())


def _row(collective: str, spec: dict, count: int, inp: torch.Tensor, t: Transport,
         times: list[float], wrong: int, calls: int, op: str) -> dict:
    algo = spec["name"]
    sent = torch.tensor([sum(t.bytes_sent)], dtype=torch.float64, device=group_device())
    dist.all_reduce(sent, op=dist.ReduceOp.MAX)
    return {"collective": collective, "algo": spec["label"], "name": algo,
            "params": spec["params"], "count": count,
            "bytes": count * inp.element_size(), "type": str(inp.dtype).replace("torch.", ""),
            "redop": op if collective in REDUCING else "none",
            "time_s": statistics.median(times), "mean_time_s": statistics.fmean(times),
            "times_s": times, "wrong": wrong,
            # gradwire's calls exchange a call header first (agree.py); the model charges it
            "header": algo != BUILTIN and dist.get_world_size() > 1 and t.check_calls,
            "max_bytes_sent_per_rank_per_iter": sent.item() / calls
            if algo != BUILTIN else None}


def bench_interleaved(collective: str, specs: list[dict], count: int, dtype: torch.dtype,
                      iters: int, warmup: int, op: str = "sum", batch: int = 1) -> list[dict]:
    """Every algorithm in turn (``warmup`` untimed calls each, then ``iters`` rounds of one
    timed run each: a lead-in and ``batch`` calls, :func:`_timed`), so that all of them meet
    the same machine: on one whose speed drifts (other load, CPU frequency), ratios between
    algorithms taken one after another move with the drift. They share one pair of buffers;
    after the last round every algorithm makes one more call on fresh input, whose output is
    checked (``wrong``). With one spec: that algorithm's runs one after another."""
    p, rank = dist.get_world_size(), dist.get_rank()
    inp, out, reset, want = _buffers(collective, count, p, rank, dtype, op, group_device())
    transports = [Transport() for _ in specs]
    runs = [_call(collective, s["name"], inp, out, t, s["params"], op)
            for s, t in zip(specs, transports, strict=True)]
    times: list[list[float]] = [[] for _ in specs]
    for _ in range(warmup):
        for run in runs:
            reset()
            run()
    for _ in range(iters):
        for k, run in enumerate(runs):
            times[k].append(_timed(run, batch, lambda run=run: (reset(), run())))
    wrong = []
    for run in runs:
        reset()
        run()
        wrong.append(_wrong(out, want))
    calls = warmup + iters * (1 + batch) + 1
    return [_row(collective, s, count, inp, t, ts, w, calls, op)
            for s, t, ts, w in zip(specs, transports, times, wrong, strict=True)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rank side of gradwire bench")
    ap.add_argument("--collective", required=True)
    ap.add_argument("--algos", required=True,
                    help="JSON list of {label, name, params}; name 'builtin' = torch.distributed")
    ap.add_argument("--sizes", required=True, help="comma list of bytes")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1,
                    help="calls timed back to back in each timed run, after a lead-in call")
    ap.add_argument("--op", default="sum", choices=OPS,
                    help="reduction of allreduce, reduce and reducescatter")
    ap.add_argument("--interleave", action="store_true",
                    help="the algorithms in turn, one call each per round")
    ap.add_argument("--device", default="cpu", choices=DEVICES,
                    help="cuda: buffers on this rank's GPU, over NCCL")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(BACKENDS[a.device], timeout=datetime.timedelta(seconds=300))
    dtype = DTYPES[a.dtype]
    itemsize = torch.tensor([], dtype=dtype).element_size()
    p = dist.get_world_size()
    rows = []
    for size in (int(s) for s in a.sizes.split(",")):
        count = elements(size, itemsize, p, a.collective)
        specs = json.loads(a.algos)
        for group in [specs] if a.interleave else [[s] for s in specs]:
            for row in bench_interleaved(a.collective, group, count, dtype, a.iters, a.warmup,
                                         a.op, a.batch):
                rows.append(row)
                if dist.get_rank() == 0:
                    print(f"GW_BENCH {json.dumps(row)}", flush=True)
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
