"""``gradwire models``, ``train`` and ``demo``: data-parallel training on an emulated cluster."""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

import typer
from rich.table import Table

from gradwire.bandwidth import parse_bandwidth
from gradwire.check import distinct
from gradwire.cli.options import (
    Bandwidth,
    BatchSize,
    Density,
    Epochs,
    Hosts,
    JsonOut,
    Loopback,
    Model,
    Mtu,
    Seed,
    check_loopback,
    check_outputs,
    check_seq_len,
    check_sparsifier_options,
    command_line,
    console,
    planned_ranks,
    use_loopback,
    write_json,
)
from gradwire.cluster import ephemeral_cluster
from gradwire.cluster.netns import MTU
from gradwire.cluster.state import check_mtu
from gradwire.errors import GradwireError
from gradwire.jobs import build_progress
from gradwire.launcher import check_timeout


def models() -> None:
    """List the models `gradwire train --model` accepts, with their size and data."""
    from gradwire.models import MODELS, build_model, num_parameters
    from gradwire.models.task import load_task

    t = Table("model", "parameters", "fp32 gradient", "data", "what")
    classes = {}
    for name, spec in MODELS.items():
        if spec.data not in classes:
            classes[spec.data] = load_task(spec, 0).classes
        n = num_parameters(build_model(name, 0, classes[spec.data]))
        t.add_row(name, f"{n / 1e6:.3f} M", f"{4 * n / 1e6:.1f} MB", spec.data, spec.description)
    console.print(t)


def train(
    ctx: typer.Context,
    model: Model = "mlp",
    agg: Annotated[str, typer.Option(help="aggregation method (dense, topk, gtopk, ...: "
                                     "see docs/training.md)")] = "dense",
    density: Density = 0.001,
    mode: Annotated[str, typer.Option(help="bucket: compress each DDP bucket; model: the "
                                      "whole gradient at once")] = "bucket",
    warmup: Annotated[bool, typer.Option(help="dense-to-sparse density warm-up in the first "
                                         "epochs")] = True,
    hosts: Hosts = 4,
    bandwidth: Bandwidth = "1gbit",
    epochs: Epochs = 10,
    batch_size: BatchSize = 32,
    lr: Annotated[float, typer.Option(help="SGD learning rate")] = 0.05,
    momentum: Annotated[float, typer.Option(help="SGD momentum")] = 0.9,
    seed: Seed = 0,
    seq_len: Annotated[int, typer.Option(help="text models: symbols per sample (1 to "
                                         "4096)")] = 64,
    rank: Annotated[int | None, typer.Option(help="PowerSGD's rank (--agg powersgd); default: "
                                             "the hook's, 4")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="save model, momentum and every "
                                                   "rank's residuals here each epoch")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="go on from --checkpoint up to "
                                         "--epochs")] = False,
    timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 3600,
    json_out: JsonOut = None,
    plot: Annotated[str | None, typer.Option(help="write loss and accuracy curves (PNG) "
                                             "here")] = None,
    mtu: Mtu = MTU,
    loopback: Loopback = False,
) -> None:
    """Data-parallel training on an emulated cluster; prints throughput, bytes per iteration,
    the time breakdown and the final loss and accuracy.

    Example: gradwire train --model resnet20 --agg gtopk --density 0.001 --epochs 20
    """
    from gradwire.report import TABLE_NOTE, plot_curves, results_table
    from gradwire.train.job import TrainConfig, train_on, validate, warmup_note

    agg = agg.strip()  # as demo's --agg items are: " topk" is topk
    cfg = TrainConfig(model=model, agg=agg, density=density, mode=mode, warmup=warmup,
                      epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, seed=seed,
                      seq_len=seq_len, rank=rank, checkpoint=checkpoint, resume=resume)
    parse_bandwidth(bandwidth)
    check_mtu(mtu)  # here, not when the cluster is made: after the notes below, and a fallback
    check_timeout(timeout)
    validate(cfg, planned_ranks(hosts, None))
    check_seq_len(ctx, model, seq_len)
    check_sparsifier_options(ctx, agg, warmup)
    check_loopback(ctx, loopback, bandwidth)
    json_path, plot_path, checkpoint_path = check_outputs(
        ("--json", json_out), ("--plot", plot), ("--checkpoint", checkpoint))
    # validate read --checkpoint as typed, so that "ck/" is refused as a folder's name, not
    # taken for an existing file "ck"; the run has it as check_outputs returns it
    cfg = dataclasses.replace(cfg, checkpoint=checkpoint_path)
    note = warmup_note(cfg, "--epochs {epochs} or more, or --no-warmup, send it")
    if note:
        print(f"gradwire train: {note}", file=sys.stderr)
    with ephemeral_cluster(hosts, bandwidth, use_loopback(loopback), mtu,
                           progress=build_progress(console, hosts)) as c:
        result = train_on(c, cfg, agg, timeout, console)
        label = c.label
    title = (f"{model} ({result['parameters'] / 1e6:.2f} M params), {hosts} ranks, {label}, "
             f"{result['epochs']} epochs, mode {mode}")
    problems = []
    if json_path:  # first: the run's result is kept whatever the report does
        try:
            write_json(json_path, _stamped(result)[0])
        except GradwireError as e:  # saved elsewhere, it says where: table and figure still
            problems.append(str(e))
    console.print(results_table([result], title))
    console.print(TABLE_NOTE)
    if plot_path:
        try:
            console.print(f"wrote {plot_curves([result], plot_path, title)}")
        except OSError as e:  # said with, not instead of, a --json saved elsewhere
            if not problems:
                raise
            problems.append(f"could not write {plot_path} ({e.strerror or e})")
    if problems:
        raise GradwireError("; ".join(problems))


def _stamped(*results: dict) -> list[dict]:
    """Runs' results as --json keeps them: each with the command, date, commit and machine
    that made it, as every other result file gradwire writes."""
    from gradwire.bench.provenance import stamp

    made = stamp(command_line())
    return [{**r, **made} for r in results]


def demo(
    ctx: typer.Context,
    hosts: Hosts = 4,
    bandwidth: Bandwidth = "1gbit",
    epochs: Annotated[int | None, typer.Option(help="epochs (1 to 10000)",
                                               show_default="20")] = None,
    model: Annotated[str | None, typer.Option(help="a model from `gradwire models`",
                                              show_default="mlp")] = None,
    agg: Annotated[str, typer.Option(help="comma-separated aggregation methods")] = "dense,topk,"
    "gtopk",
    density: Annotated[float | None, typer.Option(
        help="fraction of gradient elements a sparsifier sends, after the gTop-k paper's "
        "warm-up", show_default="0.001")] = None,
    mode: Annotated[str | None, typer.Option(help="bucket or model",
                                             show_default="model")] = None,
    batch_size: Annotated[int | None, typer.Option(
        help="samples per rank per iteration (1 to 65536)", show_default="8")] = None,
    lr: Annotated[float | None, typer.Option(help="SGD learning rate",
                                             show_default="0.02")] = None,
    seed: Seed = 0,
    timeout: Annotated[float, typer.Option(help="seconds per training run")] = 900,
    json_out: Annotated[str | None, typer.Option("--json", help="write results here")] = None,
    plot: Annotated[str | None, typer.Option(help="the figure (PNG)")] = "gradwire-demo.png",
    mtu: Mtu = MTU,
    loopback: Loopback = False,
) -> None:
    """The headline comparison: dense vs Top-k vs gTop-k (density 0.001, warm-up) training a
    1.13 M-parameter MLP on digits, on 4 emulated hosts at 1 Gbit/s; one table, one figure.
    Options left out keep the demo's settings (see docs/training.md)."""
    from gradwire.demo import DEMO, run_demo
    from gradwire.train.aggregate import METHODS
    from gradwire.train.job import validate, warmup_note

    json_path, plot_path = check_outputs(("--json", json_out), ("--plot", plot))
    overrides = {k: v for k, v in (("epochs", epochs), ("model", model), ("density", density),
                                   ("mode", mode), ("batch_size", batch_size), ("lr", lr))
                 if v is not None}
    base = dataclasses.replace(DEMO, seed=seed, **overrides)
    aggs = distinct([a.strip() for a in agg.split(",") if a.strip()])  # each once
    if not aggs:
        raise GradwireError(f"--agg is empty: expected a comma list of {', '.join(METHODS)}")
    parse_bandwidth(bandwidth)
    check_mtu(mtu)  # here, not when the cluster is made: after the notes below, and a fallback
    check_timeout(timeout)
    check_loopback(ctx, loopback, bandwidth)
    planned_ranks(hosts, None)
    runs = [dataclasses.replace(base, agg=a) for a in aggs]
    for cfg in runs:
        validate(cfg, hosts)
    for cfg in runs:
        note = warmup_note(cfg, "--epochs {epochs} or more send it")
        if note:
            print(f"gradwire demo: {note}", file=sys.stderr)
    with ephemeral_cluster(hosts, bandwidth, use_loopback(loopback), mtu,
                           progress=build_progress(console, hosts)) as c:
        run_demo(c, aggs, base, timeout, console, plot_path,
                 keep=(lambda results: write_json(json_path, _stamped(*results)))
                 if json_path else None)
