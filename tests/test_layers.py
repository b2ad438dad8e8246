"""Imports point down the layer order of docs/architecture.md, never up, and the three
consumers of the catalogue (hooks, perf, sim) never import one another. Every import counts,
those inside functions too: a lazy import couples the layers all the same."""

import ast
from pathlib import Path

import gradwire

# Lowest first. Modules in one tuple are peers: none may import another.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("check",),
    ("config", "dtypes", "bandwidth", "sizes", "jsonfile", "interrupts", "syncfree",
     "tables"),
    ("data",),
    ("models",),
    ("profiles",),
    ("cluster",),
    ("launcher",),
    ("jobs",),
    ("transport", "rendezvous"),
    ("schedules",),
    ("collectives",),
    ("compress",),
    ("sparse",),
    ("catalogue",),
    ("hooks", "perf", "sim"),
    ("train",),
    ("bench",),
    ("report",),
    ("demo",),
    ("cli",),
    ("entry",),
    ("__main__",),
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}
ROOT = Path(gradwire.__file__).parent


def _unit(module: str) -> str:
    """The layer unit of ``gradwire.x.y``: its top-level package or module, ``x``."""
    return module.split(".")[1]


def _imports(path: Path, me: str) -> set[str]:
    """The gradwire modules the file ``path`` (module ``me``) imports, relative imports
    resolved against its package."""
    package = me.removesuffix(".__init__") if me.endswith(".__init__") else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # "from . import x", "from ..y import z": up level − 1 packages
                parts = package.split(".")
                up = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{up}.{base}" if base else up
            out.add(base)
            # "from gradwire import catalogue" (or "from . import x") imports a module too
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("gradwire.")}


def test_every_module_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert units - {"__init__"} <= set(LEVEL), sorted(units - set(LEVEL) - {"__init__"})


def test_imports_point_down_the_layers():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        me = ".".join(rel.parts)
        if me == "gradwire.__init__":
            continue
        mine = _unit(me)
        for target in _imports(path, me):
            theirs = _unit(target)
            if theirs == mine:
                continue
            if LEVEL[theirs] >= LEVEL[mine]:
                wrong.append(f"{me} imports {target} ({theirs} is not below {mine})")
    assert not wrong, "\n".join(wrong)
