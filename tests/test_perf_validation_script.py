"""benchmarks/perf_validation.py (gradwire.bench.validation) on fabricated inputs, no cluster:
a row is predicted from its cluster's calibration and the model's profile alone, as advise
predicts it; errors are summarised per contention group; the advisor is scored beside naive
baselines; bad arguments are one line. The script itself runs for about half an hour."""
import copy
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import calibration_doc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.bench import validation as pv
from gradwire.cluster.shaping import tbf_burst
from gradwire.data import digits
from gradwire.perf import advise, scenario

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "perf_validation.py"
TRAIN = len(digits(0)[0].y)
AGGS = ["dense", "fp16", "topk", "gtopk", "powersgd", "signsgd"]

# A profile file's JSON: a 2-tensor model of 101 000 parameters, 6 ms of compute.
PROFILE = {
    "format": 1, "model": "toy", "description": "a test's", "batch_size": 32,
    "dtype": "float32", "forward_s": 2e-3, "backward_s": 4e-3, "step_s": 1e-3, "sources": {},
    "backward_layer_s": [1e-3, 3e-3],
    "params": [["fc.bias", 1000, [1000]], ["fc.weight", 100_000, [1000, 100]]]}
# A calibration file's JSON (gradwire.perf.calibration): 2 emulated hosts on 2 cores.
CALIBRATION = calibration_doc.doc(codecs=calibration_doc.codecs(AGGS, 101_000, 2e-4, 5e-5))


def measured(iteration_s: float) -> dict:
    """A median run's record as :func:`gradwire.bench.validation.median_run` makes it."""
    return {"iteration_s": iteration_s, "iteration_each_s": [iteration_s],
            "parts_s": {"compute": 6e-3, "step": 1e-3, "header": 1e-3},
            "cpu_s_per_rank": 0.01, "cpu_main_s_per_rank": 0.006, "cpu_hook_s_per_rank": 0.002,
            "cpu_each_s_per_rank": [0.01], "payload_bytes_per_iter_per_rank": 1000,
            "iterations": 100, "epochs": 3, "load_average": 1.0}


def result(tmp_path: Path | None = None) -> dict:
    """A validation result at 1 Gbit/s, P = 2 and 4, on a 2-core machine."""
    clusters, rows = [], []
    for p in (2, 4):
        cal = CALIBRATION | {"world": p, "nodes": p, "cpu": CALIBRATION["cpu"] | {
            "cpu_ranks_per_machine": p}}
        clusters.append({"bandwidth": "1gbit", "workers": p, "calibration": cal})
        preds = pv.predict_configuration(PROFILE, cal, "1gbit", p, AGGS, 0.001, 4)
        rows += pv.rows("1gbit", p, preds, {a: measured(0.01 * (i + 1))
                                            for i, a in enumerate(AGGS)})
    return {"command": "test", "date": "2026-11-28", "machine": "test", "model": "toy",
            "batch_size": 32, "density": 0.001, "rank": 4, "aggs": AGGS, "cores": 2,
            "profile": PROFILE, "clusters": clusters, "rows": rows}


def test_a_prediction_is_advises_from_the_calibration_file_with_its_beta_and_the_links_bucket(
        tmp_path):
    prof_file, cal_file = tmp_path / "toy.json", tmp_path / "cal.json"
    prof_file.write_text(json.dumps(PROFILE))
    cal_file.write_text(json.dumps(CALIBRATION))
    s = scenario.Scenario(model=str(prof_file), agg=",".join(AGGS), calibration=cal_file)
    advice = scenario.advise(s, 2, "1gbit", 1.0)
    cluster = replace(advice.cluster, beta=8.4e-9, burst=float(tbf_burst(1e9)))
    assert cluster.cores == 2 and cluster.coding_slowdown is None  # from the file; 0.98 < 1
    prof, aggs, table = scenario.inputs(s)
    want, _ = advise.rank(prof, cluster, aggs, table, 1.0, 1.1)
    got = pv.predict_configuration(PROFILE, CALIBRATION, "1gbit", 2, AGGS, 0.001, 4)
    assert {r.agg.method: float(r.prediction.iteration) for r in want} == {
        a: float(p.iteration) for a, p in got.items()}
    # every term of the file is read: a slower α or β gives a slower dense iteration
    for field, factor in (("alpha_s", 10), ("beta_s_per_byte", 10)):
        slower = CALIBRATION | {field: CALIBRATION[field] * factor}
        assert float(pv.predict_configuration(PROFILE, slower, "1gbit", 2, ["dense"], 0.001, 4)[
            "dense"].iteration) > float(got["dense"].iteration)


def test_no_training_measurement_moves_a_prediction():
    doc = result()
    before = pv.repredict(doc)
    assert [r["predicted_s"] for r in before] == [r["predicted_s"] for r in doc["rows"]]
    changed = copy.deepcopy(doc)
    for r in changed["rows"]:  # every measured number of every row, tripled
        m = r["measured"]
        m["iteration_s"] *= 3
        m["parts_s"] = {k: v * 3 for k, v in m["parts_s"].items()}
        for k in ("cpu_s_per_rank", "cpu_main_s_per_rank", "cpu_hook_s_per_rank"):
            m[k] *= 3
    after = pv.repredict(changed)
    assert [r["predicted_s"] for r in after] == [r["predicted_s"] for r in before]
    assert [r["predicted_parts_s"] for r in after] == [r["predicted_parts_s"] for r in before]
    for a, b in zip(after, before, strict=True):  # only the measured side and the error move
        assert a["measured_s"] == 3 * b["measured_s"]
        assert a["error"] == pytest.approx(a["predicted_s"] / a["measured_s"] - 1)


def row(p: int, agg: str, measured_s: float, predicted_s: float, rate: str = "1gbit") -> dict:
    return {"bandwidth": rate, "workers": p, "agg": agg, "measured_s": measured_s,
            "predicted_s": predicted_s, "error": predicted_s / measured_s - 1}


def test_errors_are_summarised_apart_for_uncontended_and_contended_configurations():
    rows = [row(2, "dense", 0.10, 0.11), row(2, "topk", 0.10, 0.08),  # +10 %, -20 %
            row(4, "dense", 0.10, 0.13), row(4, "topk", 0.10, 0.10)]  # +30 %, 0 %
    s = pv.summarise({"rows": rows, "cores": 2})
    assert s["uncontended"] == pytest.approx(
        {"rows": 2, "median_abs_error": 0.15, "max_abs_error": 0.2})
    assert s["contended"] == pytest.approx(
        {"rows": 2, "median_abs_error": 0.15, "max_abs_error": 0.3})
    on_four = pv.summarise({"rows": rows, "cores": 4})  # the machine's cores decide
    assert on_four["contended"] is None and on_four["uncontended"]["rows"] == 4


def test_the_advisor_is_scored_beside_always_dense_fp16_and_topk():
    rows = [  # 1gbit P=2: topk fastest, advised; 100mbit P=2: gtopk fastest, topk advised
        row(2, "dense", 0.050, 0.040), row(2, "fp16", 0.040, 0.035),
        row(2, "topk", 0.020, 0.018), row(2, "gtopk", 0.030, 0.025),
        row(2, "dense", 0.400, 0.380, "100mbit"), row(2, "fp16", 0.200, 0.210, "100mbit"),
        row(2, "topk", 0.021, 0.019, "100mbit"), row(2, "gtopk", 0.020, 0.020, "100mbit")]
    s = pv.summarise({"rows": rows, "cores": 2})
    assert [(p["advised"], p["fastest"]) for p in s["picks"]] == [("topk", "topk"),
                                                                 ("topk", "gtopk")]
    assert s["advisor"] == pytest.approx({"within_5pct": 1.0, "mean_ratio": (1 + 1.05) / 2})
    assert s["baselines"]["dense"] == pytest.approx({"within_5pct": 0.0,
                                                    "mean_ratio": (2.5 + 20) / 2})
    assert s["baselines"]["fp16"] == pytest.approx({"within_5pct": 0.0,
                                                   "mean_ratio": (2 + 10) / 2})
    # "always topk" picks what the advisor picks: a tie, so no claim
    assert s["baselines"]["topk"] == s["advisor"]
    assert not s["better_than_baselines"]
    # where topk is not the model's pick somewhere, and the pick measures faster, it holds
    rows[7]["predicted_s"] = 0.015
    s = pv.summarise({"rows": rows, "cores": 2})
    assert s["advisor"]["mean_ratio"] == 1.0 < s["baselines"]["topk"]["mean_ratio"]
    assert s["better_than_baselines"]
    text = "\n".join(pv.lines({"rows": rows, "cores": 2, "summary": s}))
    assert "always fp16: within 5 % of the fastest in 0 of 2" in text
    assert text.endswith("than every baseline: yes")


def test_a_baseline_whose_method_was_not_measured_everywhere_is_not_scored():
    rows = [row(2, "dense", 0.05, 0.05), row(2, "topk", 0.02, 0.02),
            row(4, "dense", 0.09, 0.09), row(4, "signsgd", 0.03, 0.03)]
    s = pv.summarise({"rows": rows, "cores": 2})
    assert s["baselines"]["topk"] is None and s["baselines"]["fp16"] is None
    assert s["better_than_baselines"]  # against dense, the one scored


@pytest.mark.parametrize("p", [2, 4, 8])
@settings(deadline=None, derandomize=True)  # the first example loads the data set
@given(predicted=st.floats(-4, 1).map(lambda e: 10**e))  # log-uniform: each branch often
def test_runs_last_the_steady_time_and_never_fewer_epochs_than_the_floor(p, predicted):
    e = pv.epochs_for(p, 32, predicted)
    per_epoch = TRAIN // p // 32
    assert pv.EPOCHS[p] <= e <= pv.MAX_EPOCHS
    if pv.EPOCHS[p] < e < pv.MAX_EPOCHS:  # sized by the steady time: enough, and no more
        assert (e - 1) * per_epoch * predicted >= pv.STEADY_S
        assert (e - 2) * per_epoch * predicted < pv.STEADY_S


def test_fast_configurations_get_fast_repeats_and_never_fewer_than_repeats():
    assert pv.repeats_for(0.05, 3, 5) == 5
    assert pv.repeats_for(pv.FAST_S, 3, 5) == 3
    assert pv.repeats_for(0.05, 3, 1) == 3
    assert pv.repeats_for(0.05, 1, None) == 1  # no --fast-repeats: --repeats everywhere


def test_the_median_run_is_kept_with_every_runs_time_and_the_median_cpu():
    def run(samples_per_s, cpu):
        return {"world_size": 2, "batch_size_per_rank": 32, "samples_per_s": samples_per_s,
                "seconds_per_iter": {"compute": 64 / samples_per_s}, "cpu_s_per_iter": cpu,
                "cpu_main_s_per_iter": cpu / 2, "cpu_hook_s_per_iter": cpu / 4,
                "payload_bytes_per_iter_per_rank": 10, "iterations": 10, "epochs": 3}

    got = pv.median_run([run(640.0, 0.01), run(3200.0, 0.02), run(1280.0, 0.03)])
    assert got["iteration_s"] == 0.05 and got["parts_s"]["compute"] == 0.05
    assert got["cpu_s_per_rank"] == 0.02  # the runs' median, not the median run's
    assert got["cpu_main_s_per_rank"] == 0.01 and got["cpu_hook_s_per_rank"] == 0.005
    assert got["iteration_each_s"] == [0.1, 0.02, 0.05] and got["iterations"] == 30
    two = pv.median_run([run(640.0, 0.01), run(1280.0, 0.03)])  # even: the middle two's mean
    assert two["iteration_s"] == pytest.approx(0.075)


def test_repredict_writes_the_result_its_figure_and_the_report(tmp_path):
    old, out = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(result()))
    from rich.console import Console

    console = Console(record=True, width=120)
    doc = pv.write_report(out, console, repredict_from=old, command="test")
    assert json.loads(out.read_text())["summary"] == doc["summary"]
    assert out.with_suffix(".png").stat().st_size > 0
    assert doc["summary"]["uncontended"]["rows"] == doc["summary"]["contended"]["rows"] == 6
    assert "contended (P > 2 cores): median |error|" in console.export_text()


def test_a_run_that_fails_part_way_leaves_the_last_whole_result(tmp_path, monkeypatch):
    """The result so far was kept in ``out`` itself after each cluster: a run that failed at
    its second cluster replaced the last whole result (summary, figure beside it) with a
    partial one of no summary and a new date. It is kept beside it now, marked incomplete,
    and goes once the whole result is written."""
    from rich.console import Console

    from gradwire.bench.validation import report
    from gradwire.errors import GradwireError

    out = tmp_path / "latest.json"
    out.write_text(json.dumps(result()))
    whole = out.read_text()
    so_far = result()

    def fails_at_the_second_cluster(plan, console, command, on_cluster):
        on_cluster(so_far)
        raise GradwireError("the second cluster failed")

    monkeypatch.setattr(report, "run", fails_at_the_second_cluster)
    with pytest.raises(GradwireError, match="second cluster"):
        pv.write_report(out, Console(), plan=object(), command="test")
    assert out.read_text() == whole
    partial = tmp_path / "latest.partial.json"
    assert json.loads(partial.read_text())["incomplete"] is True

    monkeypatch.setattr(report, "run", lambda plan, console, command, on_cluster: (
        on_cluster(so_far), copy.deepcopy(so_far))[1])
    pv.write_report(out, Console(), plan=object(), command="test")
    assert "summary" in json.loads(out.read_text()) and not partial.exists()


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("perf_validation", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


@pytest.mark.parametrize("args, message", [
    (["--workers", "1"], "--workers: each P must be >= 2"),
    (["--workers", "2,x"], "--workers '2,x': expected a comma list of whole numbers"),
    (["--rates", "fast"], "--rates: "),
    (["--rates", "1gbit,1gbit"], "--rates lists a value twice"),
    (["--rates", "1gbit,1000mbit"], "--rates lists one link rate twice"),
    (["--aggs", "dense,topkk"], "--aggs: unknown method 'topkk'"),
    (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["--fast-repeats", "0"], "--fast-repeats must be >= 1, got 0"),
    (["--repredict", "nowhere.json"], "nowhere.json"),
    (["--repredict", "OLD"], "not a result of this validation"),
])
def test_bad_arguments_are_one_line_errors_before_anything_runs(script, tmp_path, args,
                                                                message):
    (tmp_path / "OLD").write_text(json.dumps({"rows": [], "calibration": {}}))
    args = [str(tmp_path / a) if a in ("OLD", "nowhere.json") else a for a in args]
    with pytest.raises(SystemExit) as e:
        script([*args, "--out", str(tmp_path / "out.json")])
    text = str(e.value.code)
    assert text.startswith("perf_validation.py: error: ") and message in text
    assert "\n" not in text
    assert not (tmp_path / "out.json").exists()


def test_a_result_named_png_is_refused_before_its_figure_overwrites_it(script, tmp_path):
    with pytest.raises(SystemExit) as e:
        script(["--workers", "1", "--out", str(tmp_path / "r.PNG")])
    assert "its figure would be written over it" in str(e.value.code)
