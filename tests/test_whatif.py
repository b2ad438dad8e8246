"""gradwire whatif's sweep and §5 answers: they agree with the model's own predictions, and a
value given twice is one row or column."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import run_cli

from gradwire.errors import GradwireError
from gradwire.perf import codecs
from gradwire.perf import whatif as w
from gradwire.perf.model import Aggregation, predict
from gradwire.profiles import Profile

# 16 tensors of 4 MiB: DDP's buckets are several, so κ applies to backward in predict
PROFILE = Profile("sixteen", tuple((f"t{i}", 1 << 20) for i in range(16)), 0.01, 0.05)
RATES = list(np.geomspace(1e8, 1e11, 61))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_required_compression_is_one_exactly_where_predict_hides_the_dense_ring(dtype) -> None:
    """The §5 budget is the backward predict lets communication hide behind: the profile's,
    times the compute slowdown (compute as the ranks run it), over the compute speedup,
    times κ; the ring sums at the profile's dtype's γ, as predict's does. So dense needs no
    compression (ratio 1) exactly where its one ring allreduce fits in predict's backward,
    and more wherever it does not."""
    table = codecs.load("v100")
    setting = w.Setting(alpha=1e-4, gamma=1e-11, overlap_slowdown=1.1, compute_slowdown=2.0,
                        gamma_dtype=(("float16", 2e-10),))
    speedup = 2.0
    prof = dataclasses.replace(PROFILE, dtype=dtype)
    result = w.sweep(prof, [Aggregation("dense")], [4], RATES, [speedup], table, setting)
    ratios = [a["required_compression"] for a in result["answers"]]
    cluster = setting.cluster(4, np.asarray(RATES))
    cluster = dataclasses.replace(cluster, check_calls=False)
    hidden = predict(prof, cluster, Aggregation("dense"), table, speedup,
                     setting.overlap_slowdown).backward
    assert hidden == pytest.approx(1.1 * 0.05 * 2.0 / speedup)
    ring = predict(prof, cluster, Aggregation("dense", mode="model"), table,
                   speedup).communicate
    fits = ring <= hidden
    assert fits.any() and not fits.all()  # the rates cross the boundary
    for need, fit, t in zip(ratios, fits, ring, strict=True):
        assert (need == 1.0) == bool(fit), (need, t, hidden)
        assert need is not None and need >= 1.0


def test_a_value_given_twice_is_one_row_column_or_table(tmp_path, monkeypatch, capsys) -> None:
    """1gbit and 1000mbit are one rate, 1 and 1.0 one speedup, 4 given twice one worker count,
    dense given twice one scheme: the JSON has one row per distinct (aggregation, workers,
    rate, speedup) and the tables as many cells in a row as columns in their header."""
    js = tmp_path / "w.json"
    code, out, err = run_cli(monkeypatch, capsys, [
        "whatif", "--model", "resnet50", "--workers", "4,8,4", "--bandwidth",
        "1gbit,1000mbit,10gbit,1gbit", "--agg", "dense,topk,dense", "--compute-speedup",
        "1,2,1.0", "--json", str(js)])
    assert code == 0, err
    res = json.loads(js.read_text())
    keys = [(r["agg"], r["workers"], r["bandwidth"], r["compute_speedup"]) for r in res["rows"]]
    assert len(keys) == len(set(keys)) == 2 * 2 * 2 * 2
    answers = [(r["workers"], r["bandwidth"], r["compute_speedup"]) for r in res["answers"]]
    assert len(answers) == len(set(answers)) == 2 * 2 * 2
    assert [r["bandwidth"] for r in res["rows"][:2]] == ["1gbit", "10gbit"]  # first seen first
    text = " ".join(out.split())
    assert text.count("compute ×1:") == 1 and text.count("compute ×2:") == 1
    # one column per rate in each table (their names the header's first line), two tables
    # per speedup
    assert sum(line.split() == ["1gbit", "10gbit"] for line in out.splitlines()) == 2 * 2
    for line in out.splitlines():  # every body row has as many cells as its header
        words = line.split()
        if words[:1] in (["dense"], ["topk"]):  # the label, workers, two "ms (eff.)" cells
            assert len(words) == (2 if words[0] == "dense" else 3) + 2 * 2, line


def test_advise_ranks_a_scheme_given_twice_once(tmp_path, monkeypatch, capsys) -> None:
    js = tmp_path / "a.json"
    code, out, err = run_cli(monkeypatch, capsys, [
        "advise", "--model", "resnet50", "--workers", "4", "--agg", "dense,topk,dense",
        "--json", str(js)])
    assert code == 0, err
    assert sorted(r["agg"] for r in json.loads(js.read_text())["ranked"]) == ["dense",
                                                                             "topk ρ=0.001"]


def test_the_worker_counts_the_error_offers_as_examples_are_accepted() -> None:
    """--workers' error gives examples of its own (message sizes like 64M are not worker
    counts the model prices), and each of them parses."""
    with pytest.raises(GradwireError) as e:
        w.parse_workers("abc")
    assert "64M" not in str(e.value) and w.WORKER_FORMS in str(e.value)
    for example in ("4", "64", "1K", "4:128", "4:4K:4"):
        assert f" {example}" in w.WORKER_FORMS
        assert w.parse_workers(example)
    assert w.parse_workers("4:4K:4") == [4, 16, 64, 256, 1024, 4096]


def test_a_given_gamma_moves_the_half_precision_gammas_with_it(tmp_path) -> None:
    """--gamma-ns replaced γ but left fp16's and bf16's at the calibration's, so a γ given
    above theirs priced fp16 sums as cheaper than fp32's. Each keeps its measured extra."""
    from test_calibrate import _good

    from gradwire.perf import calibration, scenario

    path = tmp_path / "c.json"
    path.write_text(json.dumps({**_good(), "world": 4, "nodes": 4, "reduce": {
        "nbytes": 2**20, "float32_s": 1e-3, "float16_s": 4e-3, "bfloat16_s": 0.5e-3}}))
    measured = calibration.load(path)
    extra = measured.gamma_dtype()["float16"] - measured.gamma_s_per_byte
    terms, where = scenario.setting(scenario.Scenario(calibration=str(path), gamma_ns=50.0))
    assert terms.gamma == pytest.approx(50e-9) and "γ 50 ns/B" in where
    assert dict(terms.gamma_dtype) == pytest.approx({"float16": 50e-9 + extra,
                                                     "bfloat16": 50e-9})


@pytest.mark.parametrize("alpha_us", [2000.0, 0.0])
def test_a_given_alpha_moves_the_executor_s_alpha_with_it(tmp_path, alpha_us) -> None:
    """--alpha-us replaced the backend's α but left gradwire's executor at the calibration's,
    so a what-if at a higher latency priced Top-k and gTop-k (the executor's schedules) as if
    their steps had not slowed: it favoured them. The executor keeps its measured extra (never
    below 0 s)."""
    from test_calibrate import _good

    from gradwire.perf import calibration, scenario

    path = tmp_path / "c.json"
    path.write_text(json.dumps({**_good(), "alpha_transport_s": 4e-4}))
    measured = calibration.load(path)
    extra = measured.alpha_transport_s - measured.alpha_s
    terms, _ = scenario.setting(scenario.Scenario(calibration=str(path), alpha_us=alpha_us))
    assert terms.alpha == pytest.approx(alpha_us * 1e-6)
    assert terms.alpha_transport == pytest.approx(max(0.0, alpha_us * 1e-6 + extra))
    assert scenario.setting(scenario.Scenario(calibration=str(path)))[0].alpha_transport == (
        pytest.approx(4e-4))


def test_a_node_s_nvlink_is_a_rate_the_model_takes() -> None:
    """The model's rates stopped at 400gbit, tc's limit: an H100 node's NVLink (3.6 Tbit/s)
    could not be given to --intra-bandwidth. The emulated cluster still stops at tc's."""
    from gradwire.bandwidth import format_bandwidth, parse_bandwidth
    from gradwire.perf import scenario
    from gradwire.perf.model import parse_link

    assert parse_link("3.6tbit") == 3.6e12 and format_bandwidth(3.6e12) == "3.6tbit"
    terms, _ = scenario.setting(scenario.Scenario(ranks_per_node=8, intra_bandwidth="3.6tbit"))
    assert terms.intra_bps == 3.6e12
    with pytest.raises(GradwireError, match="out of range: expected 100kbit to 400gbit"):
        parse_bandwidth("3.6tbit")
    with pytest.raises(GradwireError, match="out of range: expected 100kbit to 100tbit"):
        parse_link("200tbit")
