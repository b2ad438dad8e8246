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
Element i of rank r's input is (r+1)·w_i before every timed run and before one last untimed
call, whose output is checked: the sum over P ranks is P(P+1)/2·w_i, the average (P+1)/2·w_i,
and ``wrong`` counts the elements that differ on any rank. The weights w_i are 1, 2, 4 or 8 at
random, the same on every rank, so that an element or a block that lands in the wrong place
is wrong too (with inputs equal at every position, a reduce-scatter that hands a rank another
rank's block, or a ring step that writes a chunk at another chunk's offset, would pass);
powers of two scale every partial sum exactly. A sum's inputs are w_i instead (the sum P·w_i,
the average w_i) where P(P+1)/2 is past the integers a float dtype holds exactly (from P = 23
in bfloat16, 64 in float16), so that no algorithm's order of adding rounds; an integer sum
wraps modulo 2^bits, as c10d's does, and is exact in any order. For ``--op max``, ``min``
and ``prod`` element i of rank i mod P stands out and every other rank's is the same: 2·w_i
among w_i (the max, 2·w_i), w_i among 2·w_i (the min, w_i), w_i among 1 (the product, w_i).
That is exact in every dtype at every P, and a rank that starts with the answer at its own
elements starts with a wrong one at the others', so that a call that combines nothing, or
misses a rank's part, leaves wrong elements. (The timed calls of a batch reduce what the one
before left; values that grow to inf, or wrap, cost the same.)

``--device cuda``: the buffers live on this rank's GPU (LOCAL_RANK) and the process group is
NCCL's, the built-in row included; a timed call ends when the GPU has finished it.

``--op avg``: gradwire's collectives divide the sum by P after the reduction; the built-in
baseline does the same (its SUM, then one division), the way DDP's default hook averages
and on every torch version (gloo's own ReduceOp.AVG arrived only in 2025).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

import gradwire.collectives as gc
from gradwire.bench import spec
from gradwire.bench.spec import (
    BACKENDS,
    BUILTIN,
    DEVICES,
    REDUCING,
    elements,
    measured_sizes,
    pairs,
    parse_dtypes,
    parse_ops,
)
from gradwire.check import parse_int
from gradwire.errors import GradwireError
from gradwire.rendezvous import JOIN_S, join_world
from gradwire.schedules import registry
from gradwire.transport import ALL_GATHER, REDUCE_SCATTER, Transport, group_device

# the built-in row's op for --op; avg is its sum, then a division (module docstring)
C10D_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}
DTYPES = {name: getattr(torch, name) for name in spec.DTYPES}  # --dtype's, torch's names


# The check's weights (module docstring): drawn on the CPU from a fixed seed, so that every
# rank draws the same ones whatever its device, a chunk at a time to bound the draw's memory.
WEIGHT_SEED = 0
WEIGHT_CHUNK = 1 << 20


def _weights(count: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``count`` weights, each 1, 2, 4 or 8 at random (uint8), the same on every rank."""
    g = torch.Generator().manual_seed(WEIGHT_SEED)
    w = torch.empty(count, dtype=torch.uint8, device=device)
    for start in range(0, count, WEIGHT_CHUNK):
        k = torch.randint(0, 4, (min(WEIGHT_CHUNK, count - start),), generator=g,
                          dtype=torch.uint8)
        w[start : start + k.numel()] = 1 << k
    return w


def _distinct(collective: str, p: int, dtype: torch.dtype) -> bool:
    """Whether rank r's input to a sum can be (r+1)·w (else every rank's is w) and the
    result still exact whatever the order of adding: in a float, every partial sum of 1..P
    is exact (integers up to 2/eps are), the weights scale them by powers of two, which is
    exact, and 8 × the largest such sum (2048 in float16) stays finite; an integer sum wraps
    modulo 2^bits in any order."""
    if collective in ("allgather", "broadcast") or not dtype.is_floating_point:
        return True
    return p * (p + 1) / 2 <= 2 / torch.finfo(dtype).eps


def _buffers(collective: str, count: int, p: int, rank: int, dtype: torch.dtype,
             op: str = "sum", device: torch.device | str = "cpu"):
    """(input, output, reset() to run before every call, expected output on this rank or
    None), on ``device``."""
    new = {"dtype": dtype, "device": device}
    distinct = _distinct(collective, p, dtype)
    mine = rank + 1 if distinct else 1
    total = {"sum": p * (p + 1) // 2 if distinct else p, "avg": (p + 1) / 2 if distinct else 1,
             "max": 2, "min": 1, "prod": 1}[op]
    # max, min, prod: (this rank's own elements, every other's) in units of w (1: prod's 1)
    own, others = {"max": (2, 1), "min": (1, 2), "prod": (1, None)}.get(op, (None, None))
    # uint8: in a uint8 run w.to(dtype) would be w itself, so each one below copies
    w = _weights(count, device)

    def fill(x: torch.Tensor) -> torch.Tensor:  # this rank's input, into x
        if own is None:
            return x.copy_(w).mul_(mine)
        if others is None:
            x.fill_(1)
        else:
            x.copy_(w).mul_(others)
        x[rank::p] = w[rank::p]
        x[rank::p].mul_(own)
        return x

    if collective in ("allgather", "reducescatter"):
        per = count // p
        if collective == "allgather":
            want = w.to(dtype, copy=True)
            for j in range(p):  # rank j's block of the output is its input, (j+1)·w
                want[j * per : (j + 1) * per].mul_(j + 1)
            inp, out = want[rank * per : (rank + 1) * per].clone(), torch.zeros(count, **new)
        else:
            want = w[rank * per : (rank + 1) * per].to(dtype, copy=True).mul_(total)
            inp, out = fill(torch.empty(count, **new)), torch.zeros(per, **new)
        # the output starts as NaN (an integer dtype's: the answer plus one) before every
        # call: a part an algorithm never writes counts as wrong (and is not left over from
        # another algorithm's call, with --interleave)
        if dtype.is_floating_point:
            return inp, out, (lambda: out.fill_(float("nan"))), want
        return inp, out, (lambda: torch.add(want, 1, out=out)), want
    buf = torch.empty(count, **new)
    if collective == "broadcast":  # from 0, whose input is w
        want = w.to(dtype, copy=True)
        return buf, buf, (lambda: buf.copy_(want).mul_(mine)), want
    # reduce: the root's; the others' buffers are scratch
    want = w.to(dtype, copy=True).mul_(total)
    return buf, buf, (lambda: fill(buf)), (
        want if collective == "allreduce" or rank == 0 else None)


def _call(collective: str, algo: str, inp: torch.Tensor, out: torch.Tensor,
          t: Transport, params: dict, op: str = "sum") -> Callable[[], None]:
    if algo == BUILTIN:
        red = C10D_OPS[op]
        run = {
            "allreduce": lambda: dist.all_reduce(inp, op=red),
            "broadcast": lambda: dist.broadcast(inp, 0),
            "reduce": lambda: dist.reduce(inp, 0, op=red),
            "allgather": lambda: ALL_GATHER(out, inp),
            "reducescatter": lambda: REDUCE_SCATTER(out, inp, op=red),
        }[collective]
        if op != "avg":
            return run
        p, rank = dist.get_world_size(), dist.get_rank()

        def averaged() -> None:
            run()
            if collective != "reduce" or rank == 0:
                out.div_(p)
        return averaged
    op = "product" if op == "prod" else op
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
    return taking_turns([run], iters, warmup, before)[0]


def taking_turns(runs: Sequence[Callable[[], object]], iters: int, warmup: int,
                 before: Callable[[int], object] | None = None,
                 lead_in: bool = False) -> list[list[float]]:
    """:func:`slowest_rank_times` of each of ``runs``, the runs taking turns: round i makes one
    call of each, so that a ratio of two of them is of calls made under the same conditions
    (the link's state, the other ranks' load, the machine's). ``lead_in``: each timed call
    follows an untimed one of the same run, so that it finds the links as its own calls leave
    them, not as the previous run's left them (a 100 MB allreduce before a sparse exchange)."""
    times: list[list[float]] = [[] for _ in runs]
    for i in range(warmup + iters):
        if before is not None:
            before(i)
        for j, run in enumerate(runs):
            dt = _timed(run, lead_in=run if lead_in else None)
            if i >= warmup:
                times[j].append(dt)
    return times


# elements compared at a time by the check: a bool a element, not the 8 bytes an element of
# a whole (out != want).sum(), which is 8× a 1-byte buffer
CHECK_CHUNK = 1 << 24


def _wrong(out: torch.Tensor, want: torch.Tensor | None) -> int:
    """Elements of ``out`` that differ from ``want``, summed over ranks (counted on the
    buffers' device, read once)."""
    wrong = torch.zeros(1, dtype=torch.int64, device=group_device())
    if want is not None:
        for i in range(0, out.numel(), CHECK_CHUNK):
            wrong += torch.count_nonzero(out[i : i + CHECK_CHUNK] != want[i : i + CHECK_CHUNK])
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


def check_args(a: argparse.Namespace) -> tuple[list[int], list[dict], list[tuple[str, str]]]:
    """``--sizes``, ``--algos`` and the (dtype, op) runs as the ranks run them, after checking
    every argument that argparse does not: a GradwireError, the same on every rank, instead
    of a traceback on each (``--iters 0`` one after the first size's calls, ``--batch 0`` a
    division by zero)."""
    registry.get(a.collective)
    for option, value, least in (("--iters", a.iters, 1), ("--batch", a.batch, 1),
                                 ("--warmup", a.warmup, 0)):
        if value < least:
            raise GradwireError(f"{option} must be at least {least}, got {value}")
    sizes = [parse_int(s) for s in a.sizes.split(",")]
    if not all(s is not None and s >= 1 for s in sizes):
        raise GradwireError(f"--sizes {a.sizes!r}: expected a comma list of bytes, each 1 or "
                            "more")
    try:
        specs = json.loads(a.algos)
    except ValueError:
        specs = None
    if not (isinstance(specs, list) and specs and all(
            isinstance(s, dict) and {"label", "name", "params"} <= s.keys()
            and isinstance(s["label"], str) and isinstance(s["name"], str)
            and isinstance(s["params"], dict) for s in specs)):
        raise GradwireError(f"--algos {a.algos!r}: expected a JSON list of {{label, name, "
                            "params}")
    # --op avg where the collective does not reduce: the builtin row would divide a broadcast
    # or a gather by P and be counted wrong, gradwire's calls would ignore it
    runs, _ = pairs(parse_dtypes(a.dtype), parse_ops(a.collective, a.op))
    for s in specs:
        if s["name"] == BUILTIN:
            if s["params"]:
                raise GradwireError(f"--algos: the builtin baseline takes no parameters, got "
                                    f"{s['params']}")
            continue
        try:
            registry.check_params(registry.get(a.collective, s["name"]), s["params"])
        except GradwireError as e:
            raise GradwireError(f"--algos: algorithm {s['label']!r}: {e}") from None
    return sizes, specs, runs  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gradwire.bench.rank",
                                 description="rank side of gradwire bench")
    ap.add_argument("--collective", required=True)
    ap.add_argument("--algos", required=True,
                    help="JSON list of {label, name, params}; name 'builtin' = torch.distributed")
    ap.add_argument("--sizes", required=True, help="comma list of bytes")
    ap.add_argument("--dtype", default="float32",
                    help="a dtype, a comma list of them, or all (each dtype's rows in turn)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1,
                    help="calls timed back to back in each timed run, after a lead-in call")
    ap.add_argument("--op", default="sum",
                    help="reduction of allreduce, reduce and reducescatter: one, a comma list "
                         "of them, or all (avg for the float dtypes)")
    ap.add_argument("--interleave", action="store_true",
                    help="the algorithms in turn, one call each per round")
    ap.add_argument("--device", default="cpu", choices=DEVICES,
                    help="cuda: buffers on this rank's GPU, over NCCL")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        sizes, specs, runs = check_args(a)
    except GradwireError as e:
        ap.error(str(e))
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        join_world(BACKENDS[a.device], 300, prog=ap.prog, join=JOIN_S)
    except GradwireError as e:
        raise SystemExit(f"{ap.prog}: error: {e}") from None
    p = dist.get_world_size()
    per_rank = a.collective in ("allgather", "reducescatter")
    for name in dict.fromkeys(d for d, _ in runs):  # every rank finds the same
        itemsize = spec.ITEMSIZE[name]
        small = [s for s in sizes if elements(s, itemsize, p, a.collective) == 0]
        if small:
            ap.error(f"--sizes: {small[0]} bytes hold no {name} element"
                     f"{f' for each of {p} ranks' if per_rank else ''}: expected sizes of "
                     f"at least {itemsize * (p if per_rank else 1)} bytes")
    rows = []
    for name, op in runs:  # as nccl-tests: each dtype's ops, each op's sizes
        itemsize = spec.ITEMSIZE[name]
        for size in measured_sizes(sizes, name, p, a.collective):
            for group in [specs] if a.interleave else [[s] for s in specs]:
                for row in bench_interleaved(a.collective, group, size // itemsize,
                                             DTYPES[name], a.iters, a.warmup, op, a.batch):
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
