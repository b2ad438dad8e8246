"""What a person reads from the simulator: result tables (and the paper's), sweeps with plots,
and a Perfetto / chrome://tracing timeline."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.table import Table

from gradwire.jsonfile import dumps, replace_text, save_figure
from gradwire.sim import mechanisms
from gradwire.sim.cluster import SimCluster, SimResult
from gradwire.sim.trace import Trace, add_layers, scale_compute
from gradwire.tables import wide_table


def host_costs(c: SimCluster) -> str:
    """``α 10 µs, latency 1.5 µs/host``: the cluster's per-message costs, for titles, and its
    γ per byte reduced where it is not 0 (``--calibration``'s)."""
    gamma = f", γ {c.gamma * 1e9:.3g} ns/B" if c.gamma > 0 else ""
    return f"α {c.alpha * 1e6:g} µs, latency {c.latency * 1e6:g} µs/host{gamma}"


def speedups(results: Sequence[SimResult]) -> dict[str, float]:
    """Iteration-time speed-up of each result over the baseline PS (the first when absent).
    An iteration of 0 s (one worker, a trace without compute: nothing to wait for) is as fast
    as another of 0 s and infinitely faster than one that takes time."""
    name = baseline(results)
    base = next(r for r in results if r.mechanism == name)
    return {r.mechanism: (base.iteration_s / r.iteration_s if r.iteration_s > 0
                          else 1.0 if base.iteration_s == 0 else math.inf) for r in results}


def baseline(results: Sequence[SimResult]) -> str:
    """The mechanism :func:`speedups` are over: ``ps`` where it ran, else the first."""
    return next((r.mechanism for r in results if r.mechanism == mechanisms.BASELINE),
                results[0].mechanism)


def seconds(v: float) -> str:
    """A simulated time in seconds to 4 decimals, or to 3 significant digits where that shows
    more (a small model's 0.0019 s is 0.00194 s). Below a nanosecond, a difference of two
    times is rounding (5.2e-18 s of exposed communication): shown as 0."""
    if abs(v) < 1e-9:
        v = 0.0
    if v <= 0 or not math.isfinite(v) or v >= 0.01:
        return f"{v:.4f}"
    return f"{v:.{2 - math.floor(math.log10(v))}f}"


def broken(label: str, width: int) -> str:
    """A mechanism's ``label`` on lines of at most ``width`` characters, each but the last
    ending in a ``:`` where the label is broken (an option longer than ``width`` has a line
    of its own): ``ring:bucket=26214400:compress=powersgd:rank=4`` in a table column, whole,
    never cut to "…"."""
    lines = [""]
    for part in re.findall(r"[^:]*:|[^:]+$", label):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


# A mechanism's label on one line up to this many characters (``ps:order=block:sharding=even``
# is 28), longer ones broken at their options: with the time columns of a run of hours
# (``12345.6789`` s) every row fits 120 columns
LABEL_WIDTH = 28


def results_table(results: Sequence[SimResult], title: str) -> Table:
    sp = speedups(results)
    base = baseline(results)
    # every link kind's utilisation: a server's up link is where multicast saves (the
    # distribution), its down link where in-network aggregation does
    kinds = ("worker up", "worker down", "server up", "server down")
    # the baseline by name where it is short (ps, the first where ps did not run), else by
    # place: a long label would widen the column past 120
    vs = base if len(base) <= 9 else "row 1"
    # the mechanism first: never wrapped, :func:`broken` lays its labels on lines
    t = wide_table(("mechanism", "iteration\ns", f"speed-up\nvs {vs}", "compute\ns",
                    "exposed\ncomm s", *(k.replace(" ", "\n") for k in kinds), "sim wall\ns"),
                   title)
    for r in results:
        u = r.utilisation
        t.add_row(broken(r.mechanism, LABEL_WIDTH), seconds(r.iteration_s),
                  f"{sp[r.mechanism]:.2f}x", seconds(r.compute_s), seconds(r.exposed_s),
                  *(f"{u[k]:.0%}" if k in u else "-" for k in kinds), f"{r.wall_s:.2f}")
    return t


def validation_table(rows: Sequence[dict], title: str) -> Table:
    """Simulated vs measured (``gradwire simulate --emulate``)."""
    t = wide_table(("mechanism", "servers", "α\nµs", "simulated\ns", "measured\ns", "error",
                    "bytes\nequal"), title)
    for r in rows:
        same = r["simulated_link_bytes"] == r["measured_link_bytes"]
        t.add_row(broken(r["mechanism"], LABEL_WIDTH), str(r["servers"] or "-"),
                  f"{r['alpha_s'] * 1e6:.0f}", seconds(r["simulated_s"]),
                  seconds(r["measured_s"]), f"{r['error']:+.1%}", "yes" if same else "NO")
    return t


# The paper's tables: (columns as mechanism specs, what the cells are, cluster changes).
PAPER_TABLES: dict[int, dict] = {
    4: {"title": "Table 4: speed-up of network support over PS",
        "columns": {"Aggregation only": "ina", "Multicast only": "multicast",
                    "Multicast + Aggregation": "multicast+ina"}, "speedup": True},
    6: {"title": "Table 6: speed-up of end-host mechanisms over PS",
        "columns": {"Ring-Reduce": "ring", "Ring-Reduce + Multicast": "ring+multicast",
                    "Butterfly Mixing": "butterfly"}, "speedup": True},
    8: {"title": "Table 8: 8 PS, round-robin by tensor vs an even split (s)",
        "columns": {"Multiagg": "multicast+ina", "8 PS Multiagg": "multicast+ina:sharding=even",
                    "Ring-Reduce": "ring"}, "speedup": False, "servers": 8},
    9: {"title": "Table 9: without the global barrier (s)",
        "columns": {"Multiagg": "multicast+ina", "Ring-reduce": "ring",
                    "Multiagg no barrier": "multicast+ina:barrier=off"}, "speedup": False},
    10: {"title": "Table 10: in-network aggregation vs block distribution (s)",
         "columns": {"Agg": "ina", "Block Distr.": "ps:order=block"}, "speedup": False,
         "bandwidths": (10e9, 100e9)},
}


def paper_runs(number: int, cluster: SimCluster) -> list[tuple[SimCluster,
                                                                list[mechanisms.Mechanism]]]:
    """What table ``number`` runs on each trace: (cluster, mechanisms) per link rate, the
    baseline first where its cells are speed-ups."""
    spec = PAPER_TABLES[number]
    c = dataclasses.replace(cluster, servers=spec.get("servers", cluster.servers))
    specs = [*([mechanisms.BASELINE] if spec["speedup"] else []), *spec["columns"].values()]
    return [(dataclasses.replace(c, bandwidth_bps=bw), [mechanisms.parse(s) for s in specs])
            for bw in spec.get("bandwidths", (cluster.bandwidth_bps,))]


def _prefixed(on_start: Callable[[str], None] | None,
              prefix: str) -> Callable[[str], None] | None:
    """``on_start`` (:func:`gradwire.sim.mechanisms.run`'s) telling ``prefix: text``."""
    return None if on_start is None else lambda text: on_start(f"{prefix}: {text}")


def paper_table(number: int, traces: Sequence[Trace], cluster: SimCluster,
                on_start: Callable[[str], None] | None = None) -> tuple[Table, list]:
    """One of the paper's tables for ``traces``; rows are also returned as dicts (JSON).
    ``on_start`` as :func:`gradwire.sim.mechanisms.run`'s, with the model (and the rate, where
    the table has several) prefixed."""
    spec = PAPER_TABLES[number]
    cols = spec["columns"]
    runs = paper_runs(number, cluster)
    bws = [cb.bandwidth_bps for cb, _ in runs]
    c = runs[0][0]
    head = ["model", *(["Gbps"] if len(bws) > 1 else []), *cols]
    # the servers too: --servers changes the parameter servers' cells
    where = (f"{c.workers} workers" + ("" if len(bws) > 1 else f", {bws[0] / 1e9:g} Gbit/s")
             + f", {c.servers} server(s), {host_costs(c)}")
    paper = spec.get("servers", 1)
    table = wide_table(head, f"{spec['title']}, {where}; the paper: 32 workers, {paper} "
                       f"server{'s' if paper > 1 else ''}")
    # a model's name is any string its profile or trace gives: wrapped (folded where it has
    # no space) in a column the width of the rest, never cut
    table.columns[0].no_wrap = False
    rows = []
    for t in traces:
        for cb, mechs in runs:
            bw = cb.bandwidth_bps
            at = t.model + (f" at {bw / 1e9:g} Gbit/s" if len(bws) > 1 else "")
            res = mechanisms.run(t, cb, mechs, on_start=_prefixed(on_start, at))
            by = {r.mechanism: r for r in res}
            sp = speedups(res)
            cells = {k: (sp[v] if spec["speedup"] else by[v].iteration_s) for k, v in cols.items()}
            rows.append({"model": t.model, "gbps": bw / 1e9, **cells,
                         "iteration_s": {r.mechanism: r.iteration_s for r in res}})
            fmt = "{:.2f}x" if spec["speedup"] else "{:.3f}"
            table.add_row(t.model, *([f"{bw / 1e9:g}"] if len(bws) > 1 else []),
                          *(fmt.format(v) for v in cells.values()))
    return table, rows


# ---------------------------------------------------------------- sweeps

AXES = ("workers", "bandwidth", "speedup", "layers")
# What a sweep adds per value of ``layers`` (bytes, forward s, backward s): gradwire trace's
# --layer-bytes, --layer-forward-ms and --layer-backward-ms defaults.
LAYER = (4 * 2**20, 1e-3, 2e-3)


def sweep_point(trace: Trace, cluster: SimCluster, axis: str, value: float,
                layer: tuple[int, float, float] = LAYER) -> tuple[Trace, SimCluster]:
    """The trace and cluster of one value of ``axis`` (:func:`sweep`). A value they cannot
    take (layers past a trace's limits, times grown past them) raises the edit's
    GradwireError; making a point is cheap next to simulating it, so
    :func:`gradwire.sim.simulate.prepare` makes every one before the sweep starts, and a bad
    value is not found after the others have run."""
    if axis == "workers":
        return trace, dataclasses.replace(cluster, workers=int(value))
    if axis == "bandwidth":
        return trace, dataclasses.replace(cluster, bandwidth_bps=float(value))
    if axis == "speedup":
        return scale_compute(trace, float(value)), cluster
    return add_layers(trace, int(value), *layer), cluster


def sweep(trace: Trace, cluster: SimCluster, mechs: list[mechanisms.Mechanism], axis: str,
          values: Sequence[float], layer: tuple[int, float, float] = LAYER,
          on_start: Callable[[str], None] | None = None) -> list[dict]:
    """Iteration time of every mechanism at each value of ``axis``: workers, bandwidth
    (bits/s), compute speed-up, or added layers (``layer`` = bytes, forward s, backward s).
    ``on_start`` as :func:`gradwire.sim.mechanisms.run`'s, with the value prefixed."""
    rows = []
    for v in values:
        t, c = sweep_point(trace, cluster, axis, v, layer)
        res = mechanisms.run(t, c, mechs, on_start=_prefixed(on_start, f"{axis}={v:g}"))
        rows.append({"axis": axis, "value": v,
                     "iteration_s": {r.mechanism: r.iteration_s for r in res},
                     "speedup": speedups(res), "baseline": baseline(res)})
    return rows


def plot_sweep(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis = rows[0]["axis"]
    xs = [r["value"] / (1e9 if axis == "bandwidth" else 1) for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for m in rows[0]["iteration_s"]:
        a.plot(xs, [r["iteration_s"][m] for r in rows], marker="o", label=m)
        b.plot(xs, [r["speedup"][m] for r in rows], marker="o", label=m)
    label = {"bandwidth": "bandwidth (Gbit/s)", "workers": "workers",
             "speedup": "compute speed-up", "layers": "added layers"}[axis]
    # the speed-ups are over ps where it ran, else over the first mechanism (:func:`speedups`)
    base = rows[0].get("baseline", mechanisms.BASELINE)
    for ax, y in ((a, "iteration time (s)"), (b, f"speed-up over {base}")):
        ax.set_xlabel(label)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    if axis in ("bandwidth", "workers"):
        a.set_xscale("log", base=2 if axis == "workers" else 10)
        b.set_xscale("log", base=2 if axis == "workers" else 10)
    b.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return path


# ---------------------------------------------------------------- timeline


def write_timeline(results: Sequence[SimResult], workers: int, path: Path) -> Path:
    """Chrome-trace JSON (open in ui.perfetto.dev): one process per host per mechanism,
    compute on thread 0, flows it sends on thread 1. Host ``h`` of the ``k``-th result is
    process ``k * span + h``, ``span`` the smallest power of ten from 1000 above every host
    id of the run (1000 up to 1000 hosts, ids 0-999: process 2003 is the third mechanism's
    host 3), so that no two mechanisms' hosts share a process, however many hosts there
    are."""
    top = max((e["pid"] for r in results for e in r.timeline), default=0)
    span = 1000
    while span <= top:
        span *= 10
    events: list[dict] = []
    for k, r in enumerate(results):
        base = span * k
        hosts = {e["pid"] for e in r.timeline}
        for h in sorted(hosts):
            who = f"worker {h}" if h < workers else f"server {h - workers}"
            events.append({"name": "process_name", "ph": "M", "pid": base + h,
                           "args": {"name": f"{r.mechanism}: {who}"}})
        events += [{**e, "pid": base + e["pid"]} for e in r.timeline]
    replace_text(path, dumps({"traceEvents": events, "displayTimeUnit": "ms"}))  # whole
    return path
