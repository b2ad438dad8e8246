"""``gradwire profile``, ``whatif`` and ``advise``: the performance model
(docs/performance-model.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gradwire.bandwidth import MODEL_MOST, format_bandwidth
from gradwire.check import (
    MAX_BATCH,
    MAX_POWERSGD_RANK,
    MAX_RECORDED,
    MAX_SECONDS,
    MAX_SEQ_LEN,
    check_range,
    comma_items,
)
from gradwire.cli.options import (
    check_outputs,
    check_seq_len,
    command_line,
    console,
    typed,
    write_json,
    write_text,
)
from gradwire.errors import GradwireError
from gradwire.schedules.registry import MAX_WORLD

# what the help says of every option: its unit, its range and its default
_RATES = f"100kbit to {format_bandwidth(MODEL_MOST)}"

PerfModel = Annotated[str, typer.Option("--model", help="a built-in profile (gradwire profile "
                                         "lists them) or a profile JSON file")]
PerfAgg = Annotated[str, typer.Option("--agg", help="comma list of methods (dense, fp16, topk, "
                                      "gtopk, powersgd, signsgd, ...)")]
PerfDensity = Annotated[float, typer.Option(help="sparsifiers' kept fraction, in (0, 1]")]
PerfRank = Annotated[int, typer.Option(help=f"PowerSGD rank, 1 to {MAX_POWERSGD_RANK}")]
PerfSlowdown = Annotated[float | None, typer.Option(help="factor (1 to 100) by which backward "
                                                    "slows while communication runs beside it "
                                                    "(default: the calibration's or the "
                                                    "reference setting's)")]
PerfAlpha = Annotated[float | None, typer.Option("--alpha-us", help="α: µs per schedule step, "
                                                 "0 to 1e6 (default: the calibration's or the "
                                                 "reference setting's)")]
PerfGamma = Annotated[float | None, typer.Option("--gamma-ns", help="reduction, ns per byte, "
                                                 "0 to 1000 (default: the calibration's or the "
                                                 "reference setting's)")]
PerfCodecs = Annotated[str | None, typer.Option(help="encode/decode times: v100 "
                                                "(compression-utility Table 2), h100 (measured "
                                                "on an H100) or a JSON codec table (default: "
                                                "the calibration's or the reference "
                                                "setting's)")]
PerfReference = Annotated[str, typer.Option(help="the reference setting assumed without "
                                            "--calibration: v100 (the compression-utility "
                                            "paper's V100 cluster) or h100 (see "
                                            "docs/performance-model.md)")]
PerfCompute = Annotated[str | None, typer.Option("--compute-ms", help="FORWARD,BACKWARD ms, "
                                                 "each > 0 and at most "
                                                 f"{MAX_SECONDS * 1e3:g}, instead of the "
                                                 "profile's")]
PerfMode = Annotated[str, typer.Option(help="bucket: DDP buckets; model: one bucket")]
PerfBucket = Annotated[float, typer.Option("--bucket-mb", help="DDP bucket cap, MiB, > 0 "
                                           "(--mode bucket)")]
PerfPerNode = Annotated[int, typer.Option(help=f"consecutive ranks per node, 1 to {MAX_WORLD}: "
                                          "they share the node's link to other nodes")]
PerfIntra = Annotated[str, typer.Option(help="link between the ranks of one node (with "
                                        "--ranks-per-node > 1), up to 100tbit: e.g. 3.6tbit "
                                        "for an H100's NVLink")]
PerfCalibration = Annotated[Path | None, typer.Option(
    "--calibration", help="a `gradwire calibrate` file, measured on your cluster: its α, γ, "
    "codec times, slowdowns and shared-CPU terms replace the reference setting's (default: "
    "none, the --reference setting)")]


def _check_bucket(ctx: typer.Context, mode: str) -> None:
    """A --bucket-mb typed with --mode model is refused: model mode aggregates the whole
    gradient as one bucket, and the prediction would not read it."""
    if mode == "model" and typed(ctx, "bucket_mb"):
        raise GradwireError(f"--bucket-mb {ctx.params['bucket_mb']:g} is the DDP bucket cap of "
                            "--mode bucket: --mode model aggregates the whole gradient as one "
                            "bucket; leave --bucket-mb out")


def _check_read(ctx: typer.Context, calibration: Path | None, ranks_per_node: int,
                agg: str | None) -> None:
    """Options typed where the prediction would not read them are refused, as --bucket-mb
    with --mode model: --reference beside --calibration (the calibration describes the
    cluster), --intra-bandwidth with one rank per node (no transfer stays inside a node),
    --density or --rank where no method of --agg takes it."""
    from gradwire import catalogue

    names = comma_items(agg or "")
    known = [n for n in names if n in catalogue.METHODS]
    if names and len(known) == len(names):  # an unknown name is refused where it is read
        for option, takes in (("density", lambda m: m.takes_density),
                              ("rank", lambda m: "rank" in m.options)):
            if typed(ctx, option) and not any(takes(catalogue.get(n)) for n in known):
                raise GradwireError(f"--{option} {ctx.params[option]}: no method of --agg "
                                    f"{agg} takes it; leave it out")
    if calibration is not None and typed(ctx, "reference"):
        raise GradwireError(f"--reference {ctx.params['reference']} is what is assumed without "
                            f"a calibration: --calibration {calibration} describes the cluster "
                            "instead; leave one of them out")
    if ranks_per_node == 1 and typed(ctx, "intra_bandwidth"):
        raise GradwireError(f"--intra-bandwidth {ctx.params['intra_bandwidth']} is the link "
                            "between the ranks of one node: with one rank per node every "
                            "transfer crosses --bandwidth's links; give --ranks-per-node 2 or "
                            "more, or leave --intra-bandwidth out")


def profile(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="a model from `gradwire models` to measure "
                                              "on this machine (default: none, list the "
                                              "built-in profiles)")] = None,
    batch_size: Annotated[int, typer.Option(help="samples per iteration of the one process "
                                            "profiled (1 to 65536)")] = 32,
    iters: Annotated[int, typer.Option(min=1, help="timed iterations (at most 1000)")] = 10,
    warmup: Annotated[int, typer.Option(min=0, help="untimed iterations first (at most "
                                        "1000)")] = 3,
    seq_len: Annotated[int, typer.Option(min=1, help="text models: symbols per sample (at "
                                         "most 4096)")] = 64,
    out: Annotated[str | None, typer.Option(help="write the profile (JSON) here, for "
                                            "whatif/advise --model FILE")] = None,
) -> None:
    """Measure a model's forward, per-tensor backward and optimizer-step time on this machine
    as a profile; without --model, list the built-in profiles.

    Example: gradwire profile --model resnet20 --out resnet20-here.json
    """
    from gradwire.perf import report

    if model is None:
        if out is not None:  # listing the built-in profiles writes nothing: say so, not exit 0
            raise GradwireError("--out writes a measured profile: give --model too")
        # nor does it measure: an option that says how would be ignored, its value unchecked
        given = [f"--{k.replace('_', '-')}" for k in ("batch_size", "iters", "warmup", "seq_len")
                 if typed(ctx, k)]
        if given:
            raise GradwireError(f"{', '.join(given)} {'sets' if len(given) == 1 else 'set'} how "
                                "a model is measured: give --model too (without it, profile "
                                "lists the built-in profiles)")
        console.print(report.profiles_table())
        return
    from gradwire.jobs import local_progress
    from gradwire.models import get_spec
    from gradwire.profiles.measure import measure

    check_range("--batch-size", batch_size, 1, MAX_BATCH)
    check_range("--seq-len", seq_len, 1, MAX_SEQ_LEN)
    check_range("--iters", iters, 1, MAX_RECORDED)  # as many as `gradwire trace` records
    check_range("--warmup", warmup, 0, MAX_RECORDED)
    spec = get_spec(model)
    check_seq_len(ctx, model, seq_len)
    (out_path,) = check_outputs(("--out", out))
    try:
        with local_progress(console, f"profile {model}") as update:
            p = measure(model, batch_size, iters, warmup, seq_len, on_step=update)
    except (MemoryError, RuntimeError) as e:
        short = _out_of_memory(e, model, batch_size, seq_len if spec.data == "text" else None)
        if short is None:
            raise
        raise short from None
    console.print(report.profile_table(model, p))
    same_name = report.builtin_namesake(p.model, p.numel)
    if same_name:
        console.print(same_name)
    if out_path:
        write_text(out_path, p.to_text())


def _out_of_memory(e: MemoryError | RuntimeError, model: str, batch_size: int,
                   seq_len: int | None) -> GradwireError | None:
    """A measurement that ran out of memory as one line naming the options that size it
    (torch's CPU allocator raises a RuntimeError, CUDA's an OutOfMemoryError); None for any
    other error."""
    import re

    import torch

    text = str(e)
    # torch.cuda's name: torch.OutOfMemoryError is the same class, from torch 2.5 on only
    if not (isinstance(e, MemoryError | torch.cuda.OutOfMemoryError)
            or "can't allocate memory" in text):
        return None
    asked = re.search(r"allocate (\d+) bytes", text)
    size = f" (it asked for {int(asked.group(1)) / 2**30:.3g} GiB at once)" if asked else ""
    sized = f"--batch-size {batch_size}" + ("" if seq_len is None else f" --seq-len {seq_len}")
    return GradwireError(f"profile --model {model} {sized}: one iteration needs more memory "
                         f"than this machine gives{size}; give a smaller --batch-size"
                         + ("" if seq_len is None else " or --seq-len"))


def whatif(
    ctx: typer.Context,
    model: PerfModel = "resnet50",
    workers: Annotated[str, typer.Option(help="4:128 (doubling: 4, 8, ..., 128), 4:128:4 (×4: "
                                         "4, 16, 64) or a comma list, each from 1 to "
                                         f"{MAX_WORLD}")] = "4:128",
    bandwidth: Annotated[str, typer.Option(help=f"comma list of link rates, {_RATES}, e.g. "
                                           "1gbit,10gbit")] = "1gbit,10gbit,25gbit",
    agg: PerfAgg = "dense,fp16,topk,gtopk,powersgd,signsgd",
    compute_speedup: Annotated[str, typer.Option(help="comma list of factors dividing compute "
                                                 "and encode/decode times (a faster "
                                                 "device), 1e-6 to 1e6")] = "1",
    density: PerfDensity = 0.001,
    rank: PerfRank = 4,
    mode: PerfMode = "bucket",
    bucket_mb: PerfBucket = 25.0,
    overlap_slowdown: PerfSlowdown = None,
    alpha_us: PerfAlpha = None,
    gamma_ns: PerfGamma = None,
    ranks_per_node: PerfPerNode = 1,
    intra_bandwidth: PerfIntra = "100gbit",
    codecs: PerfCodecs = None,
    compute_ms: PerfCompute = None,
    calibration: PerfCalibration = None,
    reference: PerfReference = "v100",
    plot: Annotated[str | None, typer.Option(help="write a figure of iteration time against "
                                             "workers here, in the format its extension "
                                             "names (.png, .svg, .pdf, ...)")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="write every prediction "
                                                 "here")] = None,
) -> None:
    """Predict iteration time for every (aggregation, workers, bandwidth, compute speedup), the
    compression needed for near-linear scaling and the encode+decode budget (§5 of the
    compression-utility paper).

    Example: gradwire whatif --model resnet50 --workers 4:128 --bandwidth 1gbit,10gbit
    """
    from gradwire.bench.provenance import stamp
    from gradwire.perf import report, scenario
    from gradwire.perf.whatif import plot as plot_whatif
    from gradwire.perf.whatif import refusal

    plot_path, json_path = check_outputs(("--plot", plot), ("--json", json_out), inputs=(
        ("--model", model), ("--codecs", codecs), ("--calibration", calibration)))
    _check_bucket(ctx, mode)
    _check_read(ctx, calibration, ranks_per_node, agg)
    s = scenario.Scenario(model=model, agg=agg, density=density, rank=rank, mode=mode,
                          bucket_mb=bucket_mb, codecs=codecs, compute_ms=compute_ms,
                          overlap_slowdown=overlap_slowdown, alpha_us=alpha_us,
                          gamma_ns=gamma_ns, ranks_per_node=ranks_per_node,
                          intra_bandwidth=intra_bandwidth, calibration=calibration,
                          reference=reference)
    found = scenario.whatif(s, workers, bandwidth, compute_speedup)
    found.result.update(stamp(command_line()))  # as every result file: command, date, ...
    for t in report.whatif_tables(found):
        console.print(t)
    console.print(found.note)
    for skipped in found.result["not_predicted"]:
        console.print(f"not predicted: {refusal(skipped, found.result['workers'])}")
    if json_path:  # before the plot: a plot that cannot be written must not lose the result
        write_json(json_path, found.result)
    if plot_path:
        console.print(f"wrote {plot_whatif(found.result, plot_path)}")


def advise(
    ctx: typer.Context,
    model: PerfModel = "resnet50",
    workers: Annotated[int, typer.Option(min=1, help=f"number of workers, 1 to {MAX_WORLD}")]
    = 32,
    bandwidth: Annotated[str, typer.Option(help=f"link rate, {_RATES}, e.g. 1gbit")] = "1gbit",
    agg: Annotated[str | None, typer.Option("--agg", help="comma list of methods to rank "
                                            "(default: every method)")] = None,
    density: PerfDensity = 0.001,
    rank: PerfRank = 4,
    mode: PerfMode = "bucket",
    bucket_mb: PerfBucket = 25.0,
    compute_speedup: Annotated[float, typer.Option(help="divide compute and encode/decode "
                                                   "times by this (a faster device), 1e-6 to "
                                                   "1e6")] = 1.0,
    overlap_slowdown: PerfSlowdown = None,
    alpha_us: PerfAlpha = None,
    gamma_ns: PerfGamma = None,
    ranks_per_node: PerfPerNode = 1,
    intra_bandwidth: PerfIntra = "100gbit",
    codecs: PerfCodecs = None,
    compute_ms: PerfCompute = None,
    calibration: PerfCalibration = None,
    reference: PerfReference = "v100",
    json_out: Annotated[str | None, typer.Option("--json", help="write the ranking here")]
    = None,
) -> None:
    """Rank every aggregation scheme by predicted iteration time and say why the winner wins.

    Example: gradwire advise --model resnet50 --workers 32 --bandwidth 1gbit
    """
    from gradwire.bench.provenance import stamp
    from gradwire.perf import report, scenario
    from gradwire.perf.advise import explain

    (json_path,) = check_outputs(("--json", json_out), inputs=(
        ("--model", model), ("--codecs", codecs), ("--calibration", calibration)))
    _check_bucket(ctx, mode)
    _check_read(ctx, calibration, ranks_per_node, agg)
    s = scenario.Scenario(model=model, agg=agg, density=density, rank=rank, mode=mode,
                          bucket_mb=bucket_mb, codecs=codecs, compute_ms=compute_ms,
                          overlap_slowdown=overlap_slowdown, alpha_us=alpha_us,
                          gamma_ns=gamma_ns, ranks_per_node=ranks_per_node,
                          intra_bandwidth=intra_bandwidth, calibration=calibration,
                          reference=reference)
    found = scenario.advise(s, workers, bandwidth, compute_speedup)
    console.print(report.advice_table(found))
    console.print(explain(found.ranked))
    console.print(found.note)
    for skipped in found.skipped:
        console.print(f"not ranked: {skipped}")
    if json_path:  # with the command, date, commit and machine, as every result file
        write_json(json_path, {**stamp(command_line()), **found.result})

