"""Where a training rank's CPU goes, against what the performance model charges for it.

For each link rate and P, one emulated cluster runs ``gradwire calibrate``'s rank side, then
``gradwire train`` of the project's MLP (batch 32 per rank, DDP's default buckets) once per
aggregation. Each run reports its CPU per rank and iteration (``cpu_s_per_iter``, every
thread), the training thread's part of it (``cpu_main_s_per_iter``: forward, backward, the
optimizer step) and the hook thread's (``cpu_hook_s_per_iter``: coding, its collectives' own
work); the rest is gloo's threads. Beside the hook's and gloo's together: what
:func:`gradwire.perf.model.predict` charges for coding and collectives (``Prediction.cpu``
with ``rank_cpu`` = 0) from that calibration and a codec table measured here, and the gap
per collective call (headers included).

Why: the validation (``perf_validation.py``) takes a rank's own CPU from the dense run, its
CPU less what the model charges it for coding and collectives. That estimate carries the
model's error on the dense run's collectives to every other method.

    flock /tmp/gradwire-bench.lock python benchmarks/cpu_split.py     # about 6 minutes
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

from rich.console import Console

from gradwire.bench import provenance
from gradwire.cluster import ephemeral_cluster
from gradwire.jobs import run_ranks
from gradwire.perf.model import Aggregation, predict
from gradwire.profiles.measure import measure
from gradwire.train.job import TrainConfig, train_on, validate

sys.path.insert(0, str(Path(__file__).parent))
from perf_validation import cluster_of, codec_table  # noqa: E402 - the validation's own

HERE = Path(__file__).parent
SLOW = ("dense", "fp16")  # wire-bound on slow links: fewer epochs
EPOCHS = {2: 12, 4: 20, 8: 30}  # about 4 s of steady training for the compressed methods


def run(rates: list[str], workers: list[int], aggs: list[str], console: Console) -> dict:
    prof = measure("mlp", batch_size=32, iters=10, warmup=3)
    table = codec_table(prof.numel, 5, "measured here")
    doc = {**provenance.stamp("python benchmarks/cpu_split.py " + shlex.join(sys.argv[1:])),
           "model": "mlp", "batch_size": 32, "codecs_one_thread": table.methods,
           "calibration": {}, "rows": []}
    for rate in rates:
        for p in workers:
            with ephemeral_cluster(p, rate, False) as c:
                cal = run_ranks(c, "gradwire.bench.calibrate", [], f"calibrate P={p} {rate}",
                                600, console)
                doc["calibration"][f"{rate} P={p}"] = cal
                cluster = cluster_of(cal, rate, p)
                for agg in aggs:
                    epochs = 3 if agg in SLOW else EPOCHS.get(p, 12)
                    cfg = TrainConfig(model="mlp", agg=agg, warmup=False, epochs=epochs,
                                      batch_size=32)
                    validate(cfg, p)
                    r = train_on(c, cfg, f"{agg} P={p} {rate}", 1800, console)
                    charged = predict(prof, cluster, Aggregation(agg), table, rank_cpu=0.0)
                    rest = r["cpu_s_per_iter"] - r["cpu_main_s_per_iter"]
                    hook = r["cpu_hook_s_per_iter"]
                    doc["rows"].append({
                        "bandwidth": rate, "workers": p, "agg": agg, "epochs": epochs,
                        "iteration_s": p * 32 / r["samples_per_s"],
                        "cpu_s": r["cpu_s_per_iter"], "main_cpu_s": r["cpu_main_s_per_iter"],
                        "rest_cpu_s": rest, "hook_cpu_s": hook, "gloo_cpu_s": rest - hook,
                        "model_rest_cpu_s": charged.cpu,
                        "model_coding_s": charged.coding, "model_comm_cpu_s": charged.cpu_comm,
                        "calls": charged.calls,
                        "gap_per_call_s": (rest - charged.cpu) / max(charged.calls, 1)})
    gaps = [r["gap_per_call_s"] for r in doc["rows"] if r["agg"] not in SLOW]
    mains = [r["main_cpu_s"] for r in doc["rows"]]
    doc["summary"] = {"main_cpu_s_range": [min(mains), max(mains)],
                      "compressed_gap_per_call_s_median": statistics.median(gaps)}
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--aggs", default="dense,fp16,topk,gtopk,powersgd,signsgd")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "cpu_split.json")
    a = ap.parse_args()
    console = Console()
    doc = run(a.rates.split(","), [int(p) for p in a.workers.split(",")], a.aggs.split(","),
              console)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in doc["rows"]:
        console.print(f"{r['bandwidth']:>7} P={r['workers']} {r['agg']:>9}: CPU "
                      f"{r['cpu_s'] * 1e3:5.1f} ms = training thread {r['main_cpu_s'] * 1e3:4.1f}"
                      f" + hook {r['hook_cpu_s'] * 1e3:4.1f} + gloo {r['gloo_cpu_s'] * 1e3:4.1f};"
                      f" model charges "
                      f"{r['model_rest_cpu_s'] * 1e3:4.1f} for {r['calls']} calls "
                      f"({r['gap_per_call_s'] * 1e3:+.2f} ms per call)")


if __name__ == "__main__":
    main()
