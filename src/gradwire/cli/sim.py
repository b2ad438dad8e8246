"""``gradwire trace`` and ``gradwire simulate``: compute traces, and the trace-driven network
simulator (docs/simulator.md)."""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Annotated

import typer

from gradwire.check import distinct
from gradwire.cli.options import (
    JsonOut,
    check_outputs,
    check_seed_and_batch,
    command_line,
    console,
    typed,
    write_json,
    write_text,
)
from gradwire.errors import GradwireError
from gradwire.sim.simulate import ALPHA_US, LATENCY_US, SIM_MECHANISMS


def trace_cmd(
    ctx: typer.Context,
    out: Annotated[str, typer.Option("-o", "--out", help="write the trace (JSON lines) here")],
    model: Annotated[str | None, typer.Option(help="record this model (`gradwire models`)")] = None,
    source: Annotated[Path | None, typer.Option("--from", help="edit this trace instead")] = None,
    iterations: Annotated[int, typer.Option(min=1, help="iterations recorded, with --model (at "
                                            "most 1000)")] = 3,
    batch_size: Annotated[int, typer.Option(help="samples per iteration, with --model (1 to "
                                            "65536)")] = 32,
    seed: Annotated[int, typer.Option(help="model initialisation and data, with --model (0 to "
                                      "2**32 - 1)")] = 0,
    compute_speedup: Annotated[float, typer.Option(help="divide every compute time by "
                                                   "this (1e-6 to 1e6)")] = 1.0,
    add_layers: Annotated[int, typer.Option(min=0, help="insert this many layers before the "
                                            "last parameter (a trace holds at most 100,000 "
                                            "parameters)")] = 0,
    layer_bytes: Annotated[int, typer.Option(min=1, help="each added layer's bytes (a trace "
                                             "holds at most 2**50 bytes)")] = 4 * 2**20,
    layer_forward_ms: Annotated[float, typer.Option(min=0, help="each added layer's forward "
                                                    "time")] = 1.0,
    layer_backward_ms: Annotated[float, typer.Option(min=0, help="each added layer's backward "
                                                     "time")] = 2.0,
    resize: Annotated[list[str] | None, typer.Option(help="NAME=BYTES: resize a parameter "
                                                     "(repeatable)")] = None,
) -> None:
    """Record a compute trace (backward hooks on every parameter) or edit one; see
    docs/simulator.md.

    Example: gradwire trace --model resnet50 -o resnet50.trace.jsonl
    """
    from gradwire.jobs import local_progress
    from gradwire.sim import trace as tr
    from gradwire.sim.edit import check_edits, make_trace

    (out_path,) = check_outputs(("--out", out), inputs=(("--from", source),))
    check_seed_and_batch(seed, batch_size)
    layer = (layer_bytes, layer_forward_ms / 1e3, layer_backward_ms / 1e3)
    check_edits(iterations, compute_speedup, add_layers, layer, resize or [])  # values first
    _check_unused(ctx, ("iterations", "batch_size", "seed"), source is not None and model is None,
                  "how --model is recorded: not with --from (an edit keeps the trace's own "
                  "iterations)")
    _check_unused(ctx, ("layer_bytes", "layer_forward_ms", "layer_backward_ms"), not add_layers,
                  "the layers --add-layers inserts: give --add-layers N too")
    # a recording's iterations; an edit is quick
    recording = (local_progress(console, f"trace {model}") if model is not None
                 else contextlib.nullcontext(None))
    with recording as update:
        t = make_trace(model, source, iterations=iterations, batch_size=batch_size, seed=seed,
                       compute_speedup=compute_speedup, add_layers=add_layers, layer=layer,
                       resize=resize or [], on_step=update)
    write_text(out_path, tr.dumps(t))
    it = t.iterations[0]
    console.print(f"{t.model}: {len(t.params)} parameters, "
                  f"{t.total_bytes / 1e6:.2f} MB, {len(t.iterations)} iterations, forward "
                  f"{it.forward_s * 1e3:.1f} ms, backward {it.backward_s * 1e3:.1f} ms")
    if model is not None and not add_layers and not resize:  # edits change the tensors
        from gradwire.perf.report import builtin_namesake

        # a recording gives every parameter its shape
        numel = sum(math.prod(p.shape) for p in t.params if p.shape is not None)
        same_name = builtin_namesake(t.model, numel, f"give simulate this trace as --trace {out}")
        if same_name:
            console.print(same_name)


def _check_unused(ctx: typer.Context, names: tuple[str, ...], unused: bool, what: str) -> None:
    """Where ``unused``, refuse the options of ``names`` typed on the command line: they set
    ``what``, and the run would not read them (one line naming them)."""
    given = [f"--{k.replace('_', '-')}" for k in names if unused and typed(ctx, k)]
    if given:
        raise GradwireError(f"{', '.join(given)} {'sets' if len(given) == 1 else 'set'} {what}")


def _check_overridden(ctx: typer.Context, table: int | None, sweep: str | None) -> None:
    """Refuse an option typed on the command line that ``--table`` or ``--sweep`` sets itself
    (the run would go on with its own value, and the result say nothing of the one typed)."""
    from gradwire.sim.report import PAPER_TABLES

    # which of the paper's tables fix which option; a table that is none of them is refused
    # as such (gradwire.sim.simulate.prepare), not said to run mechanisms of its own
    fixed = {"mechanism": "its own mechanisms", "servers": "8 servers" if table == 8 else None,
             "bandwidth": "10 and 100 Gbit/s links" if table == 10 else None}
    for name, what in fixed.items():
        if table in PAPER_TABLES and what is not None and typed(ctx, name):
            raise GradwireError(f"--{name} is not used with --table {table}, which runs {what}: "
                                f"leave --{name} out")
    axis = sweep.partition("=")[0] if sweep is not None else None
    if axis in ("workers", "bandwidth") and typed(ctx, axis):
        raise GradwireError(f"--{axis} is not used with --sweep {axis}=..., which sets it at each "
                            f"point: leave --{axis} out")


def simulate(
    ctx: typer.Context,
    trace: Annotated[list[Path] | None, typer.Option(help="a trace from `gradwire trace` "
                                                     "(repeatable with --table)")] = None,
    model: Annotated[list[str] | None, typer.Option(help="instead of --trace: a model "
                                                    "profile (built-in, see `gradwire "
                                                    "profile`, or a measured one's file), its "
                                                    "forward time spread over its tensors and "
                                                    "its backward time per layer (measured, or "
                                                    "in proportion to their elements); "
                                                    "repeatable with --table")] = None,
    compute_ms: Annotated[str | None, typer.Option(
        "--compute-ms", help="with --model: FORWARD,BACKWARD ms instead of the profile's "
        "(one that has none, such as alexnet)")] = None,
    workers: Annotated[int, typer.Option(min=1, help="simulated workers (at most "
                                         "4096)")] = 32,
    bandwidth: Annotated[str, typer.Option(help="every link, each way, in bits per second: "
                                           "10gbit, 25gbit, ... (units kbit, mbit, gbit, "
                                           "tbit; 100kbit to 400gbit)")] = "25gbit",
    mechanism: Annotated[str, typer.Option(help="comma list (see docs/simulator.md): ps, "
                                           "multicast, ina, multicast+ina, ring, "
                                           "ring+multicast, butterfly, any allreduce "
                                           "algorithm, NAME:KEY=VALUE options")
                         ] = SIM_MECHANISMS,
    servers: Annotated[int, typer.Option(min=1, help="parameter servers (at most 4096)")] = 1,
    iterations: Annotated[int, typer.Option(min=1, help="iterations simulated; the "
                                            "iteration time is the mean interval between "
                                            "their ends after the first (at most 1000)")] = 3,
    latency_us: Annotated[float | None, typer.Option(
        min=0, show_default=f"{LATENCY_US:g}", help="one-way latency per host (NIC, cable, half "
        "the switch), paid at each end of every flow; the default is a datacenter Ethernet's, "
        "not the paper's (it states none): see docs/simulator.md; 0 with --alpha-us 0 for an "
        "ideal network")] = None,
    alpha_us: Annotated[float | None, typer.Option(
        min=0, show_default=f"{ALPHA_US:g}", help="software overhead per message on the sender "
        "(kernel TCP send and receive path); default a datacenter Ethernet's, as "
        "--latency-us")] = None,
    seed: Annotated[int, typer.Option(help="which recorded iteration each worker replays, "
                                      "drawn from this seed (a whole number >= 0)")] = 0,
    timeline: Annotated[str | None, typer.Option(help="write a Perfetto/chrome trace "
                                                 "JSON")] = None,
    sweep: Annotated[str | None, typer.Option(help="AXIS=V1,V2,..: workers, bandwidth, "
                                              "speedup (compute divided by it) or layers "
                                              "(added as `gradwire trace --add-layers` "
                                              "adds them: 4 MiB, 1 + 2 ms each)")] = None,
    plot: Annotated[str | None, typer.Option(help="the sweep's PNG")] = None,
    table: Annotated[int | None, typer.Option(help="one of the paper's tables: 4, 6, 8, 9, "
                                              "10, each with its own mechanisms (not with "
                                              "--mechanism; table 8 runs 8 servers, table 10 "
                                              "10 and 100 Gbit/s links: not with --servers, "
                                              "--bandwidth)")] = None,
    emulate: Annotated[bool, typer.Option(help="also run each mechanism for real on an "
                                          "emulated cluster of --bandwidth links (root) and "
                                          "compare; default mechanisms ps,ring,butterfly")
                       ] = False,
    json_out: JsonOut = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", help="a `gradwire calibrate` file: its α per step (which holds the "
        "links' latency) stands for --alpha-us and --latency-us (latency 0; not with them), "
        "and its γ prices each byte reduced")] = None,
) -> None:
    """Trace-driven simulation of parameter servers, multicast, in-network aggregation and
    all-reduce mechanisms on a non-blocking switch. Every message costs --alpha-us on its
    sender and --latency-us at each end (defaults: 10 µs and 1.5 µs, 13 µs one way for a
    small message on a datacenter Ethernet; docs/simulator.md), or what --calibration
    measured on your cluster.

    Example: gradwire simulate --trace resnet50.trace.jsonl --workers 32 --bandwidth 25gbit
    or: gradwire simulate --model resnet50 --workers 64 --bandwidth 10gbit
    """
    from gradwire.bench.provenance import stamp
    from gradwire.sim.simulate import prepare, run_simulation, simulated_inputs

    timeline_path, plot_path, json_path = check_outputs(
        ("--timeline", timeline), ("--plot", plot), ("--json", json_out),
        inputs=[*(("--trace", t) for t in trace or []), *(("--model", m) for m in model or []),
                ("--calibration", calibration)])
    # a trace named twice is one (one row of --table's), as a mechanism or sweep value is
    trace = distinct(trace or [], key=lambda t: os.path.realpath(t))
    gamma = 0.0
    if calibration is not None and (alpha_us is not None or latency_us is not None):
        raise GradwireError("--calibration gives α (the links' latency in it): not with "
                            "--alpha-us or --latency-us")
    _check_overridden(ctx, table, sweep)
    # --emulate simulates with the host costs it measures, whatever was typed
    given = [f"--{k.replace('_', '-')}" for k in ("alpha_us", "latency_us", "calibration")
             if emulate and typed(ctx, k)]
    if given:
        raise GradwireError(f"{', '.join(given)}: not used with --emulate, which measures each "
                            "mechanism's α on the emulated cluster (the links' latency in it) "
                            "and γ with `gradwire calibrate`: leave it out")
    alpha_us = ALPHA_US if alpha_us is None else alpha_us
    latency_us = LATENCY_US if latency_us is None else latency_us
    slowdown = 1.0
    if calibration is not None:
        from gradwire.perf import whatif

        terms = whatif.calibration_terms(whatif.read_calibration(calibration), calibration)
        alpha, gamma = terms.alpha, terms.gamma
        alpha_us, latency_us = alpha * 1e6, 0.0
        # a profile is timed alone: its compute as the ranks run it, as whatif prices it
        slowdown = terms.compute_slowdown if model else 1.0
        console.print(f"α {alpha_us:.1f} µs per message (the calibration's α per step), γ "
                      f"{gamma * 1e9:.3g} ns/B, latency in α"
                      f"{f', compute ×{slowdown:.3g}' if slowdown != 1 else ''}: from "
                      f"{calibration}")
    sim = prepare(trace, workers=workers, bandwidth=bandwidth, mechanism=mechanism,
                  servers=servers, iterations=iterations, latency_us=latency_us,
                  alpha_us=alpha_us, gamma=gamma, seed=seed,
                  table=table, sweep=sweep, emulate=emulate, plot=plot_path,
                  timeline=timeline_path, model=model, compute_ms=compute_ms,
                  compute_slowdown=slowdown)
    for t in sim.traces if model else []:
        console.print(f"trace of {t.source}")
    out = stamp(command_line())  # dated before the run, as it always was
    out |= simulated_inputs(sim)
    out |= run_simulation(sim, console)
    if json_path:
        write_json(json_path, out)
