"""Performance model against measured training on the emulated cluster.

For each link rate and P, one emulated cluster first runs ``gradwire calibrate``'s rank side
(α per step of a P-element allreduce with every rank taking part, β by streaming, γ, and the
CPU a rank spends per step and per byte, how many ranks share how many cores, the share of
them the ranks keep busy, what each collective call waits for ranks not yet scheduled and
how much slower memory-bound CPU work runs beside the other ranks),
then ``gradwire train`` (the project's 1.13 M parameter MLP, batch 32 per rank, no density
warm-up, DDP's default buckets) ``--repeats`` times per aggregation, or ``--fast-repeats``
times where the model guesses an iteration under ``FAST_S`` (short runs: more of them cost
little), the rounds interleaved (every aggregation once, then again), and the median run kept
(one run in three that the machine slowed, as it does here by up to 40 %, no longer moves the
row; two in five with ``--fast-repeats``); the model predicts the same configuration:

- compute: forward + backward as the *other aggregations' runs at the same P and rate*
  report it (the median of theirs; ``others_compute``), split into forward and per-tensor
  backward as ``gradwire profile`` measures them in one process; the optimizer step the same
  way. No row is predicted from its own compute (until 2026-11-26 15:30 every row took the
  dense run's, whose backward runs beside its long transfers);
- network: that cluster's α per step, β and γ; every bucket pays the call-header exchange;
  each link's token bucket (the cluster's ``tc tbf``, point 7 of ``gradwire.perf.model``):
  a bucket's data calls start with what the link earned idle before them;
- stragglers (point 6): the time the dense run's ranks waited at the header exchanges beyond
  what the model charges for them, per iteration, added to every aggregation's;
- encode/decode: a codec table measured here before the runs, one thread (as each rank runs),
  through the hook's own path on the model's number of elements (``codecs.measure``);
- shared CPU (point 5 of ``gradwire.perf.model``): P ranks on this machine's cores. Before
  the runs, calibrate measures on the cluster the CPU per iteration of every aggregation's
  hook (its own path: error feedback, encode, the call header, the collectives, decode) on
  the model's buckets, all ranks at once, the methods in turn (``hook_s``; ``--hook-*`` of
  ``gradwire.bench.calibrate``); after the runs it measures them again (``--hooks-only``,
  kept as ``hook_s_after``), and a row takes the mean of the two, since the machine's speed
  drifts while the runs go on (in the run of 2026-11-26 16:03 it slowed by 15 % after the
  calibrations, and the compressed rows at 1 Gbit/s, P = 2 came out 10-17 % fast).
  ``--cpu hooks`` (the default since 2026-11-26 15:30) takes
  that as each row's coding and collective CPU, and a rank's CPU besides them as its
  training thread's, the median over the other aggregations' runs at this P on both rates
  (``thread_cpu``: no row is predicted from its own measurement). ``--cpu dense`` (the
  default before) takes a rank's CPU besides coding and communication from each dense run
  at this P (one per link rate): its measured CPU per rank (the median of its runs) less the
  model's coding and communication CPU for it on its own cluster, the mean over the rates
  (``own_cpu``); every aggregation adds its own coding and communication. Re-pricing the
  runs of 13:01 and 13:49 with the model of 15:30 gave a max of 15.3 % and 15.2 % with
  hooks, 21.7 % and 22.6 % with dense (docs/benchmarks.md).
  The same probes' wall time per iteration (the mean of the two) floors each row (point 8
  of ``gradwire.perf.model``): forward + the hooks' wall + step;
  Each row also keeps the parts of its measured CPU on the training thread and on the hook's
  (``measured_main_cpu_s_per_rank``, ``measured_hook_cpu_s_per_rank``; the rest is gloo's
  threads; ``benchmarks/cpu_split.py`` has why);
- overlap slowdown κ = 1 (not fitted).

So the other aggregations' runs supply compute and the training thread's CPU, the dense run
the ranks' spread and calibrate each hook's CPU; no row is predicted from its own
measurement. Measured iteration = P·batch / samples per
second over the steady epochs (the first epoch, which pays one-time costs, is left out); each
run has enough epochs for at least ``STEADY_S`` of steady training at the iteration time the
model guesses before the runs (``epochs_for``; the result keeps them under "epochs"). The
advisor's pick at each (rate, P) is the scheme with the lowest prediction among those
measured.

    flock /tmp/gradwire-bench.lock python benchmarks/perf_validation.py   # about 65 minutes
    python benchmarks/perf_validation.py --rates 1gbit --workers 2 --aggs dense,fp16 --out v.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import shlex
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from gradwire.bandwidth import parse_bandwidth
from gradwire.bench import provenance
from gradwire.cluster import ephemeral_cluster
from gradwire.cluster.netns import tbf_burst
from gradwire.data import digits
from gradwire.jobs import run_ranks
from gradwire.perf import codecs
from gradwire.perf.measure import measure
from gradwire.perf.model import Aggregation, Cluster, buckets, predict
from gradwire.perf.profiles import Profile
from gradwire.perf.whatif import CpuSetting
from gradwire.train.job import TrainConfig, train_on, validate

HERE = Path(__file__).parent
# at least about 20 steady iterations each after the first epoch (digits: 1437 training samples)
EPOCHS = {2: 3, 4: 4, 8: 6}
STEADY_S = 5.0  # and at least this much steady training, as predicted before the runs
MAX_EPOCHS = 60
CPU_KEYS = ("cpu_s_per_iter", "cpu_main_s_per_iter", "cpu_hook_s_per_iter")
FAST_S = 0.25  # configurations guessed faster than this per iteration get --fast-repeats runs
CPU_ESTIMATES = ("dense", "hooks")  # how a row's CPU per rank is estimated: predict_all


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
        return codecs.CodecTable("one thread", numel,
                                 codecs.measure(numel, repeats=repeats)["methods"], source)


def run(rates: list[str], workers: list[int], aggs: list[str], out: Path, console: Console,
        batch: int = 32, repeats: int = 3, cpu: str = "hooks", fast_repeats: int = 5) -> dict:
    prof = measure("mlp", batch_size=batch, iters=10, warmup=3)
    with one_thread():
        prof1 = measure("mlp", batch_size=batch, iters=20, warmup=5)
    table = codec_table(prof.numel, 7, "measured by perf_validation.py, one thread")
    doc = {**provenance.stamp("python benchmarks/perf_validation.py " + shlex.join(sys.argv[1:])),
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


def hook_cpu(cal: dict, agg: str, what: str = "cpu_s") -> float | None:
    """The CPU per iteration ``agg``'s hook spent on the cluster of calibration ``cal``
    (``what="wall_s"``: its wall time), where calibrate measured it: before the runs
    (``hook_s``), or the mean of that and the same probe after them (``hook_s_after``, runs
    since 2026-11-27)."""
    got = [c.get(agg, {}).get(what) for c in (cal.get("hook_s", {}),
                                              cal.get("hook_s_after", {}))]
    got = [v for v in got if v is not None]
    return statistics.fmean(got) if got else None


def cluster_of(cal: dict, rate: str, p: int) -> Cluster:
    """The model's cluster for one calibration ``cal`` of ``p`` hosts on ``rate`` links."""
    bps = parse_bandwidth(rate)
    return Cluster(p, bps, cal["alpha_step_s"], cal["gamma_s_per_byte"],
                   beta=cal["beta_s_per_byte"], check_calls=True, burst=float(tbf_burst(bps)),
                   **CpuSetting.from_calibration(cal, p).fields(p))


def guess(prof: Profile, table: codecs.CodecTable, cal: dict, rate: str, p: int,
          agg: str) -> float:
    """The iteration time predicted before any run (the one-process profile's compute, no
    framework CPU): only to size the runs."""
    return float(predict(prof, cluster_of(cal, rate, p), Aggregation(agg), table).iteration)


def with_compute_of(prof: Profile, ref: dict, source: str = "dense run's compute") -> Profile:
    """``prof`` with the forward, backward and optimizer step that the run ``ref`` measured,
    its forward/backward split and per-tensor backward as ``prof``'s."""
    compute = ref["seconds_per_iter"]["compute"]
    share = prof.forward_s / (prof.forward_s + prof.backward_s)
    here = prof.with_compute(compute * share, compute * (1 - share), source)
    return dataclasses.replace(here, step_s=ref["seconds_per_iter"]["step"])


def others_compute(prof: Profile, measured: dict[str, dict], agg: str) -> Profile:
    """``prof`` with the compute (forward + backward) and optimizer step of ``agg``'s rows at
    one (rate, P): the medians over the other aggregations' runs there (each configuration's
    median run), so that no row is predicted from its own measurement. Not the dense run's
    alone: its backward runs beside its long transfers and came out 1.5 times the others' at
    100 Mbit/s (P = 2: 9.6 ms against 6.3-7.7 in the 13:49 run), and every compressed row
    there was predicted that much too slow."""
    others = [m["seconds_per_iter"] for a, m in measured.items() if a != agg] or [
        measured[agg]["seconds_per_iter"]]
    ref = {"seconds_per_iter": {k: statistics.median(o[k] for o in others)
                                for k in ("compute", "step")}}
    return with_compute_of(prof, ref, "the other aggregations' runs")


def own_cpu(prof: Profile, table: codecs.CodecTable, refs: list[tuple[str, dict, dict]],
            p: int) -> float:
    """A rank's CPU per iteration besides coding and collectives, from the dense runs at P =
    ``p`` (``refs``: one (rate, calibration, median run) per link rate): each run's CPU per
    rank less what the model charges it for coding and collectives on its own cluster, the
    mean over the rates. What a rank does besides communicating does not depend on the link,
    while the CPU a dense run spends moving its megabytes does, and varies from run to run
    (at 100 Mbit/s, P = 2: 15.8, 18.4 and 18.6 ms per iteration in three validation runs of
    one library): one more independent measurement of the same thing halves its variance."""
    own = []
    for rate, cal, ref in refs:
        base = predict(with_compute_of(prof, ref), cluster_of(cal, rate, p),
                       Aggregation(ref["agg"]), table, rank_cpu=0.0)
        own.append(ref["cpu_s_per_iter"] - base.cpu)
    return statistics.fmean(own)


def reference(measured: dict[str, dict]) -> dict:
    """The run of one (rate, P) that supplies compute: dense's, or the first measured."""
    return measured.get("dense") or next(iter(measured.values()))


def thread_cpu(measured: dict[tuple[str, int], dict[str, dict]], p: int,
               agg: str) -> float | None:
    """A rank's CPU per iteration besides coding and collectives for ``agg``'s rows at P =
    ``p``: its training thread's (forward, backward, DDP's bucket copies, the optimizer step,
    the data), the median over the other aggregations' runs at this P on every rate measured
    (each configuration's median run, ``cpu_main_s_per_iter``), so that no row's prediction
    holds its own measurement. The training thread does the same work whatever the method
    (5.3-7.9 ms per iteration in every row of the 10:29 and 11:22 runs), while a dense run's
    whole CPU, from which :func:`own_cpu` takes it, moved by 5 ms between its three runs
    (1 Gbit/s, P = 8, 13:02 run). None where a run lacks the thread's CPU (runs before
    2026-11-26 07:00)."""
    mains = [m[a].get("cpu_main_s_per_iter") for (_, q), m in measured.items() if q == p
             for a in m if a != agg]
    if not mains or None in mains:
        return None
    return statistics.median(mains)


def predict_rows(prof: Profile, table: codecs.CodecTable, cal: dict, rate: str, p: int,
                 measured: dict[str, dict], batch: int,
                 cpu: dict[str, tuple[float, float | None, float | None]]) -> list[dict]:
    """The model's prediction beside each aggregation's measured result at one (rate, P), from
    the dense run's compute and straggling, the cluster's calibration ``cal``, the codec table
    and, per aggregation, ``cpu``: (a rank's own CPU, :func:`own_cpu` or :func:`thread_cpu`;
    its hook's CPU measured on the cluster, :func:`hook_cpu`, or None for the model's coding
    and collective CPU; its hook's wall time there, the floor of point 8, or None)."""
    ref = reference(measured)
    cluster = cluster_of(cal, rate, p)
    # the time the dense run's ranks waited at the header exchanges beyond what the model
    # charges them: the slowest rank's lead (point 6 of gradwire.perf.model)
    base = predict(with_compute_of(prof, ref), cluster, Aggregation(ref["agg"]), table,
                   rank_cpu=0.0)
    straggle = max(ref["seconds_per_iter"]["header"] - float(base.header), 0.0)
    cluster = dataclasses.replace(cluster, straggle=straggle)
    rows = []
    for agg, res in measured.items():
        own, hook, wall = cpu[agg]
        pred = predict(others_compute(prof, measured, agg), cluster, Aggregation(agg), table,
                       rank_cpu=own, hook_cpu=hook, hook_wall=wall)
        meas = p * batch / res["samples_per_s"]
        rows.append({
            "bandwidth": rate, "workers": p, "agg": agg, "measured_s": meas,
            "measured_each_s": res["iteration_each_s"],
            "predicted_s": float(pred.iteration), "error": float(pred.iteration) / meas - 1,
            "measured_parts_s": res["seconds_per_iter"],
            "measured_cpu_s_per_rank": res["cpu_s_per_iter"],
            "measured_cpu_each_s_per_rank": res.get("cpu_each_s"),
            "measured_main_cpu_s_per_rank": res.get("cpu_main_s_per_iter"),
            "measured_hook_cpu_s_per_rank": res.get("cpu_hook_s_per_iter"),
            "predicted_parts_s": {"forward": pred.forward, "backward": pred.backward,
                                  "step": pred.step, "coding": pred.coding,
                                  "communicate": float(pred.communicate),
                                  "exposed": float(pred.exposed),
                                  "cpu_per_rank": pred.cpu,
                                  "cpu_communicate": pred.cpu_comm,
                                  "cpu_bound": pred.cpu_bound,
                                  "header": float(pred.header), "straggle": straggle,
                                  "floor": pred.floor},
            "iterations": res["iterations"], "load_average": res["load_average"]})
    return rows


def predict_all(prof: Profile, table: codecs.CodecTable, calibration: dict[str, dict],
                measured: dict[tuple[str, int], dict[str, dict]], batch: int,
                cpu: str = "hooks") -> list[dict]:
    """Every (rate, P)'s rows (:func:`predict_rows`). ``cpu``: how a row's CPU per rank is
    estimated (``CPU_ESTIMATES``). "dense": a rank's own CPU at each P is :func:`own_cpu`
    from the dense runs on every rate measured at that P (or, with none, that
    configuration's own reference), and each row adds the model's coding and collective CPU.
    "hooks": where calibrate measured every aggregation's hook CPU on every cluster at a P
    (``hook_s``, since 2026-11-26 13:00) and the runs report their training thread's CPU, a
    row's own CPU is its P's training thread (:func:`thread_cpu`) and it adds its hook's
    measured CPU, and the hook's measured wall time floors it (point 8 of
    :mod:`gradwire.perf.model`); elsewhere as "dense", with no floor."""
    if cpu not in CPU_ESTIMATES:
        raise SystemExit(f"--cpu must be one of {', '.join(CPU_ESTIMATES)}, got {cpu!r}")
    per_p: dict[int, tuple[dict[str, float], bool]] = {}
    rows = []
    for (rate, p), group in measured.items():
        if p not in per_p:
            per_p[p] = _own_cpus(prof, table, calibration, measured, rate, p, cpu)
        own, hooks = per_p[p]
        cal = calibration[f"{rate} P={p}"]
        # each hook's probe on this cluster: its CPU and its wall (the floor)
        probes = {agg: (hook_cpu(cal, agg), hook_cpu(cal, agg, "wall_s")) if hooks
                  else (None, None) for agg in group}
        rows += predict_rows(prof, table, cal, rate, p, group, batch,
                             {agg: (own[agg], *probes[agg]) for agg in group})
    return rows


def _own_cpus(prof: Profile, table: codecs.CodecTable, calibration: dict[str, dict],
              measured: dict[tuple[str, int], dict[str, dict]], rate: str, p: int,
              cpu: str) -> tuple[dict[str, float], bool]:
    """(a rank's own CPU per aggregation at P = ``p``, whether its rows take their hooks'
    measured CPU), as :func:`predict_all` describes; ``rate``: the first rate measured at it."""
    aggs = {agg: None for (_, q), m in measured.items() if q == p for agg in m}  # in order
    if cpu == "hooks":
        cals = [calibration[f"{r} P={q}"] for (r, q) in measured if q == p]
        threads = {agg: thread_cpu(measured, p, agg) for agg in aggs}
        if all(hook_cpu(c, agg) is not None for c in cals for agg in aggs) and all(
                v is not None for v in threads.values()):
            return threads, True  # type: ignore[return-value]
    refs = [(r, calibration[f"{r} P={q}"], m["dense"])
            for (r, q), m in measured.items() if q == p and "dense" in m]
    one = own_cpu(prof, table, refs or [(rate, calibration[f"{rate} P={p}"],
                                         reference(measured[rate, p]))], p)
    return dict.fromkeys(aggs, one), False


def recorded_inputs(doc: dict) -> tuple[Profile, codecs.CodecTable]:
    """The profile (its recorded times on the model's tensors as built here) and the codec
    table one run's result ``doc`` recorded."""
    rec = doc["profile_one_process"]
    built = measure(doc["model"], batch_size=doc["batch_size"], iters=1, warmup=0)
    prof = dataclasses.replace(built, forward_s=rec["forward_s"], backward_s=rec["backward_s"],
                               step_s=rec["step_s"],
                               backward_layer_s=tuple(rec["backward_layer_s"]))
    return prof, codecs.CodecTable("one thread", prof.numel, doc["codecs_one_thread"],
                                   "recorded")


def recorded_measurements(doc: dict) -> dict[tuple[str, int], dict[str, dict]]:
    """``doc``'s measured results by (rate, P) and aggregation, as :func:`run` keeps them."""
    measured: dict[tuple[str, int], dict[str, dict]] = {}
    for r in doc["rows"]:
        key = (r["bandwidth"], r["workers"])
        measured.setdefault(key, {})[r["agg"]] = {
            "agg": r["agg"], "samples_per_s": key[1] * doc["batch_size"] / r["measured_s"],
            "seconds_per_iter": r["measured_parts_s"],
            "cpu_s_per_iter": r["measured_cpu_s_per_rank"],
            "cpu_main_s_per_iter": r.get("measured_main_cpu_s_per_rank"),
            "cpu_hook_s_per_iter": r.get("measured_hook_cpu_s_per_rank"),
            "cpu_each_s": r.get("measured_cpu_each_s_per_rank"),
            "iteration_each_s": r["measured_each_s"], "iterations": r["iterations"],
            "load_average": r["load_average"]}
    return measured


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--workers", default="2,4,8")
    ap.add_argument("--aggs", default="dense,fp16,topk,gtopk,powersgd,signsgd")
    ap.add_argument("--repeats", type=int, default=3,
                    help="training runs per configuration, interleaved; the median run is kept")
    ap.add_argument("--fast-repeats", type=int, default=5,
                    help=f"training runs for configurations the model guesses under "
                         f"{FAST_S * 1e3:.0f} ms per iteration (at least --repeats)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "perf_validation.json")
    ap.add_argument("--repredict", type=Path, metavar="JSON",
                    help="run nothing: predict this earlier run's measurements again with the "
                         "model as it is now, into --out and its plot")
    ap.add_argument("--cpu", choices=CPU_ESTIMATES, default="hooks",
                    help="a row's CPU per rank: 'hooks' (the training thread's CPU from the "
                         "other methods' runs, plus the method's hook CPU that calibrate "
                         "measured on the cluster; the default) or 'dense' (a rank's own CPU "
                         "from the dense runs less the model's charge, plus the model's coding "
                         "and collective CPU)")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                    help="run nothing: join these results of earlier runs (say, one per rate, "
                         "each inside a time limit) into --out and its plot")
    a = ap.parse_args()
    if a.repeats < 1 or a.fast_repeats < 1:
        raise SystemExit(f"--repeats and --fast-repeats must be >= 1, got {a.repeats} and "
                         f"{a.fast_repeats}")
    console = Console()
    if a.merge:
        doc = merge([json.loads(f.read_text()) for f in a.merge])
    elif a.repredict:
        doc = repredict(json.loads(a.repredict.read_text()), a.cpu)
    else:
        doc = run(a.rates.split(","), [int(p) for p in a.workers.split(",")],
                  a.aggs.split(","), a.out, console, repeats=a.repeats, cpu=a.cpu,
                  fast_repeats=a.fast_repeats)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, a.out.with_suffix(".png"))
    s = doc["summary"]
    for r in doc["rows"]:
        console.print(f"{r['bandwidth']:>7} P={r['workers']} {r['agg']:>9}: measured "
                      f"{r['measured_s'] * 1e3:7.1f} ms, predicted {r['predicted_s'] * 1e3:7.1f} "
                      f"ms ({r['error']:+.1%})")
    console.print(f"median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}; "
                  f"advisor within 5 % of best in {s['advisor_within_5pct']} of "
                  f"{len(s['advisor'])}")


if __name__ == "__main__":
    main()
