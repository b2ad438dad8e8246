"""Where a rank's cores go idle when its hook works on a thread of its own: the hooks' comm
thread (``overlap=True``, the default) against the hook's work on the training thread
(``overlap=False``), on ranks that have no spare core.

P = 2 ranks on this machine (as many ranks as cores when run on 2 cores), gloo over loopback
(no link shaping: the compressed methods' bytes are few and their time is CPU), the digits
MLP's shape (gradwire.models "mlp", 1.13 M parameters, DDP's default buckets: 2), batch 32,
SGD with momentum, one torch thread per rank, malloc as the launcher sets it. The two modes
take turns, ``--rounds`` times, on the same processes' pattern. Per mode and method, the
median over rounds of:

- ``iteration_ms``: wall time per iteration (``--iters`` after a warm-up);
- ``cpu_ms``: the rank's process CPU per iteration (all its threads), the mean over ranks;
- ``idle_ms``: iteration − CPU: the time the rank had nothing running;
- ``second_bucket_ms``: from the hook's call for the first bucket to its call for the second,
  the median and max over iterations and ranks. With the thread, the training thread's
  backward between them is 0.1 ms of work, so the rest is time it waited for a core; inline,
  the gap holds the first bucket's aggregation.

    python benchmarks/hook_thread.py                    # about 2 minutes on 2 cores

Writes results/hook_thread/latest.json with the machine, command, commit and date.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file
from gradwire.launcher import MALLOC_TUNABLES, free_port

HERE = Path(__file__).parent
OUT = HERE / "results" / "hook_thread" / "latest.json"
MODES = {"thread": True, "inline": False}  # overlap=
WORLD = 2


def _rank(rank: int, port: int, method: str, overlap: bool, iters: int, out: str) -> None:
    import gradwire.hooks as gh
    from gradwire.hooks.state import HookState
    from gradwire.models import build_model

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    calls: list[float] = []
    real = HookState.on_bucket

    def on_bucket(self, bucket):  # the time each bucket reaches the hook
        calls.append(time.perf_counter())
        return real(self, bucket)

    HookState.on_bucket = on_bucket  # type: ignore[method-assign]
    net = DDP(build_model("mlp", 0))
    gh.make(method, density=0.001, overlap=overlap).register(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(1024, 64, generator=g), torch.randint(0, 10, (1024,), generator=g)

    def step(i: int) -> None:
        j = (i * 32) % 992
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[j : j + 32]), y[j : j + 32]).backward()
        opt.step()

    for i in range(50):
        step(i)
    dist.barrier()
    calls.clear()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(iters):
        step(i)
    wall, cpu = (time.perf_counter() - t0) / iters, (time.process_time() - c0) / iters
    gaps = [b - a for a, b in zip(calls[0::2], calls[1::2], strict=False)]
    Path(out, f"{rank}.json").write_text(json.dumps({"wall": wall, "cpu": cpu, "gaps": gaps}))
    dist.barrier()
    dist.destroy_process_group()


def run(method: str, overlap: bool, iters: int, tmp: Path) -> dict:
    """One run of P = 2 ranks; its figures."""
    mp.spawn(_rank, args=(free_port(), method, overlap, iters, str(tmp)), nprocs=WORLD)
    ranks = [json.loads(Path(tmp, f"{r}.json").read_text()) for r in range(WORLD)]
    gaps = [gap for r in ranks for gap in r["gaps"]]
    wall = max(r["wall"] for r in ranks)
    cpu = statistics.mean(r["cpu"] for r in ranks)
    return {"iteration_ms": wall * 1e3, "cpu_ms": cpu * 1e3, "idle_ms": (wall - cpu) * 1e3,
            "second_bucket_ms": {"median": statistics.median(gaps) * 1e3,
                                 "max": max(gaps) * 1e3}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="topk,gtopk,signsgd,powersgd")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args(argv)
    command = provenance.script_command(None if argv is None else [__file__, *argv])
    os.environ.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)  # as the launcher runs ranks
    methods = a.methods.split(",")
    each: dict[str, dict[str, list[dict]]] = {m: {k: [] for k in MODES} for m in methods}
    with tempfile.TemporaryDirectory(prefix="gradwire-hook-thread-") as tmp:
        for _ in range(a.rounds):
            for m in methods:
                for mode, overlap in MODES.items():  # interleaved: thread, inline, thread, ...
                    each[m][mode].append(run(m, overlap, a.iters, Path(tmp)))
                    print(m, mode, each[m][mode][-1], flush=True)
    rows = []
    for m in methods:
        row: dict = {"method": m}
        for mode in MODES:
            runs = each[m][mode]
            row[mode] = {k: statistics.median(r[k] for r in runs)
                         for k in ("iteration_ms", "cpu_ms", "idle_ms")}
            row[mode]["second_bucket_ms"] = {
                "median": statistics.median(r["second_bucket_ms"]["median"] for r in runs),
                "max": max(r["second_bucket_ms"]["max"] for r in runs)}
            row[mode]["runs"] = runs
        row["thread_over_inline"] = (row["thread"]["iteration_ms"]
                                     / row["inline"]["iteration_ms"])
        rows.append(row)
    doc = {**provenance.stamp(command), "cores": len(os.sched_getaffinity(0)), "world": WORLD,
           "model": "mlp", "batch_size": 32, "density": 0.001, "iters": a.iters,
           "rounds": a.rounds, "modes": {k: f"overlap={v}" for k, v in MODES.items()},
           "rows": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, doc)
    for r in rows:
        t, i = r["thread"], r["inline"]
        print(f"{r['method']:9s} thread {t['iteration_ms']:.2f} ms (idle {t['idle_ms']:.2f}, "
              f"2nd bucket {t['second_bucket_ms']['median']:.2f}/"
              f"{t['second_bucket_ms']['max']:.2f}) inline {i['iteration_ms']:.2f} ms "
              f"(idle {i['idle_ms']:.2f}) ratio {r['thread_over_inline']:.3f}")


if __name__ == "__main__":
    main()
