"""The ``gradwire`` command line. Every user error ends in one line and a non-zero exit."""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gradwire.bandwidth import format_bandwidth, parse_bandwidth
from gradwire.cluster import (
    Cluster,
    cluster_down,
    cluster_up,
    ephemeral_cluster,
    list_clusters,
    load_cluster,
    netns_available,
)
from gradwire.cluster.netns import LOOPBACK_LABEL, MTU
from gradwire.errors import GradwireError
from gradwire.jsonfile import check_writable
from gradwire.launcher import launch

app = typer.Typer(help="gradwire: gradient aggregation on bandwidth-limited networks.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
cluster_app = typer.Typer(help="Emulated clusters: hosts in network namespaces, shaped links.",
                          no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")
# Piped output (CI logs, files) gets full-width tables instead of 80 truncated columns.
console = Console(width=None if sys.stdout.isatty() else 160)

Hosts = Annotated[int, typer.Option("--hosts", "-n", help="number of hosts (ranks)", min=1)]
Bandwidth = Annotated[str, typer.Option(
    "--bandwidth", "-b", help="per-host link rate in each direction: 100mbit, 1gbit, 10gbit, "
    "25gbit or none")]
Mtu = Annotated[int, typer.Option(
    help="largest IP packet on every link, bytes: 1500 (Ethernet) or e.g. 9000 (jumbo frames); "
    "tbf counts frame headers against the rate")]
Loopback = Annotated[bool, typer.Option(
    "--loopback", help=f"run without namespaces ({LOOPBACK_LABEL}); automatic without root")]


def _use_loopback(requested: bool) -> bool:
    if requested:
        return True
    ok, why = netns_available()
    if not ok:
        print(f"gradwire: {why}; falling back to {LOOPBACK_LABEL}", file=sys.stderr)
    return not ok


def _cluster(ctx: typer.Context, hosts: int, bandwidth: str, name: str | None, loopback: bool,
             mtu: int = MTU) -> contextlib.AbstractContextManager[Cluster]:
    """The live cluster ``name``, or an ephemeral one removed when the block ends. With a live
    cluster, a --hosts, --bandwidth or --mtu typed on the command line must match it (they
    would otherwise be ignored without a word)."""
    if name is not None:
        c = load_cluster(name)
        for key, given, have in (("hosts", hosts, len(c.hosts)), ("mtu", mtu, c.mtu),
                                 ("bandwidth", parse_bandwidth(bandwidth), c.bandwidth_bps)):
            typed = getattr(ctx.get_parameter_source(key), "name", None) == "COMMANDLINE"
            if typed and given != have:
                shown = (f"{have} hosts" if key == "hosts" else f"MTU {have}" if key == "mtu"
                         else f"{format_bandwidth(have)} links")  # type: ignore[arg-type]
                raise GradwireError(f"--{key} {ctx.params[key]} does not match cluster "
                                    f"{c.name} ({shown}): leave --{key} out with --cluster")
        return contextlib.nullcontext(c)
    return ephemeral_cluster(hosts, bandwidth, _use_loopback(loopback), mtu)


ClusterName = Annotated[str | None, typer.Option(
    "--cluster", help="use this live cluster (its hosts, bandwidth and MTU) instead of a new "
    "one; a --hosts, --bandwidth or --mtu given with it must match it")]


@cluster_app.command("up")
def cluster_up_cmd(hosts: Hosts = 4, bandwidth: Bandwidth = "1gbit",
                   name: Annotated[str | None, typer.Option(help="gw + 6 hex digits")] = None,
                   mtu: Mtu = MTU) -> None:
    """Create an emulated cluster that stays up until `gradwire cluster down`."""
    c = cluster_up(hosts, bandwidth, name, mtu=mtu)
    console.print(f"cluster [bold]{c.name}[/] up: {c.label}")
    _print_hosts(c)


@cluster_app.command("down")
def cluster_down_cmd(name: Annotated[str | None, typer.Argument()] = None,
                     all_: Annotated[bool, typer.Option("--all", help="every gradwire cluster, "
                                                        "orphans included")] = False) -> None:
    """Remove a cluster: its namespaces (and their processes), veth pairs and bridge."""
    removed = cluster_down(name, all_)
    console.print(f"removed: {', '.join(removed) or 'nothing'}")


@cluster_app.command("status")
def cluster_status_cmd(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List live clusters and their hosts."""
    live = list_clusters()
    if as_json:
        print(json.dumps([json.loads(c.to_json()) for c in live], indent=1))
        return
    if not live:
        console.print("no gradwire clusters are up")
    for c in live:
        note = (f" [yellow](stale: run {c.owner[0]} exited without removing it; the next "
                f"cluster made here removes it, or `gradwire cluster down {c.name}`)[/]"
                if c.stale else "")
        console.print(f"[bold]{c.name}[/]: {c.label}{note}")
        if c.shaped:
            buf = (f"{c.send_buffer_bytes / 1e3:.0f} kB" if c.send_buffer_bytes
                   else "this machine's")
            console.print(f"links: tc tbf {format_bandwidth(c.bandwidth_bps)} each direction, "
                          f"bucket {c.burst_bytes / 1e3:.0f} kB; hosts' TCP send buffer at "
                          f"most {buf}")
        _print_hosts(c)


def _print_hosts(c) -> None:
    t = Table("rank", "namespace", "address", "interface", "link (each direction)", "MTU")
    for h in c.hosts:
        t.add_row(str(h.rank), h.netns or "-", h.addr, h.ifname, format_bandwidth(c.bandwidth_bps),
                  str(c.mtu) if h.netns else "-")
    console.print(t)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    cmd: Annotated[list[str], typer.Argument(help="the command each rank runs, after --")],
    hosts: Hosts = 2,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    timeout: Annotated[float | None, typer.Option(help="seconds for the whole run")] = None,
    mtu: Mtu = MTU,
    loopback: Loopback = False,
) -> None:
    """Run CMD once per host with torchrun's environment; stop all if one fails.

    Example: gradwire run --hosts 4 --bandwidth 1gbit -- python train.py
    """
    with _cluster(ctx, hosts, bandwidth, cluster, loopback, mtu) as c:
        res = launch(c, cmd, timeout=timeout)
    if res.returncode != 0:
        print(f"gradwire run: {res.message}", file=sys.stderr)
        raise typer.Exit(res.returncode)


def _methods() -> str:
    from gradwire.train.aggregate import METHODS

    return ", ".join(METHODS)


Model = Annotated[str, typer.Option(help="a model from `gradwire models`")]
Density = Annotated[float, typer.Option(help="fraction of gradient elements a sparsifier sends")]
Epochs = Annotated[int, typer.Option(help="epochs (>= 1)")]
BatchSize = Annotated[int, typer.Option(help="samples per rank per iteration")]
Seed = Annotated[int, typer.Option(help="model initialisation and data order")]
JsonOut = Annotated[Path | None, typer.Option("--json", help="write the result JSON here")]


def _outputs(*options: tuple[str, Path | None]) -> None:
    """Refuse, before any work, output paths that cannot be written (one line each)."""
    for option, path in options:
        check_writable(path, option)


@app.command()
def models() -> None:
    """List the models `gradwire train --model` accepts, with their size and data."""
    from gradwire.models import MODELS, build_model, num_parameters
    from gradwire.train.task import load_task

    t = Table("model", "parameters", "fp32 gradient", "data", "what")
    classes = {}
    for name, spec in MODELS.items():
        if spec.data not in classes:
            classes[spec.data] = load_task(spec, 0).classes
        n = num_parameters(build_model(name, 0, classes[spec.data]))
        t.add_row(name, f"{n / 1e6:.3f} M", f"{4 * n / 1e6:.1f} MB", spec.data, spec.description)
    console.print(t)


@app.command()
def train(
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
    seq_len: Annotated[int, typer.Option(help="text models: symbols per sample")] = 64,
    checkpoint: Annotated[Path | None, typer.Option(help="save model, momentum and every "
                                                    "rank's residuals here each epoch")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="go on from --checkpoint up to "
                                         "--epochs")] = False,
    timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 3600,
    json_out: JsonOut = None,
    plot: Annotated[Path | None, typer.Option(help="write loss and accuracy curves (PNG) "
                                              "here")] = None,
    mtu: Mtu = MTU,
    loopback: Loopback = False,
) -> None:
    """Data-parallel training on an emulated cluster; prints throughput, bytes per iteration,
    the time breakdown and the final loss and accuracy.

    Example: gradwire train --model resnet20 --agg gtopk --density 0.001 --epochs 20
    """
    from gradwire.report import TABLE_NOTE, plot_curves, results_table
    from gradwire.train.job import TrainConfig, train_on, validate

    cfg = TrainConfig(model=model, agg=agg, density=density, mode=mode, warmup=warmup,
                      epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, seed=seed,
                      seq_len=seq_len, checkpoint=checkpoint, resume=resume)
    parse_bandwidth(bandwidth)
    validate(cfg, hosts)
    _outputs(("--json", json_out), ("--plot", plot), ("--checkpoint", checkpoint))
    with ephemeral_cluster(hosts, bandwidth, _use_loopback(loopback), mtu) as c:
        result = train_on(c, cfg, agg, timeout, console)
        label = c.label
    title = (f"{model} ({result['parameters'] / 1e6:.2f} M params), {hosts} ranks, {label}, "
             f"{result['epochs']} epochs, mode {mode}")
    console.print(results_table([result], title))
    console.print(TABLE_NOTE)
    if json_out:
        json_out.write_text(json.dumps(result, indent=1) + "\n")
        console.print(f"wrote {json_out}")
    if plot:
        console.print(f"wrote {plot_curves([result], plot, title)}")


@app.command()
def demo(
    hosts: Hosts = 4,
    bandwidth: Bandwidth = "1gbit",
    epochs: Epochs | None = None,
    model: Model | None = None,
    agg: Annotated[str, typer.Option(help="comma-separated aggregation methods")] = "dense,topk,"
    "gtopk",
    density: Density | None = None,
    mode: Annotated[str | None, typer.Option(help="bucket or model (the demo's)")] = None,
    batch_size: BatchSize | None = None,
    lr: Annotated[float | None, typer.Option(help="SGD learning rate")] = None,
    seed: Seed = 0,
    timeout: Annotated[float, typer.Option(help="seconds per training run")] = 900,
    json_out: Annotated[Path | None, typer.Option("--json", help="write results here")] = None,
    plot: Annotated[Path | None, typer.Option(help="the figure (PNG)")] = Path("gradwire-demo.png"),
    mtu: Mtu = MTU,
    loopback: Loopback = False,
) -> None:
    """The headline comparison: dense vs Top-k vs gTop-k (density 0.001, warm-up) training a
    1.12 M-parameter MLP on digits, on 4 emulated hosts at 1 Gbit/s; one table, one figure.
    Options left out keep the demo's settings (see docs/training.md)."""
    import dataclasses

    from gradwire.demo import DEMO, run_demo
    from gradwire.train.job import validate

    _outputs(("--json", json_out), ("--plot", plot))
    overrides = {k: v for k, v in (("epochs", epochs), ("model", model), ("density", density),
                                   ("mode", mode), ("batch_size", batch_size), ("lr", lr))
                 if v is not None}
    base = dataclasses.replace(DEMO, seed=seed, **overrides)
    aggs = [a.strip() for a in agg.split(",") if a.strip()]
    if not aggs:
        raise GradwireError(f"--agg is empty: expected a comma list of {_methods()}")
    parse_bandwidth(bandwidth)
    for a in aggs:
        validate(dataclasses.replace(base, agg=a), hosts)
    with ephemeral_cluster(hosts, bandwidth, _use_loopback(loopback), mtu) as c:
        results = run_demo(c, aggs, base, timeout, console, plot)
    if json_out:
        json_out.write_text(json.dumps(results, indent=1))


@app.command()
def bench(
    ctx: typer.Context,
    collective: Annotated[str, typer.Option(help="allreduce, broadcast, reduce, allgather or "
                                            "reducescatter")] = "allreduce",
    algo: Annotated[str | None, typer.Option(help="comma list, each NAME or NAME:KEY=VALUE[:...] "
                                             "(e.g. ring:pipeline=4); default: every algorithm "
                                             "of the collective")] = None,
    sizes: Annotated[str, typer.Option(help="bytes: 1K:64M (doubling), 1K:64M:4, or a comma "
                                       "list")] = "1K:64M",
    hosts: Hosts = 4,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    dtype: Annotated[str, typer.Option(help="float32, float16, bfloat16 or float64")] = "float32",
    op: Annotated[str, typer.Option(help="reduction of allreduce, reduce and reducescatter: "
                                    "sum or avg (the sum, then one division by the ranks)")]
    = "sum",
    iters: Annotated[int, typer.Option(min=1, help="timed runs per size and algorithm; a "
                                       "row reports their median")] = 5,
    batch: Annotated[int, typer.Option(min=1, help="calls timed back to back in each run "
                                       "(nccl-tests' -n), after one untimed lead-in call "
                                       "that starts the links from idle")] = 2,
    warmup: Annotated[int, typer.Option(min=0, help="untimed calls first")] = 1,
    interleave: Annotated[bool, typer.Option(help="run the algorithms (and the baseline) in "
                                             "turn, one timed run each per round, instead of "
                                             "one after another: ratios between them then "
                                             "hold on a machine whose speed drifts")] = False,
    param: Annotated[list[str] | None, typer.Option(help="algorithm parameter KEY=VALUE "
                                                    "for every listed algorithm that takes "
                                                    "it (repeatable)")] = None,
    builtin: Annotated[bool, typer.Option(help="add torch.distributed's own collective as "
                                          "the baseline row")] = True,
    timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 3600,
    json_out: Annotated[Path | None, typer.Option("--json", help="write rows here")] = None,
    mtu: Mtu = MTU,
    loopback: Loopback = False,
    device: Annotated[str, typer.Option(help="cpu (gloo) or cuda: buffers on the GPU, over "
                                        "NCCL; every emulated host is its own NCCL host, "
                                        "so hosts may share one GPU")] = "cpu",
) -> None:
    """Time collectives like nccl-tests, with the built-in collective and the model's
    prediction beside each algorithm. Every result is checked: the command fails (after
    writing --json) when any element came out wrong."""
    from gradwire.bench.report import wrong_rows
    from gradwire.bench.run import run_bench
    from gradwire.bench.sizes import parse_sizes
    from gradwire.bench.spec import check_device, check_op, check_shared, parse_params, parse_specs

    _outputs(("--json", json_out))
    specs = parse_specs(collective, algo)
    check_op(collective, op)
    if dtype not in ("float32", "float16", "bfloat16", "float64"):
        raise GradwireError(f"--dtype {dtype!r} is not supported: expected float32, float16, "
                            "bfloat16 or float64")
    check_device(device)
    size_list = parse_sizes(sizes)
    params = parse_params(param or [])
    check_shared(collective, specs, params)
    parse_bandwidth(bandwidth)
    with _cluster(ctx, hosts, bandwidth, cluster, loopback, mtu) as c:
        result = run_bench(c, collective, specs, size_list, dtype, iters, warmup, params,
                           builtin, timeout, console, interleave, op, device, batch)
    result["command"] = "gradwire " + shlex.join(sys.argv[1:])
    if json_out:
        json_out.write_text(json.dumps(result, indent=1) + "\n")
        console.print(f"wrote {json_out}")
    failed = wrong_rows(result["rows"])
    if failed:
        raise GradwireError(failed)


@app.command()
def calibrate(
    ctx: typer.Context,
    hosts: Hosts = 2,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 600,
    codec_numel: Annotated[int, typer.Option(min=0, help="also time every compressor's encode "
                                             "and decode on this many elements (0: skip)")] =
    2_000_000,
    mtu: Mtu = MTU,
    loopback: Loopback = False,
) -> None:
    """Measure α (ping-pong, and per step of an allreduce over every host), β (streaming), γ
    (reduction), the CPU ranks spend and how they share cores, and each method's encode and
    decode time, and save them with the links' token bucket for the model (whatif/advise
    --codecs FILE reads the coding times)."""
    from gradwire.bench import calibrate as cal
    from gradwire.jobs import run_ranks
    from gradwire.perf import codecs
    from gradwire.perf.whatif import CpuSetting

    parse_bandwidth(bandwidth)
    if cluster is None and hosts < 2:
        raise GradwireError(f"calibrate needs --hosts >= 2, got {hosts}")
    folder = cal.calibration_dir()  # where the result goes: check it first
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GradwireError(f"cannot save calibrations in {str(folder)!r} ({e.strerror}): set "
                            "GRADWIRE_HOME to a folder that can be written") from None
    with _cluster(ctx, hosts, bandwidth, cluster, loopback, mtu) as c:
        measured = run_ranks(c, "gradwire.bench.calibrate", [], "calibrate", timeout, console)
        key = c.link_key
        n_hosts, label, bucket = len(c.hosts), c.label, c.burst_bytes
    if codec_numel:
        measured["codecs"] = codecs.measure(codec_numel)
    d = cal.record(measured, key, n_hosts, label, bucket)
    t = Table("α (us)", f"α per step, {n_hosts} ranks (us)", "β (ns/byte)", "link (Gbit/s)",
              "burst (kB, measured)", "γ (ns/byte)", "network", "saved to")
    t.add_row(f"{d['alpha_s'] * 1e6:.1f}", f"{d['alpha_step_s'] * 1e6:.1f}",
              f"{d['beta_s_per_byte'] * 1e9:.3f}",
              f"{d['link_gbit_per_s_measured']:.3f}",
              f"{d['burst_bytes'] / 1e3:.0f} ({d['burst_bytes_measured'] / 1e3:.0f})",
              f"{d['gamma_s_per_byte'] * 1e9:.4f}", d["network"], d["path"])
    console.print(t)
    console.print(f"shared-CPU terms for the model: {d['cpu_ranks_per_machine']} ranks on "
                  f"{d['cores_per_machine']} cores; "
                  f"{CpuSetting.from_calibration(d, n_hosts).describe()}")
    if codec_numel:
        how = ("through the hook" if "through the hook" in measured["codecs"]["source"]
               else "compressors only")
        t = Table("method", "encode (ms)", "decode (ms)",
                  title=f"encode/decode of {codec_numel:,} fp32 elements, this machine ({how})")
        for name, m in measured["codecs"]["methods"].items():
            t.add_row(name, f"{m['encode_s'] * 1e3:.2f}", f"{m['decode_s'] * 1e3:.2f}")
        console.print(t)


@app.command("trace")
def trace_cmd(
    out: Annotated[Path, typer.Option("-o", "--out", help="write the trace (JSON lines) here")],
    model: Annotated[str | None, typer.Option(help="record this model (`gradwire models`)")] = None,
    source: Annotated[Path | None, typer.Option("--from", help="edit this trace instead")] = None,
    iterations: Annotated[int, typer.Option(min=1, help="iterations kept")] = 3,
    batch_size: BatchSize = 32,
    seed: Seed = 0,
    compute_speedup: Annotated[float, typer.Option(help="divide every compute time by "
                                                   "this")] = 1.0,
    add_layers: Annotated[int, typer.Option(min=0, help="insert this many layers before the "
                                            "last parameter")] = 0,
    layer_bytes: Annotated[int, typer.Option(min=1, help="each added layer's bytes")] = 4 * 2**20,
    layer_forward_ms: Annotated[float, typer.Option(min=0)] = 1.0,
    layer_backward_ms: Annotated[float, typer.Option(min=0)] = 2.0,
    resize: Annotated[list[str] | None, typer.Option(help="NAME=BYTES: resize a parameter "
                                                     "(repeatable)")] = None,
) -> None:
    """Record a compute trace (backward hooks on every parameter) or edit one; see
    docs/simulator.md.

    Example: gradwire trace --model resnet50 -o resnet50.trace.jsonl
    """
    from gradwire.sim import trace as tr

    if (model is None) == (source is None):
        raise GradwireError("give exactly one of --model (record) and --from (edit)")
    _outputs(("--out", out))
    if model is not None:
        from gradwire.sim.record import record

        t = record(model, iterations, batch_size, seed=seed)
    else:
        t = tr.load(source)
    if compute_speedup != 1.0:
        t = tr.scale_compute(t, compute_speedup)
    if add_layers:
        t = tr.add_layers(t, add_layers, layer_bytes, layer_forward_ms / 1e3,
                          layer_backward_ms / 1e3)
    for item in resize or []:
        name, sep, value = item.rpartition("=")
        if not sep or not value.isdigit():
            raise GradwireError(f"--resize {item!r}: expected NAME=BYTES")
        t = tr.resize(t, name, int(value))
    tr.save(t, out)
    it = t.iterations[0]
    console.print(f"wrote {out}: {t.model}, {len(t.params)} parameters, "
                  f"{t.total_bytes / 1e6:.2f} MB, {len(t.iterations)} iterations, forward "
                  f"{it.forward_s * 1e3:.1f} ms, backward {it.backward_s * 1e3:.1f} ms")


def _sweep_value(axis: str, text: str) -> float:
    """One value of ``--sweep AXIS=..``: a link rate, or a number (whole for workers and
    layers, > 0 for speedup)."""
    if axis == "bandwidth":
        bps = parse_bandwidth(text)
        if bps is None:
            raise GradwireError("--sweep bandwidth=none cannot be simulated: give rates such "
                                "as 10gbit,25gbit")
        return bps
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if axis in ("workers", "layers"):
        low = 1 if axis == "workers" else 0
        ok, allowed = math.isfinite(v) and v == int(v) and v >= low, f"whole numbers >= {low}"
    else:
        ok, allowed = math.isfinite(v) and v > 0, "numbers > 0"
    if not ok:
        raise GradwireError(f"--sweep {axis}: {text!r} is not valid: expected {allowed}")
    return v


SIM_MECHANISMS = "ps,multicast,ina,multicast+ina,ring,ring+multicast,butterfly"
EMULATED_MECHANISMS = "ps,ring,butterfly"  # --emulate's default: what runs for real


@app.command()
def simulate(
    trace: Annotated[list[Path], typer.Option(help="a trace from `gradwire trace` "
                                              "(repeatable with --table)")],
    workers: Annotated[int, typer.Option(min=1)] = 32,
    bandwidth: Annotated[str, typer.Option(help="every link, each way: 10gbit, 25gbit, "
                                           "...")] = "25gbit",
    mechanism: Annotated[str, typer.Option(help="comma list (see docs/simulator.md): ps, "
                                           "multicast, ina, multicast+ina, ring, "
                                           "ring+multicast, butterfly, any allreduce "
                                           "algorithm, NAME:KEY=VALUE options")
                         ] = SIM_MECHANISMS,
    servers: Annotated[int, typer.Option(min=1, help="parameter servers")] = 1,
    iterations: Annotated[int, typer.Option(min=1)] = 3,
    latency_us: Annotated[float, typer.Option(min=0, help="one-way latency per host")] = 0.0,
    seed: Seed = 0,
    timeline: Annotated[Path | None, typer.Option(help="write a Perfetto/chrome trace "
                                                  "JSON")] = None,
    sweep: Annotated[str | None, typer.Option(help="AXIS=V1,V2,..: workers, bandwidth, "
                                              "speedup or layers")] = None,
    plot: Annotated[Path | None, typer.Option(help="the sweep's PNG")] = None,
    table: Annotated[int | None, typer.Option(help="one of the paper's tables: 4, 6, 8, 9, "
                                              "10")] = None,
    emulate: Annotated[bool, typer.Option(help="also run each mechanism for real on an "
                                          "emulated cluster of --bandwidth links (root) and "
                                          "compare; default mechanisms ps,ring,butterfly")
                       ] = False,
    json_out: JsonOut = None,
) -> None:
    """Trace-driven simulation of parameter servers, multicast, in-network aggregation and
    all-reduce mechanisms on a non-blocking switch.

    Example: gradwire simulate --trace resnet50.trace.jsonl --workers 32 --bandwidth 25gbit
    """
    from gradwire.bench.provenance import stamp
    from gradwire.sim import mechanisms as mech
    from gradwire.sim import report
    from gradwire.sim.cluster import SimCluster
    from gradwire.sim.trace import load

    _outputs(("--timeline", timeline), ("--plot", plot), ("--json", json_out))
    if plot is not None and sweep is None:
        raise GradwireError("--plot draws a --sweep: give --sweep AXIS=V1,V2,.. too")
    bps = parse_bandwidth(bandwidth)
    if bps is None:
        raise GradwireError("--bandwidth none cannot be simulated: give a rate such as 25gbit")
    traces = [load(t) for t in trace]
    cluster = SimCluster(workers, bps, servers, latency_us * 1e-6, iterations=iterations,
                         seed=seed)
    out: dict = stamp("gradwire " + shlex.join(sys.argv[1:]))
    if table is not None:
        if table not in report.PAPER_TABLES:
            raise GradwireError(f"--table {table}: expected one of "
                                f"{', '.join(map(str, report.PAPER_TABLES))}")
        t, rows = report.paper_table(table, traces, cluster)
        console.print(t)
        out["rows"] = rows
    elif sweep is not None:
        axis, sep, values = sweep.partition("=")
        if axis not in report.AXES or not sep:
            raise GradwireError(f"--sweep {sweep!r}: expected AXIS=V1,V2 with AXIS one of "
                                f"{', '.join(report.AXES)}")
        vals = [_sweep_value(axis, v.strip()) for v in values.split(",") if v.strip()]
        if not vals:
            raise GradwireError(f"--sweep {sweep!r}: no values: expected {axis}=V1,V2,..")
        with console.status("simulating") as status:
            rows = report.sweep(traces[0], cluster, mech.parse_list(mechanism), axis, vals,
                                on_start=status.update)
        for r in rows:
            console.print(f"{axis}={r['value']:g}: " + ", ".join(
                f"{m} {s:.4f} s" for m, s in r["iteration_s"].items()))
        if plot:
            console.print(f"wrote {report.plot_sweep(rows, plot, traces[0].model)}")
        out["rows"] = rows
    elif emulate:
        from gradwire.sim import emulate as emu

        if len(trace) != 1 or timeline or plot:
            raise GradwireError("--emulate takes one --trace and no --timeline, --sweep or "
                                "--plot")
        if mechanism == SIM_MECHANISMS:  # the default names fabric mechanisms it cannot run
            mechanism = EMULATED_MECHANISMS
        rows, cal = emu.validate(trace[0], workers, servers, bandwidth,
                                 mech.parse_list(mechanism), console, iterations, seed)
        console.print(report.validation_table(rows, f"{traces[0].model}: {workers} workers, "
                                              f"{bandwidth} emulated, {servers} server(s)"))
        out |= {"calibration": cal, "rows": rows}
    else:
        with console.status("simulating") as status:
            results = mech.run(traces[0], cluster, mech.parse_list(mechanism),
                               timeline is not None, on_start=status.update)
        console.print(report.results_table(results, f"{traces[0].model}: {workers} workers, "
                                           f"{format_bandwidth(bps)}, {servers} server(s)"))
        if timeline:
            console.print(f"wrote {report.write_timeline(results, workers, timeline)}")
        out["results"] = [r.to_json() for r in results]
    if json_out:
        json_out.write_text(json.dumps(out, indent=1) + "\n")
        console.print(f"wrote {json_out}")


@app.command()
def profile(
    model: Annotated[str | None, typer.Option(help="a model from `gradwire models` to measure "
                                              "on this machine")] = None,
    batch_size: BatchSize = 32,
    iters: Annotated[int, typer.Option(min=1, help="timed iterations")] = 10,
    warmup: Annotated[int, typer.Option(min=0, help="untimed iterations first")] = 3,
    seq_len: Annotated[int, typer.Option(min=1, help="text models: symbols per sample")] = 64,
    out: Annotated[Path | None, typer.Option(help="write the profile (JSON) here, for "
                                             "whatif/advise --model FILE")] = None,
) -> None:
    """Measure a model's forward, per-tensor backward and optimizer-step time on this machine
    as a profile; without --model, list the built-in profiles.

    Example: gradwire profile --model resnet20 --out resnet20-here.json
    """
    from gradwire.perf import profiles

    if model is None:
        t = Table("profile", "parameters", "forward (ms)", "backward (ms)", "batch", "what")
        for name in profiles.builtin_names():
            p = profiles.load(name)
            ms = [f"{v * 1e3:.1f}" if v is not None else "-" for v in (p.forward_s, p.backward_s)]
            t.add_row(name, f"{p.numel:,}", *ms, str(p.batch_size or "-"), p.description)
        console.print(t)
        return
    from gradwire.perf.measure import measure

    if batch_size < 1:
        raise GradwireError(f"--batch-size must be >= 1, got {batch_size}")
    _outputs(("--out", out))
    p = measure(model, batch_size, iters, warmup, seq_len)
    t = Table("model", "parameters", "tensors", "forward (ms)", "backward (ms)", "step (ms)",
              title=p.sources["forward_s"])
    t.add_row(model, f"{p.numel:,}", str(len(p.params)), f"{p.forward_s * 1e3:.2f}",
              f"{p.backward_s * 1e3:.2f}", f"{p.step_s * 1e3:.2f}")
    console.print(t)
    if out:
        out.write_text(p.to_text())
        console.print(f"wrote {out}")


PerfModel = Annotated[str, typer.Option("--model", help="a built-in profile (gradwire profile "
                                         "lists them) or a profile JSON file")]
PerfAgg = Annotated[str, typer.Option("--agg", help="comma list of methods (dense, fp16, topk, "
                                      "gtopk, powersgd, signsgd, ...)")]
PerfDensity = Annotated[float, typer.Option(help="sparsifiers' kept fraction")]
PerfRank = Annotated[int, typer.Option(help="PowerSGD rank")]
PerfSlowdown = Annotated[float, typer.Option(help="factor (>= 1) by which backward slows while "
                                             "communication runs beside it")]
PerfAlpha = Annotated[float, typer.Option("--alpha-us", help="latency per message, µs "
                                          "(default: this cluster's calibration)")]
PerfGamma = Annotated[float, typer.Option("--gamma-ns", help="reduction, ns per byte")]
PerfCodecs = Annotated[str, typer.Option(help="encode/decode times: here (this machine's "
                                         "benchmark), v100 (compression-utility Table 2) or a "
                                         "JSON file")]
PerfCompute = Annotated[str | None, typer.Option("--compute-ms", help="FORWARD,BACKWARD ms "
                                                 "to use instead of the profile's")]
PerfMode = Annotated[str, typer.Option(help="bucket: DDP buckets; model: one bucket")]
PerfBucket = Annotated[float, typer.Option("--bucket-mb", help="DDP bucket cap, MiB")]
PerfPerNode = Annotated[int, typer.Option(help="consecutive ranks per node: they share the "
                                          "node's link to other nodes")]
PerfIntra = Annotated[str, typer.Option(help="link between the ranks of one node (with "
                                        "--ranks-per-node > 1)")]
PerfCalibration = Annotated[Path | None, typer.Option(
    "--calibration", help="a `gradwire calibrate` file: its α per step and γ replace "
    "--alpha-us and --gamma-ns, and its shared-CPU terms bound the iteration")]


def _calibrated(path: Path | None, alpha_us: float, gamma_ns: float):
    """(α s, γ s/B, shared-CPU terms or None, a line saying where they came from)."""
    from gradwire.perf.whatif import load_calibration

    if path is None:
        return alpha_us * 1e-6, gamma_ns * 1e-9, None, f"α {alpha_us:g} µs, γ {gamma_ns:g} ns/B"
    alpha, gamma, cpu = load_calibration(path)
    where = f"α {alpha * 1e6:.0f} µs per step, γ {gamma * 1e9:.3g} ns/B from {path}"
    if cpu is None:
        return alpha, gamma, None, where + " (no CPU terms in it: cores of their own)"
    who = "every worker on one machine" if cpu.one_machine else "each node's ranks"
    return alpha, gamma, cpu, where + f"; {who} sharing {cpu.cores:g} cores ({cpu.describe()})"


def _node(ranks_per_node: int, intra_bandwidth: str) -> tuple[int, float]:
    from gradwire.perf.model import parse_link

    if ranks_per_node < 1:
        raise GradwireError(f"--ranks-per-node must be >= 1, got {ranks_per_node}")
    try:
        return ranks_per_node, parse_link(intra_bandwidth)
    except GradwireError as e:
        raise GradwireError(f"--intra-bandwidth: {e}") from None


def _perf_inputs(model: str, agg: str, density: float, rank: int, mode: str, bucket_mb: float,
                 codecs: str, compute_ms: str | None):
    from gradwire.perf import codecs as codec_tables
    from gradwire.perf import profiles
    from gradwire.perf.model import Aggregation
    from gradwire.perf.whatif import parse_numbers

    prof = profiles.load(model)
    if compute_ms is not None:
        times = parse_numbers("--compute-ms", compute_ms, low=0.0)
        if len(times) != 2:
            raise GradwireError(f"--compute-ms {compute_ms!r}: expected FORWARD,BACKWARD in ms")
        prof = prof.with_compute(times[0] / 1e3, times[1] / 1e3, "--compute-ms")
    if bucket_mb <= 0:
        raise GradwireError(f"--bucket-mb must be > 0, got {bucket_mb}")
    if rank < 1:
        raise GradwireError(f"--rank must be >= 1, got {rank}")
    names = [a.strip() for a in agg.split(",") if a.strip()]
    if not names:
        raise GradwireError("--agg needs at least one method")
    aggs = [Aggregation(n, density=density, rank=rank, mode=mode, bucket_mb=bucket_mb)
            for n in names]
    return prof, aggs, codec_tables.load(codecs)


@app.command()
def whatif(
    model: PerfModel = "resnet50",
    workers: Annotated[str, typer.Option(help="4:128 (doubling), 4:128:4 or a comma list")] =
    "4:128",
    bandwidth: Annotated[str, typer.Option(help="comma list of link rates, e.g. 1gbit,10gbit")]
    = "1gbit,10gbit,25gbit",
    agg: PerfAgg = "dense,fp16,topk,gtopk,powersgd,signsgd",
    compute_speedup: Annotated[str, typer.Option(help="comma list of compute speedups")] = "1",
    density: PerfDensity = 0.001,
    rank: PerfRank = 4,
    mode: PerfMode = "bucket",
    bucket_mb: PerfBucket = 25.0,
    overlap_slowdown: PerfSlowdown = 1.0,
    alpha_us: PerfAlpha = 307.0,
    gamma_ns: PerfGamma = 0.11,
    ranks_per_node: PerfPerNode = 1,
    intra_bandwidth: PerfIntra = "100gbit",
    codecs: PerfCodecs = "here",
    compute_ms: PerfCompute = None,
    calibration: PerfCalibration = None,
    plot: Annotated[Path | None, typer.Option(help="write a PNG of iteration time against "
                                              "workers here")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write every prediction "
                                                  "here")] = None,
) -> None:
    """Predict iteration time for every (aggregation, workers, bandwidth, compute speedup), the
    compression needed for near-linear scaling and the encode+decode budget (§5 of the
    compression-utility paper).

    Example: gradwire whatif --model resnet50 --workers 4:128 --bandwidth 1gbit,10gbit
    """
    from gradwire.perf import whatif as w
    from gradwire.perf.model import parse_link

    _outputs(("--plot", plot), ("--json", json_out))
    prof, aggs, table = _perf_inputs(model, agg, density, rank, mode, bucket_mb, codecs,
                                     compute_ms)
    rates = [parse_link(b) for b in bandwidth.split(",")]
    speedups = w.parse_numbers("--compute-speedup", compute_speedup)
    if alpha_us < 0 or gamma_ns < 0 or overlap_slowdown < 1:
        raise GradwireError("--alpha-us and --gamma-ns must be >= 0 and --overlap-slowdown >= 1")
    alpha, gamma, cpu, where = _calibrated(calibration, alpha_us, gamma_ns)
    setting = w.Setting(alpha, gamma, overlap_slowdown, *_node(ranks_per_node, intra_bandwidth),
                        cpu=cpu)
    result = w.sweep(prof, aggs, w.parse_workers(workers), rates, speedups, table, setting)
    result["command"] = "gradwire " + shlex.join(sys.argv[1:])
    bws = list(dict.fromkeys(r["bandwidth"] for r in result["rows"]))
    for x in speedups:
        t = Table("aggregation", "workers", *(f"{b}: ms (eff.)" for b in bws),
                  title=f"{prof.model} ({prof.numel / 1e6:.2f} M params), compute ×{x:g}: "
                        "predicted iteration time and scaling efficiency")
        rows = [r for r in result["rows"] if r["compute_speedup"] == x]
        for key in dict.fromkeys((r["agg"], r["workers"]) for r in rows):
            cells = [r for r in rows if (r["agg"], r["workers"]) == key]
            t.add_row(key[0], str(key[1]), *(f"{r['iteration_s'] * 1e3:.1f} "
                                              f"({r['efficiency']:.0%})" for r in cells))
        console.print(t)
        a = Table("workers", *(f"{b}: ratio / budget" for b in bws),
                  title="compression an all-reducible scheme needs for linear scaling, and the "
                        "most encode+decode may cost (dense time − compute time)")
        ans = [r for r in result["answers"] if r["compute_speedup"] == x]
        for p in dict.fromkeys(r["workers"] for r in ans):
            a.add_row(str(p), *(f"{r['required_compression']:.3g}× / "
                                f"{r['coding_budget_s'] * 1e3:.1f} ms"
                                for r in ans if r["workers"] == p))
        console.print(a)
    per_node = (f"{ranks_per_node} ranks per node ({intra_bandwidth} inside); "
                if ranks_per_node > 1 else "")
    console.print(f"{where}, overlap slowdown "
                  f"{overlap_slowdown:g}; {per_node}compute: {result['compute_source']}; "
                  f"encode/decode: {table.source}")
    if plot:
        console.print(f"wrote {w.plot(result, plot)}")
    if json_out:
        json_out.write_text(json.dumps(result, indent=1) + "\n")
        console.print(f"wrote {json_out}")


@app.command()
def advise(
    model: PerfModel = "resnet50",
    workers: Annotated[int, typer.Option(min=1, help="number of workers")] = 32,
    bandwidth: Annotated[str, typer.Option(help="link rate, e.g. 1gbit")] = "1gbit",
    agg: Annotated[str | None, typer.Option("--agg", help="comma list of methods to rank "
                                            "(default: every method)")] = None,
    density: PerfDensity = 0.001,
    rank: PerfRank = 4,
    mode: PerfMode = "bucket",
    bucket_mb: PerfBucket = 25.0,
    compute_speedup: Annotated[float, typer.Option(help="compute speedup")] = 1.0,
    overlap_slowdown: PerfSlowdown = 1.0,
    alpha_us: PerfAlpha = 307.0,
    gamma_ns: PerfGamma = 0.11,
    ranks_per_node: PerfPerNode = 1,
    intra_bandwidth: PerfIntra = "100gbit",
    codecs: PerfCodecs = "here",
    compute_ms: PerfCompute = None,
    calibration: PerfCalibration = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the ranking here")]
    = None,
) -> None:
    """Rank every aggregation scheme by predicted iteration time and say why the winner wins.

    Example: gradwire advise --model resnet50 --workers 32 --bandwidth 1gbit
    """
    from gradwire.hooks import METHODS
    from gradwire.perf import advise as adv
    from gradwire.perf.model import parse_link
    from gradwire.perf.whatif import Setting

    _outputs(("--json", json_out))
    prof, aggs, table = _perf_inputs(model, agg or ",".join(METHODS), density, rank, mode,
                                     bucket_mb, codecs, compute_ms)
    if alpha_us < 0 or gamma_ns < 0:
        raise GradwireError("--alpha-us and --gamma-ns must be >= 0")
    alpha, gamma, cpu, where = _calibrated(calibration, alpha_us, gamma_ns)
    cluster = Setting(alpha, gamma, overlap_slowdown, *_node(ranks_per_node, intra_bandwidth),
                      cpu=cpu).cluster(workers, parse_link(bandwidth))
    g = cluster.ranks_per_node
    ranked, skipped = adv.rank(prof, cluster, aggs, table, compute_speedup, overlap_slowdown)
    t = Table("#", "aggregation", "iteration (ms)", "efficiency", "not hidden (ms)",
              "encode+decode (ms)", "wire (ms)", "sent/rank (MB)",
              title=f"{prof.model}, {workers} workers, {bandwidth}"
                    + (f", {g} per node ({intra_bandwidth} inside)" if g > 1 else ""))
    for i, r in enumerate(ranked, 1):
        p = r.prediction
        t.add_row(str(i), r.agg.label, f"{r.seconds * 1e3:.1f}", f"{float(p.efficiency):.0%}",
                  f"{r.overhead * 1e3:.1f}", f"{p.coding * 1e3:.1f}",
                  f"{float(p.communicate) * 1e3:.1f}", f"{p.wire_bytes / 1e6:.3g}")
    console.print(t)
    console.print(adv.explain(ranked))
    console.print(where)
    for s in skipped:
        console.print(f"not ranked: {s}")
    if json_out:
        json_out.write_text(json.dumps([{"agg": r.agg.label, "iteration_s": r.seconds,
                                         "overhead_s": r.overhead} for r in ranked], indent=1))
        console.print(f"wrote {json_out}")


def main() -> None:
    try:
        rc = app(standalone_mode=False)
    except GradwireError as e:
        print(f"gradwire: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        if e.filename is None:
            raise
        # a file the checks up front could not foresee (a disk that filled, a folder removed)
        print(f"gradwire: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        print("gradwire: interrupted; cleaned up", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as e:
        # click's own usage errors (a value out of range, an unknown option or command): one line
        # like ours instead of a usage box. With no arguments, typer has printed the help.
        if type(e).__name__ != "NoArgsIsHelpError":
            print(f"gradwire: error: {e.format_message()}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2))
    if isinstance(rc, int) and rc != 0:
        sys.exit(rc)
if __name__ == "__main__":
    main()
