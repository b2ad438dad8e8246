"""Collectives benchmark on the emulated 1 Gbit/s cluster (issue: collectives written once).

Parts (all by default, in this order; each is `gradwire calibrate` / `gradwire bench` run as a
user would, with a private GRADWIRE_HOME so the model uses the calibration of this run):
1. calibrate  α, β, γ on 2 hosts.
2. ring       allreduce 64 MiB at P=4 and P=8: ring (its default sub-chunking, and fixed
              pipeline=1 and 4 for comparison) vs torch.distributed's all_reduce in the same
              run, taking turns (``bench --interleave``), median of 7 calls each; target:
              default ring busbw ≥ 0.97× built-in.
3. lp         broadcast 64 MiB at P=8, the algorithms taking turns: LP vs binomial (target
              ≥ 1.8×) and LP vs n/bandwidth
              (target within 10 %); then again on links of 9000-byte MTU (jumbo frames,
              calibrated apart), where frame headers take 0.7 % of the rate instead of 4.4 %.
4. crossover  allreduce 1 KiB…64 MiB at P=8: the size where the bandwidth-optimal ring starts to
              beat the latency-optimal recursive doubling, measured (the algorithms taking
              turns, 4 calls back to back per timed run) and predicted.
5. model      every registered algorithm of every collective, P=4, 1…64 MiB: predicted vs
              measured time (targets: median error ≤ 5 %, max ≤ 15 %) and a plot; median of
              11 timed runs of 4 calls back to back at 1 and 4 MiB, of 3 single calls at 16
              and 64 MiB.

Every timed run of `gradwire bench` starts at a barrier and makes one untimed lead-in call
first, so its timed calls find the links as calls back to back leave them (--batch).

    python benchmarks/collectives.py                 # ~20 min; writes benchmarks/results/
                                                     # collectives/latest.json and .png
    python benchmarks/collectives.py --parts ring    # one part (others kept from the last run)

Needs root (network namespaces). Run it on an otherwise idle machine: 8 ranks share 2 cores.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gradwire.bench import calibrate, provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file, save_figure
from gradwire.schedules import registry
from gradwire.schedules.cost import CostParams, back_to_back

HERE = Path(__file__).parent
OUT = HERE / "results" / "collectives" / "latest.json"  # the plot beside it (.png)
BW = "1gbit"
MiB = 2**20


def gradwire(home: str, *args: str) -> None:
    cmd = [sys.executable, "-m", "gradwire.cli", *args]
    print("$ gradwire " + shlex.join(args), flush=True)
    p = subprocess.run(cmd, env={**os.environ, "GRADWIRE_HOME": home})
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): gradwire {shlex.join(args)}")


def bench(home: str, collective: str, algos: str, sizes: str, hosts: int, iters: int,
          mtu: int = 1500, interleave: bool = False, batch: int = 1) -> dict:
    out = Path(home) / f"{collective}-{hosts}-{len(os.listdir(home))}.json"
    gradwire(home, "bench", "--collective", collective, "--algo", algos, "--sizes", sizes,
             "--hosts", str(hosts), "--bandwidth", BW, "--iters", str(iters),
             "--batch", str(batch), "--json", str(out), "--mtu", str(mtu),
             *(["--interleave"] if interleave else []))
    return json.loads(out.read_text())


def row(res: dict, algo: str, size: int) -> dict:
    return next(r for r in res["rows"] if r["algo"] == algo and r["bytes"] == size)


def part_calibrate(home: str) -> dict:
    gradwire(home, "calibrate", "--hosts", "2", "--bandwidth", BW)
    return json.loads((Path(home) / "calibration" / f"{BW}.json").read_text())


RING_ITERS = 7


def part_ring(home: str) -> dict:
    out: dict = {"by_world_size": {}}
    for p in (4, 8):
        # In turns (the built-in call, then each ring, round after round): the ratio is
        # taken between calls that met the same machine.
        res = bench(home, "allreduce", "ring,ring:pipeline=1,ring:pipeline=4", "64M", p,
                    RING_ITERS, interleave=True)
        base = row(res, "builtin", 64 * MiB)["busbw_Gbitps"]
        rings = {r["algo"]: r["busbw_Gbitps"] for r in res["rows"] if r["algo"] != "builtin"}
        out["by_world_size"][p] = {"builtin_busbw_Gbitps": base, "ring_busbw_Gbitps": rings,
                         "ratio_to_builtin": {a: b / base for a, b in rings.items()},
                         "target": ">= 0.97", "bench": res}
    return out


JUMBO = 9000


def part_lp(home: str, cal: dict) -> dict:
    out = lp_broadcast(home, cal, 1500)
    gradwire(home, "calibrate", "--hosts", "2", "--bandwidth", BW, "--mtu", str(JUMBO),
             "--model", "resnet20", "--device", "cpu")
    jumbo = json.loads((Path(home) / "calibration" / f"{BW}-mtu{JUMBO}.json").read_text())
    return {**out, f"mtu{JUMBO}": {**lp_broadcast(home, jumbo, JUMBO), "calibration": jumbo}}


def lp_broadcast(home: str, cal: dict, mtu: int) -> dict:
    # taking turns, as the ring part: the ratio is of calls made under the same conditions
    res = bench(home, "broadcast", "lp,binomial,scatter_ag", "64M", 8, 5, mtu, interleave=True)
    lp, binomial = row(res, "lp", 64 * MiB), row(res, "binomial", 64 * MiB)
    nominal = 64 * MiB * 8 / 1e9  # n over the 1 Gbit/s the links are shaped to
    link = 64 * MiB * cal["beta_s_per_byte"]  # n over the TCP payload rate calibrate measured
    return {"lp_s": lp["time_s"], "binomial_s": binomial["time_s"],
            "speedup_over_binomial": binomial["time_s"] / lp["time_s"], "target_speedup": ">= 1.8",
            "n_over_bandwidth_s": nominal, "lp_over_ideal": lp["time_s"] / nominal,
            "n_over_measured_link_rate_s": link, "lp_over_link_rate": lp["time_s"] / link,
            "target_over_ideal": "<= 1.10", "bench": res}


def crossing(sizes: list[int], a: list[float], b: list[float]) -> float | None:
    """The size where b stops being slower than a (log-interpolated), None if never."""
    for i in range(1, len(sizes)):
        d0, d1 = math.log(b[i - 1] / a[i - 1]), math.log(b[i] / a[i])
        if d0 > 0 >= d1:
            f = d0 / (d0 - d1)
            return math.exp(math.log(sizes[i - 1]) + f * math.log(sizes[i] / sizes[i - 1]))
    return None


def predicted_crossover(params: CostParams, p: int, small: str, large: str) -> float | None:
    grid = [int(2 ** (e / 8)) // 4 * 4 for e in range(8 * 10, 8 * 27)]
    # priced as bench's model column prices them: calls back to back (each with its header,
    # the same for both, left out)
    t = {name: [back_to_back([(registry.schedule("allreduce", name, p, n // 4), 4)], params)
                for n in grid] for name in (small, large)}
    return crossing(grid, t[small], t[large])


def part_crossover(home: str, cal: dict) -> dict:
    p = 8
    # in turns, like the ring part: which algorithm wins at a size is a comparison
    res = bench(home, "allreduce", "rd,tree,rhd,ring", "1K:64M:4", p, 5, interleave=True,
                batch=CROSSOVER_BATCH)
    sizes = sorted({r["bytes"] for r in res["rows"]})
    times = {a: [row(res, a, s)["time_s"] for s in sizes] for a in ("rd", "ring")}
    params = calibrate.cost_params(cal)
    return {"world_size": p, "latency_optimal": "rd", "bandwidth_optimal": "ring",
            "measured_crossover_bytes": crossing(sizes, times["rd"], times["ring"]),
            "predicted_crossover_bytes": predicted_crossover(params, p, "rd", "ring"),
            "bench": res}


# Calls of 1 and 4 MiB vary most from one to the next (a ring allreduce of 1 MiB took 15.8 to
# 23.1 ms within one run of three), and cost least: they get more timed runs, each of 4 calls
# back to back after the lead-in call (gradwire bench --batch): (timed runs, calls each).
MODEL_ITERS = {"1M,4M": (11, 4), "16M,64M": (3, 1)}
CROSSOVER_BATCH = 4


def part_model(home: str) -> dict:
    benches = [bench(home, c, ",".join(a.name for a in registry.algorithms(c)), sizes, 4, iters,
                     batch=batch)
               for c in ("allreduce", "broadcast", "reduce", "allgather", "reducescatter")
               for sizes, (iters, batch) in MODEL_ITERS.items()]
    pts = [{"collective": r["collective"], "algo": r["algo"], "bytes": r["bytes"],
            "measured_s": r["time_s"], "predicted_s": r["predicted_s"],
            "error": r["prediction_error"]}
           for b in benches for r in b["rows"] if r["algo"] != "builtin" and r["bytes"] >= MiB]
    errs = [abs(x["error"]) for x in pts]
    return {"world_size": 4, "points": pts, "median_abs_error": statistics.median(errs),
            "max_abs_error": max(errs), "targets": {"median": "<= 0.05", "max": "<= 0.15"},
            "worst": max(pts, key=lambda x: abs(x["error"])), "benches": benches}


def plot(model: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 5))
    colls = sorted({x["collective"] for x in model["points"]})
    for i, c in enumerate(colls):
        pts = [x for x in model["points"] if x["collective"] == c]
        ax.scatter([x["measured_s"] for x in pts], [x["predicted_s"] for x in pts], s=18,
                   label=c, color=f"C{i}", zorder=3)
        bx.scatter([x["bytes"] for x in pts], [100 * x["error"] for x in pts], s=18,
                   color=f"C{i}", label=c, zorder=3)
    lo = min(x["measured_s"] for x in model["points"]) / 1.5
    hi = max(x["measured_s"] for x in model["points"]) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="0.9",
                    label="±15 %", zorder=0)
    ax.set(xscale="log", yscale="log", xlabel="measured time (s)", ylabel="predicted time (s)",
           title=f"α-β-γ model vs measured, P={model['world_size']}, 1 Gbit/s emulated")
    ax.legend(fontsize=8)
    bx.axhspan(-5, 5, color="0.9", label="±5 %", zorder=0)
    bx.axhline(0, color="k", lw=0.8)
    bx.set(xscale="log", xlabel="message size (bytes)", ylabel="prediction error (%)",
           title=f"median |error| {100 * model['median_abs_error']:.1f} %, "
                 f"max {100 * model['max_abs_error']:.1f} %")
    bx.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def command() -> str:
    return provenance.script_command()


PARTS = ("calibrate", "ring", "lp", "crossover", "model")
# The parts whose figures come from the calibration: lp (n over the calibrated link rate),
# crossover (its predicted size) and model (every prediction).
CALIBRATED = ("lp", "crossover", "model")
WORLD_SIZES = (2, 4, 8)  # calibrate: 2 hosts; ring: 4 and 8; lp, crossover: 8; model: 4


def note(cores: int) -> str:
    """What the cluster is, and which of its world sizes have more ranks than cores."""
    return ("emulated cluster: network namespaces on one bridge, tc tbf 1gbit both ways; up to "
            f"8 ranks on this machine's {cores} cores"
            + provenance.contention(WORLD_SIZES, cores))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="calibrate,ring,lp,crossover,model",
                    help="comma list of calibrate, ring, lp, crossover, model")
    ap.add_argument("--out", type=out_file, default=OUT,
                    help="result file; parts not run are kept from it (the plot goes beside it "
                         "as .png when the model part is there)")
    a = ap.parse_args()
    parts = a.parts.split(",")
    if not parts or not set(parts) <= set(PARTS):
        # a misspelt part would run nothing and still restamp the file with this command
        ap.error(f"--parts: expected a comma list of {', '.join(PARTS)}, got {a.parts!r}")
    out = a.out
    result = json.loads(out.read_text()) if out.exists() else {}
    stale = [q for q in CALIBRATED if q in result and q not in parts]
    if "calibrate" in parts and stale:
        # they would stay beside a calibration they were not predicted from
        ap.error(f"--parts: a new calibration would leave {', '.join(stale)} of {out} "
                 "predicted from the one it replaces: run them with it (--parts calibrate,"
                 f"{','.join(stale)})")
    home = tempfile.mkdtemp(prefix="gradwire-bench-")
    if "calibrate" in parts or "calibration" not in result:
        result["calibration"] = part_calibrate(home)
    else:  # reuse the committed calibration so predictions stay comparable
        (Path(home) / "calibration").mkdir()
        (Path(home) / "calibration" / f"{BW}.json").write_text(
            json.dumps(result["calibration"]))
    cal = result["calibration"]
    steps = {"ring": lambda: part_ring(home), "lp": lambda: part_lp(home, cal),
             "crossover": lambda: part_crossover(home, cal), "model": lambda: part_model(home)}
    for name in parts:
        if name in steps:
            load = os.getloadavg()
            result[name] = steps[name]()
            # parts are rerun alone: each keeps when, how, where, on which code and under what
            # load (the file's own machine is the last run's, not every part's)
            result[name].update(date=provenance.now(), command=command(),
                                commit=provenance.commit(), machine=provenance.machine(),
                                load_average_before=load)
    result["command"] = command()
    result["machine"] = provenance.machine()
    result["note"] = note(os.cpu_count() or 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    if "model" in result:
        plot(result["model"], out.with_suffix(".png"))
    print(summary(result))
    print(f"wrote {out}")


def summary(r: dict) -> str:
    lines = []
    if "ring" in r:
        for p, d in r["ring"]["by_world_size"].items():
            best = max(d["ratio_to_builtin"].items(), key=lambda kv: kv[1])
            lines.append(f"ring P={p}: builtin {d['builtin_busbw_Gbitps']:.3f} Gbit/s; "
                         + ", ".join(f"{k} {v:.3f}x" for k, v in d["ratio_to_builtin"].items())
                         + f" (best {best[0]}; target: ring >= 0.97x)")
    if "lp" in r:
        d = r["lp"]
        for label, x in (("", d), (f" (MTU {JUMBO})", d.get(f"mtu{JUMBO}"))):
            if x:
                lines.append(f"lp broadcast P=8 64MiB{label}: "
                             f"{x['speedup_over_binomial']:.2f}x binomial, "
                             f"{x['lp_over_ideal']:.3f}x n/(1 Gbit/s), "
                             f"{x['lp_over_link_rate']:.3f}x n/(measured link rate)")
    if "crossover" in r:
        d = r["crossover"]
        lines.append(f"crossover rd->ring P=8: measured {d['measured_crossover_bytes']}, "
                     f"predicted {d['predicted_crossover_bytes']}")
    if "model" in r:
        d = r["model"]
        lines.append(f"model P=4, >=1MiB: median |err| {d['median_abs_error']:.3f}, max "
                     f"{d['max_abs_error']:.3f} ({d['worst']['collective']}/"
                     f"{d['worst']['algo']} {d['worst']['bytes']})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
