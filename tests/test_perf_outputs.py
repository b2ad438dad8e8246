"""What whatif's and advise's outputs record: advise's --json is one record (provenance, inputs,
every ranked scheme's breakdown, the schemes left out); whatif leaves out the points the model
refuses (int8 beyond 127 workers) and predicts the rest; both say where a method's codec times
were measured at another density or rank than asked."""

from __future__ import annotations

import json
import re

import calibration_doc
import pytest
from conftest import one_line_cli_error, run_cli

from gradwire.perf import codecs


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


def _cli(monkeypatch, capsys, args: list[str]) -> tuple[int, str, str]:
    code, out, err = run_cli(monkeypatch, capsys, args)
    return code, " ".join(out.split()), err  # the console wraps lines: compare words


ADVISE = ["advise", "--model", "resnet50", "--workers", "32", "--bandwidth", "10gbit",
          "--codecs", "h100"]
ROW = {"agg", "method", "workers", "bandwidth", "compute_speedup", "iteration_s", "efficiency",
       "communicate_s", "exposed_s", "coding_s", "wire_bytes"}  # whatif's rows


def test_advise_json_is_one_record_of_provenance_inputs_ranking_and_the_left_out(
        home, monkeypatch, capsys):
    """advise's --json was a bare list of (agg, iteration_s, overhead_s): no command, date or
    commit, no inputs, no breakdown and nothing of the schemes it left out."""
    js = home / "a.json"
    code, out, err = _cli(monkeypatch, capsys, [*ADVISE, "--agg", "dense,topk,powersgd,int8",
                                                "--json", str(js)])
    assert code == 0, err
    rec = json.loads(js.read_text())
    assert isinstance(rec, dict)
    assert rec["command"].startswith("gradwire advise --model resnet50")
    assert {"date", "commit", "machine"} <= set(rec)
    assert (rec["model"], rec["workers"], rec["bandwidth"], rec["compute_speedup"]) == (
        "resnet50", 32, "10gbit", 1.0)
    assert (rec["density"], rec["rank"], rec["mode"], rec["bucket_mb"]) == (0.001, 4, "bucket",
                                                                            25.0)
    assert rec["alpha_s"] == pytest.approx(50e-6) and rec["overlap_slowdown"] == 1.0
    assert rec["codec_table"] == "h100" and "H100" in rec["codecs"]
    assert rec["reference"] == "v100" and rec["calibration"] is None
    assert rec["ranks_per_node"] == 1 and rec["gamma_s_per_byte"] > 0
    assert rec["aggs"] == ["dense", "topk ρ=0.001", "powersgd r=4", "int8"]
    assert " ".join(rec["note"].split()) in out  # the inputs line, as printed
    ranked = rec["ranked"]
    assert len(ranked) == 3
    for r in ranked:
        assert set(r) == ROW | {"overhead_s"}
        assert r["overhead_s"] == pytest.approx(r["exposed_s"])
        assert (r["workers"], r["bandwidth"]) == (32, "10gbit")
    assert [r["iteration_s"] for r in ranked] == sorted(r["iteration_s"] for r in ranked)
    winner = re.search(r"(\S+(?: ρ=\S+| r=\S+)?) wins at (\S+) ms", out)
    assert winner and ranked[0]["agg"] == winner.group(1)
    assert f"{ranked[0]['iteration_s'] * 1e3:.1f}" == winner.group(2)
    dense = next(r for r in ranked if r["agg"] == "dense")
    assert dense["coding_s"] == 0 and dense["wire_bytes"] > ranked[0]["wire_bytes"]
    # what it printed as not ranked, line for line
    left_out = rec["not_ranked"]
    assert len(left_out) == 1 and left_out[0].startswith("int8: codec table 'h100'")
    assert " ".join(f"not ranked: {left_out[0]}".split()) in out


def _int8_table(tmp_path) -> str:
    """A codec table that prices int8 (neither built-in one does)."""
    path = tmp_path / "int8.json"
    path.write_text(json.dumps(calibration_doc.codecs(("dense", "int8"))))
    return str(path)


WHY = "128 ranks leave no level to send"


def test_whatif_predicts_every_point_but_int8_beyond_127_workers(home, monkeypatch, capsys):
    """`whatif --agg dense,int8 --codecs FILE` at the default --workers 4:128 failed whole on
    int8's limit at 128 workers; the other points are predicted, the refused one said."""
    js, png = home / "w.json", home / "w.png"
    code, out, err = _cli(monkeypatch, capsys, [
        "whatif", "--model", "resnet20", "--compute-ms", "20,40", "--bandwidth", "1gbit",
        "--agg", "dense,int8", "--codecs", _int8_table(home), "--json", str(js), "--plot",
        str(png)])
    assert code == 0, err
    assert f"not predicted: int8 at 128 workers: {WHY}" in out
    res = json.loads(js.read_text())
    points = {(r["agg"], r["workers"]) for r in res["rows"]}
    assert points == {("dense", p) for p in (4, 8, 16, 32, 64, 128)} | {
        ("int8", p) for p in (4, 8, 16, 32, 64)}
    assert res["not_predicted"] == [{"agg": "int8", "workers": [128],
                                     "reason": res["not_predicted"][0]["reason"]}]
    assert res["not_predicted"][0]["reason"].startswith(WHY)
    assert len(res["answers"]) == 6 and png.stat().st_size > 0  # the §5 answers at every P
    assert set(res["rows"][0]) == ROW


def test_whatif_says_the_worker_counts_of_one_method_in_one_line(home, monkeypatch, capsys):
    table = _int8_table(home)
    args = ["whatif", "--model", "resnet20", "--compute-ms", "20,40", "--bandwidth", "1gbit",
            "--codecs", table]
    code, out, err = _cli(monkeypatch, capsys, [*args, "--agg", "dense,int8", "--workers",
                                                "64,128,256", "--compute-speedup", "1,2"])
    assert code == 0, err
    assert out.count("not predicted") == 1
    assert f"not predicted: int8 at 128, 256 workers: {WHY}" in out
    # nothing to predict at all: one line saying why (int8 refused at each count asked)
    code, out, err = _cli(monkeypatch, capsys, [*args, "--agg", "int8", "--workers",
                                                "128,256"])
    one_line_cli_error(code, err, "no aggregation scheme could be predicted",
                       f"int8 at every worker count asked (128 to 256): {WHY}")


@pytest.mark.parametrize("command", ["advise", "whatif"])
def test_a_method_priced_at_another_density_or_rank_than_measured_says_so(
        command, home, monkeypatch, capsys):
    """h100's Top-k times were measured at density 0.001 and PowerSGD's at rank 4: asked at
    0.01 and 32 they were used unchanged, unsaid."""
    js = home / "out.json"
    args = [command, "--model", "resnet50", "--workers", "8", "--bandwidth", "10gbit",
            "--codecs", "h100", "--agg", "dense,topk,powersgd", "--json", str(js)]
    code, out, err = _cli(monkeypatch, capsys, [*args, "--density", "0.01", "--rank", "32"])
    assert code == 0, err
    topk = "topk's encode/decode times were measured at density 0.001; priced here at 0.01"
    powersgd = "powersgd's encode/decode times were measured at rank 4; priced here at 32"
    assert out.count(f"{topk} unchanged") == 1 and out.count(f"{powersgd} unchanged") == 1
    assert json.loads(js.read_text())["codec_params_apart"] == [
        {"method": "topk", "measured_at": {"density": 0.001}, "priced_at": {"density": 0.01}},
        {"method": "powersgd", "measured_at": {"rank": 4}, "priced_at": {"rank": 32}}]


@pytest.mark.parametrize("command", ["advise", "whatif"])
def test_a_method_priced_at_the_parameters_measured_says_nothing(command, home, monkeypatch,
                                                                 capsys):
    js = home / "out.json"
    code, out, err = _cli(monkeypatch, capsys, [
        command, "--model", "resnet50", "--workers", "8", "--bandwidth", "10gbit", "--codecs",
        "h100", "--agg", "dense,topk,powersgd", "--density", "0.001", "--rank", "4", "--json",
        str(js)])
    assert code == 0, err
    assert "measured at" not in out
    assert json.loads(js.read_text())["codec_params_apart"] == []


def test_only_parameters_both_sides_have_are_compared() -> None:
    table = codecs.CodecTable("t", 10, {
        "topk": {"params": {"density": "0.1", "selector": "exact"}},  # not a number: unknown
        "fp16": {"params": {"density": 0.5}},  # fp16 takes no density
        "gtopk": {},  # no params recorded
        "dgc": {"params": {"density": 0.01}}}, "")
    assert table.measured_apart("topk", 0.01, 4) is None
    assert table.measured_apart("fp16", 0.01, 4) is None
    assert table.measured_apart("gtopk", 0.01, 4) is None
    assert table.measured_apart("qsgd", 0.01, 4) is None  # the table lacks it
    assert table.measured_apart("dgc", 0.01, 32) is None  # dgc takes no rank
    assert table.measured_apart("dgc", 0.001, 4) == {
        "method": "dgc", "measured_at": {"density": 0.01}, "priced_at": {"density": 0.001}}
