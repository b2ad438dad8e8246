"""A validation predicts; it does not refit. For each predicted quantity of the validations
(benchmarks/perf_validation.py's iteration times and advisor, benchmarks/sim_validation.py's
simulated iteration times), the measurement it is compared with cannot reach it: measured
times set to absurd values leave every prediction as it was, and the calibration a prediction
takes is measured before any run it is compared with. No cluster is started: the emulated
runs and calibrations are stand-ins."""
import contextlib
import copy
import importlib.util
import inspect
import itertools
from pathlib import Path

import pytest
from rich.console import Console
from test_perf_validation_script import AGGS, CALIBRATION, PROFILE

from gradwire.bench import validation as pv
from gradwire.bench.validation import runs as pv_runs
from gradwire.sim import emulate
from gradwire.sim.trace import synthetic

ABSURD = (1e-9, 1e4)  # measured seconds no prediction could be near


def calibration(p: int) -> dict:
    return CALIBRATION | {"world": p, "nodes": p,
                          "cpu": CALIBRATION["cpu"] | {"cpu_ranks_per_machine": p}}


def iterations(preds: dict) -> dict[str, float]:
    return {a: float(x.iteration) for a, x in preds.items()}


# ---- perf_validation: the iteration time of every (rate, P, method)


def test_predict_configuration_takes_no_measurement():
    names = list(inspect.signature(pv.predict_configuration).parameters)
    assert names == ["profile", "calibration", "rate", "workers", "aggs", "density", "rank"]


def fake_run(iteration_s: float, epochs: int) -> dict:
    """A training run's record as gradwire train returns it, its iteration ``iteration_s``."""
    return {"world_size": 2, "batch_size_per_rank": 32, "samples_per_s": 64 / iteration_s,
            "seconds_per_iter": {"compute": iteration_s, "coding": iteration_s / 2},
            "cpu_s_per_iter": iteration_s, "cpu_main_s_per_iter": iteration_s,
            "cpu_hook_s_per_iter": iteration_s, "payload_bytes_per_iter_per_rank": 10**9,
            "iterations": 7, "epochs": epochs}


def one_cluster(monkeypatch, tmp_path, measured_s: float) -> tuple[list[str], dict, dict, dict]:
    """benchmarks/perf_validation.py's cluster (calibrate, predict, train) with stand-ins for
    the cluster, calibrate and train, every run measuring ``measured_s``: (what ran, in order;
    the cluster record; the median runs; the predictions)."""
    events: list[str] = []
    cal = calibration(2)
    monkeypatch.setattr(pv_runs, "ephemeral_cluster",
                        lambda *a, **k: contextlib.nullcontext("cluster"))

    def calibrate(*a, **k):
        events.append("calibrate")
        return copy.deepcopy(cal)

    def predict(*a, **k):
        events.append("predict")
        return pv.predict_configuration(*a, **k)

    def train(c, cfg, *a, **k):
        events.append(f"train {cfg.agg}")
        return fake_run(measured_s, cfg.epochs)

    monkeypatch.setattr(pv_runs, "_calibrate", calibrate)
    monkeypatch.setattr(pv_runs, "predict_configuration", predict)
    monkeypatch.setattr(pv_runs, "train_on", train)
    monkeypatch.setattr(pv_runs, "validate", lambda *a, **k: None)
    plan = pv.Plan(["1gbit"], [2], AGGS, repeats=2)
    entry, measured, preds = pv_runs.one_cluster(plan, "1gbit", 2, PROFILE,
                                                 tmp_path / "toy.json", Console(quiet=True))
    return events, entry, measured, preds


def test_a_cluster_is_calibrated_and_predicted_before_any_training_run(monkeypatch, tmp_path):
    events, entry, _, preds = one_cluster(monkeypatch, tmp_path, 0.01)
    assert events[:2] == ["calibrate", "predict"]  # the calibration holds no training run
    assert events.count("calibrate") == events.count("predict") == 1
    assert all(e.startswith("train ") for e in events[2:]) and len(events) == 2 + 2 * len(AGGS)
    # the prediction is the calibration's and the profile's alone
    want = pv.predict_configuration(PROFILE, entry["calibration"], "1gbit", 2, AGGS,
                                    pv_runs.DENSITY, pv_runs.RANK)
    assert iterations(preds) == iterations(want)


@pytest.mark.parametrize("measured_s", ABSURD)
def test_training_times_do_not_reach_a_clusters_predictions(monkeypatch, tmp_path, measured_s):
    _, entry, measured, preds = one_cluster(monkeypatch, tmp_path, measured_s)
    _, _, _, normal = one_cluster(monkeypatch, tmp_path, 0.01)
    assert iterations(preds) == iterations(normal)
    rows = pv.rows("1gbit", 2, preds, measured)
    for r in rows:
        assert r["measured_s"] == pytest.approx(measured_s)
        assert r["predicted_s"] == float(normal[r["agg"]].iteration)
        assert r["predicted_parts_s"] == pv.predict.parts(normal[r["agg"]])


def result() -> dict:
    """A validation result at 1 Gbit/s, P = 2 and 4, each row measured 10-60 ms."""
    clusters, rows = [], []
    for p in (2, 4):
        cal = calibration(p)
        clusters.append({"bandwidth": "1gbit", "workers": p, "calibration": cal,
                         "epochs": dict.fromkeys(AGGS, 3), "runs": dict.fromkeys(AGGS, 3),
                         "calibrate_wall_s": 60.0, "run_wall_s": {a: [10.0] for a in AGGS}})
        preds = pv.predict_configuration(PROFILE, cal, "1gbit", p, AGGS, 0.001, 4)
        rows += pv.rows("1gbit", p, preds, {
            a: pv.median_run([fake_run(0.01 * (i + 1), 3)]) | {"load_average": 1.0}
            for i, a in enumerate(AGGS)})
    return {"command": "test", "model": "toy", "batch_size": 32, "density": 0.001, "rank": 4,
            "aggs": AGGS, "cores": 2, "profile": PROFILE, "clusters": clusters, "rows": rows}


def absurd(x: object, value: float) -> object:
    """Every number in ``x`` replaced with ``value``."""
    if isinstance(x, dict):
        return {k: absurd(v, value) for k, v in x.items()}
    if isinstance(x, list):
        return [absurd(v, value) for v in x]
    return value if isinstance(x, int | float) and not isinstance(x, bool) else x


@pytest.mark.parametrize("value", ABSURD)
def test_repredict_reads_nothing_measured_nor_the_old_predictions(value):
    doc = result()
    before = pv.repredict(doc)
    changed = copy.deepcopy(doc)
    for r in changed["rows"]:  # every measured number, the old prediction and its error
        r["measured"] = absurd(r["measured"], value)
        for k in ("measured_s", "predicted_s", "error"):
            r[k] = value
        r["predicted_parts_s"] = absurd(r["predicted_parts_s"], value)
    for c in changed["clusters"]:  # what the runs took and how many there were
        for k in ("epochs", "runs", "calibrate_wall_s", "run_wall_s"):
            c[k] = absurd(c[k], value)
    after = pv.repredict(changed)
    assert [r["predicted_s"] for r in after] == [r["predicted_s"] for r in before]
    assert [r["predicted_parts_s"] for r in after] == [r["predicted_parts_s"] for r in before]
    # and each is its cluster's calibration's and the profile's alone
    for c in doc["clusters"]:
        want = iterations(pv.predict_configuration(PROFILE, c["calibration"], "1gbit",
                                                   c["workers"], AGGS, 0.001, 4))
        assert {r["agg"]: r["predicted_s"] for r in after if r["workers"] == c["workers"]
                } == want
    assert all(r["measured_s"] == value for r in after)


# ---- perf_validation: the advisor's pick and its score


def advisor_rows() -> list[dict]:
    """Two configurations, every method measured and predicted in each."""
    out = []
    for p, rate in ((2, "1gbit"), (4, "100mbit")):
        for i, a in enumerate(AGGS):
            predicted = 0.01 * (1 + (i * 7 + p) % len(AGGS))
            measured = 0.02 * (1 + (i * 5 + p) % len(AGGS))
            out.append({"bandwidth": rate, "workers": p, "agg": a, "measured_s": measured,
                        "predicted_s": predicted, "error": predicted / measured - 1})
    return out


def test_the_advisors_pick_uses_only_predictions():
    rows = advisor_rows()
    picks = [p["advised"] for p in pv.summarise({"rows": rows, "cores": 2})["picks"]]
    by_config = {k: [r for r in rows if (r["bandwidth"], r["workers"]) == k]
                 for k in dict.fromkeys((r["bandwidth"], r["workers"]) for r in rows)}
    # every order of the measured times within each configuration: the same picks
    first, second = by_config.values()
    for order in itertools.islice(itertools.permutations(range(len(AGGS))), 0, None, 37):
        shuffled = copy.deepcopy(rows)
        for group in (shuffled[:len(AGGS)], shuffled[len(AGGS):]):
            times = [g["measured_s"] for g in group]
            for g, j in zip(group, order, strict=True):
                g["measured_s"] = times[j]
        s = pv.summarise({"rows": shuffled, "cores": 2})
        assert [p["advised"] for p in s["picks"]] == picks
    assert picks == [min(g, key=lambda r: r["predicted_s"])["agg"] for g in (first, second)]


def test_the_advisor_and_the_always_dense_and_topk_baselines_are_scored_on_the_same_rows():
    rows = advisor_rows()
    s = pv.summarise({"rows": rows, "cores": 2})
    groups = [[r for r in rows if r["workers"] == p] for p in (2, 4)]
    fastest = [min(r["measured_s"] for r in g) for g in groups]

    def ratios(pick) -> list[float]:
        return [pick(g)["measured_s"] / f for g, f in zip(groups, fastest, strict=True)]

    for method in ("dense", "topk"):
        got = ratios(lambda g, m=method: next(r for r in g if r["agg"] == m))
        assert s["baselines"][method]["mean_ratio"] == pytest.approx(sum(got) / len(got))
    mine = ratios(lambda g: min(g, key=lambda r: r["predicted_s"]))
    assert s["advisor"]["mean_ratio"] == pytest.approx(sum(mine) / len(mine))
    assert [p["ratio"] for p in s["picks"]] == pytest.approx(mine)
    assert s["better_than_baselines"] == all(
        s["advisor"]["mean_ratio"] < b["mean_ratio"] for b in s["baselines"].values())


# ---- sim_validation: the simulated iteration time of every (trace, P, mechanism)

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "sim_validation.py"
SIM_CAL = {"alpha_s": 3e-4, "alpha_call_s": 6e-4, "alpha_transport_s": 4e-4,
           "alpha_stream_s": 2e-4, "beta_s_per_byte": 8.4e-9, "gamma_s_per_byte": 1e-10,
           "world": 2}


def load_script():
    spec = importlib.util.spec_from_file_location("sim_validation_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def toy_trace():
    return synthetic("toy", [262148, 4096, 1028, 524288], forward_s=0.01, backward_s=0.02)


def stand_ins(monkeypatch, events: list[str], measured_s: float, run_alpha_s: float,
              mod=None) -> None:
    """No cluster, no calibrate and no recording: a toy trace, a fixed calibration, and
    emulated runs that measure ``measured_s`` per iteration and ``run_alpha_s`` as their α."""
    def calibrate(*a, **k):
        events.append("calibrate")
        return dict(SIM_CAL)

    def run(trace_path, c, mechanisms, *a, **k):
        events.append("run")
        return [{"mechanism": m.label, "ends": [measured_s * i for i in range(c.iterations)],
                 "iteration_s": measured_s, "alpha_s": run_alpha_s,
                 "link_bytes": {"worker up": 1.0}} for m in mechanisms]

    monkeypatch.setattr(emulate, "calibrate", calibrate)
    monkeypatch.setattr(emulate, "run", run)
    if mod is not None:
        monkeypatch.setattr(mod, "record", lambda *a, **k: toy_trace())


def sim_main(monkeypatch, tmp_path, measured_s: float, run_alpha_s: float) -> tuple[list, dict]:
    import json

    mod = load_script()
    events: list[str] = []
    stand_ins(monkeypatch, events, measured_s, run_alpha_s, mod)
    out = tmp_path / f"v{measured_s}-{run_alpha_s}.json"
    assert mod.main(["--traces", "resnet20", "--workers", "4", "--iterations", "3",
                     "--out", str(out)]) == 0
    return events, json.loads(out.read_text())


def test_sim_validation_simulates_from_the_calibration_not_the_runs_own_alpha(
        monkeypatch, tmp_path):
    """The script simulated each mechanism with the α its own emulated run measured (its own
    schedule, on the cluster it is compared with, in the same run): a refit."""
    _, low = sim_main(monkeypatch, tmp_path, 0.05, 1e-6)
    events, high = sim_main(monkeypatch, tmp_path, 40.0, 0.5)
    assert [r["simulated_s"] for r in high["rows"]] == [r["simulated_s"] for r in low["rows"]]
    assert [r["measured_s"] for r in high["rows"]] == [40.0] * len(high["rows"])
    assert [r["run_alpha_s"] for r in high["rows"]] == [0.5] * len(high["rows"])
    assert events.index("calibrate") < events.index("run")  # every calibration before any run
    assert "calibrate" not in events[events.index("run"):]
    alphas = {r["mechanism"]: r["alpha_s"] for r in high["rows"]}
    assert alphas == {"ps": 2e-4, "ring": 4e-4, "butterfly": 4e-4}


@pytest.mark.parametrize("measured_s,run_alpha_s", [(1e-6, 1e-9), (1e3, 10.0)])
def test_a_simulation_is_the_calibrations_whatever_the_run_measures(
        monkeypatch, tmp_path, measured_s, run_alpha_s):
    from dataclasses import replace

    from gradwire.sim import mechanisms as mech
    from gradwire.sim.cluster import SimCluster
    from gradwire.sim.trace import save

    stand_ins(monkeypatch, [], measured_s, run_alpha_s)
    path = save(toy_trace(), tmp_path / "toy.trace.jsonl")
    mechanisms = mech.parse_list("ps,ring,butterfly")
    rows, used = emulate.validate(path, 4, 1, "1gbit", mechanisms, Console(quiet=True), 3)
    c = SimCluster(4, 8 / SIM_CAL["beta_s_per_byte"], 1, latency=0.0,
                   gamma=SIM_CAL["gamma_s_per_byte"], iterations=3, seed=0,
                   send_buffer=used["send_buffer"])
    for r, m in zip(rows, mechanisms, strict=True):
        want = m.run(toy_trace(), replace(c, alpha=emulate.calibrated_alpha(m, SIM_CAL)), False)
        assert r["simulated_s"] == want.iteration_s
        assert r["measured_s"] == measured_s and r["run_alpha_s"] == run_alpha_s
        assert r["error"] == pytest.approx(want.iteration_s / measured_s - 1)
    # and the calibration does move it: it is an input
    slow = {**SIM_CAL, "alpha_transport_s": 4e-2, "alpha_stream_s": 2e-2}
    monkeypatch.setattr(emulate, "calibrate", lambda *a, **k: slow)
    again, _ = emulate.validate(path, 4, 1, "1gbit", mechanisms, Console(quiet=True), 3)
    assert all(s["simulated_s"] > r["simulated_s"] for s, r in zip(again, rows, strict=True))


def test_a_parameter_server_needs_the_calibrations_stream_alpha(tmp_path):
    from gradwire.errors import GradwireError
    from gradwire.sim import mechanisms as mech

    ps, ring = mech.parse_list("ps,ring")
    assert emulate.calibrated_alpha(ring, {"alpha_s": 1e-3}) == 1e-3
    with pytest.raises(GradwireError, match="no 'alpha_stream_s'"):
        emulate.calibrated_alpha(ps, {"alpha_s": 1e-3})
