"""The validation's runs: how many epochs and runs each configuration gets, the median run
kept from them, the codec table timed on one thread, :func:`run`, which calibrates each
cluster, trains every aggregation on it and predicts every row as it goes, and
:func:`write_report`, what ``benchmarks/perf_validation.py`` runs."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import statistics
from collections.abc import Iterator
from pathlib import Path

import torch
from rich.console import Console

from gradwire.bench import codec_probe, provenance
from gradwire.bench.validation.predict import guess, predict_all
from gradwire.bench.validation.summary import merge, plot, repredict, summarise
from gradwire.cluster import ephemeral_cluster
from gradwire.data import digits
from gradwire.jobs import run_ranks
from gradwire.perf import codecs
from gradwire.perf.model import Aggregation, buckets
from gradwire.profiles import Profile
from gradwire.profiles.measure import measure
from gradwire.train.job import TrainConfig, train_on, validate

# at least about 20 steady iterations each after the first epoch (digits: 1437 training samples)
EPOCHS = {2: 3, 4: 4, 8: 6}
STEADY_S = 5.0  # and at least this much steady training, as predicted before the runs
MAX_EPOCHS = 60
CPU_KEYS = ("cpu_s_per_iter", "cpu_main_s_per_iter", "cpu_hook_s_per_iter")
FAST_S = 0.25  # configurations guessed faster than this per iteration get --fast-repeats runs


@functools.cache
def _train_samples() -> int:
    return len(digits(0)[0].y)


def epochs_for(p: int, batch: int, predicted_s: float) -> int:
    """Epochs for one run at P = ``p``: the first (one-time costs, left out) and enough steady
    ones to last ``STEADY_S`` at the predicted iteration time, never fewer than ``EPOCHS``.
    Runs of the compressed methods took 1-2 s of steady training with ``EPOCHS`` alone, and
    their three runs differed by up to 76 %; a P = 4 signSGD probe on 1 Gbit/s (2026-11-26,
    four runs each way) differed by 12.1 % with 33 steady iterations and 8.7 % with 121."""
    per_epoch = max(_train_samples() // p // batch, 1)
    steady = math.ceil(STEADY_S / max(predicted_s, 1e-3) / per_epoch)
    return min(max(EPOCHS.get(p, 3), 1 + steady), MAX_EPOCHS)


def repeats_for(predicted_s: float, repeats: int, fast_repeats: int) -> int:
    """Training runs for one configuration: ``fast_repeats`` (never fewer than ``repeats``)
    where the iteration the model guesses before the runs is under ``FAST_S``, else
    ``repeats``. Those runs last 10-20 s each here, and their rows were the noisy ones: of
    one configuration's three runs, gTop-k at 100 Mbit/s, P = 8 took 75.3, 72.4 and 63.1 ms
    per iteration in the 15:16 run, where the 100 Mbit/s dense runs, 0.4-0.7 s an iteration,
    agreed within 1 %; the advisor's pick there missed the best measured by 5.2 %."""
    return max(repeats, fast_repeats) if predicted_s < FAST_S else repeats


def median_run(runs: list[dict]) -> dict:
    """One result from repeated training runs of one configuration: the run with the median
    iteration time (for an even count, the mean of the middle two) and its time breakdown; the
    CPU per rank (and its parts) the median over the runs, each its own: the run of median
    time need not have the median CPU, and the prediction takes a rank's CPU from the dense
    run's. Every run's iteration time and CPU kept."""
    size = runs[0]["world_size"] * runs[0]["batch_size_per_rank"]
    its = [size / r["samples_per_s"] for r in runs]
    order = sorted(range(len(runs)), key=its.__getitem__)
    mid = [runs[i] for i in order[(len(runs) - 1) // 2 : len(runs) // 2 + 1]]
    mean = statistics.fmean
    return {**mid[0], "samples_per_s": size / mean(size / r["samples_per_s"] for r in mid),
            "iteration_each_s": its,
            "seconds_per_iter": {k: mean(r["seconds_per_iter"][k] for r in mid)
                                 for k in mid[0]["seconds_per_iter"]},
            **{k: statistics.median(r[k] for r in runs) for k in CPU_KEYS},
            "cpu_each_s": [r["cpu_s_per_iter"] for r in runs],
            "iterations": sum(r["iterations"] for r in runs)}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread, as each rank runs (OMP_NUM_THREADS=1); then as it was."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def codec_table(numel: int, repeats: int, source: str) -> codecs.CodecTable:
    """Every method's encode and decode on ``numel`` elements, timed here on one thread."""
    with one_thread():
        methods = codec_probe.measure(numel, repeats=repeats)["methods"]
        return codecs.CodecTable("one thread", numel, methods, source)


def run(rates: list[str], workers: list[int], aggs: list[str], out: Path, console: Console,
        batch: int = 32, repeats: int = 3, cpu: str = "hooks", fast_repeats: int = 5,
        command: str | None = None) -> dict:
    """The whole validation: for each link rate and P, calibrate an emulated cluster (with
    every aggregation's hook CPU), train each aggregation on it ``repeats`` times (or
    ``fast_repeats``, :func:`repeats_for`), the rounds interleaved, measure the hooks' CPU
    again, and predict every row so far (:func:`~.predict.predict_all` with ``cpu``), the
    result written to ``out`` after each cluster; ``command`` is recorded with it."""
    prof = measure("mlp", batch_size=batch, iters=10, warmup=3)
    with one_thread():
        prof1 = measure("mlp", batch_size=batch, iters=20, warmup=5)
    table = codec_table(prof.numel, 7, "measured by perf_validation.py, one thread")
    doc = {**provenance.stamp(command),
           "model": "mlp", "batch_size": batch, "repeats": repeats,
           "fast_repeats": fast_repeats, "cpu_estimate": cpu,
           "profile_one_process": prof.to_json() | {"params": len(prof.params)},
           "profile_one_thread": prof1.to_json(), "rows": [],
           "codecs_one_thread": table.methods,
           "conditions": {"load_average_start": os.getloadavg()}, "calibration": {}}
    measured: dict[tuple[str, int], dict[str, dict]] = {}
    for rate in rates:
        for p in workers:
            runs: dict[str, list[dict]] = {agg: [] for agg in aggs}
            with ephemeral_cluster(p, rate, False) as c:
                cal = run_ranks(c, "gradwire.bench.calibrate", hook_args(prof, aggs),
                                f"calibrate P={p} {rate}", 600, console)
                doc["calibration"][f"{rate} P={p}"] = cal
                guessed = {agg: guess(prof, table, cal, rate, p, agg) for agg in aggs}
                epochs = {agg: epochs_for(p, batch, guessed[agg]) for agg in aggs}
                count = {agg: repeats_for(guessed[agg], repeats, fast_repeats) for agg in aggs}
                doc.setdefault("epochs", {})[f"{rate} P={p}"] = epochs
                doc.setdefault("runs_per_configuration", {})[f"{rate} P={p}"] = count
                for i in range(max(count.values())):
                    for agg in (a for a in aggs if i < count[a]):
                        cfg = TrainConfig(model="mlp", agg=agg, warmup=False,
                                          epochs=epochs[agg], batch_size=batch)
                        validate(cfg, p)
                        runs[agg].append(train_on(c, cfg, f"{agg} P={p} {rate} ({i + 1})",
                                                  1800, console))
                cal["hook_s_after"] = run_ranks(
                    c, "gradwire.bench.calibrate", [*hook_args(prof, aggs), "--hooks-only"],
                    f"hooks' CPU again P={p} {rate}", 600, console)["hook_s"]
            load = os.getloadavg()[0]
            measured[rate, p] = {agg: median_run(rs) | {"load_average": load}
                                 for agg, rs in runs.items()}
            # every row again: a rank's own CPU at this P now has this rate's dense run too
            doc["rows"] = predict_all(prof, table, doc["calibration"], measured, batch, cpu)
            out.write_text(json.dumps(summarise(doc), indent=1) + "\n")  # partial results kept
    return summarise(doc)


def hook_args(prof: Profile, aggs: list[str]) -> list[str]:
    """Calibrate's arguments for measuring each aggregation's hook CPU on the model's buckets
    (as DDP forms them with its default sizes)."""
    sizes = ",".join(str(n) for n, _ in buckets(prof, Aggregation("dense")))
    return ["--hook-buckets", sizes, "--hook-methods", ",".join(aggs)]


def write_report(out: Path, console: Console, *, rates: list[str], workers: list[int],
                 aggs: list[str], repeats: int = 3, fast_repeats: int = 5, cpu: str = "hooks",
                 merge_from: list[Path] | None = None, repredict_from: Path | None = None,
                 command: str | None = None) -> dict:
    """What ``benchmarks/perf_validation.py`` does: run the validation (:func:`run`), or,
    with ``merge_from``, join earlier results (:func:`~.summary.merge`), or, with
    ``repredict_from``, predict an earlier result again (:func:`~.summary.repredict`); then
    write it to ``out`` and its figure beside it, and print every row and the summary."""
    if merge_from:
        doc = merge([json.loads(f.read_text()) for f in merge_from])
    elif repredict_from:
        doc = repredict(json.loads(repredict_from.read_text()), cpu)
    else:
        doc = run(rates, workers, aggs, out, console, repeats=repeats, cpu=cpu,
                  fast_repeats=fast_repeats, command=command)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, out.with_suffix(".png"))
    s = doc["summary"]
    for r in doc["rows"]:
        console.print(f"{r['bandwidth']:>7} P={r['workers']} {r['agg']:>9}: measured "
                      f"{r['measured_s'] * 1e3:7.1f} ms, predicted {r['predicted_s'] * 1e3:7.1f} "
                      f"ms ({r['error']:+.1%})")
    console.print(f"median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}; "
                  f"advisor within 5 % of best in {s['advisor_within_5pct']} of "
                  f"{len(s['advisor'])}")
    return doc
