"""What ``benchmarks/perf_validation.py`` does: run the validation, or predict an earlier
result again, then write the result, its figure and the printed report."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from gradwire.bench import provenance
from gradwire.bench.validation.predict import repredict
from gradwire.bench.validation.runs import Plan, run
from gradwire.bench.validation.summary import lines, plot, summarise
from gradwire.check import MAX_SECONDS, is_int, is_real
from gradwire.errors import GradwireError
from gradwire.jsonfile import dumps, read_object, replace_text, shown


def dump(doc: dict, out: Path) -> None:
    """Write ``doc`` to ``out``, replaced whole (:func:`gradwire.jsonfile.replace_text`)."""
    replace_text(out, dumps(doc, indent=1) + "\n")


def partial_path(out: Path) -> Path:
    """Where a validation's result so far is kept while it runs: ``NAME.partial.json``
    beside ``out``."""
    return out.with_name(f"{out.stem}.partial{out.suffix or '.json'}")


def load_result(path: Path) -> dict:
    """A result this script wrote, for ``--repredict``; one-line errors otherwise."""
    doc = read_object(path, f"--repredict {path}")
    missing = [k for k in ("clusters", "profile", "rows", "cores", "density", "rank", "model")
               if k not in doc]
    if missing:
        raise GradwireError(f"--repredict {path}: not a result of this validation (no "
                            f"{', '.join(missing)}; results before the calibration file's "
                            "format 2 cannot be predicted again)")
    # what repredict, summarise and plot read, checked here: a damaged result is one line,
    # not a traceback half way through (a measured time of 0 would divide by zero)
    where = f"--repredict {path}"
    for field, ok, expected in (
            ("model", isinstance(doc["model"], str), "text"),
            ("profile", isinstance(doc["profile"], dict), "an object"),
            ("cores", is_int(doc["cores"], 1), "an integer >= 1"),
            ("density", is_real(doc["density"], 0, 1, above=True), "a number > 0 and <= 1"),
            ("rank", is_int(doc["rank"], 1), "an integer >= 1"),
            ("clusters", isinstance(doc["clusters"], list), "a list"),
            ("rows", isinstance(doc["rows"], list), "a list")):
        _check(where, field, doc[field], ok, expected)
    for i, c in enumerate(doc["clusters"]):
        _configuration(where, f"clusters[{i}]", c)
        _check(where, f"clusters[{i}].calibration", c.get("calibration"),
               isinstance(c.get("calibration"), dict), "an object")
    for i, r in enumerate(doc["rows"]):
        _configuration(where, f"rows[{i}]", r)
        m = r.get("measured")
        _check(where, f"rows[{i}].agg", r.get("agg"), isinstance(r.get("agg"), str), "text")
        _check(where, f"rows[{i}].measured", m, isinstance(m, dict), "an object")
        t = m.get("iteration_s")
        _check(where, f"rows[{i}].measured.iteration_s", t,
               is_real(t, 0, MAX_SECONDS, above=True),
               f"a number of seconds > 0 and <= {MAX_SECONDS:g}")
    return doc


def _check(where: str, field: str, value: object, ok: bool, expected: str) -> None:
    if not ok:
        got = shown(repr(value))
        raise GradwireError(f"{where}: field {field!r} must be {expected}, got "
                            f"{got if len(got) <= 60 else got[:57] + '...'}")


def _configuration(where: str, field: str, d: object) -> None:
    """A cluster record's or a row's link rate and P, ``d`` an object."""
    _check(where, field, d, isinstance(d, dict), "an object")
    assert isinstance(d, dict)
    _check(where, f"{field}.bandwidth", d.get("bandwidth"), isinstance(d.get("bandwidth"), str),
           "text")
    _check(where, f"{field}.workers", d.get("workers"), is_int(d.get("workers"), 2),
           "an integer >= 2")


def write_report(out: Path, console: Console, plan: Plan | None = None,
                 repredict_from: Path | None = None, command: str | None = None) -> dict:
    """Run ``plan`` (:func:`~.runs.run`; the result so far is kept after each cluster in
    :func:`partial_path`, marked ``"incomplete"``, and removed once ``out`` is written), or
    predict the result at ``repredict_from`` again with the model as it is now
    (:func:`~.predict.repredict`, its measurements kept); then summarise, write ``out`` and
    its figure beside it (``.png``), and print the report. A run that fails part way leaves
    ``out`` as it was: kept there, the partial result replaced a whole one with no summary
    and a new date, beside the old figure."""
    if repredict_from is not None:
        doc = load_result(repredict_from)
        try:
            again = repredict(doc)
        except GradwireError as e:
            raise GradwireError(f"--repredict {repredict_from}: {e}") from None
        doc = {**doc, "rows": again,
               "repredicted": {"date": provenance.now(), "commit": provenance.commit(),
                               "command": command}}
    elif plan is not None:
        partial = partial_path(out)
        doc = run(plan, console, command,
                  on_cluster=lambda d: dump({**d, "incomplete": True}, partial))
    else:
        raise GradwireError("write_report needs a plan or a result to predict again")
    if not doc["rows"]:
        raise GradwireError("no rows to report")
    doc["summary"] = summarise(doc)
    dump(doc, out)
    if plan is not None and repredict_from is None:
        partial_path(out).unlink(missing_ok=True)
    plot(doc, out.with_suffix(".png"))
    for line in lines(doc):
        console.print(line, markup=False, highlight=False)
    return doc
