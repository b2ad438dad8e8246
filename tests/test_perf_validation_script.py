"""How benchmarks/perf_validation.py (gradwire.bench.validation) sizes and summarises its
training runs (the script itself runs for most of an hour, outside CI)."""
import copy
import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradwire.bench import validation
from gradwire.data import digits

RESULTS = Path(__file__).parent.parent / "benchmarks" / "results"


@pytest.fixture(scope="module")
def pv():
    return validation


TRAIN = len(digits(0)[0].y)


@pytest.mark.parametrize("p", [2, 4, 8])
@given(predicted=st.floats(1e-4, 10.0))
def test_runs_last_the_steady_time_and_never_fewer_epochs_than_before(pv, p, predicted):
    e = pv.epochs_for(p, 32, predicted)
    per_epoch = TRAIN // p // 32
    assert pv.EPOCHS[p] <= e <= pv.MAX_EPOCHS
    if pv.EPOCHS[p] < e < pv.MAX_EPOCHS:  # sized by the steady time: enough, and no more
        assert (e - 1) * per_epoch * predicted >= pv.STEADY_S
        assert (e - 2) * per_epoch * predicted < pv.STEADY_S


def test_slow_configurations_keep_their_epochs_and_fast_ones_get_more(pv):
    assert pv.epochs_for(8, 32, 0.7) == pv.EPOCHS[8]  # dense at 100 Mbit/s, P = 8
    assert pv.epochs_for(2, 32, 0.015) > 3 * pv.EPOCHS[2]  # Top-k at P = 2
    assert pv.epochs_for(2, 32, 1e-6) == pv.MAX_EPOCHS


def test_fast_configurations_get_more_runs_and_never_fewer_than_repeats(pv):
    assert pv.repeats_for(0.05, 3, 5) == 5
    assert pv.repeats_for(pv.FAST_S, 3, 5) == 3  # 100 Mbit/s dense: 0.4-0.7 s
    assert pv.repeats_for(0.05, 3, 1) == 3
    assert pv.repeats_for(0.5, 7, 5) == 7


def test_the_median_run_is_kept_with_every_runs_time_and_the_median_cpu(pv):
    def run(samples_per_s, cpu):
        return {"world_size": 2, "batch_size_per_rank": 32, "samples_per_s": samples_per_s,
                "seconds_per_iter": {"compute": 64 / samples_per_s}, "cpu_s_per_iter": cpu,
                "cpu_main_s_per_iter": cpu / 2, "cpu_hook_s_per_iter": cpu / 4, "iterations": 10}

    # the run of median time (1280 samples/s) spent the most CPU: the CPU is the runs' median
    got = pv.median_run([run(640.0, 0.01), run(3200.0, 0.02), run(1280.0, 0.03)])
    assert got["samples_per_s"] == 1280.0 and got["seconds_per_iter"]["compute"] == 0.05
    assert got["cpu_s_per_iter"] == 0.02
    assert got["cpu_main_s_per_iter"] == 0.01 and got["cpu_hook_s_per_iter"] == 0.005
    assert got["iteration_each_s"] == [0.1, 0.02, 0.05] and got["iterations"] == 30
    assert got["cpu_each_s"] == [0.01, 0.02, 0.03]


@pytest.fixture(scope="module")
def recorded(pv):
    """The 06:18 validation run's inputs and measurements (committed)."""
    doc = json.loads((RESULTS / "perf_validation_0618.json").read_text())
    return doc, *pv.recorded_inputs(doc), pv.recorded_measurements(doc)


def test_a_ranks_own_cpu_is_the_mean_over_the_dense_runs_at_its_p(pv, recorded):
    doc, prof, table, measured = recorded
    refs = [(rate, doc["calibration"][f"{rate} P=4"], measured[rate, 4]["dense"])
            for rate in ("1gbit", "100mbit")]
    one = [pv.own_cpu(prof, table, [r], 4) for r in refs]
    assert pv.own_cpu(prof, table, refs, 4) == pytest.approx(sum(one) / 2)
    # each a few milliseconds, under the dense run's whole CPU per rank (16-19 ms)
    for (_, _, dense), own in zip(refs, one, strict=True):
        assert 0.002 < own < dense["cpu_s_per_iter"]
    # a dense run 1 ms dearer moves the estimate by half of it
    dearer = (refs[1][0], refs[1][1], refs[1][2] | {"cpu_s_per_iter":
                                                     refs[1][2]["cpu_s_per_iter"] + 1e-3})
    assert pv.own_cpu(prof, table, [refs[0], dearer], 4) == pytest.approx(
        pv.own_cpu(prof, table, refs, 4) + 0.5e-3)


def test_every_row_at_a_p_is_predicted_from_the_same_own_cpu(pv, recorded):
    doc, prof, table, measured = recorded
    rows = pv.predict_all(prof, table, doc["calibration"], measured, doc["batch_size"])
    assert len(rows) == len(doc["rows"]) == 36
    for p in (2, 4, 8):
        own = pv.own_cpu(prof, table, [(r, doc["calibration"][f"{r} P={p}"],
                                        measured[r, p]["dense"]) for r in ("1gbit", "100mbit")],
                         p)
        for r in rows:
            if r["workers"] == p and r["agg"] == "dense":  # its CPU less the model's charge
                parts = r["predicted_parts_s"]
                charge = parts["cpu_per_rank"] - own
                assert charge == pytest.approx(parts["cpu_communicate"] + parts["coding"],
                                               rel=0.05)
    # a configuration measured alone keeps its own dense run
    alone = {("1gbit", 2): measured["1gbit", 2]}
    assert len(pv.predict_all(prof, table, doc["calibration"], alone, 32)) == 6


def test_with_hook_cpu_measured_a_row_is_its_threads_cpu_from_the_other_methods_plus_its_hook(
        pv, recorded):
    """--cpu hooks: where calibrate measured every aggregation's hook on every cluster
    (``hook_s``) and the runs report their training thread's CPU, a row's CPU per rank is the
    median training thread CPU of the *other* aggregations' runs at its P (both rates) plus
    its own hook's measured CPU."""
    doc, prof, table, measured = recorded
    measured = copy.deepcopy(measured)
    cal = copy.deepcopy(doc["calibration"])
    aggs = list(measured["1gbit", 2])
    for c in cal.values():
        c["hook_s"] = {agg: {"cpu_s": 1e-3 * (i + 1), "wall_s": 0.01}
                       for i, agg in enumerate(aggs)}
    for (rate, _), group in measured.items():
        for i, agg in enumerate(aggs):  # 5, 6, ... ms; 0.5 ms more at 100 Mbit/s
            group[agg]["cpu_main_s_per_iter"] = 5e-3 + 1e-3 * i + 0.5e-3 * (rate == "100mbit")
    rows = pv.predict_all(prof, table, cal, measured, doc["batch_size"], "hooks")
    for i, agg in enumerate(aggs):
        others = [5e-3 + 1e-3 * j + 0.5e-3 * k for j in range(len(aggs)) if j != i
                  for k in (0, 1)]
        want = statistics.median(others) + 1e-3 * (i + 1)
        got = [r["predicted_parts_s"]["cpu_per_rank"] for r in rows if r["agg"] == agg]
        assert got == pytest.approx([want] * 6)
    assert pv.thread_cpu(measured, 2, "dense") == pytest.approx(statistics.median(
        [5e-3 + 1e-3 * j + 0.5e-3 * k for j in range(1, len(aggs)) for k in (0, 1)]))
    # the dense estimate takes neither; runs without the thread's CPU, or calibrations
    # without hook_s, keep it with "hooks" (the default) too
    # (test_every_row_at_a_p_is_predicted_from_the_same_own_cpu)
    dense = pv.predict_all(prof, table, cal, measured, doc["batch_size"], "dense")
    assert [r["predicted_s"] for r in dense] == [r["predicted_s"] for r in pv.predict_all(
        prof, table, doc["calibration"], measured, doc["batch_size"], "hooks")]
    assert pv.thread_cpu(recorded[3], 2, "dense") is None
    assert pv.hook_cpu(doc["calibration"]["1gbit P=2"], "dense") is None
    # the probe's wall floors a row (point 8): forward + wall + step where it binds
    assert all(0 < r["predicted_parts_s"]["floor"] <= r["predicted_s"] for r in rows)
    assert all(r["predicted_parts_s"]["floor"] == 0 for r in dense)
    for c in cal.values():
        c["hook_s"]["signsgd"]["wall_s"] = 2.0
    floored = pv.predict_all(prof, table, cal, measured, doc["batch_size"], "hooks")
    for r, was in zip(floored, rows, strict=True):
        pp = r["predicted_parts_s"]
        if r["agg"] == "signsgd":
            assert r["predicted_s"] == pytest.approx(pp["forward"] + 2.0 + pp["step"])
        else:
            assert r["predicted_s"] == was["predicted_s"]


def test_a_hooks_cpu_is_the_mean_of_the_probes_before_and_after_the_runs(pv):
    """Calibrate's hook probe runs before a cluster's runs (``hook_s``) and again after them
    (``hook_s_after``): a row takes the mean, so a machine that drifts while the runs go on
    is met halfway; a probe missing on either side leaves the other."""
    cal = {"hook_s": {"topk": {"cpu_s": 0.004}, "dense": {"cpu_s": 0.010}},
           "hook_s_after": {"topk": {"cpu_s": 0.006}}}
    assert pv.hook_cpu(cal, "topk") == pytest.approx(0.005)
    assert pv.hook_cpu(cal, "dense") == pytest.approx(0.010)
    assert pv.hook_cpu({"hook_s_after": {"topk": {"cpu_s": 0.006}}}, "topk") == 0.006
    assert pv.hook_cpu(cal, "signsgd") is None
    cal["hook_s"]["topk"]["wall_s"], cal["hook_s_after"]["topk"]["wall_s"] = 0.02, 0.03
    assert pv.hook_cpu(cal, "topk", "wall_s") == pytest.approx(0.025)
    assert pv.hook_cpu(cal, "dense", "wall_s") is None


def test_a_rows_compute_is_the_median_of_the_other_aggregations_runs(pv, recorded):
    """Each row's forward + backward and step are the medians of the *other* aggregations'
    runs at its (rate, P), never its own: doubling one row's measured compute moves every
    other row's input and leaves its own."""
    doc, prof, table, measured = recorded
    measured = copy.deepcopy(measured)
    group = measured["1gbit", 2]
    aggs = list(group)
    for i, agg in enumerate(aggs):
        group[agg]["seconds_per_iter"]["compute"] = 0.01 + 1e-3 * i
        group[agg]["seconds_per_iter"]["step"] = 1e-3 + 1e-4 * i

    def inputs(m):
        rows = pv.predict_rows(prof, table, doc["calibration"]["1gbit P=2"], "1gbit", 2, m,
                               doc["batch_size"], dict.fromkeys(m, (0.01, None, None)))
        return {r["agg"]: (r["predicted_parts_s"]["forward"] + r["predicted_parts_s"][
            "backward"], r["predicted_parts_s"]["step"]) for r in rows}

    before = inputs(group)
    for i, agg in enumerate(aggs):
        others = [j for j in range(len(aggs)) if j != i]
        assert before[agg] == pytest.approx(
            (statistics.median(0.01 + 1e-3 * j for j in others),
             statistics.median(1e-3 + 1e-4 * j for j in others)))
    group["topk"]["seconds_per_iter"]["compute"] *= 2
    after = inputs(group)
    assert after["topk"] == before["topk"]
    assert all(after[a][0] >= before[a][0] for a in aggs)
    assert sum(after[a] != before[a] for a in aggs) >= 2


def test_merged_runs_keep_every_clusters_calibration_and_epochs(pv):
    def doc(rate):
        row = {"bandwidth": rate, "workers": 2, "agg": "dense", "measured_s": 0.1,
               "predicted_s": 0.1, "error": 0.0}
        return {"command": f"run {rate}", "date": "2026-11-26", "machine": "m", "rows": [row],
                "conditions": {}, "summary": {"load_average_end": [0.0, 0.0, 0.0]},
                "profile_one_process": {}, "profile_one_thread": {}, "codecs_one_thread": {},
                "calibration": {f"{rate} P=2": {"alpha_s": 1.0}},
                "epochs": {f"{rate} P=2": {"dense": 3}}}

    got = pv.merge([doc("1gbit"), doc("100mbit")])
    assert set(got["epochs"]) == set(got["calibration"]) == {"1gbit P=2", "100mbit P=2"}
    assert got["command"] == "run 1gbit; run 100mbit" and len(got["rows"]) == 2
    with pytest.raises(SystemExit, match="overlap"):
        pv.merge([doc("1gbit"), doc("1gbit")])


def test_codecs_are_timed_on_one_thread_and_the_thread_count_comes_back(pv):
    import torch

    before = torch.get_num_threads()
    with pv.one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    table = pv.codec_table(4096, 1, "test")
    assert torch.get_num_threads() == before
    enc, dec = table.seconds("topk", 4096, 2)
    assert enc > 0 and dec >= 0
