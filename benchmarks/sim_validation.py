"""The simulator against the emulated cluster (issue 6's validation).

Two traces recorded on this machine by ``gradwire trace`` — VGG-16 (61 MB of gradients in 45
tensors, batch 32: bandwidth-bound) and ResNet-20 (1.1 MB in 65 tensors, batch 128: many small
messages) — are replayed by every rank of an emulated 1 Gbit/s cluster (compute as waits, real
bytes through the transport; ``gradwire.sim.emulate``) for PS with 1 and 2 servers, ring-reduce
and butterfly mixing at P = 4 and 8. A validation predicts; it does not refit: every
configuration is simulated before it runs, from what ``gradwire.sim.emulate.calibrate``
measured on P emulated hosts at the start, before any measured run (the link rate, γ, α per
step of gradwire's executor for the collectives and a stream's α per message for parameter
servers), and this machine's TCP send buffer (``emulate.validate``). A run whose ranks (P,
and a parameter server's servers) outnumber this machine's cores contends for them: the
summary gives the errors of those (``contended``) and of the others (``uncontended``) apart,
beside those of every run.

    flock /tmp/gradwire-bench.lock python benchmarks/sim_validation.py   # about 12 minutes
    python benchmarks/sim_validation.py --traces resnet20 --workers 4 --out v.json
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

from gradwire.bench import provenance
from gradwire.bench.sharing import usable_cores
from gradwire.bench.validation.summary import errors as validation_errors
from gradwire.check import parse_int
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file, save_figure
from gradwire.sim import emulate, report
from gradwire.sim import mechanisms as mech
from gradwire.sim.record import record
from gradwire.sim.trace import save

HERE = Path(__file__).parent
OUT = HERE / "results" / "sim_validation" / "latest.json"
BATCH = {"vgg16": 32, "resnet20": 128}
RATE = "1gbit"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    marks = {"ps": "o", "ring": "s", "butterfly": "^"}
    for r in doc["rows"]:
        label = f"{r['mechanism']}{'/' + str(r['servers']) if r['servers'] else ''}"
        ax.scatter(r["measured_s"], r["simulated_s"], marker=marks[r["mechanism"]],
                   c="tab:blue" if r["trace"] == "vgg16" else "tab:orange",
                   s=30 + 10 * r["workers"], alpha=0.8)
        ax.annotate(f"{label} P={r['workers']}", (r["measured_s"], r["simulated_s"]),
                    fontsize=6, xytext=(3, -3), textcoords="offset points")
    lo = min(min(r["measured_s"], r["simulated_s"]) for r in doc["rows"]) * 0.8
    hi = max(max(r["measured_s"], r["simulated_s"]) for r in doc["rows"]) * 1.25
    xs = [lo, hi]
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="grey", alpha=0.2,
                    label="±10 %")
    ax.set(xscale="log", yscale="log", xlabel="measured iteration (s)",
           ylabel="simulated iteration (s)",
           title=f"simulator vs emulated {RATE} cluster\n(blue VGG-16, orange ResNet-20)\n"
                 f"median |error| {doc['summary']['median_abs_error']:.1%}, "
                 f"max {doc['summary']['max_abs_error']:.1%}")
    ax.legend(loc="upper left")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def ranks(row: dict) -> int:
    """The processes a run of ``row`` started: its workers and its parameter servers."""
    return row["workers"] + row["servers"]


def errors(rows: list[dict]) -> dict | None:
    """Runs, median and max |error| of ``rows`` (None when there are none), as the model's
    validation summarises its rows."""
    e = validation_errors(rows)
    return None if e is None else {"runs": e.pop("rows"), **e}


def summarise(rows: list[dict], cores: int) -> dict:
    """The errors of every run, and apart those of runs with more ranks than ``cores``
    (contended) and the others; whether every run's bytes per link kind were simulated."""
    every = errors(rows)
    assert every is not None
    return {**every, "cores": cores,
            "uncontended": errors([r for r in rows if ranks(r) <= cores]),
            "contended": errors([r for r in rows if ranks(r) > cores]),
            "bytes_equal": all(r["simulated_link_bytes"] == r["measured_link_bytes"]
                               for r in rows)}


def parse_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> tuple[list[str], list[int]]:
    """--traces, --workers and --iterations, checked before any calibration: an unknown trace
    failed with a KeyError, --workers x with a ValueError, and --iterations 1 with a traceback
    after every P's calibration."""
    traces = a.traces.split(",")
    if any(t not in BATCH for t in traces):
        ap.error(f"--traces takes {', '.join(BATCH)}, got {a.traces!r}")
    workers = [parse_int(p) for p in a.workers.split(",")]
    if any(p is None or p < 2 for p in workers):
        ap.error(f"--workers must be a comma list of whole numbers >= 2, got {a.workers!r}")
    if a.iterations < 2:
        ap.error("--iterations must be >= 2 (the measured time is the interval between "
                 f"iteration ends), got {a.iterations}")
    return traces, [p for p in workers if p is not None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="vgg16,resnet20")
    ap.add_argument("--workers", default="4,8")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args(argv)
    traces, workers = parse_args(ap, a)
    console = Console(stderr=True)
    command = provenance.script_command(None if argv is None else [__file__, *argv])
    doc: dict = {**provenance.stamp(command),
                 "conditions": {"load_average_start": os.getloadavg()}, "rows": []}
    tdir = a.out.parent / "traces"
    tdir.mkdir(parents=True, exist_ok=True)
    # every P's calibration before any measured run: what its simulations take
    cals = {p: emulate.calibrate(p, RATE, console) for p in workers}
    doc["calibrations"] = {str(p): cal for p, cal in cals.items()}
    doc["simulated_cluster"] = {}
    for model in traces:
        path = save(record(model, iterations=3, batch_size=BATCH[model]),
                    tdir / f"{model}.trace.jsonl")
        for p in workers:
            for servers, names in ((1, "ps,ring,butterfly"), (2, "ps")):
                rows, used = emulate.validate(path, p, servers, RATE, mech.parse_list(names),
                                              console, a.iterations, calibration=cals[p])
                console.print(report.validation_table(rows, f"{model}: {p} workers, {RATE}, "
                                                      f"{servers} server(s)"))
                doc["rows"] += [{"trace": model, "batch_size": BATCH[model], **r} for r in rows]
                doc["simulated_cluster"][str(p)] = {k: used[k] for k in ("link_bps",
                                                                         "send_buffer")}
    doc["summary"] = summarise(doc["rows"], usable_cores())
    doc["conditions"]["load_average_end"] = os.getloadavg()
    write_json(a.out, doc)
    plot(doc, a.out.with_suffix(".png"))
    s = doc["summary"]
    for name in ("uncontended", "contended"):
        e = s[name]
        console.print(f"{name} (ranks {'<=' if name == 'uncontended' else '>'} {s['cores']} "
                      "cores): " + ("no runs" if e is None else
                                    f"median |error| {e['median_abs_error']:.1%}, max "
                                    f"{e['max_abs_error']:.1%} over {e['runs']} runs"))
    console.print(f"median |error| {s['median_abs_error']:.1%}, max "
                  f"{s['max_abs_error']:.1%} over {s['runs']} runs; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
