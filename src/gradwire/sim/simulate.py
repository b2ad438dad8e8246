"""``gradwire simulate``: one of the paper's tables, a sweep of one axis, an emulation check,
or every mechanism side by side on one trace, printed and returned for the result file.

This module is imported by the command line for its defaults, so the simulator itself is
imported when a simulation runs (``gradwire --help`` stays quick)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gradwire.bandwidth import format_bandwidth, parse_bandwidth
from gradwire.check import (
    MAX_ALPHA_US,
    SPEEDUP_RANGE,
    check_real,
    comma_items,
    distinct,
    parse_int,
    parse_number,
)
from gradwire.errors import GradwireError
from gradwire.schedules.registry import MAX_WORLD

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from rich.console import Console

    from gradwire.jobs import _Quarters
    from gradwire.sim.cluster import SimCluster
    from gradwire.sim.mechanisms import Mechanism
    from gradwire.sim.trace import Trace

SIM_MECHANISMS = "ps,multicast,ina,multicast+ina,ring,ring+multicast,butterfly"
EMULATED_MECHANISMS = "ps,ring,butterfly"  # --emulate's default: what runs for real
# The defaults of --latency-us and --alpha-us, in µs: gradwire.sim.cluster's datacenter
# Ethernet (written out here so that `gradwire --help` need not import the simulator).
LATENCY_US = 1.5
ALPHA_US = 10.0


def sweep_value(axis: str, text: str) -> float:
    """One value of ``--sweep AXIS=..``: a link rate, or a number (whole for workers, up to
    the simulator's most, and layers, up to the most a trace holds; speedup in the trace's
    range)."""
    from gradwire.sim.trace import MAX_PARAMS

    if axis == "bandwidth":
        return parse_bandwidth(text, unshaped=False)  # type: ignore[return-value]
    if axis in ("workers", "layers"):
        # written as --workers takes it: "1e2" and "4.0" are refused there, so here too
        n = parse_int(text)
        low, high = (1, MAX_WORLD) if axis == "workers" else (0, MAX_PARAMS)
        ok = n is not None and low <= n <= high
        v = float(n) if ok else math.nan  # type: ignore[arg-type]
        allowed = f"whole numbers >= {low} (up to {high})"
    else:
        v = parse_number(text)
        if v is None:
            v = math.nan
        low, high = SPEEDUP_RANGE
        ok, allowed = low <= v <= high, f"numbers > 0 (from {low:g} to {high:g})"
    if not ok:
        raise GradwireError(f"--sweep {axis}: {text!r} is not valid: expected {allowed}")
    return v


def parse_sweep(text: str, axes: tuple[str, ...]) -> tuple[str, list[float]]:
    """``--sweep AXIS=V1,V2,..``: the axis (one of ``axes``) and its values."""
    axis, sep, values = text.partition("=")
    if axis not in axes or not sep:
        raise GradwireError(f"--sweep {text!r}: expected AXIS=V1,V2 with AXIS one of "
                            f"{', '.join(axes)}")
    # a value given twice (2,2; 1gbit,1000mbit) is one point: one run, one row, one key
    vals = distinct([sweep_value(axis, v) for v in comma_items(values)])
    if not vals:
        raise GradwireError(f"--sweep {text!r}: no values: expected {axis}=V1,V2,..")
    return axis, vals


@dataclass(frozen=True)
class Simulation:
    """A ``gradwire simulate`` request, checked: its ``paths``' traces loaded and the cluster
    built; what to do with them as :func:`run_simulation` says."""

    paths: list[Path]
    traces: list[Trace]
    cluster: SimCluster
    bandwidth: str
    mechanism: str = SIM_MECHANISMS
    table: int | None = None
    sweep: str | None = None
    emulate: bool = False
    plot: Path | None = None
    timeline: Path | None = None


def prepare(paths: list[Path], *, workers: int = 32, bandwidth: str = "25gbit",
            mechanism: str = SIM_MECHANISMS, servers: int = 1, iterations: int = 3,
            latency_us: float = LATENCY_US, alpha_us: float = ALPHA_US, seed: int = 0,
            table: int | None = None, sweep: str | None = None, emulate: bool = False,
            plot: Path | None = None, timeline: Path | None = None,
            gamma: float = 0.0, model: Sequence[str] | None = None,
            compute_ms: str | None = None, compute_slowdown: float = 1.0) -> Simulation:
    """The traces at ``paths``, or the one made from the model profile ``model`` (a built-in
    name or a profile file: :func:`gradwire.sim.trace.from_profile`), on ``workers`` workers
    and ``servers`` servers behind one non-blocking switch of ``bandwidth`` links
    (``latency_us`` one way per host, ``alpha_us`` per message; 0 and 0 for an ideal network;
    ``gamma`` seconds per byte reduced). Everything :func:`run_simulation` will be asked is
    checked here, before it starts. ``model``: one profile, or several for a ``table``;
    ``compute_ms``: their forward and backward times replaced (``--compute-ms
    FORWARD,BACKWARD``); ``compute_slowdown``: their compute as the ranks run it, a
    calibration's (a profile is timed alone, as whatif and advise scale it; a recorded trace
    is not scaled)."""
    from gradwire.sim import report
    from gradwire.sim.cluster import SimCluster
    from gradwire.sim.trace import from_profile, load, scale_compute

    model = distinct(list(model or []))  # a profile named twice is one (one row of --table's)
    if model and paths:
        raise GradwireError("--model makes the trace from a profile: not with --trace")
    if not model and not paths:  # every run reads the first trace
        raise GradwireError("no --trace given: expected a trace file from `gradwire trace`, "
                            "or --model NAME for a built-in or measured profile "
                            "(`gradwire profile` lists them)")
    if compute_ms is not None and not model:
        raise GradwireError("--compute-ms sets a model profile's times: give --model NAME too "
                            "(a trace's are scaled with `gradwire trace --from FILE "
                            "--compute-speedup F`)")
    if model and emulate:
        raise GradwireError("--emulate replays a recorded trace on real ranks: give --trace "
                            "FILE (from `gradwire trace`), not --model")
    if plot is not None and sweep is None:
        raise GradwireError("--plot draws a --sweep: give --sweep AXIS=V1,V2,.. too")
    if table is not None and table not in report.PAPER_TABLES:
        raise GradwireError(f"--table {table}: expected one of "
                            f"{', '.join(map(str, report.PAPER_TABLES))}")
    if emulate and (len(paths) != 1 or timeline or plot or sweep):
        raise GradwireError("--emulate takes one --trace and no --timeline, --sweep or --plot")
    if table is not None and (sweep is not None or emulate):
        raise GradwireError(f"--table {table} is a run of its own: not with --sweep or --emulate")
    if timeline is not None and (table is not None or sweep is not None):
        raise GradwireError("--timeline records one plain run: not with --table or --sweep")
    for option, given in (("--trace files", paths), ("--model profiles", model)):
        if len(given) > 1 and table is None:
            raise GradwireError(f"{len(given)} {option}: only --table takes several (the "
                                "paper's tables compare models); give one")
    axis, values = parse_sweep(sweep, report.AXES) if sweep is not None else ("", [])
    mechs = mechanisms(EMULATED_MECHANISMS if emulate and mechanism == SIM_MECHANISMS
                       else mechanism)
    if table is None and servers != 1 and not any(_serves(m) for m in mechs):
        # the run would say "N server(s)" of a run that had none
        raise GradwireError(f"--servers {servers} is for the parameter-server mechanisms (ps, "
                            f"multicast, ina, multicast+ina), and --mechanism {mechanism!r} "
                            "names none: leave --servers out or add one")
    bps = parse_bandwidth(bandwidth, unshaped=False)
    assert bps is not None
    for option, us in (("--latency-us", latency_us), ("--alpha-us", alpha_us)):
        check_real(option, us, high=MAX_ALPHA_US)  # as whatif's and advise's --alpha-us
    if model:
        from gradwire import profiles

        traces = []
        for name in model:
            prof = profiles.load(name)
            if compute_ms is not None:
                prof = profiles.with_compute_ms(prof, compute_ms)
            made = from_profile(prof, f"--model {name}")
            traces.append(made if compute_slowdown == 1 else
                          scale_compute(made, 1 / compute_slowdown))
    else:
        traces = [load(t) for t in paths]
    cluster = SimCluster(workers, bps, servers, latency_us / 1e6, alpha_us / 1e6,
                         gamma=gamma, iterations=iterations, seed=seed)
    for v in values:  # each point made (not run) now: an edit the trace cannot take fails here,
        # and so does a point too large to simulate, before the points ahead of it run
        try:
            check_sizes(*report.sweep_point(traces[0], cluster, axis, v), mechs)
        except GradwireError as e:
            raise GradwireError(f"--sweep {axis}={v:g}: {e}") from None
    if table is not None:
        for t in traces:
            for c, ms in report.paper_runs(table, cluster):
                check_sizes(t, c, ms)
    elif not values and not emulate:
        check_sizes(traces[0], cluster, mechs, timeline is not None)
    return Simulation(paths, traces, cluster, bandwidth, mechanism, table, sweep, emulate, plot,
                      timeline)


def check_sizes(trace: Trace, cluster: SimCluster, mechs: list[Mechanism],
                record: bool = False) -> None:
    """Refuse a mechanism too large to replay (or, with ``record``, to record) before any
    runs: a PS on 4096 workers ran the others for minutes before it was refused."""
    from gradwire.sim.mechanisms import check

    check(trace, cluster, mechs, record)


def simulated_inputs(s: Simulation) -> dict:
    """What a result file records of the run's inputs, beside the command: each trace (its
    model, source, tensors, bytes and pass times) and the cluster, so that a result says what
    was simulated without the command's files at hand."""
    c = s.cluster
    return {
        "traces": [{"model": t.model, "source": t.source, "tensors": len(t.params),
                    "bytes": t.total_bytes, "forward_s": t.iterations[0].forward_s,
                    "backward_s": t.iterations[0].backward_s} for t in s.traces],
        "cluster": {"workers": c.workers, "bandwidth": s.bandwidth,
                    "bandwidth_bps": c.bandwidth_bps, "servers": c.servers,
                    "alpha_s": c.alpha, "latency_s": c.latency, "gamma_s_per_byte": c.gamma,
                    "iterations": c.iterations, "seed": c.seed}}


def _serves(m: Mechanism) -> bool:
    """Whether ``m`` runs on parameter servers (takes ``--servers``)."""
    from gradwire.sim.ps import PSOptions

    return isinstance(m.options, PSOptions)


def mechanisms(text: str) -> list[Mechanism]:
    """``--mechanism``'s comma list, each once: one named twice is one run and one row (the
    sweep's JSON keys them by name)."""
    from gradwire.sim.mechanisms import parse_list

    return distinct(parse_list(text), key=lambda m: m.label)


def run_simulation(s: Simulation, console: Console) -> dict:
    """Run ``s``, printing to ``console`` as it goes:

    1. ``table``: one of the paper's tables (:data:`gradwire.sim.report.PAPER_TABLES`) for
       every trace;
    2. else ``sweep`` (``AXIS=V1,V2,..``): the first trace's iteration time along one axis,
       drawn to ``plot`` if given;
    3. else ``emulate``: each mechanism run for real on an emulated cluster beside its
       simulation (default mechanisms :data:`EMULATED_MECHANISMS`, one trace);
    4. else every mechanism on the first trace, with a Perfetto ``timeline`` if given.

    Returns the result file's rows (or results, and the calibration an emulation used)."""
    from gradwire.jobs import plain_progress
    from gradwire.sim import mechanisms as mech
    from gradwire.sim import report

    c, first = s.cluster, s.traces[0]
    lines = plain_progress(console, "simulate")  # where no spinner shows, stderr lines do
    if s.table is not None:
        with _told(console, lines) as told:
            t, rows = report.paper_table(s.table, s.traces, c, on_start=told)
        console.print(t)
        return {"rows": rows}
    if s.sweep is not None:
        return {"rows": _sweep(first, c, s.mechanism, s.sweep, s.plot, console, lines)}
    if s.emulate:
        from gradwire.sim import emulate as emu

        # the default names fabric mechanisms it cannot run
        mechanism = EMULATED_MECHANISMS if s.mechanism == SIM_MECHANISMS else s.mechanism
        rows, cal = emu.validate(s.paths[0], c.workers, c.servers, s.bandwidth,
                                 mechanisms(mechanism), console, c.iterations, c.seed)
        console.print(report.validation_table(rows, f"{first.model}: {c.workers} workers, "
                                              f"{s.bandwidth} emulated, {c.servers} server(s)"))
        return {"calibration": cal, "rows": rows}
    with _told(console, lines) as told:
        results = mech.run(first, c, mechanisms(s.mechanism), s.timeline is not None,
                           on_start=told)
    console.print(report.results_table(results, f"{first.model}: {c.workers} workers, "
                                       f"{format_bandwidth(c.bandwidth_bps)}, {c.servers} "
                                       f"server(s), {report.host_costs(c)}"))
    if s.timeline:
        console.print(f"wrote {report.write_timeline(results, c.workers, s.timeline)}")
    return {"results": [r.to_json() for r in results]}


@contextlib.contextmanager
def _told(console: Console, lines: _Quarters | None) -> Iterator[Callable[[str], None]]:
    """What a simulation tells of its progress: the console's spinner, or ``lines``
    (:func:`gradwire.jobs.plain_progress`) where none shows."""
    with console.status("simulating") as status:
        yield status.update if lines is None else lines.say


def _sweep(trace: Trace, cluster: SimCluster, mechanism: str, sweep: str, plot: Path | None,
           console: Console, lines: _Quarters | None = None) -> list[dict]:
    """Point 2 of :func:`run_simulation`: one line per value, then the plot; progress on the
    console's spinner, or as ``lines`` (:func:`gradwire.jobs.plain_progress`)."""
    from gradwire.sim import report

    axis, vals = parse_sweep(sweep, report.AXES)
    with _told(console, lines) as told:
        rows = report.sweep(trace, cluster, mechanisms(mechanism), axis, vals, on_start=told)
    for r in rows:
        # a rate as it was typed (1gbit), not bits/s (1e+09)
        value = format_bandwidth(r["value"]) if axis == "bandwidth" else f"{r['value']:g}"
        console.print(f"{axis}={value}: " + ", ".join(
            f"{m} {report.seconds(s)} s" for m, s in r["iteration_s"].items()))
    if plot:
        console.print(f"wrote {report.plot_sweep(rows, plot, trace.model)}")
    return rows
