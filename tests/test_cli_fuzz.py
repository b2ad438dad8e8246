"""Bad values for every option of every command: the command either refuses the value with one
line on stderr that starts with "gradwire" and exits non-zero, or accepts it; never a
traceback. The options come from the typer app itself, so a new option is fed bad values with
no change here; a new command must say below where its real work starts.

Nothing real starts: each command's real work (ranks, a cluster, a training run, a
simulation) is replaced by raising :class:`Launched`, so an accepted value ends there, and
everything a command does before it is its checking. The CLI runs in this process, on the
click command typer builds, built once (typer rebuilds it on every call, 17 ms of the 17.5 a
refused value takes).
"""
import sys

import pytest
import typer
import typer.main
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradwire import cli
from gradwire.sim.trace import save, synthetic


class Launched(Exception):
    """Raised where a command's real work would start: its checks all passed."""


# Where each command's real work starts, as (module, attribute), replaced by raising Launched.
WORK = {
    "run": [("gradwire.cli.cluster", "launch")],
    "cluster up": [("gradwire.cluster.netns", "reap_stale")],  # its checks done, nothing made
    "cluster down": [("gradwire.cluster.netns", "_teardown")],
    "cluster status": [],
    "models": [],
    "train": [("gradwire.train.job", "train_on")],
    "demo": [("gradwire.demo", "run_demo")],
    "bench": [("gradwire.bench.run", "run_bench")],
    "calibrate": [("gradwire.jobs", "run_ranks")],  # after its cluster opens
    "trace": [("gradwire.sim.record", "record")],
    "simulate": [("gradwire.sim.simulate", "run_simulation")],
    "profile": [("gradwire.profiles.measure", "measure")],
    "whatif": [("gradwire.perf.whatif", "sweep")],
    "advise": [("gradwire.perf.advise", "rank")],
}
# Options each command is given besides the one under test: required ones, and --loopback
# (the loopback cluster costs nothing to make, and has no namespaces to leave behind).
BASE = {
    "run": ["--loopback"], "train": ["--loopback"], "demo": ["--loopback"],
    "bench": ["--loopback"], "calibrate": ["--loopback"],
    "trace": ["-o", "out.jsonl", "--from", "tiny.jsonl"], "simulate": ["--trace", "tiny.jsonl"],
    "profile": ["--model", "mlp"],
}

BAD = ["nan", "inf", "-inf", "-1", "0", "1e309", "99999999999999999999999999",
       "-99999999999999999999", "", " ", "١", "١gbit", "٣٢K", "1_000", "0x10", "½", "1e-320",
       "unknownword", "none", "a=b", "ring:pipeline=-1", "=", "a\nb", "9" * 5000,
       "/dev/full", "/proc/version", "/", "/nonexistent-gw/x", "/etc/passwd/x", "/dev/zero"]
VALUES = st.one_of(
    st.sampled_from(BAD),
    st.floats().map(repr),
    st.integers(-10**40, 10**40).map(str),
    st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
            max_size=12),  # argv cannot hold NUL or lone surrogates
)


def _commands() -> dict:
    out = {}

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                walk(cmd, f"{prefix}{name} ")
            else:
                out[f"{prefix}{name}"] = cmd

    walk(typer.main.get_command(cli.app), "")
    return out


COMMANDS = _commands()
CASES = [pytest.param(name, p, id=f"{name} {p.opts[0] if p.opts else p.name}")
         for name, cmd in COMMANDS.items() for p in cmd.params
         if not getattr(p, "is_flag", False)]


def test_every_command_says_where_its_work_starts():
    assert set(COMMANDS) == set(WORK), "a new command: add where its real work starts to WORK"


@pytest.fixture
def cli_here(monkeypatch, tmp_path):
    """The CLI in this process: the command built once, the real work replaced, files and
    state in ``tmp_path``, and a tiny trace there for the commands that read one."""
    import importlib

    built = typer.main.get_command(cli.app)
    monkeypatch.setattr(typer.main, "get_command", lambda app: built)

    def launched(*args, **kwargs):
        raise Launched

    for calls in WORK.values():
        for module, attr in calls:
            monkeypatch.setattr(importlib.import_module(module), attr, launched)
    monkeypatch.setattr("gradwire.cluster.netns.netns_available", lambda: (True, ""))
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    save(synthetic("tiny", [1000, 2000, 3000], 0.01, 0.02), tmp_path / "tiny.jsonl")
    return monkeypatch


def argv_for(name: str, param, value: str) -> list[str]:
    """``gradwire NAME`` with the command's base options and ``param`` set to ``value``."""
    base = list(BASE.get(name, []))
    if param.param_type_name == "argument":
        return [*name.split(), *base, *(["--"] if name == "run" else []), value]
    flag = param.opts[0]
    for i, word in enumerate(base):  # the option under test replaces the base's value
        if word in param.opts:
            del base[i:i + 2]
            break
    return [*name.split(), *base, flag, value, *(["--", "true"] if name == "run" else [])]


def check(monkeypatch, capsys, name: str, param, value: str) -> None:
    args = argv_for(name, param, value)
    code, out, err = run_cli(monkeypatch, capsys, args, started=(Launched,))
    assert "Traceback" not in err + out, (args, err)
    if code != 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gradwire"), (args, err)


@pytest.mark.parametrize("name,param", CASES)
def test_each_bad_value_is_one_line_or_accepted(cli_here, capsys, name, param):
    for value in BAD:
        check(cli_here, capsys, name, param, value)


@pytest.mark.parametrize("name,param", CASES)
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_random_values_are_one_line_or_accepted(cli_here, capsys, name, param, value):
    check(cli_here, capsys, name, param, value)


def test_the_command_list_has_one_line_per_command():
    """`gradwire --help` lists each command on one line of a 120-column terminal (its own
    --help holds the rest), and every command has its line."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "gradwire.cli", "--help"], capture_output=True,
                         text=True, env={"COLUMNS": "120", "PATH": ""}, timeout=60).stdout
    box = [line for line in out[out.index("Commands"):].splitlines() if line.startswith("│")]
    names = [line.strip("│ ").split()[0] for line in box]
    commands = typer.main.get_command(cli.app).commands  # type: ignore[attr-defined]
    assert sorted(names) == sorted(commands), out
    assert set(cli.SHORT_HELP) == set(commands) - {"cluster"}


def test_version_prints_one_line_and_exits_zero(monkeypatch, capsys):
    import gradwire

    code, out, err = run_cli(monkeypatch, capsys, ["--version"])
    assert (code, out, err) == (0, f"gradwire {gradwire.__version__}\n", "")
