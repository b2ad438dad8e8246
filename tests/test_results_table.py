"""Every figure in docs/results.md and in README.md's results table is in the result file the
row cites, and the docs hold (almost) no clock times or commit ids.

The rule, per row of a docs/results.md table (the tables with a ``key`` column):

- ``result file`` links a committed file. A JSON file is read; the row's ``key`` cell holds
  one or more Python expressions (in backticks, separated by ``;``) over that file: its
  top-level fields are names, ``a.b`` and ``a["b"]`` both index, and ``pick(rows, k=v)`` is
  the one element of a list whose fields match. Every number written in the ``figure`` and
  ``baseline`` cells must be one of the expressions' values rounded as shown (3.08 matches
  3.0849; a value in a fraction is shown in % by a ``* 100`` in its expression), and every
  expression's value must be written there. Numbers glued to a word (fp16, r4) are names,
  not figures.
- The ``date`` cell is the date of a ``date`` field somewhere in the file, and the
  ``command`` cell names a script or command that a ``command`` field of the file ran.
- A row citing a test (``tests/...py``) names test functions in its ``key`` cell
  (``test: name, ...``); each must exist in that file. Its figures are what the test asserts.
- A row whose figure is ``TODO`` is skipped (the figures are still to be filled in).

README.md's results table (the one with a ``file`` column) cites result files that
docs/results.md rows also cite; each of its numbers must be a value of one of those rows' keys.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DOC = ROOT / "docs" / "results.md"
README = ROOT / "README.md"

NUMBER = re.compile(r"(?<![\w.\-−])([-−]?\d+(?:\.\d+)?)(?![\w.])")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]+)`")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
CLOCK = re.compile(r"(?<![\d:.])(?:[01]?\d|2[0-3]):[0-5]\d(?!\d)")
# A commit id as written in prose: 7-40 hex digits, at least one digit and one letter a-f.
COMMIT = re.compile(r"(?<![\w-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")


@dataclass
class Row:
    doc: Path
    line: int
    cells: dict[str, str]

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def cited(self, column: str) -> Path:
        """The file the cell links (a markdown link, relative to the doc) or names in
        backticks (relative to the repository)."""
        cell = self.cells[column]
        link = LINK.search(cell)
        if link:
            return (self.doc.parent / link.group(1).split("#")[0]).resolve()
        code = CODE.search(cell)
        assert code, f"{self}: the {column!r} cell cites no file: {cell!r}"
        return ROOT / code.group(1).split("::")[0]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(doc: Path) -> list[list[Row]]:
    """The markdown tables of ``doc``, each a list of rows keyed by lower-cased header."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    out: list[list[Row]] = []
    i = 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip()):
            header = [h.lower() for h in _cells(lines[i])]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = _cells(lines[i])
                assert len(cells) == len(header), (
                    f"{doc.name}:{i + 1}: {len(cells)} cells under {len(header)} headers")
                rows.append(Row(doc, i + 1, dict(zip(header, cells, strict=True))))
                i += 1
            out.append(rows)
        else:
            i += 1
    return out


def claim_rows() -> list[Row]:
    return [r for t in tables(RESULTS_DOC) for r in t if "key" in r.cells]


def readme_rows() -> list[Row]:
    return [r for t in tables(README) for r in t if {"file", "figure"} <= r.cells.keys()]


# Evaluating a key over a JSON file ------------------------------------------------------------

class Node:
    """A JSON object or list whose fields read as attributes or items."""

    def __init__(self, value: object) -> None:
        self._v = value

    def __getattr__(self, name: str) -> object:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return wrap(self._v[name])  # type: ignore[index]
        except (KeyError, TypeError):
            raise AttributeError(f"no field {name!r}") from None

    def __getitem__(self, key: object) -> object:
        return wrap(self._v[key])  # type: ignore[index]

    def __iter__(self):
        return (wrap(x) for x in self._v)  # type: ignore[union-attr]

    def __len__(self) -> int:
        return len(self._v)  # type: ignore[arg-type]

    def _field(self, name: str) -> object:
        return self._v.get(name) if isinstance(self._v, dict) else None


def wrap(value: object) -> object:
    return Node(value) if isinstance(value, (dict, list)) else value


def pick(rows: Node, **match: object) -> object:
    """The one element of ``rows`` whose fields equal ``match``."""
    found = [r for r in rows if all(r._field(k) == v for k, v in match.items())]
    assert len(found) == 1, f"pick({match}) matched {len(found)} elements"
    return found[0]


HELPERS = {"pick": pick, "median": statistics.median, "mean": statistics.fmean, "len": len,
           "sum": sum, "min": min, "max": max, "abs": abs, "round": round, "any": any,
           "all": all, "sorted": sorted}


def evaluate(expr: str, data: dict) -> float:
    scope = {"__builtins__": {}, **HELPERS, "d": Node(data),
             **{k: wrap(v) for k, v in data.items() if k.isidentifier()}}
    value = eval(expr, scope)  # noqa: S307 - expressions written in our own docs
    assert isinstance(value, (int, float)) and not isinstance(value, bool), (
        f"{expr!r} is {value!r}, not a number")
    return float(value)


def keys(row: Row) -> list[str]:
    return [e.strip() for span in CODE.findall(row.cells["key"]) for e in span.split(";")
            if e.strip()]


def shown(row: Row, *columns: str) -> list[str]:
    text = " ".join(row.cells.get(c, "") for c in columns)
    return NUMBER.findall(text.replace("**", ""))


def matches(text: str, value: float) -> bool:
    """``value`` rounded to the decimals of ``text`` is ``text``."""
    number = float(text.replace("−", "-"))
    decimals = len(text.split(".")[1]) if "." in text else 0
    return math.isclose(value, number, abs_tol=0.5 * 10 ** -decimals + 1e-9)


def strings(data: object, field: str) -> list[str]:
    """Every string value of ``field`` anywhere in ``data``."""
    if isinstance(data, dict):
        out = [v for k, v in data.items() if k == field and isinstance(v, str)]
        return out + [s for v in data.values() for s in strings(v, field)]
    if isinstance(data, list):
        return [s for v in data for s in strings(v, field)]
    return []


def load(path: Path) -> dict:
    assert path.is_file(), f"cited result file {path.relative_to(ROOT)} does not exist"
    return json.loads(path.read_text(encoding="utf-8"))


# The tests ------------------------------------------------------------------------------------

def _params(rows: list[Row]) -> list:
    return [pytest.param(r, id=str(r),
                         marks=[pytest.mark.skip(reason="figures marked TODO in "
                                                        "docs/results.md")]
                         if "TODO" in r.cells.get("figure", "") else [])
            for r in rows]


def test_the_results_doc_and_the_readme_have_result_tables():
    assert len(claim_rows()) >= 10
    assert 1 <= len(readme_rows()) <= 10


@pytest.mark.parametrize("row", _params(claim_rows()))
def test_each_figure_of_a_results_row_is_in_its_file(row: Row):
    path = row.cited("result file")
    if path.suffix == ".py":
        source = path.read_text(encoding="utf-8")
        names = re.findall(r"\btest_\w+", row.cells["key"])
        assert names, f"{row}: a row citing a test names its test functions in 'key'"
        for name in names:
            assert f"def {name}(" in source, f"{row}: {path.name} has no {name}"
        return
    data = load(path)
    values = {e: evaluate(e, data) for e in keys(row)}
    assert values, f"{row}: no key expressions"
    numbers = shown(row, "figure", "baseline, same run")
    for text in numbers:
        assert any(matches(text, v) for v in values.values()), (
            f"{row}: {text} is not a value of any key: {values}")
    for expr, value in values.items():
        assert any(matches(t, value) for t in numbers), (
            f"{row}: {expr} = {value:g} is not written in the figure or baseline")
    dates = {s[:10] for s in strings(data, "date")}
    assert row.cells["date"] in dates, f"{row}: date {row.cells['date']} not in {dates}"
    commands = " ".join(strings(data, "command"))
    for named in CODE.findall(row.cells["command"]):
        program = named.split()[1] if named.startswith("python") else " ".join(named.split()[:2])
        assert program in commands, f"{row}: {program!r} is not a command the file ran"


@pytest.mark.parametrize("row", _params(readme_rows()))
def test_each_figure_of_the_readme_table_is_in_a_results_row(row: Row):
    path = row.cited("file")
    data = load(path)
    same = [r for r in claim_rows() if r.cited("result file") == path]
    assert same, f"{row}: docs/results.md has no row citing {path.relative_to(ROOT)}"
    values = [evaluate(e, data) for r in same for e in keys(r)]
    for text in shown(row, "figure", "baseline, same run"):
        assert any(matches(text, v) for v in values), (
            f"{row}: {text} is not a value of any key of docs/results.md's rows for this file")
    dates = {s[:10] for s in strings(data, "date")}
    assert row.cells["date"] in dates, f"{row}: date {row.cells['date']} not in {dates}"


def _docs() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_the_docs_hold_at_most_five_clock_times_and_two_commit_ids():
    clocks, commits = [], []
    for doc in _docs():
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{doc.relative_to(ROOT)}:{n}"
            clocks += [f"{where} {m}" for m in CLOCK.findall(line)]
            commits += [f"{where} {m}" for m in COMMIT.findall(line)]
    assert len(clocks) <= 5, f"{len(clocks)} clock times: {clocks}"
    assert len(commits) <= 2, f"{len(commits)} commit ids: {commits}"
