"""The validation's summary: the errors, uncontended and contended configurations apart, the
advisor's picks scored against naive baselines, the printed table and the figure."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gradwire.catalogue import METHODS
from gradwire.jsonfile import save_figure

BASELINES = ("dense", "fp16", "topk")  # "always this method"
WITHIN = 0.05  # a pick within 5 % of the fastest measured counts as a good pick


def contended(workers: int, cores: int) -> bool:
    """Whether ``workers`` ranks on one machine of ``cores`` cores share them (P > cores)."""
    return workers > cores


def errors(rows: list[dict]) -> dict | None:
    """Median and max |error| of ``rows`` (None when there are none)."""
    if not rows:
        return None
    abs_err = [abs(r["error"]) for r in rows]
    return {"rows": len(rows), "median_abs_error": statistics.median(abs_err),
            "max_abs_error": max(abs_err)}


def configurations(rows: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """The rows of each (link rate, P), in the order first met."""
    out: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        out.setdefault((r["bandwidth"], r["workers"]), []).append(r)
    return out


def score(groups: list[list[dict]], choose: Callable[[list[dict]], dict | None]) -> dict | None:
    """How a policy ``choose`` (a configuration's rows → the row it picks) does over
    ``groups``: the share of configurations where its pick's measured time is within
    ``WITHIN`` of the fastest measured, and the mean over them of pick / fastest. None
    where it picks nothing in some configuration (its method was not measured there)."""
    ratios = []
    for g in groups:
        pick = choose(g)
        if pick is None:
            return None
        ratios.append(pick["measured_s"] / min(r["measured_s"] for r in g))
    return {"within_5pct": sum(x <= 1 + WITHIN for x in ratios) / len(ratios),
            "mean_ratio": statistics.fmean(ratios)}


def advisor(rows: list[dict]) -> dict:
    """The model's first-ranked method per configuration, scored (:func:`score`) beside
    "always dense", "always fp16" and "always topk". ``better_than_baselines``: the advisor's
    mean ratio is strictly lower than every scored baseline's (a tie is not better)."""
    groups = list(configurations(rows).values())

    order = {m: i for i, m in enumerate(METHODS)}

    def advised(g: list[dict]) -> dict:
        # equal predictions rank as advise ranks them (gradwire.perf.advise.rank): in the
        # catalogue's order, dense first, not in the order the methods were measured
        return min(g, key=lambda r: (r["predicted_s"], order.get(r["agg"], len(order)),
                                     r["agg"]))

    def always(method: str) -> Callable[[list[dict]], dict | None]:
        return lambda g: next((r for r in g if r["agg"] == method), None)

    picks = [{"bandwidth": g[0]["bandwidth"], "workers": g[0]["workers"],
              "advised": advised(g)["agg"],
              "fastest": min(g, key=lambda r: r["measured_s"])["agg"],
              "ratio": advised(g)["measured_s"] / min(r["measured_s"] for r in g)}
             for g in groups]
    mine = score(groups, advised)
    baselines = {m: score(groups, always(m)) for m in BASELINES}
    scored = [b for b in baselines.values() if b is not None]
    assert mine is not None  # the advisor always picks a measured row
    return {"picks": picks, "advisor": mine, "baselines": baselines,
            "better_than_baselines": bool(scored) and all(
                mine["mean_ratio"] < b["mean_ratio"] for b in scored)}


def summarise(doc: dict) -> dict:
    """The summary of a result ``doc``: errors over its uncontended and contended rows
    (P ≤ or > the cores of the machine it ran on, ``doc["cores"]``), and the advisor."""
    rows, cores = doc["rows"], doc["cores"]
    return {"cores": cores,
            "uncontended": errors([r for r in rows if not contended(r["workers"], cores)]),
            "contended": errors([r for r in rows if contended(r["workers"], cores)]),
            **advisor(rows)}


def _pct(x: float) -> str:
    return f"{x:.1%}"


def lines(doc: dict) -> list[str]:
    """The report as text: every row, the errors by group, the advisor beside the
    baselines."""
    s, cores = doc["summary"], doc["cores"]
    out = [f"{'rate':>7} {'P':>2} {'method':>9} {'measured':>9} {'predicted':>9} {'error':>7}"]
    for r in doc["rows"]:
        mark = "  contended" if contended(r["workers"], cores) else ""
        out.append(f"{r['bandwidth']:>7} {r['workers']:>2} {r['agg']:>9} "
                   f"{r['measured_s'] * 1e3:6.1f} ms {r['predicted_s'] * 1e3:6.1f} ms "
                   f"{r['error']:+7.1%}{mark}")
    for name, what in (("uncontended", f"P <= {cores} cores"),
                       ("contended", f"P > {cores} cores")):
        e = s[name]
        out.append(f"{name} ({what}): " + (
            "no rows" if e is None else f"median |error| {_pct(e['median_abs_error'])}, max "
            f"{_pct(e['max_abs_error'])} over {e['rows']} rows"))
    for p in s["picks"]:
        out.append(f"{p['bandwidth']} P={p['workers']}: advised {p['advised']}, fastest "
                   f"measured {p['fastest']} ({p['ratio']:.3f}x)")
    n = len(s["picks"])
    for name, sc in (("advisor", s["advisor"]),
                     *((f"always {m}", b) for m, b in s["baselines"].items())):
        out.append(f"{name:>13}: " + ("not measured in every configuration" if sc is None
                                      else f"within 5 % of the fastest in "
                                      f"{round(sc['within_5pct'] * n)} of {n}, mean "
                                      f"{sc['mean_ratio']:.3f}x the fastest"))
    out.append("advisor strictly better on average (mean ratio) than every baseline: "
               + ("yes" if s["better_than_baselines"] else "no"))
    return out


def plot(doc: dict, path: Path) -> None:
    """Predicted against measured iteration, one colour per method, one marker per link
    rate, contended configurations hollow."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cores = doc["rows"], doc["cores"]
    fig, ax = plt.subplots(figsize=(6, 5))
    aggs = list(dict.fromkeys(r["agg"] for r in rows))
    rates = list(dict.fromkeys(r["bandwidth"] for r in rows))
    for i, agg in enumerate(aggs):
        # markers repeat past the fifth rate (its label tells them apart): zip stopped there
        # and left every row of a sixth rate out of the figure
        for rate, marker in zip(rates, itertools.cycle("os^Dv"), strict=False):
            for hot in (False, True):
                pts = [(r["measured_s"] * 1e3, r["predicted_s"] * 1e3) for r in rows
                       if r["agg"] == agg and r["bandwidth"] == rate
                       and contended(r["workers"], cores) == hot]
                if pts:
                    ax.scatter(*zip(*pts, strict=True), marker=marker, zorder=3,
                               facecolors="none" if hot else f"C{i}", edgecolors=f"C{i}",
                               label=None if hot else f"{agg}, {rate}")
    lim = [min(min(r["measured_s"], r["predicted_s"]) for r in rows) * 1e3 * 0.8,
           max(max(r["measured_s"], r["predicted_s"]) for r in rows) * 1e3 * 1.2]
    xs = np.geomspace(*lim, 50)
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * 0.85, xs * 1.15, color="0.9", label="±15 %", zorder=1)
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="measured iteration (ms)",
           ylabel="predicted iteration (ms)")
    ticks = [t for t in (5, 10, 20, 30, 50, 100, 200, 300, 500, 1000, 2000)
             if lim[0] <= t <= lim[1]]
    for axis in (ax.xaxis, ax.yaxis):  # plain labels, none on the minor ticks (they collide)
        axis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        axis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    s = doc["summary"]
    title = [f"{name} {_pct(e['median_abs_error'])} / {_pct(e['max_abs_error'])}"
             for name, e in (("uncontended", s["uncontended"]), ("contended", s["contended"]))
             if e is not None]
    ax.set_title(f"{doc['model']}, median / max |error|: " + ", ".join(title)
                 + " (hollow: contended)", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
