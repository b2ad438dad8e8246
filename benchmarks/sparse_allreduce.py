"""Sparse aggregation on the emulated 1 Gbit/s cluster, next to Table I of the gTop-k paper.

For m = 25·10⁶ fp32 elements, density ρ = 0.001 (k = 25 000), P = 4 and 8: measured time of
gTopKAllReduce (its default, the butterfly: ``gtopk`` and ``gtopk_rd``; the paper's binomial
tree: ``gtopk_tree``),
TopKAllReduce (rd and ring allgather), dense allreduce (gradwire's ring and
torch.distributed's built-in), and gTop-k end to end (error feedback, selection, dense
average), next to the predictions of
- Table I's formulas with the paper's α = 0.436 ms, β = 3.6·10⁻⁵ ms per element;
- Table I's formulas with this cluster's calibrated α and β (β per element = 4 × per byte);
- gradwire's cost model on the schedule that ran (calibrated α, β, γ).
Target: dense / gTopKAllReduce ≥ 50 at P = 8.

    python benchmarks/sparse_allreduce.py                  # ~3 min; needs root (namespaces)
    python benchmarks/sparse_allreduce.py --loopback --m 1e5 --hosts 2 --out /tmp/s.json
                                                           # smoke run, no shaping

The calibration is $GRADWIRE_HOME/calibration/<bandwidth>.json (`gradwire calibrate --hosts 2
--bandwidth 1gbit`), else the one in benchmarks/results/collectives/latest.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from ab import earlier_src, revision, this_code

from gradwire.bench import calibrate, provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file
from gradwire.schedules import registry
from gradwire.schedules.cost import CostParams, cost, traffic
from gradwire.sparse import schedule

HERE = Path(__file__).parent
OUT = HERE / "results" / "sparse_allreduce" / "latest.json"
# the calibration used where this machine has none for 1gbit (collectives.py writes it)
COLLECTIVES = HERE / "results" / "collectives" / "latest.json"
RANK = HERE / "ranks" / "sparse_allreduce.py"
PAPER_ALPHA_S, PAPER_BETA_S_PER_ELEMENT = 0.436e-3, 3.6e-8  # 1 GbE cluster of the paper


def table_1(p: int, m: int, k: int, alpha: float, beta: float) -> dict[str, float]:
    """Table I of the gTop-k paper, β per element (log base 2)."""
    lg = math.log2(p)
    return {"dense": 2 * (p - 1) * alpha + 2 * (p - 1) / p * m * beta,
            "topk": lg * alpha + 2 * (p - 1) * k * beta,
            "gtopk": 2 * lg * alpha + 4 * k * lg * beta}


def model(p: int, m: int, k: int, params: CostParams) -> dict[str, tuple[float, int]]:
    """gradwire's cost model on the schedules that run: (seconds, most bytes a rank sends)."""
    runs = {"dense_ring": (registry.schedule("allreduce", "ring", p, m, itemsize=4), 4),
            "topk_rd": (schedule("topk", p, m, k, algo="rd"), 1),
            "topk_ring": (schedule("topk", p, m, k, algo="ring"), 1),
            "gtopk": (schedule("gtopk", p, m, k), 1),
            "gtopk_rd": (schedule("gtopk", p, m, k, algo="rd"), 1),
            "gtopk_tree": (schedule("gtopk", p, m, k, algo="tree"), 1)}
    return {name: (cost(s, params, size), int(traffic(s, size).bytes_sent.sum(1).max()))
            for name, (s, size) in runs.items()}


def calibration(bandwidth: str) -> tuple[CostParams, str]:
    found = calibrate.load(bandwidth)
    if found:
        return found[0], f"{calibrate.calibration_path(bandwidth)} ({found[1]['date']})"
    committed = COLLECTIVES
    d = json.loads(committed.read_text())["calibration"] if committed.exists() else None
    if bandwidth == "1gbit" and d:
        return (CostParams(d["alpha_s"], d["beta_s_per_byte"], d["gamma_s_per_byte"]),
                f"{committed} ({d['date']})")
    raise SystemExit(f"no calibration for {bandwidth}: run `gradwire calibrate --hosts 2 "
                     f"--bandwidth {bandwidth}` first")


def run_ranks(p: int, args: argparse.Namespace, src: Path | None = None,
              skip: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="gradwire-sparse-") as tmp:
        out = Path(tmp) / "rows.json"
        net = ["--loopback"] if args.loopback else ["--bandwidth", args.bandwidth]
        cmd = [sys.executable, "-m", "gradwire.cli", "run", "--hosts", str(p), *net,
               "--timeout", str(args.timeout), "--", sys.executable, str(RANK)]
        env = {**os.environ, "M": str(args.m), "DENSITY": str(args.density),
               "ITERS": str(args.iters), "WARMUP": str(args.warmup), "OUT": str(out),
               "SKIP": args.skip if skip is None else skip}
        if src is not None:
            env["PYTHONPATH"] = str(src)
        print("$ " + (f"PYTHONPATH={src} " if src else "") + shlex.join(cmd), flush=True)
        res = subprocess.run(cmd, env=env)
        if res.returncode != 0 or not out.exists():
            raise SystemExit(f"P={p} failed ({res.returncode})")
        return json.loads(out.read_text())


SPARSE_ROWS = ("gtopk", "gtopk_unchecked", "gtopk_rd", "topk_rd", "topk_ring")
SLOW_ROWS = "gtopk_end_to_end_threshold,gtopk_end_to_end_exact,dense_ring,dense_builtin"


def one(p: int, args: argparse.Namespace, cal: CostParams, old_src: Path | None) -> dict:
    def earlier() -> dict[str, float]:
        old = run_ranks(p, args, old_src, SLOW_ROWS)["rows"]
        return {name: old[name]["time_s"] for name in SPARSE_ROWS}

    # The earlier commit's sparse rows run just before and just after these, so that a drift
    # over the run (or the order) does not favour either side; the ratios use their mean.
    before = earlier() if old_src is not None else None
    got = run_ranks(p, args)
    after = earlier() if old_src is not None else None
    m, k, rows = got["m"], got["k"], got["rows"]
    paper = table_1(p, m, k, PAPER_ALPHA_S, PAPER_BETA_S_PER_ELEMENT)
    ours = table_1(p, m, k, cal.alpha, 4 * cal.beta)
    predicted = model(p, m, k, cal)
    predicted["gtopk_unchecked"] = predicted["gtopk"]  # the model prices no header
    table = {"gtopk": "gtopk", "gtopk_unchecked": "gtopk", "gtopk_tree": "gtopk",
             "topk_rd": "topk", "topk_ring": "topk", "dense_ring": "dense",
             "dense_builtin": "dense"}
    for name, row in rows.items():
        if name in table:
            row["table1_paper_s"] = paper[table[name]]
            row["table1_calibrated_s"] = ours[table[name]]
        if name in predicted:
            row["model_s"], row["model_max_bytes_sent_per_rank"] = predicted[name]
    g = rows["gtopk"]["time_s"]
    ratios = {f"{d}_over_gtopk": rows[d]["time_s"] / g for d in ("dense_ring", "dense_builtin")
              if d in rows}
    ratios["topk_rd_over_gtopk"] = rows["topk_rd"]["time_s"] / g
    if "gtopk_unchecked" in rows:
        u = rows["gtopk_unchecked"]["time_s"]
        ratios.update({f"{d}_over_gtopk_unchecked": rows[d]["time_s"] / u
                       for d in ("dense_ring", "dense_builtin") if d in rows})
    if "gtopk_rd" in rows:
        ratios["gtopk_rd_over_gtopk"] = rows["gtopk_rd"]["time_s"] / g
    if "gtopk_tree" in rows:
        ratios.update({f"{d}_over_gtopk_tree": rows[d]["time_s"] / rows["gtopk_tree"]["time_s"]
                       for d in ("dense_ring", "dense_builtin", "topk_rd") if d in rows})
    if before and after:
        got["baseline_time_s"] = {"before": before, "after": after}
        ratios.update({f"{n}_baseline_over_this": (before[n] + after[n]) / 2 / rows[n]["time_s"]
                       for n in SPARSE_ROWS})
    return {**got, "ratios": ratios,
            "table1_paper_dense_over_gtopk": paper["dense"] / paper["gtopk"],
            "table1_calibrated_dense_over_gtopk": ours["dense"] / ours["gtopk"]}


def summary(res: dict) -> str:
    lines = []
    for p, d in res["by_world_size"].items():
        lines.append(f"P={p}, m={d['m']}, k={d['k']}:")
        lines.append(f"  {'method':28} {'measured':>10} {'Table I paper':>14} "
                     f"{'Table I calib':>14} {'model':>10}")
        for name, r in d["rows"].items():
            def ms(key: str, r: dict = r) -> str:
                return f"{1e3 * r[key]:.2f} ms" if key in r else "-"
            lines.append(f"  {name:28} {ms('time_s'):>10} {ms('table1_paper_s'):>14} "
                         f"{ms('table1_calibrated_s'):>14} {ms('model_s'):>10}")
        lines.append("  " + ", ".join(f"{k} {v:.1f}x" for k, v in d["ratios"].items())
                     + f" (Table I: paper {d['table1_paper_dense_over_gtopk']:.1f}x, "
                     f"calibrated {d['table1_calibrated_dense_over_gtopk']:.1f}x)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="4,8", help="comma list of world sizes")
    ap.add_argument("--m", type=float, default=25e6, help="gradient elements (fp32)")
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--loopback", action="store_true", help="no namespaces, no shaping (smoke)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--skip", default="", help="comma list of rows not to run")
    ap.add_argument("--baseline", metavar="REV",
                    help="also run the sparse rows with commit REV's code, just before and "
                         "just after this checkout's, on the same cluster size (A/B in one run)")
    ap.add_argument("--out", type=out_file, default=OUT)
    args = ap.parse_args()
    args.m = int(args.m)
    cal, source = calibration(args.bandwidth)
    with ExitStack() as stack:
        old_src = stack.enter_context(earlier_src(args.baseline)) if args.baseline else None
        by_size = {int(p): one(int(p), args, cal, old_src) for p in args.hosts.split(",")}
    result = {
        **provenance.stamp(provenance.script_command()),
        "network": "loopback, unshaped" if args.loopback else
                   f"emulated: network namespaces on one bridge, tc tbf {args.bandwidth}",
        "note": "all ranks share the machine's cores; the sparse rows start from entries "
                "selected beforehand (Table I's quantity); gtopk_end_to_end adds error "
                "feedback, the selection and the dense average",
        "paper": {"alpha_s": PAPER_ALPHA_S, "beta_s_per_element": PAPER_BETA_S_PER_ELEMENT},
        "calibration": {"alpha_s": cal.alpha, "beta_s_per_byte": cal.beta,
                        "gamma_s_per_byte": cal.gamma, "source": source},
        "target": "dense / gtopk >= 50 at P=8",
        "code": this_code(),
        "baseline": args.baseline and revision(args.baseline),
        "by_world_size": by_size,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    print(summary(result))


if __name__ == "__main__":
    main()
