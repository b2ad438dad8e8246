"""What whatif, advise and profile print is true and complete: a method the cluster cannot run
leaves the others ranked, every input of a calibration is named, the payload is not called
what a rank sends, κ's share of "compute" is said, and the help gives every option's
range."""

from __future__ import annotations

import json

import calibration_doc
import pytest
from conftest import one_line_cli_error, run_cli

import gradwire.profiles.measure as measure_module
from gradwire.perf import report, scenario
from gradwire.perf.advise import explain


def _cli(monkeypatch, capsys, args: list[str]) -> tuple[int, str, str]:
    code, out, err = run_cli(monkeypatch, capsys, args)
    return code, " ".join(out.split()), err  # the console wraps lines: compare words


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


def _calibration(tmp_path, **fields) -> str:
    """A calibration whose codec table prices int8, as every `gradwire calibrate` writes."""
    doc = calibration_doc.doc(codecs=calibration_doc.codecs(("dense", "topk", "int8")),
                              **fields)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    return str(path)


ADVISE = ["advise", "--model", "resnet20", "--compute-ms", "20,40", "--bandwidth", "1gbit"]


def test_advise_beyond_127_ranks_ranks_every_method_but_int8(home, monkeypatch, capsys):
    """`advise --workers 200 --calibration cal.json` failed whole on int8's limit ("200 ranks
    leave no level to send"), though nobody asked for int8 and every other method runs."""
    cal = _calibration(home)
    code, out, err = _cli(monkeypatch, capsys, [*ADVISE, "--workers", "200",
                                                "--calibration", cal, "--json",
                                                str(home / "a.json")])
    assert code == 0, err
    assert "not ranked: int8: 200 ranks leave no level to send" in out
    ranked = [r["agg"] for r in json.loads((home / "a.json").read_text())["ranked"]]
    assert sorted(ranked) == ["dense", "topk ρ=0.001"]
    # at 127 ranks int8 runs and is ranked
    code, out, err = _cli(monkeypatch, capsys, [*ADVISE, "--workers", "127",
                                                "--calibration", cal, "--json",
                                                str(home / "a.json")])
    assert code == 0 and "int8: 127 ranks" not in out, err
    assert "int8" in [r["agg"] for r in json.loads((home / "a.json").read_text())["ranked"]]
    # int8 alone: nothing to rank, one line saying why
    code, out, err = _cli(monkeypatch, capsys, [*ADVISE, "--workers", "200",
                                                "--calibration", cal, "--agg", "int8"])
    one_line_cli_error(code, err, "no aggregation scheme could be predicted",
                       "int8: 200 ranks leave no level to send")


def test_the_inputs_line_names_a_calibration_s_kappa_and_coding(home, monkeypatch, capsys):
    """The line that says where every input came from left out the calibration's κ (1.87 in a
    real one: backward nearly twice as long beside communication) and its coding slowdown,
    which the reference setting's line names."""
    cal = _calibration(home, overlap_slowdown=1.87, coding_slowdown=1.04)
    code, out, err = _cli(monkeypatch, capsys, [*ADVISE, "--workers", "4",
                                                "--calibration", cal])
    assert code == 0, err
    assert "κ 1.87, coding shares the device with backward (×1.04)" in out
    cal = _calibration(home, overlap_slowdown=1.2, coding_slowdown=0.9)
    code, out, err = _cli(monkeypatch, capsys, ["whatif", *ADVISE[1:], "--workers", "4",
                                                "--agg", "dense", "--calibration", cal])
    assert code == 0, err
    assert "κ 1.20, coding beside backward" in out


def test_advise_calls_the_payload_a_payload(home, monkeypatch, capsys):
    """The column "sent/rank" and "MB sent per rank" gave each rank's payload: at 32 ranks a
    dense ring sends 62/32 of it, Top-k's allgather 31 times it, so Top-k and gTop-k showed
    the same bytes "sent" where one sends six times the other's."""
    code, out, err = _cli(monkeypatch, capsys, ["advise", "--workers", "32", "--agg",
                                                "dense,topk,gtopk"])
    assert code == 0, err
    assert "MB sent per rank" not in out and "MB of payload per rank over 5 buckets" in out
    # the table's header and title, as rich lays them out at any width
    found = scenario.advise(scenario.Scenario(agg="dense", mode="model"), 1, "1gbit", 1.0)
    table = report.advice_table(found)
    assert table.columns[-1].header == "payload/rank\n(MB)"
    assert table.title == "resnet50, 1 worker, 1gbit"
    assert "over 1 bucket)" in explain(found.ranked)


def test_advise_says_how_much_of_its_compute_kappa_adds(home, monkeypatch, capsys):
    """With κ 2, "305.0 ms of compute" was the profile's 183 ms plus 122 ms of backward slowed
    by communication, unsaid; the table's efficiency (60 %) counts that part against it."""
    args = ["advise", "--workers", "8", "--bandwidth", "100gbit", "--agg", "dense"]
    code, out, err = _cli(monkeypatch, capsys, [*args, "--overlap-slowdown", "2"])
    assert code == 0, err
    assert ("305.0 ms of compute (122.0 ms of it backward slowed by the communication beside "
            "it)") in out
    code, out, err = _cli(monkeypatch, capsys, args)
    assert code == 0 and "183.0 ms of compute and" in out and "slowed" not in out, err


def test_a_codec_table_of_no_methods_says_so(home, monkeypatch, capsys):
    path = home / "codecs.json"
    path.write_text(json.dumps({"numel": 10, "methods": {}}))
    code, out, err = _cli(monkeypatch, capsys, [*ADVISE, "--workers", "4", "--agg",
                                                "dense,topk", "--codecs", str(path)])
    assert code == 0, err
    assert "(it has none)" in out and "(it has )" not in out


def test_a_given_negative_zero_is_said_as_zero(home, monkeypatch, capsys):
    code, out, err = _cli(monkeypatch, capsys, ["advise", "--workers", "4", "--agg", "dense",
                                                "--gamma-ns", "-0", "--alpha-us", "-0"])
    assert code == 0, err
    assert "given: α 0 µs, γ 0 ns/B" in out and "-0" not in out


@pytest.mark.parametrize(("command", "option", "said"), [
    ("whatif", "--workers", "each from 1 to 4096"),
    ("whatif", "--workers", "×4: 4, 16, 64"),
    ("whatif", "--bandwidth", "100kbit to 100tbit"),
    ("whatif", "--plot", "the format its extension names"),
    ("advise", "--workers", "1 to 4096"),
    ("advise", "--bandwidth", "100kbit to 100tbit"),
    ("advise", "--density", "in (0, 1]"),
    ("advise", "--rank", "1 to 1024"),
    ("advise", "--ranks-per-node", "1 to 4096"),
    ("advise", "--compute-ms", "at most 1e+09"),
    ("advise", "--calibration", "default: none"),
    ("profile", "--model", "default: none, list the built-in profiles"),
])
def test_the_help_gives_each_option_s_range_and_default(home, monkeypatch, capsys, command,
                                                        option, said):
    monkeypatch.setenv("COLUMNS", "2000")  # one option a line: its help unwrapped
    code, out, err = run_cli(monkeypatch, capsys, [command, "--help"])
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.strip("│ ").startswith(option + " "))
    assert said in line, line


def test_profile_refuses_seq_len_for_a_model_that_reads_no_text(home, monkeypatch, capsys):
    """`profile --model mlp --seq-len 5` measured the MLP as if it had not been given."""
    def measured(*args, **kwargs):
        raise AssertionError("measured")

    monkeypatch.setattr(measure_module, "measure", measured)
    code, _, err = _cli(monkeypatch, capsys, ["profile", "--model", "mlp", "--seq-len", "5"])
    one_line_cli_error(code, err, "--seq-len 5 sets a text model's symbols per sample",
                       "mlp reads digits")


def test_profile_out_of_memory_is_one_line(home, monkeypatch, capsys):
    """`profile --model lstm --batch-size 65536 --seq-len 4096` ended in torch's traceback:
    "DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes"."""
    def measured(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 68719476736 bytes. "
                           "Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(measure_module, "measure", measured)
    code, _, err = _cli(monkeypatch, capsys, ["profile", "--model", "lstm", "--batch-size",
                                              "65536", "--seq-len", "4096"])
    one_line_cli_error(code, err, "--batch-size 65536 --seq-len 4096", "64 GiB",
                       "give a smaller --batch-size or --seq-len")

    def failed(*args, **kwargs):  # another error is not taken for one of memory
        raise RuntimeError("something else")

    monkeypatch.setattr(measure_module, "measure", failed)
    with pytest.raises(RuntimeError, match="something else"):
        _cli(monkeypatch, capsys, ["profile", "--model", "mlp"])
