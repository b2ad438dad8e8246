"""The CLI prints paths and files' own words (a profile's or trace's model name, its sources)
as they are, "[...]" included, and errors name what is wrong."""

import json

import pytest
from calibration_doc import doc
from conftest import one_line_cli_error, run_cli

from gradwire import profiles
from gradwire.sim import trace as tr


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    """Lines as long as the paths in them: at 120 columns a long temporary path wrapped
    inside a word, and the printed path could not be found as it is."""
    from gradwire.cli import options
    monkeypatch.setattr(options.console, "width", 1000)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _trace(path, model: str = "toy") -> str:
    path.write_text(tr.dumps(tr.synthetic(model, [4000, 4000, 400], 0.01, 0.02)))
    return str(path)


def test_advise_names_a_calibration_path_with_brackets_as_it_is(tmp_path, monkeypatch, capsys):
    # rich read "[old]" as markup and dropped it: the note named /.../cal.json, another file
    cal = tmp_path / "cal[old].json"
    cal.write_text(json.dumps(doc()))
    code, out, err = run_cli(monkeypatch, capsys, ["advise", "--workers", "4", "--agg",
                                                   "dense,topk", "--calibration", str(cal)])
    assert code == 0, err
    assert f"from {cal};" in _flat(out)


def test_whatif_and_advise_take_a_profile_whose_words_have_brackets(tmp_path, monkeypatch,
                                                                    capsys):
    # a profile file's model name and sources are its own text: "[/b]" was a closing markup
    # tag, and the command failed with rich's MarkupError traceback
    d = json.loads(profiles.load("resnet50").to_text())
    d["model"] = "net[/b]"
    d["sources"]["backward_s"] = "my [red]rig"
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(d))
    for cmd in (["whatif", "--workers", "4", "--bandwidth", "1gbit"], ["advise", "--workers", "4"]):
        code, out, err = run_cli(monkeypatch, capsys, [*cmd, "--model", str(prof), "--agg",
                                                       "dense,topk"])
        assert code == 0, err
        assert "net[/b]" in _flat(out) and "compute: my [red]rig" in _flat(out), cmd


def test_trace_edit_prints_a_model_name_with_brackets(tmp_path, monkeypatch, capsys):
    src = _trace(tmp_path / "t.jsonl", "toy[/b]")
    code, out, err = run_cli(monkeypatch, capsys, ["trace", "--from", src, "-o",
                                                   str(tmp_path / "o.jsonl")])
    assert code == 0, err
    assert "toy[/b]: 3 parameters" in _flat(out)


def test_simulate_names_a_calibration_path_with_brackets_as_it_is(tmp_path, monkeypatch, capsys):
    cal = tmp_path / "cal[old].json"
    cal.write_text(json.dumps(doc()))
    code, out, err = run_cli(monkeypatch, capsys, [
        "simulate", "--trace", _trace(tmp_path / "t.jsonl"), "--workers", "2", "--mechanism",
        "ring", "--iterations", "2", "--calibration", str(cal)])
    assert code == 0, err
    assert f"from {cal}" in _flat(out)


def test_simulate_refuses_an_unknown_table_as_such(tmp_path, monkeypatch, capsys):
    # it said "--mechanism is not used with --table 5, which runs its own mechanisms", of a
    # table that does not exist
    t = _trace(tmp_path / "t.jsonl")
    code, _, err = run_cli(monkeypatch, capsys, ["simulate", "--trace", t, "--table", "5",
                                                 "--mechanism", "ring"])
    one_line_cli_error(code, err, "--table 5: expected one of 4, 6, 8, 9, 10")


def test_simulate_runs_a_trace_named_twice_once(tmp_path, monkeypatch, capsys):
    t = _trace(tmp_path / "t.jsonl")
    out = tmp_path / "o.json"
    code, _, err = run_cli(monkeypatch, capsys, [
        "simulate", "--trace", t, "--trace", str(tmp_path / "." / "t.jsonl"), "--table", "9",
        "--workers", "2", "--iterations", "2", "--json", str(out)])
    assert code == 0, err
    assert len(json.loads(out.read_text())["rows"]) == 1


def test_simulate_and_written_paths_print_brackets_as_they_are(tmp_path, monkeypatch, capsys):
    """The simulator's tables titled with a trace's model name, and every "wrote PATH", read
    "[...]" as markup: "[/b]" ended the command in rich's MarkupError traceback (after the
    file was written), and "[old]" went missing from the path said."""
    folder = tmp_path / "x[/b]"  # a folder "x[" holding "b]"
    folder.mkdir(parents=True)
    out_json = folder / "r[old].json"
    code, out, err = run_cli(monkeypatch, capsys, [
        "simulate", "--trace", _trace(tmp_path / "t.jsonl", "toy[/b]"), "--workers", "2",
        "--mechanism", "ring", "--iterations", "1", "--json", str(out_json)])
    assert code == 0, err
    assert "toy[/b]" in _flat(out) and f"wrote {out_json}" in _flat(out)
    assert json.loads(out_json.read_text())
