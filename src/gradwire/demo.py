"""The main job: data-parallel training on an emulated cluster, reported as one table.

Each aggregation scheme in ``aggs`` is trained in turn on the same cluster with the same seed,
so the rows of the table differ only in how gradients cross the network.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from gradwire.cluster import Cluster
from gradwire.jobs import run_ranks


def train_on(cluster: Cluster, agg: str, epochs: int, model: str, seed: int,
             timeout: float, console: Console) -> dict:
    """Run the training worker once per host and return rank 0's result."""
    args = ["--agg", agg, "--model", model, "--epochs", str(epochs), "--seed", str(seed)]
    return run_ranks(cluster, "gradwire.train.worker", args, f"{agg:>8}", timeout, console)


def results_table(results: Sequence[dict], title: str) -> Table:
    table = Table(title=title)
    for col in ("aggregation", "samples/s", "wire MB/iter/rank", "compute ms", "comm ms",
                "step ms", "final loss", "test accuracy"):
        table.add_column(col, justify="left" if col == "aggregation" else "right")
    for r in results:
        s = r["seconds_per_iter"]
        wire = r["wire_tx_bytes_per_iter_per_rank"]
        table.add_row(r["agg"], f"{r['samples_per_s']:.0f}",
                      "n/a (loopback)" if wire is None else f"{wire / 1e6:.3f}",
                      f"{s['compute'] * 1e3:.1f}", f"{s['communicate'] * 1e3:.1f}",
                      f"{s['step'] * 1e3:.1f}", f"{r['loss'][-1]:.4f}",
                      f"{r['test_accuracy'][-1] * 100:.1f} %")
    return table


def run_demo(cluster: Cluster, aggs: Sequence[str], epochs: int, model: str, seed: int,
             timeout: float, console: Console) -> list[dict]:
    console.print(f"[bold]gradwire demo[/]: {model} on digits, {len(cluster.hosts)} ranks, "
                  f"{cluster.label}, {epochs} epochs, seed {seed}")
    results = [train_on(cluster, a, epochs, model, seed, timeout, console) for a in aggs]
    r0 = results[0]
    title = (f"{r0['model']} ({r0['parameters'] / 1e6:.2f} M params), {r0['world_size']} ranks, "
             f"{cluster.label}")
    console.print(results_table(results, title))
    console.print("wire MB = bytes leaving each host's interface (TCP/IP headers included), "
                  "measured; times are per iteration, averaged over ranks.")
    return results
