"""What several commands share: the console, option types, the cluster a command runs on, and
the checks and writes around their output files."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gradwire.bandwidth import format_bandwidth, parse_bandwidth
from gradwire.cluster import Cluster, ephemeral_cluster, load_cluster, netns_available
from gradwire.cluster.netns import LOOPBACK_LABEL, MTU
from gradwire.errors import GradwireError
from gradwire.jsonfile import check_writable

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
ClusterName = Annotated[str | None, typer.Option(
    "--cluster", help="use this live cluster (its hosts, bandwidth and MTU) instead of a new "
    "one; a --hosts, --bandwidth or --mtu given with it must match it")]

Model = Annotated[str, typer.Option(help="a model from `gradwire models`")]
Density = Annotated[float, typer.Option(help="fraction of gradient elements a sparsifier sends")]
Epochs = Annotated[int, typer.Option(help="epochs (>= 1)")]
BatchSize = Annotated[int, typer.Option(help="samples per rank per iteration")]
Seed = Annotated[int, typer.Option(help="model initialisation and data order")]
JsonOut = Annotated[Path | None, typer.Option("--json", help="write the result JSON here")]


def use_loopback(requested: bool) -> bool:
    """Whether to run on loopback: asked for, or (said on stderr) no namespaces here."""
    if requested:
        return True
    ok, why = netns_available()
    if not ok:
        print(f"gradwire: {why}; falling back to {LOOPBACK_LABEL}", file=sys.stderr)
    return not ok


def cluster_for(ctx: typer.Context, hosts: int, bandwidth: str, name: str | None,
                loopback: bool, mtu: int = MTU) -> contextlib.AbstractContextManager[Cluster]:
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
    return ephemeral_cluster(hosts, bandwidth, use_loopback(loopback), mtu)


def check_outputs(*options: tuple[str, Path | None]) -> None:
    """Refuse, before any work, output paths that cannot be written (one line each)."""
    for option, path in options:
        check_writable(path, option)


def command_line() -> str:
    """This command as typed, for the result files that record it."""
    return "gradwire " + shlex.join(sys.argv[1:])


def write_json(path: Path, doc: object) -> None:
    """Write ``doc`` to ``path`` (indented, one newline at the end) and say so."""
    path.write_text(json.dumps(doc, indent=1) + "\n")
    console.print(f"wrote {path}")
