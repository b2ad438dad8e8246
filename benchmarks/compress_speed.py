"""Compression speed: how long compressing costs, next to what it saves on the wire.

(a) Top-k selection, 25 M fp32, density 0.001 (the gTop-k paper's m and ρ): torch.topk on |x|
    against gradwire's sampled-threshold selector, in the same process, taking turns, median of
    --repeats; speed ratio and recall of the exact top-k.
(b) Encode and decode time of every registered compressor on a 25.6 M-element fp32 gradient
    (ResNet-50 sized), shaped like Table 2 of the compression-utility paper (Agarwal et al.
    2021): method, params, encode ms, decode ms, wire bytes, compression ratio.
(c) signSGD's majority vote over P = 2, 4, 8, 16 ranks' sign payloads of that many elements:
    gradwire's ``majority_vote`` against the plain way (unpack each rank's bits to ±1, add
    them up, take the sign) in the same process, taking turns; the results must be equal.
(d) The quantizers' decode (signSGD, EF-signSGD, QSGD s = 255 and 15, TernGrad) on that many
    elements of fp32 and fp16: through the byte table (``bits.decode_codes``, what decompress
    does) against unpacking every code to a byte first and converting and scaling it after
    (what decompress did before), in the same process, taking turns; the results must be
    equal, element for
    element (NaN's sign aside: none here).

    python benchmarks/compress_speed.py            # writes results/compress_speed/latest.json
    python benchmarks/compress_speed.py --size 2000000 --topk-size 2000000 --repeats 3 \\
        --out /tmp/quick.json                       # a quick look
    python benchmarks/compress_speed.py --device cuda
    python benchmarks/compress_speed.py --parts c  # one part; the others kept from --out
    python benchmarks/compress_speed.py --parts d
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.compress import SignSGD, get, majority_vote, threshold_topk
from gradwire.compress.base import generator
from gradwire.compress.bits import unpack_bits
from gradwire.jsonfile import out_file

HERE = Path(__file__).parent
OUT = HERE / "results" / "compress_speed" / "latest.json"

# (name, params) rows of table (b): Table 2's methods and settings, then the rest of the registry.
METHODS: list[tuple[str, dict[str, object]]] = [
    ("powersgd", {"rank": 4}), ("powersgd", {"rank": 8}), ("powersgd", {"rank": 16}),
    ("topk", {"density": 0.2, "selector": "exact"}), ("topk", {"density": 0.2}),
    ("topk", {"density": 0.1, "selector": "exact"}), ("topk", {"density": 0.1}),
    ("topk", {"density": 0.01, "selector": "exact"}), ("topk", {"density": 0.01}),
    ("topk", {"density": 0.001, "selector": "exact"}), ("topk", {"density": 0.001}),
    ("signsgd", {}), ("efsignsgd", {}),
    ("randomk", {"density": 0.01}), ("dgc", {"density": 0.001}),
    ("qsgd", {"s": 255}), ("qsgd", {"s": 15}), ("terngrad", {}),
    ("fp16", {}), ("bf16", {}),
]


def _timed(fn: Callable[[], object], device: str) -> tuple[float, object]:
    """Seconds of one call of ``fn`` (its kernels finished), and its result."""
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def median_ms(fn: Callable[[], object], repeats: int, device: str) -> tuple[float, object]:
    """Median wall time of ``fn`` over ``repeats`` runs after one warm-up, and its last result."""
    return paired_ms([fn], repeats, device)[0]


def paired_ms(fns: list[Callable[[], object]], repeats: int, device: str
              ) -> list[tuple[float, object]]:
    """(median ms, last result) of each of ``fns``, one warm-up each, then taking turns run by
    run: a ratio of two of them is of calls made under the same conditions."""
    outs = [fn() for fn in fns]
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t, outs[i] = _timed(fn, device)
            times[i].append(t)
    return [(statistics.median(t) * 1e3, o) for t, o in zip(times, outs, strict=True)]


def topk_selection(size: int, density: float, repeats: int, device: str) -> dict[str, object]:
    x = torch.randn(size, generator=torch.Generator().manual_seed(0)).to(device)
    k = max(1, round(density * size))
    calls = iter(range(10**9))
    (ref_ms, ref), (ours_ms, ours) = paired_ms(
        [lambda: torch.topk(x.abs(), k, sorted=False).indices,
         lambda: threshold_topk(x, k, generator(0, next(calls), device))], repeats, device)
    recall = torch.isin(ours, ref).double().mean().item()  # type: ignore[arg-type]
    return {"numel": size, "dtype": "float32", "density": density, "k": k,
            "torch_topk_ms": round(ref_ms, 2), "threshold_ms": round(ours_ms, 2),
            "speedup": round(ref_ms / ours_ms, 2), "recall": recall,
            "selected": ours.numel()}  # type: ignore[attr-defined]


def encode_decode(size: int, repeats: int, device: str) -> list[dict[str, object]]:
    x = torch.randn(size, generator=torch.Generator().manual_seed(1)).to(device)
    rows = []
    for name, params in METHODS:
        c = get(name, **params)
        enc_ms, payload = median_ms(lambda c=c: c.compress(x), repeats, device)
        dec_ms, _ = median_ms(lambda c=c, p=payload: c.decompress(p, size), repeats, device)
        wire = c.wire_bytes(size, x.dtype)
        rows.append({"method": name, "params": c.params, "encode_ms": round(enc_ms, 2),
                     "decode_ms": round(dec_ms, 2), "wire_bytes": wire,
                     "compression": round(size * 4 / wire, 1)})
    return rows


def plus_minus(bits: torch.Tensor, numel: int) -> torch.Tensor:
    """Each sign bit unpacked to a byte, then ±1 (int8): the baselines' first step."""
    return unpack_bits(bits, 1, numel).to(torch.int8) * 2 - 1


def plain_vote(payloads: list, numel: int) -> torch.Tensor:
    """The baseline of (c): every rank's bits unpacked to ±1 and added, then the sign."""
    total = torch.zeros(numel, dtype=torch.int32, device=payloads[0].bits.device)
    for p in payloads:
        total += plus_minus(p.bits, numel)
    return torch.sign(total).to(payloads[0].dtype)


def unpacked_decode(c: Any, p: Any, numel: int) -> torch.Tensor:
    """The baseline of (d): every code unpacked to a byte, then converted and scaled."""
    if c.name == "signsgd":
        return plus_minus(p.bits, numel).to(p.dtype)
    if c.name == "efsignsgd":
        return (plus_minus(p.bits, numel).to(p.scale.dtype) * p.scale).to(p.dtype)
    if c.name == "qsgd":
        lev = unpack_bits(p.levels, c._level_width(), numel)
        mag = lev.to(p.norm.dtype) * (p.norm / c.s)
        neg = unpack_bits(p.signs, 1, numel).bool()
        return torch.where(neg, -mag, mag).to(p.dtype)
    codes = unpack_bits(p.codes, 2, numel)  # terngrad
    unit = (codes & 1).to(torch.int8) - (codes >> 1).to(torch.int8)
    return (unit.to(p.scale.dtype) * p.scale).to(p.dtype)


DECODED = [("signsgd", {}), ("efsignsgd", {}), ("qsgd", {"s": 255}), ("qsgd", {"s": 15}),
           ("terngrad", {})]


def decode_table(size: int, repeats: int, device: str) -> list[dict[str, object]]:
    rows = []
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(size, generator=torch.Generator().manual_seed(2)).to(device, dtype)
        for name, params in DECODED:
            c = get(name, **params)
            p = c.compress(x)
            (plain_ms, want), (ours_ms, got) = paired_ms(
                [lambda c=c, p=p: unpacked_decode(c, p, size),
                 lambda c=c, p=p: c.decompress(p, size)], repeats, device)
            rows.append({"method": name, "params": c.params, "dtype": str(dtype)[6:],
                         "numel": size, "unpacked_ms": round(plain_ms, 2),
                         "table_ms": round(ours_ms, 2), "speedup": round(plain_ms / ours_ms, 2),
                         "equal": bool(torch.equal(got, want)
                                       and torch.equal(got.signbit(), want.signbit()))})
    return rows


def vote(size: int, repeats: int, device: str) -> list[dict[str, object]]:
    rows = []
    for ranks in (2, 4, 8, 16):
        g = torch.Generator().manual_seed(ranks)
        payloads = [SignSGD().compress(torch.randn(size, generator=g).to(device))
                    for _ in range(ranks)]
        (plain_ms, want), (ours_ms, got) = paired_ms(
            [lambda p=payloads: plain_vote(p, size), lambda p=payloads: majority_vote(p, size)],
            repeats, device)
        rows.append({"ranks": ranks, "numel": size, "plain_ms": round(plain_ms, 2),
                     "majority_vote_ms": round(ours_ms, 2),
                     "speedup": round(plain_ms / ours_ms, 2),
                     "equal": bool(torch.equal(got, want))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=25_600_000, help="elements for table (b)")
    ap.add_argument("--topk-size", type=int, default=25_000_000, help="elements for (a)")
    ap.add_argument("--density", type=float, default=0.001, help="density for (a)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out", type=out_file, default=OUT)
    ap.add_argument("--parts", default="a,b,c,d", help="comma list of a, b, c, d (see above)")
    args = ap.parse_args()
    # one line each, before anything runs: --repeats 0 took the median of nothing, a size of
    # 0 or less failed in torch (or "measured" empty tensors), and a density of 0 selected
    # one element while the result recorded density 0
    for option, value in (("--size", args.size), ("--topk-size", args.topk_size),
                          ("--repeats", args.repeats)):
        if value < 1:
            ap.error(f"{option} must be >= 1, got {value}")
    if not 0 < args.density <= 1 or round(args.density * args.topk_size) < 1:
        ap.error(f"--density must be in (0, 1] and select at least one of --topk-size "
                 f"{args.topk_size} elements, got {args.density}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    parts = set(args.parts.split(","))
    if not parts <= {"a", "b", "c", "d"}:
        raise SystemExit(f"--parts: expected a comma list of a, b, c, d, got {args.parts!r}")

    # Parts not run keep what --out holds; each part records when and how it ran.
    result = json.loads(args.out.read_text()) if args.out.exists() and parts != {
        "a", "b", "c", "d"} else {}
    stamp = {**provenance.stamp(provenance.script_command(), args.device),
             "threads": torch.get_num_threads()}
    # The file's own stamp is table (b)'s; (a) keeps its own in topk_selection, so that a run
    # of one of them does not restamp the other, kept from an earlier run, with this command.
    sel = result.get("topk_selection")
    if "b" in parts and "a" not in parts and isinstance(sel, dict) and "date" not in sel:
        sel.update({k: result[k] for k in stamp if k in result})  # (a) from before: its stamp
    if "b" in parts:
        result.update(stamp)
    if "a" in parts:
        result["topk_selection"] = {**topk_selection(args.topk_size, args.density, args.repeats,
                                                     args.device), **stamp}
    if "b" in parts:
        result["rows"] = encode_decode(args.size, args.repeats, args.device)
    if "c" in parts:
        result["vote"] = {**stamp, "rows": vote(args.size, args.repeats, args.device)}
    if "d" in parts:
        result["decode"] = {**stamp,
                            "rows": decode_table(args.size, args.repeats, args.device)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)

    console = Console(width=max(130, shutil.get_terminal_size().columns))
    if "a" in parts:
        sel = result["topk_selection"]
        console.print(f"(a) top-k of {sel['numel']:,} fp32, k = {sel['k']:,}: torch.topk "
                      f"{sel['torch_topk_ms']} ms, threshold selector {sel['threshold_ms']} ms, "
                      f"{sel['speedup']}x, recall {sel['recall']:.4f}")
    if "b" in parts:
        table = Table(title=f"(b) encode + decode, {args.size:,} fp32 elements, {args.device}, "
                            f"median of {args.repeats}")
        for col in ("method", "params", "encode ms", "decode ms", "wire bytes", "ratio"):
            table.add_column(col, justify="left" if col in ("method", "params") else "right",
                             no_wrap=True)
        for r in result["rows"]:
            params = ", ".join(f"{k}={v}" for k, v in r["params"].items())  # type: ignore[attr-defined]
            table.add_row(str(r["method"]), params, f"{r['encode_ms']:.1f}",
                          f"{r['decode_ms']:.1f}", f"{r['wire_bytes']:,}", f"{r['compression']}x")
        console.print(table)
    if "c" in parts:
        for r in result["vote"]["rows"]:
            console.print(f"(c) vote of {r['ranks']} ranks, {r['numel']:,} elements: plain "
                          f"{r['plain_ms']} ms, majority_vote {r['majority_vote_ms']} ms, "
                          f"{r['speedup']}x, equal: {r['equal']}")
    if "d" in parts:
        for r in result["decode"]["rows"]:
            console.print(f"(d) {r['method']} {r['params']} {r['dtype']}, {r['numel']:,}: "
                          f"unpacked first {r['unpacked_ms']} ms, byte table {r['table_ms']} "
                          f"ms, {r['speedup']}x, equal: {r['equal']}")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
