"""Edges of the command line that the fuzzing of every option (test_cli_fuzz.py) cannot see: an
output that names a file the command reads, options a command would ignore without a word, and
``cluster status --json`` saying what its table says. Each runs the CLI in this process, with
the real work (a simulation, a ranking, a measurement) replaced where it would start."""
import json
from importlib import resources

import pytest
from conftest import Started, one_line_cli_error, run_cli, start_here

from gradwire.cluster.state import Cluster, Host, save_cluster
from gradwire.profiles import BUILTIN_DIR
from gradwire.sim.trace import save, synthetic


@pytest.fixture
def here(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path / "home"))
    (tmp_path / "state").mkdir()
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


# ---- an output that would overwrite the file the command reads


def _profile(path):
    path.write_text(resources.files("gradwire.profiles").joinpath(BUILTIN_DIR, "resnet50.json")
                    .read_text())
    return path


@pytest.mark.parametrize("args", [
    ["--json", "./in.jsonl"],
    ["--timeline", "in.jsonl"],
])
def test_simulate_refuses_to_write_over_its_trace(here, monkeypatch, capsys, args):
    """`simulate --trace in.jsonl --json in.jsonl` ran and replaced the trace with its result."""
    save(synthetic("tiny", [1000, 2000], 0.01, 0.02), here / "in.jsonl")
    before = (here / "in.jsonl").read_text()
    start_here(monkeypatch, "gradwire.sim.simulate", "run_simulation")
    code, _, err = run_cli(monkeypatch, capsys, ["simulate", "--trace", "in.jsonl", *args],
                           started=(Started,))
    one_line_cli_error(code, err, args[0], "--trace")
    assert (here / "in.jsonl").read_text() == before
    # only the same file is refused: a result beside the trace is taken
    code, _, err = run_cli(monkeypatch, capsys, ["simulate", "--trace", "in.jsonl", args[0],
                                                 "out.json"], started=(Started,))
    assert code == 0, err


@pytest.mark.parametrize("command,work", [
    ("advise", ("gradwire.perf.advise", "rank")),
    ("whatif", ("gradwire.perf.whatif", "sweep")),
])
def test_whatif_and_advise_refuse_to_write_over_their_profile(here, monkeypatch, capsys,
                                                              command, work):
    """`advise --model mine.json --json mine.json` replaced the profile with the ranking."""
    before = _profile(here / "mine.json").read_text()
    start_here(monkeypatch, *work)
    code, _, err = run_cli(monkeypatch, capsys, [command, "--model", "mine.json", "--json",
                                                 str(here / "mine.json")], started=(Started,))
    one_line_cli_error(code, err, "--json", "--model")
    assert (here / "mine.json").read_text() == before


def test_calibrate_refuses_to_write_over_its_profile(here, monkeypatch, capsys):
    _profile(here / "mine.json")
    start_here(monkeypatch, "gradwire.jobs", "run_ranks")
    code, _, err = run_cli(monkeypatch, capsys, ["calibrate", "--loopback", "--device", "cpu",
                                                 "--model", "mine.json", "--out", "mine.json"],
                           started=(Started,))
    one_line_cli_error(code, err, "--out", "--model")


# ---- options a command would ignore


@pytest.mark.parametrize("option,value", [
    ("--batch-size", "64"), ("--batch-size", "-5"), ("--iters", "5"), ("--warmup", "0"),
    ("--seq-len", "99999"),
])
def test_profile_without_a_model_refuses_measuring_options(here, monkeypatch, capsys, option,
                                                           value):
    """Without --model, profile lists the built-in profiles: a measuring option given with it
    was ignored, a bad value too, and the command exited 0 (only --out was refused)."""
    code, out, err = run_cli(monkeypatch, capsys, ["profile", option, value])
    one_line_cli_error(code, err, option, "--model")
    assert out == ""
    code, out, err = run_cli(monkeypatch, capsys, ["profile"])  # without them: the list
    assert code == 0 and "resnet50" in out, err


# ---- cluster status: the JSON says what the table says


def _stale_cluster() -> str:
    host = Host(0, "gw0ed6e5-h0", "10.213.9.1", "eth0")
    save_cluster(Cluster("gw0ed6e5", 1e9, [host], subnet=9))  # its namespace is not there
    return "its namespace gw0ed6e5-h0 is gone"


def test_status_json_says_a_cluster_is_stale(here, monkeypatch, capsys):
    """The table marks a stale cluster (nothing can use it); the JSON did not, so a script
    picked it and its run was refused."""
    why = _stale_cluster()
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status"])
    assert code == 0 and why in " ".join(out.split()), err
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status", "--json"])
    assert code == 0, err
    (c,) = json.loads(out)
    assert c["name"] == "gw0ed6e5" and c["stale"] == why


def test_status_table_says_a_cluster_is_still_being_built(here, monkeypatch, capsys):
    """The JSON's ready flag said so; the table showed such a cluster as a usable one."""
    host = Host(0, "gw0ed6e6-h0", "10.213.10.1", "eth0")
    save_cluster(Cluster("gw0ed6e6", 1e9, [host], subnet=10, ready=False))
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status", "--json"])
    (c,) = json.loads(out)
    assert c["ready"] is False and c["stale"] is None
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status"])
    assert code == 0 and "still being built" in " ".join(out.split()), out
