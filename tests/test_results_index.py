"""benchmarks/results/ stays indexed, and every benchmark writes into its own folder there.

(a) benchmarks/results/README.md lists every file under benchmarks/results/*/ and only files
    that exist, and is what ``python benchmarks/index.py`` writes now (no stale provenance);
(b) every benchmark script's default output (its module-level ``OUT``, which its ``--out``
    defaults to) lies in benchmarks/results/<script name>/; a script with none is named in
    NO_DEFAULT_OUT;
(c) every ``results/...`` path that benchmarks/, src/ and tests/ name is in a benchmark's
    folder (no flat results/<file> left).
(d) every result file is strict JSON (no NaN or Infinity).
Reads files only: no benchmark runs, nothing imported but benchmarks/index.py."""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from conftest import strict_json

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
README = RESULTS / "README.md"
HELPERS = {"ab", "index"}  # modules in benchmarks/ that are not benchmarks
# Scripts that write no file unless told where: why.
NO_DEFAULT_OUT = {
    "compress_ab": "--out is required (an A/B names its change)",
    "decode_gather_cuda": "prints its table",
    "hook_equivalence": "writes fingerprints only with --out (--compare alone checks)",
    "topk_select": "--out is required (named for the device it ran on)",
}
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.stem not in HELPERS)


def _index():
    spec = importlib.util.spec_from_file_location("benchmarks_index", BENCHMARKS / "index.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _listed() -> list[str]:
    """The files README.md's table links to, relative to benchmarks/results/."""
    rows = [line for line in README.read_text().splitlines() if line.startswith("| ")]
    links = [re.findall(r"\]\(([^)]+)\)", line) for line in rows[1:]]  # [0]: the header
    return [link for found in links for link in found if not link.startswith("../")]


def test_index_lists_every_result_file_and_only_existing_ones():
    on_disk = {f.relative_to(RESULTS).as_posix() for f in _index().result_files(RESULTS)}
    listed = _listed()
    assert len(listed) == len(set(listed)), "a file is listed twice"
    missing = sorted(on_disk - set(listed))
    gone = sorted(set(listed) - on_disk)
    assert not missing, f"not in benchmarks/results/README.md: {missing}; run " \
                        "python benchmarks/index.py"
    assert not gone, f"listed in benchmarks/results/README.md but not there: {gone}"
    assert on_disk, "no result files found"


def test_result_files_are_strict_json():
    """No NaN or Infinity in a committed result file: JSON has neither, and jq, JavaScript
    and most libraries refuse a file that holds them (write null: gradwire.jsonfile.dumps)."""
    bad = []
    for f in sorted(RESULTS.rglob("*.json")):
        try:
            strict_json(f.read_text())
        except ValueError as e:
            bad.append(f"{f.relative_to(RESULTS)}: {e}")
    assert not bad, bad


def test_index_is_what_index_py_writes():
    assert README.read_text() == _index().render(RESULTS), \
        "benchmarks/results/README.md is stale: run python benchmarks/index.py"


def _value(node: ast.expr, env: dict, script: Path):
    """A module-level path expression: str constants, names bound before, __file__,
    Path(...), .parent and /."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return script if node.id == "__file__" else env[node.id]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "Path" and len(node.args) == 1 and not node.keywords):
        return Path(_value(node.args[0], env, script))
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        return Path(_value(node.value, env, script)).parent
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return Path(_value(node.left, env, script)) / _value(node.right, env, script)
    raise ValueError(ast.unparse(node))


def _module_paths(tree: ast.Module, script: Path) -> dict:
    env: dict = {}
    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            try:
                env[stmt.targets[0].id] = _value(stmt.value, env, script)
            except (ValueError, KeyError):
                pass
    return env


def _out_defaults(tree: ast.Module) -> list[ast.expr | None]:
    """The default= of every add_argument("--out", ...) (None where it has none)."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "--out"):
            found.append(next((k.value for k in node.keywords if k.arg == "default"), None))
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_default_output_is_in_the_benchmarks_folder(script: Path):
    tree = ast.parse(script.read_text())
    out = _module_paths(tree, script.resolve()).get("OUT")
    defaults = _out_defaults(tree)
    if script.stem in NO_DEFAULT_OUT:
        assert out is None and all(d is None for d in defaults), \
            f"{script.name} has a default output now: drop it from NO_DEFAULT_OUT"
        return
    assert out is not None, (f"{script.name}: no module-level OUT = HERE / 'results' / "
                             f"'{script.stem}' / 'latest.json' (or name it in NO_DEFAULT_OUT)")
    folder = RESULTS / script.stem
    assert Path(out).resolve().parent == folder.resolve(), \
        f"{script.name} writes {out}, not into {folder.relative_to(ROOT)}/"
    used = any(isinstance(n, ast.Name) and n.id == "OUT" and isinstance(n.ctx, ast.Load)
               for n in ast.walk(tree))
    for d in defaults:  # default=OUT, or none and OUT chosen in the code (by --device, ...)
        assert (isinstance(d, ast.Name) and d.id == "OUT") or (d is None and used), \
            f"{script.name}: --out defaults to {d and ast.unparse(d)}, not OUT"


def test_no_default_out_names_real_scripts():
    assert set(NO_DEFAULT_OUT) <= {s.stem for s in SCRIPTS}


# results/<folder>/... or results/<file>, after "benchmarks/" or where a path starts
PATH = re.compile(r"(?:\bbenchmarks/|(?<![\w./$-]))results/(\w[\w.-]*)(/?)")


def test_named_result_paths_are_in_a_benchmarks_folder():
    sources = [*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("*.sh"),
               *BENCHMARKS.glob("ranks/*.py"), *ROOT.glob("src/**/*.py"),
               *ROOT.glob("src/**/*.json"), *ROOT.glob("tests/**/*.py")]
    bad = []
    for path in sources:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for name, slash in PATH.findall(line):
                if slash and (RESULTS / name).is_dir() or not slash and name == "README.md":
                    continue
                bad.append(f"{path.relative_to(ROOT)}:{n}: results/{name}{slash}")
    assert not bad, "paths outside a benchmark's folder in benchmarks/results/:\n" + \
                    "\n".join(bad)
