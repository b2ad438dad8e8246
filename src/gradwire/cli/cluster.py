"""``gradwire cluster up/down/status`` and ``gradwire run``: emulated clusters, and a command
run once per host on one."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gradwire.bandwidth import format_bandwidth
from gradwire.cli.options import (
    Bandwidth,
    ClusterName,
    Hosts,
    Loopback,
    Mtu,
    cluster_for,
    console,
)
from gradwire.cluster import Cluster, cluster_down, cluster_up, list_clusters, load_cluster
from gradwire.cluster.netns import MTU, orphan_clusters
from gradwire.cluster.state import NAME_RE, state_files
from gradwire.errors import GradwireError
from gradwire.interrupts import Interrupted
from gradwire.jobs import build_progress
from gradwire.launcher import check_command, check_timeout, launch


def up(hosts: Hosts = 4, bandwidth: Bandwidth = "1gbit",
       name: Annotated[str | None, typer.Option(help="gw + 6 lowercase hex digits")] = None,
       mtu: Mtu = MTU) -> None:
    """Create an emulated cluster that stays up until `gradwire cluster down`."""
    c = cluster_up(hosts, bandwidth, name, mtu=mtu, progress=build_progress(console, hosts))
    try:
        console.print(f"cluster [bold]{c.name}[/] up: {escape(c.label)}", markup=True)
        console.print(hosts_table(c))
    except (Interrupted, KeyboardInterrupt):
        # A stop before the cluster is all told: it goes, as the line gradwire ends on says
        # ("interrupted ...; cleaned up"), rather than stay up with its name unseen.
        cluster_down(c.name)
        raise


def down(name: Annotated[str | None, typer.Argument(help="the cluster (gw + 6 lowercase hex "
                                                    "digits); default: the only live one")] = None,
         all_: Annotated[bool, typer.Option("--all", help="every gradwire cluster on "
                                            "this machine, orphans and other GRADWIRE_STATE_DIRs' "
                                            "included")] = False) -> None:
    """Remove a cluster: its namespaces (and their processes), veth pairs and bridge."""
    removed = cluster_down(name, all_)
    console.print(f"removed: {', '.join(removed) or 'nothing'}")


def status(as_json: Annotated[bool, typer.Option("--json", help="print the clusters as "
                                                  "JSON")] = False) -> None:
    """List live clusters and their hosts, and the clusters whose state file does not read
    (what is left of them stays until `gradwire cluster down NAME`)."""
    live = list_clusters()
    broken = unreadable_clusters({c.name for c in live})
    orphans = [n for n in orphan_clusters() if n not in broken]
    one = len(orphans) == 1
    left = (f"left behind: {', '.join(orphans)}, namespaces or links with no state file here "
            "(a run killed before it cleaned up, or another GRADWIRE_STATE_DIR's); "
            f"`gradwire cluster down {orphans[0] if one else 'NAME'}` removes "
            f"{'it' if one else 'one'}" if orphans else "")
    if as_json:  # each with what the table says of it: why it is stale (null: it is not)
        print(json.dumps([{**json.loads(c.to_json()), "stale": c.why_stale} for c in live],
                         indent=1))
        for why in broken.values():  # not in the list, whose entries are whole clusters
            print(f"gradwire: {why}", file=sys.stderr)
        if left:
            print(f"gradwire: {left}", file=sys.stderr)
        return
    if not live and not broken:
        console.print("no gradwire clusters are up")
    for name, why in broken.items():
        console.print(f"[bold]{escape(name)}[/]: [yellow]{escape(why)}[/]", markup=True,
                      highlight=False)
    for c in live:
        why = c.why_stale
        note = (f" [yellow](stale: {escape(why)}; the next cluster made here removes it, or "
                f"`gradwire cluster down {c.name}`)[/]" if why else
                "" if c.ready else
                " [yellow](still being built, or its build stopped half way: runs refuse it "
                f"until `gradwire cluster up` is done; else `gradwire cluster down {c.name}`)[/]")
        console.print(f"[bold]{c.name}[/]: {escape(c.label)}{note}", markup=True)
        if c.shaped:
            buf = (f"{c.send_buffer_bytes / 1e3:.0f} kB" if c.send_buffer_bytes
                   else "this machine's")
            console.print(f"links: tc tbf {format_bandwidth(c.bandwidth_bps)} each direction, "
                          f"bucket {c.burst_bytes / 1e3:.0f} kB; hosts' TCP send buffer at "
                          f"most {buf}")
        console.print(hosts_table(c))
    if left:  # last: after the clusters that are whole
        console.print(f"[yellow]{escape(left)}[/]", markup=True, highlight=False)


def unreadable_clusters(live: set[str]) -> dict[str, str]:
    """The clusters (by name) that have a state file that :func:`list_clusters` could not read,
    each with the one line saying why: `cluster status` had left them out, and said "no
    gradwire clusters are up" while `gradwire run --cluster NAME` refused the one it named."""
    out = {}
    for path in state_files():
        if path.stem in live or not NAME_RE.match(path.stem):
            continue
        try:
            load_cluster(path.stem)
        except GradwireError as e:
            if path.exists():  # not one that a run removed just now
                out[path.stem] = str(e)
    return out


def hosts_table(c: Cluster) -> Table:
    t = Table("rank", "namespace", "address", "interface", "link (each direction)", "MTU")
    for h in c.hosts:
        t.add_row(str(h.rank), h.netns or "-", h.addr, h.ifname, format_bandwidth(c.bandwidth_bps),
                  str(c.mtu) if h.netns else "-")
    return t


def run(
    ctx: typer.Context,
    cmd: Annotated[list[str], typer.Argument(help="the command each rank runs, after --")],
    hosts: Hosts = 2,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    timeout: Annotated[float | None, typer.Option(help="seconds for the whole run "
                                                  "(default: no limit)")] = None,
    mtu: Mtu = MTU,
    loopback: Loopback = False,
) -> None:
    """Run CMD once per host with torchrun's environment; stop all if one fails.

    SIGINT, SIGTERM, SIGHUP or SIGQUIT stops every rank and removes the cluster before
    gradwire exits.

    Example: gradwire run --hosts 4 --bandwidth 1gbit -- python train.py
    """
    check_timeout(timeout)
    check_command(cmd)  # before a cluster is built for it
    try:
        with cluster_for(ctx, hosts, bandwidth, cluster, loopback, mtu) as c:
            res = launch(c, cmd, timeout=timeout)
    except Interrupted as e:  # the ranks are stopped and the cluster is removed by now
        print(f"gradwire run: {e}", file=sys.stderr)
        raise typer.Exit(e.exit_status) from None
    if res.returncode != 0:
        print(f"gradwire run: {res.message}", file=sys.stderr)
        raise typer.Exit(res.returncode)
