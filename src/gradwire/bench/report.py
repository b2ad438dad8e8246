"""Turn ``gradwire bench`` rows into nccl-tests columns and the model's prediction.

algbw = S / t (GB = 10⁹ bytes; S is the whole buffer, the gathered output for allgather);
busbw = algbw × factor: allreduce 2(p−1)/p, allgather and reduce-scatter (p−1)/p, broadcast
and reduce 1. The prediction is the schedule's cost under calibrated α, β, γ, plus the cost
of the call header's exchange (:func:`gradwire.collectives.agree.header_spec`) where the
timed call made one (the row's ``header``; gradwire's calls do unless
GRADWIRE_CHECK_CALLS=0), for calls back to back as bench times them: on shaped links each link
carries its token-bucket credit from one call into the next
(:func:`gradwire.schedules.cost.back_to_back`). The built-in allreduce row is predicted as a
ring (gloo's allreduce is a ring), other built-ins are not. An average (``redop`` avg) adds
one pass over the part the slowest rank divides, at γ per byte: the whole buffer for
allreduce and reduce (the root), 1/P of the input for reduce-scatter.
"""

from __future__ import annotations

import math

from rich import box
from rich.table import Table

from gradwire.bench.spec import BUILTIN
from gradwire.collectives.agree import header_spec
from gradwire.schedules import registry
from gradwire.schedules.cost import CostParams, back_to_back
from gradwire.sizes import format_size

BUSBW_FACTOR = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "reducescatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


def predict(row: dict, p: int, params: CostParams) -> float | None:
    """The schedule's cost for this row's algorithm, parameters, size and element type."""
    algo, algo_params = row["name"], row["params"]
    if algo == BUILTIN:
        if row["collective"] != "allreduce":
            return None
        algo, algo_params = "ring", {}
    itemsize = row["bytes"] // row["count"] if row["count"] else 4
    # The API builds with the buffer's itemsize (LP's auto block depends on it): so does this.
    s = registry.schedule(row["collective"], algo, p, row["count"], 0,
                          **{"itemsize": itemsize, **algo_params})
    parts = [(s, itemsize)]
    if row.get("header"):
        collective, h_algo, count, h_params = header_spec(p)
        parts.insert(0, (registry.schedule(collective, h_algo, p, count, **h_params), 1))
    divide = 0.0
    if row.get("redop") == "avg":
        divided = row["bytes"] // p if row["collective"] == "reducescatter" else row["bytes"]
        divide = params.gamma * divided
    return back_to_back(parts, params) + divide


def annotate(rows: list[dict], p: int, params: CostParams | None) -> None:
    """Add algbw, busbw (GB/s and Gbit/s), predicted time and its error to every row."""
    for r in rows:
        t = r["time_s"]
        algbw = r["bytes"] / t / 1e9 if t > 0 else 0.0
        r["algbw_GBps"] = algbw
        r["busbw_GBps"] = algbw * BUSBW_FACTOR[r["collective"]](p)
        r["busbw_Gbitps"] = r["busbw_GBps"] * 8
        pred = predict(r, p, params) if params else None
        r["predicted_s"] = pred
        # a call with nothing to send (one rank) is priced at 0 s: the model has no error to
        # show for the local copy it times, not -100 %
        r["prediction_error"] = (pred - t) / t if pred and t > 0 else None


def rate_text(x: float, decimals: int) -> str:
    """A bandwidth to ``decimals`` places, or to more where fewer would keep under three
    significant digits: on a slow link every row read alike (1 Mbit/s: busbw 0.001 Gbit/s,
    algbw 0.0001 GB/s, whatever the algorithm)."""
    if x > 0 and math.isfinite(x):
        decimals = max(decimals, 2 - math.floor(math.log10(x)))
    return f"{x:.{decimals}f}"


def table(rows: list[dict], title: str) -> Table:
    # nccl-tests' columns, each unit on a second header line, one space between columns and
    # no rules but the header's: a row of 2 GiB in a 1-byte dtype (10-digit count, 10-digit
    # #wrong), a 16-character algorithm spec and a 30 s call fits 120 columns; where a
    # terminal is narrower a figure folds onto a second line, never cut to "…"
    tb = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False)
    for col in ("size\n(B)", "count\n(elements)", "type", "redop", "algo", "time\n(us)",
                "algbw\n(GB/s)", "busbw\n(GB/s)", "busbw\n(Gbit/s)", "model\n(us)",
                "model\nerr", "#wrong"):
        tb.add_column(col, justify="left" if col == "algo" else "right", overflow="fold")
    for r in rows:
        pred, err = r["predicted_s"], r["prediction_error"]
        tb.add_row(format_size(r["bytes"]), str(r["count"]), r["type"], r.get("redop", "-"),
                   r["algo"],
                   f"{r['time_s'] * 1e6:.1f}", rate_text(r["algbw_GBps"], 4),
                   rate_text(r["busbw_GBps"], 4), rate_text(r["busbw_Gbitps"], 3),
                   "-" if pred is None else f"{pred * 1e6:.1f}",
                   "-" if err is None else f"{err * 100:+.1f}%", str(r["wrong"]))
    return tb


def footer(rows: list[dict]) -> list[str]:
    """nccl-tests' closing lines: elements that came out wrong (every row, every rank), and
    each algorithm's bus bandwidth averaged over its rows (every size, dtype and op)."""
    wrong = sum(r["wrong"] for r in rows)
    lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    by_algo: dict[str, list[float]] = {}
    for r in rows:
        by_algo.setdefault(r["algo"], []).append(r["busbw_Gbitps"])
    width = max((len(a) for a in by_algo), default=0)
    lines += [f"# Avg bus bandwidth    : {a:<{width}} {rate_text(sum(v) / len(v), 3)} Gbit/s"
              for a, v in by_algo.items()]
    return lines


def wrong_rows(rows: list[dict]) -> str | None:
    """None when every row was right, else a one-line account of the wrong ones."""
    bad = [r for r in rows if r["wrong"]]
    if not bad:
        return None
    # the dtype and op of a row where several ran (--dtype, --op lists): else rows read alike
    kinds = [k for k in ("type", "redop") if len({r.get(k) for r in rows}) > 1]
    shown = ", ".join(f"{' '.join([r['algo'], *(str(r[k]) for k in kinds)])} at "
                      f"{format_size(r['bytes'])} ({r['wrong']} elements)" for r in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return (f"{len(bad)} of {len(rows)} rows gave a wrong result: {shown}{more} (every rank "
            "checks its output against the known answer after the last timed call)")
