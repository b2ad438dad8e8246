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


def test_a_missing_name_is_caught():
    import gradwire.bench.rank as rank

    assert not _has(rank, "gradwire.bench.rank", "no_such_helper")
    assert _has(importlib.import_module("gradwire.bench"), "gradwire.bench", "calibrate")
