"""What ``benchmarks/perf_validation.py`` does: run the validation, or predict an earlier
result again, then write the result, its figure and the printed report."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from gradwire.bench import provenance
from gradwire.bench.validation.predict import repredict
from gradwire.bench.validation.runs import Plan, run
from gradwire.bench.validation.summary import lines, plot, summarise
from gradwire.errors import GradwireError
from gradwire.jsonfile import dumps, read_object, replace_text


def dump(doc: dict, out: Path) -> None:
    """Write ``doc`` to ``out``, replaced whole (:func:`gradwire.jsonfile.replace_text`)."""
    replace_text(out, dumps(doc, indent=1) + "\n")


def load_result(path: Path) -> dict:
    """A result this script wrote, for ``--repredict``; one-line errors otherwise."""
    doc = read_object(path, f"--repredict {path}")
    missing = [k for k in ("clusters", "profile", "rows", "cores", "density", "rank")
               if k not in doc]
    if missing:
        raise GradwireError(f"--repredict {path}: not a result of this validation (no "
                            f"{', '.join(missing)}; results before the calibration file's "
                            "format 2 cannot be predicted again)")
    return doc


def write_report(out: Path, console: Console, plan: Plan | None = None,
                 repredict_from: Path | None = None, command: str | None = None) -> dict:
    """Run ``plan`` (:func:`~.runs.run`; the result so far is kept in ``out`` after each
    cluster), or predict the result at ``repredict_from`` again with the model as it is now
    (:func:`~.predict.repredict`, its measurements kept); then summarise, write ``out`` and
    its figure beside it (``.png``), and print the report."""
    if repredict_from is not None:
        doc = load_result(repredict_from)
        doc = {**doc, "rows": repredict(doc),
               "repredicted": {"date": provenance.now(), "commit": provenance.commit(),
                               "command": command}}
    elif plan is not None:
        doc = run(plan, console, command, on_cluster=lambda d: dump(d, out))
    else:
        raise GradwireError("write_report needs a plan or a result to predict again")
    if not doc["rows"]:
        raise GradwireError("no rows to report")
    doc["summary"] = summarise(doc)
    dump(doc, out)
    plot(doc, out.with_suffix(".png"))
    for line in lines(doc):
        console.print(line, markup=False, highlight=False)
    return doc
