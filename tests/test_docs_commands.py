"""The command lines README.md and docs/*.md show exist as written: every `gradwire` command
and option they type is one the CLI takes, every option of a `python benchmarks/...` line is
one its script takes, and the defaults the guides state are the CLI's. Read from the CLI's own
click commands (what `--help` prints), so a renamed or removed option fails here; nothing runs."""
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import typer

from gradwire.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")


def _commands() -> dict[str, Any]:
    """Every command by the words that name it: "train", "cluster up", ... (typer's own
    click commands: a group has ``commands``)."""
    group = typer.main.get_command(app)
    out: dict[str, Any] = {}
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        if hasattr(cmd, "commands"):
            out.update({f"{name} {sub}": c for sub, c in cmd.commands.items()})
        out[name] = cmd
    return out


COMMANDS = _commands()


def _options(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))} | {
        "--help"}


def _param(command: str, option: str) -> Any:
    (param,) = [p for p in COMMANDS[command].params if option in p.opts]
    return param


def _prose(doc: str) -> str:
    """A guide's text with every run of whitespace one space, so a phrase matches across the
    page's line breaks."""
    return " ".join((ROOT / doc).read_text().split())


def _segments(text: str) -> list[str]:
    """Each shell command of a line: split at &&, ;, | and a comment, up to a `--` that
    hands the rest to the program run."""
    text = text.split(" #")[0]
    return [s.strip().split(" -- ")[0] for s in re.split(r"&&|;|\|", text)]


def _documented() -> list[tuple[str, str, bool]]:
    """(where, command text after "gradwire ", strict) for every gradwire command line of
    the docs: strict for code blocks (the word after gradwire must be a command), not for
    inline code, which also quotes output such as `gradwire run: rank 2 stalled`."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        name = str(doc.relative_to(ROOT))
        for lang, block in FENCE.findall(text):
            if lang not in ("bash", "text", ""):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                line = line.removeprefix("$ ").strip()
                for seg in _segments(line):
                    if seg.startswith("gradwire "):
                        found.append((name, seg[len("gradwire "):], True))
        prose = FENCE.sub("", text)
        for span in INLINE.findall(prose):
            span = " ".join(span.split())
            for seg in _segments(span):
                if seg.startswith("gradwire "):
                    found.append((name, seg[len("gradwire "):], False))
    return found


def _resolve(rest: str) -> tuple[str | None, str]:
    words = rest.split()
    if len(words) >= 2 and f"{words[0]} {words[1]}" in COMMANDS:
        return f"{words[0]} {words[1]}", " ".join(words[2:])
    if words and words[0] in COMMANDS:
        return words[0], " ".join(words[1:])
    return None, rest


def test_the_docs_show_gradwire_command_lines():
    strict = [r for r in _documented() if r[2]]
    assert len(strict) >= 40
    assert {_resolve(r)[0] for _, r, _ in strict} >= {
        "run", "models", "train", "demo", "bench", "calibrate", "trace", "simulate",
        "profile", "whatif", "advise", "cluster up", "cluster down", "cluster status"}


@pytest.mark.parametrize("where,rest,strict", _documented(),
                         ids=[f"{w}:{r[:40]}" for w, r, _ in _documented()])
def test_a_documented_gradwire_command_and_its_options_exist(where, rest, strict):
    command, args = _resolve(rest)
    if command is None:
        word = rest.split()[0] if rest.split() else ""
        assert not (strict or (re.fullmatch(r"[a-z]+", word) and "--" in rest)), \
            f"{where}: `gradwire {rest}`: no command {word!r}"
        return
    unknown = set(OPTION.findall(args)) - _options(COMMANDS[command])
    assert not unknown, f"{where}: `gradwire {command}` has no option {sorted(unknown)}"


def _benchmark_lines() -> list[tuple[str, str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text().replace("\\\n", " ")
        for m in re.finditer(r"python3? (benchmarks/[\w/]+\.py)([^`\n]*)", text):
            out.append((str(doc.relative_to(ROOT)), m.group(1), m.group(2).split(" #")[0]))
    return out


def test_every_documented_benchmark_script_and_option_exists():
    lines = _benchmark_lines()
    assert len(lines) >= 20
    for where, script, rest in lines:
        path = ROOT / script
        assert path.is_file(), f"{where}: {script} does not exist"
        src = path.read_text()
        for opt in OPTION.findall(rest):
            if opt.startswith("--"):
                assert f'"{opt}"' in src or f"'{opt}'" in src, \
                    f"{where}: {script} takes no {opt}"


# (command, option, the default the docs state, where they state it)
DEFAULTS = [
    ("run", "--hosts", 2, None),
    ("run", "--bandwidth", "1gbit", None),
    ("run", "--timeout", None, "README.md"),  # "--timeout bounds the whole run": no limit
    ("cluster up", "--hosts", 4, None),
    ("train", "--rank", None, "docs/training.md"),  # "leaving it out is not --rank 4"
    ("train", "--warmup", True, "docs/training.md"),  # "--warmup (the default of train"
    ("train", "--mode", "bucket", "docs/training.md"),
    ("bench", "--warmup", 1, "docs/algorithms.md"),  # "after --warmup untimed calls (1)"
    ("bench", "--iters", 5, "docs/algorithms.md"),   # "--iters timed runs (5)"
    ("bench", "--batch", 2, "docs/algorithms.md"),   # "--batch calls back to back (2"
    ("bench", "--interleave", False, "docs/algorithms.md"),
    ("bench", "--builtin", True, None),  # README: "torch.distributed's own ... a baseline row"
    ("bench", "--device", "cpu", "README.md"),       # "--device cuda runs over NCCL"
    ("simulate", "--iterations", 3, "docs/simulator.md"),  # "--iterations, default 3"
    ("simulate", "--emulate", False, "docs/simulator.md"),
    ("whatif", "--reference", "v100", "docs/performance-model.md"),
    ("advise", "--reference", "v100", "docs/performance-model.md"),
    ("whatif", "--intra-bandwidth", "100gbit", "docs/performance-model.md"),
    ("advise", "--intra-bandwidth", "100gbit", "docs/performance-model.md"),
    ("whatif", "--agg", "dense,fp16,topk,gtopk,powersgd,signsgd", "docs/performance-model.md"),
    ("demo", "--agg", "dense,topk,gtopk", "docs/training.md"),
    ("demo", "--plot", "gradwire-demo.png", "docs/training.md"),
] + [(c, "--mtu", 1500, "docs/cluster.md")
     for c in ("run", "train", "demo", "bench", "calibrate", "cluster up")]


@pytest.mark.parametrize("command,option,default,doc", DEFAULTS,
                         ids=[f"{c} {o}" for c, o, _, _ in DEFAULTS])
def test_a_documented_default_is_the_clis(command, option, default, doc):
    assert _param(command, option).default == default
    if doc is not None:
        assert option in (ROOT / doc).read_text(), f"{doc} no longer mentions {option}"


def test_the_defaults_the_guides_give_without_an_option_default():
    """Defaults `--help` shows in brackets (the demo's settings, the simulator's host
    costs, PowerSGD's rank) come from the library: the docs' values are its values."""
    from gradwire.compress import COMPRESSORS
    from gradwire.config import DEFAULT_ALPHA_S
    from gradwire.demo import DEMO
    from gradwire.sim.cluster import DEFAULT_ALPHA_S as SIM_ALPHA
    from gradwire.sim.cluster import DEFAULT_LATENCY_S

    training = _prose("docs/training.md")
    assert ("the digits MLP, density 0.001 with the paper's warm-up, `--mode model`, 20 epochs,"
            " batch 8 per rank, lr 0.02, momentum 0.9, seed 0") in training
    assert (DEMO.model, DEMO.density, DEMO.mode, DEMO.warmup, DEMO.epochs, DEMO.batch_size,
            DEMO.lr, DEMO.momentum, DEMO.seed) == ("mlp", 0.001, "model", True, 20, 8, 0.02,
                                                   0.9, 0)
    assert "sets PowerSGD's rank, 4 by default" in training
    assert inspect.signature(COMPRESSORS["powersgd"]).parameters["rank"].default == 4
    simulator = _prose("docs/simulator.md")
    assert "| `--alpha-us` (`alpha`) | 10 µs per message" in simulator
    assert "| `--latency-us` (`latency`) | 1.5 µs per host" in simulator
    assert (SIM_ALPHA, DEFAULT_LATENCY_S) == (10e-6, 1.5e-6)
    assert "the model is nominal (α 50 µs, the link rate, γ 0)" in _prose("docs/algorithms.md")
    assert DEFAULT_ALPHA_S == 50e-6


def test_the_documented_environment_defaults(monkeypatch):
    from gradwire import config

    readme, reliability = _prose("README.md"), _prose("docs/reliability.md")
    assert "`GRADWIRE_TIMEOUT` (60 s)" in readme
    assert "`GRADWIRE_TIMEOUT` seconds (default 60, from 0.001 to 2e6" in reliability
    assert config.timeout({}) == 60
    assert (config.MIN_TIMEOUT_S, config.MAX_TIMEOUT_S) == (0.001, 2e6)
    for name in ("GRADWIRE_HOME", "GRADWIRE_STATE_DIR", "GRADWIRE_CHECK_CALLS"):
        monkeypatch.delenv(name, raising=False)
    assert config.check_calls() is True  # "It is on by default"
    assert "It is on by default; turn it off with `GRADWIRE_CHECK_CALLS=0`" in reliability
    assert config.state_dir() == Path("/run/gradwire")
    assert "`/run/gradwire/<name>.json` (override with `GRADWIRE_STATE_DIR`)" in _prose(
        "docs/cluster.md")
    assert config.home() == Path("~/.cache/gradwire").expanduser()
    assert "`$GRADWIRE_HOME/calibration/` (default `~/.cache/gradwire`)" in _prose(
        "docs/algorithms.md")
