"""gradwire whatif, advise and profile: outputs, files, and one-line errors for every option."""

from __future__ import annotations

import json
import math
import sys

import calibration_doc
import pytest
from conftest import strict_json

from gradwire.cli import main


def _cli(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["gradwire", *args])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    # the console wraps text at 120 columns: compare words, not lines
    return code, " ".join(out.out.split()), out.err


def test_whatif_writes_every_prediction_and_the_plot(tmp_path, monkeypatch, capsys) -> None:
    js, png = tmp_path / "w.json", tmp_path / "w.png"
    code, out, err = _cli(["whatif", "--model", "resnet50", "--workers", "4:16", "--bandwidth",
                           "1gbit,10gbit", "--agg", "dense,gtopk,powersgd",
                           "--compute-speedup", "1,2", "--plot", str(png), "--json", str(js)],
                          monkeypatch, capsys)
    assert code == 0, err
    res = json.loads(js.read_text())
    assert len(res["rows"]) == 3 * 3 * 2 * 2 and len(res["answers"]) == 3 * 2 * 2
    assert png.stat().st_size > 10_000
    # Faster links never need more compression, and dense never beats compute alone.
    for r in res["answers"]:
        assert r["coding_budget_s"] >= 0
    # null: no ratio suffices (latency alone exceeds backward)
    one = {(r["workers"], r["compute_speedup"]): r["required_compression"] or math.inf
           for r in res["answers"] if r["bandwidth"] == "1gbit"}
    ten = {(r["workers"], r["compute_speedup"]): r["required_compression"] or math.inf
           for r in res["answers"] if r["bandwidth"] == "10gbit"}
    assert all(ten[k] <= one[k] for k in one)


def test_whatif_says_where_no_compression_suffices_in_valid_json(tmp_path, monkeypatch,
                                                               capsys) -> None:
    """At 2048 workers a dense ring's latency alone (2(P−1) steps of α) exceeds ResNet-50's
    backward: no compression ratio suffices. The table says so and the JSON has null, not
    Infinity (which strict JSON readers refuse)."""
    js = tmp_path / "w.json"
    code, out, err = _cli(["whatif", "--model", "resnet50", "--workers", "2048",
                           "--bandwidth", "10gbit", "--agg", "dense", "--json", str(js)],
                          monkeypatch, capsys)
    assert code == 0, err
    assert "none (α alone > backward)" in out and "inf" not in out
    res = strict_json(js.read_text())
    assert [a["required_compression"] for a in res["answers"]] == [None]


def test_eight_ranks_per_node_sharing_a_link_turn_the_ranking_to_gtopk(tmp_path, monkeypatch,
                                                                       capsys) -> None:
    # Top-k gathers every rank's entries: 8 ranks behind one 10 Gbit/s link send 8 times the
    # bytes through it; gTop-k's tree sends k entries per edge.
    js = tmp_path / "a.json"
    args = ["advise", "--model", "resnet50", "--workers", "32", "--bandwidth", "10gbit",
            "--agg", "topk,gtopk", "--reference", "h100", "--json", str(js)]
    code, out, err = _cli(args, monkeypatch, capsys)
    assert code == 0, err
    alone = {r["agg"]: r["iteration_s"] for r in json.loads(js.read_text())["ranked"]}
    code, out, err = _cli(["advise", "--model", "resnet50", "--workers", "2", "--bandwidth",
                           "100gbit", "--agg", "dense"], monkeypatch, capsys)
    assert code == 0 and "Ranked by time alone" not in out  # dense loses nothing to compression
    code, out, err = _cli([*args, "--ranks-per-node", "8"], monkeypatch, capsys)
    assert code == 0, err
    assert "8 per node (100gbit inside)" in out and "gtopk ρ=0.001 wins" in out
    shared = {r["agg"]: r["iteration_s"] for r in json.loads(js.read_text())["ranked"]}
    assert shared["topk ρ=0.001"] > alone["topk ρ=0.001"]
    assert shared["gtopk ρ=0.001"] < shared["topk ρ=0.001"]


def test_advise_ranks_every_method_and_explains_the_winner(monkeypatch, capsys) -> None:
    code, out, err = _cli(["advise", "--model", "resnet50", "--workers", "32", "--bandwidth",
                           "1gbit"], monkeypatch, capsys)
    assert code == 0, err
    assert "wins at" in out and "Dense takes" in out
    assert "Ranked by time alone" in out  # the winner compresses: accuracy is not in the rank
    for method in ("dense", "fp16", "topk", "gtopk", "powersgd", "signsgd", "qsgd"):
        assert method in out


def test_advise_lists_the_methods_a_codec_table_cannot_price_on_one_line(monkeypatch,
                                                                           capsys) -> None:
    code, out, err = _cli(["advise", "--model", "resnet50", "--workers", "64", "--bandwidth",
                           "10gbit", "--codecs", "v100"], monkeypatch, capsys)
    assert code == 0, err
    assert out.count("not ranked") == 1
    unpriced = " ".join(out.split("not ranked: ")[1].split())
    assert "qsgd" in unpriced and "int8" in unpriced and "codec table 'v100'" in unpriced
    assert "dense" in out.split("not ranked")[0]


@pytest.mark.parametrize("command", ["advise", "whatif"])
def test_the_inputs_line_names_the_codec_table_that_priced_the_run(command, monkeypatch,
                                                                   capsys) -> None:
    """--codecs replaces the reference setting's table: the line saying where each input came
    from names the table given, not the setting's own, and the compute's source."""
    args = [command, "--model", "resnet50", "--workers", "32", "--bandwidth", "10gbit"]
    code, out, err = _cli([*args, "--codecs", "h100"], monkeypatch, capsys)
    assert code == 0, err
    assert "codecs h100 (given, for the setting's v100)" in out and "codecs v100," not in out
    assert "compute: compression-utility paper" in out
    code, out, err = _cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert "codecs v100," in out and "given" not in out


@pytest.mark.parametrize(("args", "message"), [
    (["whatif", "--workers", "8:2"], "--workers '8:2'"),
    (["whatif", "--bandwidth", "1gbt"], "bandwidth '1gbt' is not valid"),
    (["whatif", "--bandwidth", "none"], "bandwidth 'none' is not valid: expected a rate like "
     "100mbit, 1gbit, 2.5gbit, 10gbit, 25gbit (units kbit, mbit, gbit, tbit)\n"),
    (["advise", "--bandwidth", "1gbt"], "(units kbit, mbit, gbit, tbit)\n"),
    (["whatif", "--agg", "dense,topkk"], "did you mean 'topk'"),
    (["whatif", "--compute-speedup", "2,x"], "'x' is not a number"),
    (["whatif", "--density", "2"], "density must be in (0, 1]"),
    (["whatif", "--mode", "layer"], "mode must be 'bucket' or 'model'"),
    (["whatif", "--overlap-slowdown", "0.5"], "--overlap-slowdown must be >= 1, got 0.5"),
    (["whatif", "--codecs", "h200"], "unknown codec table 'h200'"),
    (["whatif", "--reference", "a100"], "unknown reference setting 'a100'"),
    (["whatif", "--model", "bert-base"], "has no compute times"),
    (["whatif", "--compute-ms", "1,2,3"], "expected FORWARD,BACKWARD"),
    (["advise", "--model", "resnet-50"], "did you mean 'resnet50'"),
    (["advise", "--agg", "qsgd,int8", "--codecs", "v100"], "no aggregation scheme could be "
     "predicted: qsgd, int8: codec table 'v100' has no encode/decode time for them"),
    (["advise", "--rank", "0"], "--rank (PowerSGD's) must be from 1 to 1024, got 0"),
    (["advise", "--ranks-per-node", "0"], "--ranks-per-node must be >= 1"),
    (["whatif", "--ranks-per-node", "2", "--intra-bandwidth", "fast"],
     "--intra-bandwidth: bandwidth 'fast' is not valid"),
    (["advise", "--bucket-mb", "0"], "--bucket-mb must be > 0"),
    (["advise", "--workers", "0"], "--workers"),
    (["advise", "--workers", "5000"], "--workers 5000: workers must be a whole number from 1 "
                                      "to 4096"),
    (["whatif", "--workers", "4:8192"], "--workers '4:8192': workers must be a whole number "
                                        "from 1 to 4096"),
    (["whatif", "--workers", "64M"], "--workers '64M': workers must be a whole number from 1 "
                                     "to 4096"),
    (["whatif", "--workers", "abc"], "--workers 'abc': worker count 'abc' is not valid: "
                                     "expected a worker count like 4, 64, 1K, a range 4:128 or "
                                     "4:4K:4, or a comma list of them, from 1 to 4096"),
    (["whatif", "--compute-speedup", "inf"], "each value must be a finite number > 0, got inf"),
    (["profile", "--model", "resnet"], "unknown model 'resnet'"),
    (["profile", "--out", "gw-never-written.json"],
     "--out writes a measured profile: give --model too"),
])
def test_bad_options_are_one_line(args, message, monkeypatch, capsys) -> None:
    code, out, err = _cli(args, monkeypatch, capsys)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(("text", "message"), [
    (None, "unknown codec table"),
    ('{"numel": 5, "methods": }', "line 1, column 25: not valid JSON"),
    ("[1, 2]", "expected a JSON object at the top, got list"),
    ('{"numel": "x", "methods": {}}', "field 'numel' must be an integer >= 1"),
    ('{"numel": 5, "methods": []}', "field 'methods' must be an object"),
    ('{"numel": 5, "methods": {"dense": 1}}', "methods.dense must be an object"),
    ('{"numel": 5, "methods": {"dense": {"encode_s": 0}}}', "methods.dense.decode_s must be a"),
    ('{"numel": 5, "methods": {"dense": {"encode_s": -1, "decode_s": 0}}}',
     "methods.dense.encode_s must be a number of seconds >= 0, got -1"),
    ('{"codecs": {"numel": 5, "methods": {"dense": {"encode_s": 0, "decode_s": 0, '
     '"decode_fixed_s": "x"}}}}', "methods.dense.decode_fixed_s must be a"),
    ('{"codecs": {"numel": 5, "methods": {"topkk": {"encode_s": 0, "decode_s": 0}}}}',
     "methods.topkk: unknown method 'topkk' (did you mean 'topk'?)"),
    ('{"codecs": 5}', "field 'codecs' must be an object (a codec table: numel, methods), got 5"),
    ('{"codecs": null}', "field 'codecs' must be an object"),
    ('{"codecs": [1]}', "field 'codecs' must be an object"),
])
def test_bad_codec_tables_are_one_line(text, message, tmp_path, monkeypatch, capsys) -> None:
    """--codecs FILE: a codec table, or a calibration file holding one under "codecs"."""
    path = tmp_path / "codecs.json"
    if text is not None:
        path.write_text(text)
    code, out, err = _cli(["whatif", "--model", "resnet20", "--workers", "4", "--agg", "dense",
                           "--codecs", str(path)], monkeypatch, capsys)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_compute_ms_makes_a_profile_without_times_usable(monkeypatch, capsys) -> None:
    code, out, err = _cli(["advise", "--model", "bert-base", "--compute-ms", "100,200",
                           "--workers", "8", "--agg", "dense,powersgd"], monkeypatch, capsys)
    assert code == 0, err
    assert "bert-base, 8 workers" in out


CPU = calibration_doc.cpu(cpu_ranks_per_machine=8, cpu_step_s=3.5e-4, cpu_byte_s=5e-10,
                         cpu_share=0.95, cpu_sync_s=1.5e-3, cpu_sync_step_s=2.5e-4,
                         cpu_slowdown=1.3)
# 8 emulated hosts on one 2-core machine
CALIBRATION = calibration_doc.doc(alpha_s=1.6e-3, alpha_call_s=2.2e-2, beta_s_per_byte=8.36e-9,
                                  gamma_s_per_byte=1e-10, overlap_slowdown=1.2,
                                  coding_slowdown=0.9, cpu=CPU, world=8, ranks_per_node=8,
                                  model="resnet20", network="emulated 8 hosts")


def test_a_calibration_of_an_emulated_cluster_puts_every_worker_on_its_cores(
        tmp_path, monkeypatch, capsys) -> None:
    """8 ranks on 2 cores: the sparse methods, with little on the wire, are bound by CPU; a
    calibration without CPU fields (older calibrate) gives cores of their own, and says so."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(CALIBRATION))
    args = ["advise", "--model", "resnet20", "--compute-ms", "20,40", "--workers", "8",
            "--agg", "dense,topk", "--json", str(tmp_path / "a.json")]
    code, out, err = _cli([*args, "--calibration", str(path)], monkeypatch, capsys)
    assert code == 0, err
    assert "bound by the shared cores" in out and "every worker on one machine" in out
    shared = json.loads((tmp_path / "a.json").read_text())["ranked"]
    path.write_text(json.dumps({**CALIBRATION, "cpu": None}))
    code, out, err = _cli([*args, "--calibration", str(path)], monkeypatch, capsys)
    assert code == 0, err
    assert "no CPU terms in it" in out and "bound by the shared cores" not in out
    alone = json.loads((tmp_path / "a.json").read_text())["ranked"]
    by = {r["agg"]: r["iteration_s"] for r in alone}
    assert all(r["iteration_s"] >= by[r["agg"]] for r in shared)
    assert any(r["iteration_s"] > 1.5 * by[r["agg"]] for r in shared)


def test_whatif_records_the_shared_cpu_it_used(tmp_path, monkeypatch, capsys) -> None:
    path, js = tmp_path / "cal.json", tmp_path / "w.json"
    path.write_text(json.dumps(CALIBRATION))
    code, out, err = _cli(["whatif", "--model", "resnet20", "--compute-ms", "20,40",
                           "--workers", "2,8", "--bandwidth", "1gbit", "--agg", "topk",
                           "--calibration", str(path), "--json", str(js)], monkeypatch, capsys)
    assert code == 0, err
    res = json.loads(js.read_text())
    assert res["shared_cpu"]["cores"] == 2 and res["shared_cpu"]["one_machine"] is True
    assert res["alpha_s"] == CALIBRATION["alpha_s"]
    assert res["overlap_slowdown"] == 1.2 and res["codecs"] == "a test's"
    assert res["coding_slowdown"] is None  # measured below 1: coding overlaps backward


@pytest.mark.parametrize(("text", "message"), [
    (None, "No such file or directory"),
    ("[1, 2", "line 1, column 6: not valid JSON"),
    ("[1, 2]", "expected a JSON object at the top, got list"),
    ('{"alpha_s": 1}', "written by an older gradwire calibrate"),
    (json.dumps({**CALIBRATION, "cpu": {**CPU, "cpu_share": "most"}}), "cpu.cpu_share"),
    (json.dumps({**CALIBRATION, "alpha_s": float("nan")}), "field 'alpha_s'"),
    (json.dumps({**CALIBRATION, "gamma_s_per_byte": -1e-9}), "field 'gamma_s_per_byte'"),
    (json.dumps({**CALIBRATION, "cpu": {**CPU, "cpu_byte_s": float("inf")}}),
     "cpu.cpu_byte_s"),
    (json.dumps({**CALIBRATION, "cpu": {**CPU, "cpu_share": 2}}), "cpu_share"),
])
def test_bad_calibration_files_are_one_line(text, message, tmp_path, monkeypatch,
                                            capsys) -> None:
    path = tmp_path / "cal.json"
    if text is not None:
        path.write_text(text)
    code, out, err = _cli(["advise", "--model", "resnet20", "--compute-ms", "20,40",
                           "--calibration", str(path)], monkeypatch, capsys)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _ranked(label: str, iteration: float, coding: float, wire: float):
    import numpy as np

    from gradwire.perf.advise import Ranked
    from gradwire.perf.model import Aggregation, Prediction

    p = Prediction(np.array(iteration), 0.01, 0.03, 0.001, np.array(wire), coding,
                   np.array(iteration - 0.041), 1000, 1)
    return Ranked(Aggregation(label), p)


@pytest.mark.parametrize(("runner_up", "said"), [
    (("fp16", 0.2, 0.001, 0.05), "fp16 ties with it at 200.0 ms"),
    (("fp16", 0.25, 0.03, 0.05), "(25.0 % slower), mostly more encode+decode"),
    (("fp16", 0.25, 0.001, 0.09), "(25.0 % slower), mostly more time on the wire"),
    (("fp16", 0.25, 0.001, 0.05), "(25.0 % slower), mostly less of its communication hidden"),
])
def test_advise_says_why_the_runner_up_loses_or_that_it_ties(runner_up, said) -> None:
    from gradwire.perf.advise import explain

    text = explain([_ranked("bf16", 0.2, 0.001, 0.05), _ranked(*runner_up)])
    assert said in text, text
    assert ("Runner-up" in text) == ("ties" not in said)
