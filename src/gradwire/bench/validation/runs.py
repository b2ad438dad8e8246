"""The validation's runs: the arguments checked, the model's profile measured, and for each
(link rate, P) an emulated cluster calibrated, every configuration predicted, then trained
``repeats`` times (the rounds interleaved) and its median run kept."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.console import Console

from gradwire.bench import provenance
from gradwire.bench.calibrate import calibrate
from gradwire.bench.sharing import usable_cores
from gradwire.bench.validation.predict import predict_configuration, rows
from gradwire.catalogue import METHODS
from gradwire.check import comma_items, parse_int
from gradwire.cluster import ephemeral_cluster, netns_available
from gradwire.cluster.state import MAX_HOSTS
from gradwire.data import digits
from gradwire.errors import GradwireError, did_you_mean
from gradwire.perf.model import Prediction, parse_link
from gradwire.profiles import Profile
from gradwire.profiles.measure import measure
from gradwire.train.job import TrainConfig, train_on, validate

if TYPE_CHECKING:
    from gradwire.cluster import Cluster

MODEL = "mlp"  # the project's 1.13 M parameter MLP on the digits data
DENSITY, RANK = 0.001, 4  # the sparsifiers' kept fraction and PowerSGD's rank: train's defaults
# at least about 20 steady iterations each after the first epoch (digits: 1438 training samples)
EPOCHS = {2: 3, 4: 4, 8: 6}
STEADY_S = 5.0  # and at least this much steady training, at the iteration time predicted
MAX_EPOCHS = 60
FAST_S = 0.25  # configurations predicted faster than this per iteration get --fast-repeats runs
CALIBRATE_S, TRAIN_S = 600.0, 1800.0  # time limits of one calibration and one training run


@dataclass(frozen=True)
class Plan:
    """What one validation runs: ``rates`` × ``workers`` clusters, each method of ``aggs``
    trained ``repeats`` times (``fast_repeats``, where given, when predicted under
    ``FAST_S``)."""

    rates: list[str]
    workers: list[int]
    aggs: list[str]
    repeats: int = 3
    fast_repeats: int | None = None
    batch: int = 32

    def __post_init__(self) -> None:
        for option, items in (("--rates", self.rates), ("--workers", self.workers),
                              ("--aggs", self.aggs)):
            if not items:
                raise GradwireError(f"{option} needs at least one value")
            if len(set(items)) != len(items):
                raise GradwireError(f"{option} lists a value twice: {items}")
        links = []
        for rate in self.rates:
            try:
                links.append(parse_link(rate))
            except GradwireError as e:
                raise GradwireError(f"--rates: {e}") from None
        if len(set(links)) != len(links):  # 1gbit and 1000mbit are one cluster, run twice
            raise GradwireError(f"--rates lists one link rate twice: {self.rates}")
        for p in self.workers:
            if p < 2:
                raise GradwireError(f"--workers: each P must be >= 2 (calibrate needs two "
                                    f"ranks), got {p}")
            if p > MAX_HOSTS:  # refused here, not when its cluster is made after the others
                raise GradwireError(f"--workers: each P must be at most {MAX_HOSTS} (the hosts "
                                    f"an emulated cluster holds), got {p}")
        for agg in self.aggs:
            if agg not in METHODS:
                raise GradwireError(f"--aggs: unknown method {agg!r}"
                                    f"{did_you_mean(agg, METHODS)}: expected some of "
                                    f"{', '.join(METHODS)}")
        for option, n in (("--repeats", self.repeats), ("--fast-repeats", self.fast_repeats)):
            if n is not None and n < 1:
                raise GradwireError(f"{option} must be >= 1, got {n}")


def parse_plan(rates: str, workers: str, aggs: str, repeats: int = 3,
               fast_repeats: int | None = None) -> Plan:
    """A :class:`Plan` from the script's comma lists; one-line errors naming the option."""
    # ASCII digits only: int() would also read "1_6" as 16 and other scripts' digits
    read = [parse_int(p) for p in workers.split(",")]
    ps = [p for p in read if p is not None]
    if len(ps) != len(read):
        raise GradwireError(f"--workers {workers!r}: expected a comma list of whole numbers "
                            "(e.g. 2,4)")
    return Plan(comma_items(rates), ps, comma_items(aggs), repeats, fast_repeats)


@functools.cache
def _train_samples() -> int:
    return len(digits(0)[0].y)


def epochs_for(p: int, batch: int, predicted_s: float) -> int:
    """Epochs for one run at P = ``p``: the first (one-time costs, left out of the measured
    iteration) and enough steady ones to last ``STEADY_S`` at the predicted iteration time,
    never fewer than ``EPOCHS``. Shorter runs of the compressed methods (1-2 s of steady
    training) differed by up to 76 % between repeats."""
    per_epoch = max(_train_samples() // p // batch, 1)
    steady = math.ceil(STEADY_S / max(predicted_s, 1e-3) / per_epoch)
    return min(max(EPOCHS.get(p, 3), 1 + steady), MAX_EPOCHS)


def repeats_for(predicted_s: float, repeats: int, fast_repeats: int | None) -> int:
    """Training runs for one configuration: ``fast_repeats`` (never fewer than ``repeats``;
    None: ``repeats``) where the predicted iteration is under ``FAST_S``, else ``repeats``.
    Short runs are the noisy ones and cost little to repeat."""
    if fast_repeats is None or predicted_s >= FAST_S:
        return repeats
    return max(repeats, fast_repeats)


def median_run(runs: list[dict]) -> dict:
    """One measurement from repeated training runs of one configuration: the median run's
    seconds per iteration over its steady epochs (for an even count, the mean of the middle
    two) and its parts; the CPU per rank and its parts, each the median over the runs (the
    run of median time need not have the median CPU); every run's iteration and CPU kept."""
    size = runs[0]["world_size"] * runs[0]["batch_size_per_rank"]
    its = [size / r["samples_per_s"] for r in runs]
    order = sorted(range(len(runs)), key=its.__getitem__)
    middle = order[(len(runs) - 1) // 2 : len(runs) // 2 + 1]
    mid = [runs[i] for i in middle]
    mean = statistics.fmean
    return {"iteration_s": mean(its[i] for i in middle),
            "iteration_each_s": its,
            "parts_s": {k: mean(r["seconds_per_iter"][k] for r in mid)
                        for k in mid[0]["seconds_per_iter"]},
            "cpu_s_per_rank": statistics.median(r["cpu_s_per_iter"] for r in runs),
            "cpu_main_s_per_rank": statistics.median(r["cpu_main_s_per_iter"] for r in runs),
            "cpu_hook_s_per_rank": statistics.median(r["cpu_hook_s_per_iter"] for r in runs),
            "cpu_each_s_per_rank": [r["cpu_s_per_iter"] for r in runs],
            "payload_bytes_per_iter_per_rank": mid[0]["payload_bytes_per_iter_per_rank"],
            "iterations": sum(r["iterations"] for r in runs),
            "epochs": runs[0]["epochs"]}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread, as each rank runs (the launcher sets OMP_NUM_THREADS=1); then as
    it was."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def profile(batch: int) -> Profile:
    """The model's compute as ``OMP_NUM_THREADS=1 gradwire profile --model mlp`` measures it
    (one thread, as each rank computes), in this process, before any run."""
    with one_thread():
        return measure(MODEL, batch_size=batch, iters=30, warmup=5)


def _calibrate(cluster: Cluster, profile_file: Path, out: Path, label: str,
               console: Console) -> dict:
    """``gradwire calibrate`` on the open ``cluster``: its rank side (codecs timed on the
    model's profile, at the training's density and rank) and the cluster's label, link rate
    and token bucket; the calibration file's JSON."""
    args = ["--model", str(profile_file), "--density", repr(DENSITY), "--rank", str(RANK),
            "--device", "cpu"]
    cal, _ = calibrate(lambda: contextlib.nullcontext(cluster), out, args,
                       f"gradwire calibrate {' '.join(args)} ({label})", CALIBRATE_S, console)
    return cal.to_json()


def run(plan: Plan, console: Console, command: str | None = None,
        on_cluster: Callable[[dict], None] | None = None) -> dict:
    """The whole validation (:mod:`gradwire.bench.validation` describes the result); after
    each cluster, ``on_cluster`` is given the result so far (to keep it, should a later
    cluster fail)."""
    ok, why = netns_available()
    if not ok:
        raise GradwireError(f"the validation trains on emulated clusters: {why}")
    prof = profile(plan.batch)
    doc = {**provenance.stamp(command), "model": MODEL,
           "batch_size": plan.batch, "density": DENSITY, "rank": RANK, "aggs": plan.aggs,
           "repeats": plan.repeats, "fast_repeats": plan.fast_repeats,
           # the cores the ranks may run on (they inherit this process's affinity), as
           # gradwire bench counts them: the summary's contended configurations are P > cores
           "cores": usable_cores(), "profile_threads": 1, "profile": prof.to_json(),
           "clusters": [], "rows": [],
           "conditions": {"load_average_start": os.getloadavg()}}
    with tempfile.TemporaryDirectory(prefix="gradwire-validation-") as tmp:
        profile_file = Path(tmp, f"{MODEL}.json")
        profile_file.write_text(prof.to_text())
        for rate in plan.rates:
            for p in plan.workers:
                entry, measured, preds = one_cluster(plan, rate, p, doc["profile"],
                                                     profile_file, console)
                doc["clusters"].append(entry)
                doc["rows"] += rows(rate, p, preds, measured)
                if on_cluster is not None:
                    on_cluster(doc)
    doc["conditions"]["load_average_end"] = os.getloadavg()
    return doc


def one_cluster(plan: Plan, rate: str, p: int, prof: dict, profile_file: Path,
                console: Console) -> tuple[dict, dict[str, dict], dict[str, Prediction]]:
    """On an emulated cluster of ``p`` hosts with links of ``rate``: calibrate, predict every
    method (the profile ``prof``, also in ``profile_file`` for calibrate's ranks), then train
    each. Returns the cluster's record (calibration, epochs, runs, wall times), each method's
    median run and its prediction."""
    label = f"P={p} {rate}"
    with ephemeral_cluster(p, rate, False) as c:
        t0 = time.monotonic()
        cal = _calibrate(c, profile_file, profile_file.with_name("calibration.json"), label,
                         console)
        calibrate_s = time.monotonic() - t0
        preds = predict_configuration(prof, cal, rate, p, plan.aggs, DENSITY, RANK)
        guess = {a: float(preds[a].iteration) for a in plan.aggs}
        epochs = {a: epochs_for(p, plan.batch, guess[a]) for a in plan.aggs}
        count = {a: repeats_for(guess[a], plan.repeats, plan.fast_repeats) for a in plan.aggs}
        runs: dict[str, list[dict]] = {a: [] for a in plan.aggs}
        wall: dict[str, list[float]] = {a: [] for a in plan.aggs}
        for i in range(max(count.values())):  # interleaved: every method once, then again
            for agg in (a for a in plan.aggs if i < count[a]):
                cfg = TrainConfig(model=MODEL, agg=agg, density=DENSITY, warmup=False,
                                  epochs=epochs[agg], batch_size=plan.batch)
                validate(cfg, p)
                t0 = time.monotonic()
                runs[agg].append(train_on(c, cfg, f"{agg} {label} ({i + 1})", TRAIN_S,
                                          console))
                wall[agg].append(time.monotonic() - t0)
    load = os.getloadavg()[0]
    measured = {a: median_run(rs) | {"load_average": load} for a, rs in runs.items()}
    entry = {"bandwidth": rate, "workers": p, "calibration": cal, "epochs": epochs,
             "runs": count, "calibrate_wall_s": calibrate_s, "run_wall_s": wall}
    return entry, measured, preds
