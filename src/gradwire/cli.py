"""The ``gradwire`` command line. Every user error ends in one line and a non-zero exit."""

from __future__ import annotations

import contextlib
import json
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
from gradwire.cluster.netns import LOOPBACK_LABEL
from gradwire.errors import GradwireError
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
Loopback = Annotated[bool, typer.Option(
    "--loopback", help=f"run without namespaces ({LOOPBACK_LABEL}); automatic without root")]


def _use_loopback(requested: bool) -> bool:
    if requested:
        return True
    ok, why = netns_available()
    if not ok:
        print(f"gradwire: {why}; falling back to {LOOPBACK_LABEL}", file=sys.stderr)
    return not ok


def _cluster(hosts: int, bandwidth: str, name: str | None,
             loopback: bool) -> contextlib.AbstractContextManager[Cluster]:
    """The live cluster ``name``, or an ephemeral one removed when the block ends."""
    if name is not None:
        return contextlib.nullcontext(load_cluster(name))
    return ephemeral_cluster(hosts, bandwidth, _use_loopback(loopback))


ClusterName = Annotated[str | None, typer.Option(
    "--cluster", help="use this live cluster (its hosts and bandwidth) instead of a new one")]


@cluster_app.command("up")
def cluster_up_cmd(hosts: Hosts = 4, bandwidth: Bandwidth = "1gbit",
                   name: Annotated[str | None, typer.Option(help="gw + 6 hex digits")] = None,
                   ) -> None:
    """Create an emulated cluster that stays up until `gradwire cluster down`."""
    c = cluster_up(hosts, bandwidth, name)
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
        console.print(f"[bold]{c.name}[/]: {c.label}")
        _print_hosts(c)


def _print_hosts(c) -> None:
    t = Table("rank", "namespace", "address", "interface", "link (each direction)")
    for h in c.hosts:
        t.add_row(str(h.rank), h.netns or "-", h.addr, h.ifname, format_bandwidth(c.bandwidth_bps))
    console.print(t)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    cmd: Annotated[list[str], typer.Argument(help="the command each rank runs, after --")],
    hosts: Hosts = 2,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    timeout: Annotated[float | None, typer.Option(help="seconds for the whole run")] = None,
    loopback: Loopback = False,
) -> None:
    """Run CMD once per host with torchrun's environment; stop all if one fails.

    Example: gradwire run --hosts 4 --bandwidth 1gbit -- python train.py
    """
    with _cluster(hosts, bandwidth, cluster, loopback) as c:
        res = launch(c, cmd, timeout=timeout)
    if res.returncode != 0:
        print(f"gradwire run: {res.message}", file=sys.stderr)
        raise typer.Exit(res.returncode)


@app.command()
def demo(
    hosts: Hosts = 4,
    bandwidth: Bandwidth = "1gbit",
    epochs: Annotated[int, typer.Option(min=1)] = 10,
    model: str = "mlp",
    agg: Annotated[str, typer.Option(help="comma-separated aggregation schemes")] = "dense",
    seed: int = 0,
    timeout: Annotated[float, typer.Option(help="seconds per training run")] = 900,
    json_out: Annotated[Path | None, typer.Option("--json", help="write results here")] = None,
    loopback: Loopback = False,
) -> None:
    """Train on the emulated cluster (default: 4 hosts, 1 Gbit/s) and print one table."""
    from gradwire.demo import run_demo
    from gradwire.models import MODELS
    from gradwire.train.aggregate import AGGREGATORS

    aggs = [a.strip() for a in agg.split(",") if a.strip()]
    for a in aggs:
        if a not in AGGREGATORS:
            raise GradwireError(f"unknown aggregation {a!r}: expected {', '.join(AGGREGATORS)}")
    if model not in MODELS:
        raise GradwireError(f"unknown model {model!r}: expected one of {', '.join(MODELS)}")
    parse_bandwidth(bandwidth)
    with ephemeral_cluster(hosts, bandwidth, _use_loopback(loopback)) as c:
        results = run_demo(c, aggs, epochs, model, seed, timeout, console)
    if json_out:
        json_out.write_text(json.dumps(results, indent=1))


@app.command()
def bench(
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
    iters: Annotated[int, typer.Option(min=1)] = 5,
    warmup: Annotated[int, typer.Option(min=0)] = 1,
    param: Annotated[list[str] | None, typer.Option(help="algorithm parameter KEY=VALUE "
                                                    "(repeatable)")] = None,
    builtin: Annotated[bool, typer.Option(help="add torch.distributed's own collective as "
                                          "the baseline row")] = True,
    timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 3600,
    json_out: Annotated[Path | None, typer.Option("--json", help="write rows here")] = None,
    loopback: Loopback = False,
) -> None:
    """Time collectives like nccl-tests, with the built-in collective and the model's
    prediction beside each algorithm."""
    from gradwire.bench.run import run_bench
    from gradwire.bench.sizes import parse_sizes
    from gradwire.bench.spec import parse_params, parse_specs

    specs = parse_specs(collective, algo)
    if dtype not in ("float32", "float16", "bfloat16", "float64"):
        raise GradwireError(f"--dtype {dtype!r} is not supported: expected float32, float16, "
                            "bfloat16 or float64")
    size_list = parse_sizes(sizes)
    params = parse_params(param or [])
    parse_bandwidth(bandwidth)
    with _cluster(hosts, bandwidth, cluster, loopback) as c:
        result = run_bench(c, collective, specs, size_list, dtype, iters, warmup, params,
                           builtin, timeout, console)
    result["command"] = "gradwire " + shlex.join(sys.argv[1:])
    if json_out:
        json_out.write_text(json.dumps(result, indent=1) + "\n")
        console.print(f"wrote {json_out}")


@app.command()
def calibrate(
    hosts: Hosts = 2,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 600,
    loopback: Loopback = False,
) -> None:
    """Measure α (ping-pong), β (streaming) and γ (reduction) and save them for the model."""
    from gradwire.bench import calibrate as cal
    from gradwire.jobs import run_ranks

    parse_bandwidth(bandwidth)
    if cluster is None and hosts < 2:
        raise GradwireError(f"calibrate needs --hosts >= 2, got {hosts}")
    with _cluster(hosts, bandwidth, cluster, loopback) as c:
        measured = run_ranks(c, "gradwire.bench.calibrate", [], "calibrate", timeout, console)
        key = format_bandwidth(c.bandwidth_bps) if c.shaped else "loopback"
        d = cal.record(measured, key, len(c.hosts), c.label)
    t = Table("α (us)", "β (ns/byte)", "link (Gbit/s)", "γ (ns/byte)", "network", "saved to")
    t.add_row(f"{d['alpha_s'] * 1e6:.1f}", f"{d['beta_s_per_byte'] * 1e9:.3f}",
              f"{d['link_gbit_per_s_measured']:.3f}", f"{d['gamma_s_per_byte'] * 1e9:.4f}",
              d["network"], d["path"])
    console.print(t)


def main() -> None:
    try:
        app()
    except GradwireError as e:
        print(f"gradwire: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("gradwire: interrupted; cleaned up", file=sys.stderr)
        sys.exit(130)
if __name__ == "__main__":
    main()
