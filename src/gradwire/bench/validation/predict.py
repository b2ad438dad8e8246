"""The model's prediction beside each measured row of the validation, from what the runs and
the calibrations measured: every input from other runs or from calibrate, never the row's own
measurement (docs/performance-model.md)."""

from __future__ import annotations

import dataclasses
import statistics

from gradwire.bandwidth import parse_bandwidth
from gradwire.cluster.netns import tbf_burst
from gradwire.perf import codecs
from gradwire.perf.model import Aggregation, ClusterModel, predict
from gradwire.perf.whatif import CpuSetting
from gradwire.profiles import Profile
from gradwire.profiles.measure import measure

CPU_ESTIMATES = ("dense", "hooks")  # how a row's CPU per rank is estimated: predict_all


def hook_cpu(cal: dict, agg: str, what: str = "cpu_s") -> float | None:
    """The CPU per iteration ``agg``'s hook spent on the cluster of calibration ``cal``
    (``what="wall_s"``: its wall time), where calibrate measured it: before the runs
    (``hook_s``), or the mean of that and the same probe after them (``hook_s_after``, runs
    since 2026-11-27)."""
    got = [c.get(agg, {}).get(what) for c in (cal.get("hook_s", {}),
                                              cal.get("hook_s_after", {}))]
    got = [v for v in got if v is not None]
    return statistics.fmean(got) if got else None


def cluster_of(cal: dict, rate: str, p: int) -> ClusterModel:
    """The model's cluster for one calibration ``cal`` of ``p`` hosts on ``rate`` links."""
    bps = parse_bandwidth(rate)
    return ClusterModel(p, bps, cal["alpha_step_s"], cal["gamma_s_per_byte"],
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
