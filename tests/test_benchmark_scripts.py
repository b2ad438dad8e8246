"""The committed benchmark scripts import only what the library has: they run for hours and
outside CI, so a name removed from gradwire must fail here, not in the next benchmark run."""
import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py")) + sorted(BENCHMARKS.glob("ranks/*.py"))


def _gradwire_imports(path: Path) -> list[tuple[str, str]]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gradwire"):
            names += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            names += [(a.name, "") for a in node.names if a.name.startswith("gradwire")]
    return names


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) > 20 and any(p.parent.name == "ranks" for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_gradwire_name_a_benchmark_imports_exists(path):
    for module, name in _gradwire_imports(path):
        mod = importlib.import_module(module)
        if name:
            assert _has(mod, module, name), f"{path.name}: from {module} import {name}"


def _has(mod, module: str, name: str) -> bool:
    if hasattr(mod, name):
        return True
    try:  # a submodule not imported yet
        return importlib.util.find_spec(f"{module}.{name}") is not None
    except ModuleNotFoundError:
        return False


MAINS = [p for p in sorted(BENCHMARKS.glob("*.py")) if 'if __name__ == "__main__"' in p.read_text()]


@pytest.mark.parametrize("path", MAINS, ids=lambda p: p.name)
def test_every_script_answers_help_and_cleans_up_on_signals(path):
    """``--help`` must print usage, not start an hour of measurement: every script parses its
    arguments with argparse. A script makes clusters only with ``ephemeral_cluster``, which
    removes them on SIGTERM and SIGHUP too (a bare cluster_up would leave them up)."""
    tree = ast.parse(path.read_text(), str(path))
    calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
             for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "ArgumentParser" in calls, f"{path.name}: no argparse, so --help would run it"
    assert "cluster_up" not in calls, f"{path.name}: use ephemeral_cluster, not cluster_up"


def test_the_scripts_with_a_main_are_found():
    assert len(MAINS) > 20 and BENCHMARKS / "ab.py" not in MAINS


def test_a_missing_name_is_caught():
    import gradwire.bench.rank as rank

    assert not _has(rank, "gradwire.bench.rank", "no_such_helper")
    assert _has(importlib.import_module("gradwire.bench"), "gradwire.bench", "calibrate")


def test_ddp_hooks_runs_and_our_dense_hook_trains_as_ddp_does(tmp_path):
    """benchmarks/ddp_hooks.py end to end on loopback (2 ranks, a tiny model): every hook is
    timed and trained, and gradwire's dense hook reaches the loss of DDP's own allreduce; with
    --profile, each hook's extra profiled step is kept, under its own name (a variant's,
    "<hook>/nocheck", had been filed under the plain hook's), and leaves the losses as they
    were."""
    import json
    import subprocess
    import sys

    out = tmp_path / "ddp_hooks.json"
    hooks = "torch:allreduce,gradwire:dense,gradwire:dense/nocheck,torch:fp16,gradwire:topk-0.1"
    subprocess.run([sys.executable, str(BENCHMARKS / "ddp_hooks.py"), "--loopback", "--hosts",
                    "2", "--model", "mlp-tiny", "--rounds", "2", "--warmup", "1", "--iters", "2",
                    "--hooks", hooks, "--profile", "3", "--out", str(out)], check=True,
                   capture_output=True, timeout=300)
    doc = json.loads(out.read_text())
    summary = doc["summary"]
    assert set(summary) == set(hooks.split(",")) and {"date", "machine", "commit"} <= set(doc)
    assert set(doc["profiles"]) == set(hooks.split(","))
    assert summary["gradwire:dense"]["loss"] == summary["torch:allreduce"]["loss"]
    assert all(r["median_s"] > 0 and len(r["slowest_s"]) == 2 for r in doc["rows"])
    assert "gradwire:dense vs torch:allreduce" in doc["speed_ratios"]
    profiles = doc["profiles"]
    assert set(profiles) == set(hooks.split(","))
    assert all(any("Name" in x for x in t) and any("total" in x for x in t)
               for t in profiles.values())


@pytest.mark.parametrize("hook, says", [
    ("torch:bf16", "'torch:bf16' is not a hook"),
    ("gradwire:int9", "unknown method 'int9'"),
    ("gradwire:fp16/fast", "the variant after '/' must be nocheck, one or thread"),
])
def test_ddp_hooks_refuses_a_hook_it_cannot_run_in_one_line(hook, says):
    """Before any rank starts: one line, no traceback from the ranks."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(BENCHMARKS / "ddp_hooks.py"), "--loopback",
                        "--hooks", f"torch:allreduce,{hook}"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_powersgd_accuracy_trains_every_hook(tmp_path):
    """benchmarks/powersgd_accuracy.py end to end, small: 2 loopback ranks, rank 1, one
    epoch; every hook reaches an accuracy above chance on digits' 10 classes."""
    import json
    import subprocess
    import sys

    out = tmp_path / "powersgd.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "powersgd_accuracy.py"), "--worlds", "2",
                    "--ranks", "1", "--epochs", "1", "--out", str(out)], check=True,
                   capture_output=True, timeout=300)
    doc = json.loads(out.read_text())
    assert [r["hook"] for r in doc["rows"]] == ["dense", "torch:powersgd-r1",
                                                "gradwire:powersgd-r1",
                                                "gradwire:powersgd-r1/default"]
    assert all(r["test_accuracy"] > 0.2 for r in doc["rows"]) and "commit" in doc
