"""The validation's report: a result re-predicted with the model as it is now, the summary
(errors, the advisor's picks), results of several runs merged, and the figure."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import numpy as np

from gradwire.bench import provenance
from gradwire.bench.validation.predict import (
    predict_all,
    recorded_inputs,
    recorded_measurements,
)


def repredict(doc: dict, cpu: str = "hooks") -> dict:
    """``doc``'s measurements with the predictions of the model as it is now, from the inputs
    the run recorded (its profile's times, codec table and calibrations); the parameter
    tensors come from the model as built here. Each row keeps its run's load average."""
    if "runs" in doc:
        raise SystemExit("--repredict takes one run's result, not a merged one")
    prof, table = recorded_inputs(doc)
    measured = recorded_measurements(doc)
    rows = predict_all(prof, table, doc["calibration"], measured, doc["batch_size"], cpu)
    load_end = doc["summary"]["load_average_end"]
    out = summarise({**doc, "rows": rows,
                     "cpu_estimate": cpu,
                     "repredicted": {"date": provenance.now(), "commit": provenance.commit()}})
    out["summary"]["load_average_end"] = load_end
    return out


def summarise(doc: dict) -> dict:
    rows = doc["rows"]
    if not rows:
        return doc
    errs = [abs(r["error"]) for r in rows]
    picks = []
    for key in dict.fromkeys((r["bandwidth"], r["workers"]) for r in rows):
        group = [r for r in rows if (r["bandwidth"], r["workers"]) == key]
        pick = min(group, key=lambda r: r["predicted_s"])
        best = min(group, key=lambda r: r["measured_s"])
        picks.append({"bandwidth": key[0], "workers": key[1], "advised": pick["agg"],
                      "best_measured": best["agg"],
                      "advised_vs_best": pick["measured_s"] / best["measured_s"] - 1})
    doc["summary"] = {"configs": len(rows), "median_abs_error": statistics.median(errs),
                      "max_abs_error": max(errs), "advisor": picks,
                      "advisor_within_5pct": sum(x["advised_vs_best"] <= 0.05 for x in picks),
                      "load_average_end": os.getloadavg()}
    return doc


def merge(docs: list[dict]) -> dict:
    """One report from runs of the same script on one machine: their rows and calibrations
    joined; each run's command, date and conditions kept under "runs" (every row was predicted
    with its own run's profile and codec table, which the first run's stand for at the top)."""
    keys = [(r["bandwidth"], r["workers"], r["agg"]) for d in docs for r in d["rows"]]
    if len(set(keys)) != len(keys):
        raise SystemExit("--merge: the runs overlap (a rate, P and aggregation twice)")
    if len({d["machine"] for d in docs}) != 1:
        raise SystemExit("--merge: the runs come from different machines")
    doc = {k: v for k, v in docs[0].items() if k != "summary"}
    doc["runs"] = [{"command": d["command"], "date": d["date"],
                    "conditions": d["conditions"] | {"load_average_end":
                                                     d["summary"]["load_average_end"]},
                    "profile_one_process": d["profile_one_process"],
                    "profile_one_thread": d["profile_one_thread"],
                    "codecs_one_thread": d["codecs_one_thread"]} for d in docs]
    doc["rows"] = [r for d in docs for r in d["rows"]]
    doc["calibration"] = {k: v for d in docs for k, v in d["calibration"].items()}
    doc["epochs"] = {k: v for d in docs for k, v in d.get("epochs", {}).items()}
    doc["command"] = "; ".join(d["command"] for d in docs)
    doc = summarise(doc)
    del doc["summary"]["load_average_end"]  # this machine's, not the runs' (kept under "runs")
    return doc


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    aggs = list(dict.fromkeys(r["agg"] for r in doc["rows"]))
    for i, agg in enumerate(aggs):
        for rate, marker in zip(dict.fromkeys(r["bandwidth"] for r in doc["rows"]), "os^",
                                strict=False):
            pts = [(r["measured_s"] * 1e3, r["predicted_s"] * 1e3) for r in doc["rows"]
                   if r["agg"] == agg and r["bandwidth"] == rate]
            if pts:
                ax.scatter(*zip(*pts, strict=True), color=f"C{i}", marker=marker,
                           label=f"{agg}, {rate}", zorder=3)
    lim = [min(min(r["measured_s"], r["predicted_s"]) for r in doc["rows"]) * 1e3 * 0.8,
           max(max(r["measured_s"], r["predicted_s"]) for r in doc["rows"]) * 1e3 * 1.2]
    xs = np.geomspace(*lim, 50)
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * 0.85, xs * 1.15, color="0.9", label="±15 %", zorder=1)
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="measured iteration (ms)",
           ylabel="predicted iteration (ms)")
    ticks = [t for t in (10, 20, 50, 100, 200, 500, 1000, 2000) if lim[0] <= t <= lim[1]]
    for axis in (ax.xaxis, ax.yaxis):  # plain labels, none on the minor ticks (they collide)
        axis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        axis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    s = doc["summary"]
    ax.set_title(f"mlp, P = 2/4/8: median |error| {s['median_abs_error']:.1%}, "
                 f"max {s['max_abs_error']:.1%}", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

