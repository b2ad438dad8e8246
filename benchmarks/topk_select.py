"""The top-k selectors alone on one device: one abs pass and torch.topk (which breaks ties its
own way) beside gradwire's ``select`` (exact and sampled threshold, ties to the smaller index;
on a GPU its device path, with no host sync), the host path's code and the full tie rule
(``largest``), on the same fp32 gradient, median of --repeats, each call synchronised, the ways
taking turns call by call (one untimed call of each first); and under "back to back", each
way's ms per call when --repeats calls go out with one sync after.

    python benchmarks/topk_select.py --device cuda --out benchmarks/results/topk_select/h200.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from gradwire.bench import provenance
from gradwire.bench.codec_probe import sync
from gradwire.cli.options import write_json
from gradwire.compress import select
from gradwire.compress.base import generator
from gradwire.jsonfile import out_file


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


def turns_ms(ways: dict, repeats: int, device: str) -> dict[str, float]:
    """Median ms of ``repeats`` synchronised calls of each of ``ways``, after one untimed call
    of each, the ways taking turns call by call: a ratio of two of them (a selector over
    torch.topk) is of calls made under the same conditions. Timed one way after the other,
    a drift of the machine's speed fell between them."""
    dev = torch.device(device)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(repeats + 1):
        for name, fn in ways.items():
            sync(dev)
            t0 = time.perf_counter()
            fn()
            sync(dev)
            if i:
                times[name].append(time.perf_counter() - t0)
    return {name: round(statistics.median(t) * 1e3, 3) for name, t in times.items()}


def densities(text: str, size: int) -> list[float]:
    """``--densities`` as numbers, each in (0, 1] and selecting at least one of ``size``."""
    out = []
    for v in text.split(","):
        try:
            d = float(v)
        except ValueError:
            raise ValueError(f"--densities: {v!r} is not a number") from None
        if not 0 < d <= 1 or int(d * size) < 1:
            raise ValueError(f"--densities: {v} must be in (0, 1] and select at least one of "
                             f"--size {size} elements")
        out.append(d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--size", type=int, default=25_600_000)
    ap.add_argument("--densities", default="0.001,0.01,0.2")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=out_file, required=True)
    args = ap.parse_args()
    if args.size < 1 or args.repeats < 1:
        ap.error(f"--size and --repeats must be >= 1, got {args.size} and {args.repeats}")
    try:
        wanted = densities(args.densities, args.size)
    except ValueError as e:
        ap.error(str(e))
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    x = torch.randn(args.size, generator=torch.Generator().manual_seed(1)).to(args.device)
    rows = []
    for d in wanted:
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
        row.update(turns_ms(ways, args.repeats, args.device))
        row["back to back"] = {name: back_to_back_ms(fn, args.repeats, args.device)
                               for name, fn in ways.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {**provenance.stamp(provenance.script_command(), args.device),
           "size": args.size, "ms": rows}
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
