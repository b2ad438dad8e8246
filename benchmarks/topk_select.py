"""The top-k selectors alone on one device: one abs pass and torch.topk (which breaks ties its
own way) beside gradwire's ``select`` (exact and sampled threshold, ties to the smaller index;
on a GPU its device path, with no host sync), the host path's code and the full tie rule
(``largest``), on the same fp32 gradient, median of --repeats, each call synchronised; and
under "back to back", each way's ms per call when --repeats calls go out with one sync after.

    python benchmarks/topk_select.py --device cuda --out benchmarks/results/topk_select/h200.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from gradwire.bench import provenance
from gradwire.bench.codec_probe import sync
from gradwire.cli.options import write_json
from gradwire.compress import select
from gradwire.compress.base import generator


def back_to_back_ms(fn, repeats: int, device: str) -> float:
    """ms per call of ``repeats`` calls issued back to back, one sync at the end: the larger of
    the host's time to issue a call and the device's time to run it (on a GPU, a selector
    slower here than synchronised is bound by issuing its kernels from Python)."""
    dev = torch.device(device)
    fn()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(dev)
    return round((time.perf_counter() - t0) / repeats * 1e3, 3)


def median_ms(fn, repeats: int, device: str) -> float:
    dev = torch.device(device)
    times = []
    for _ in range(repeats + 1):
        sync(dev)
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times[1:]) * 1e3, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--size", type=int, default=25_600_000)
    ap.add_argument("--densities", default="0.001,0.01,0.2")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    x = torch.randn(args.size, generator=torch.Generator().manual_seed(1)).to(args.device)
    rows = []
    for d in (float(v) for v in args.densities.split(",")):
        k = int(d * args.size)
        ways = {"abs pass": lambda: x.abs(),
                "torch.topk": lambda k=k: torch.topk(x.abs(), k, sorted=False).indices,
                # select(): what the hooks call; on a GPU the device path (no host sync)
                "select exact": lambda k=k: select.select(x, k, "exact"),
                "select threshold": lambda k=k: select.select(x, k, "threshold"),
                # the host path's code, on whatever device x is
                "exact (host code)": lambda k=k: select.exact_topk(x, k),
                "threshold (host code)": lambda k=k: select.threshold_topk(
                    x, k, generator(0, 0, args.device)),
                "full tie rule (largest)": lambda k=k: select.largest(x.abs(), k)}
        row = {"density": d, "k": k}
        row.update({name: median_ms(fn, args.repeats, args.device) for name, fn in ways.items()})
        row["back to back"] = {name: back_to_back_ms(fn, args.repeats, args.device)
                               for name, fn in ways.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {**provenance.stamp(provenance.script_command(), args.device),
           "size": args.size, "ms": rows}
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
