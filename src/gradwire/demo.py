"""The headline comparison: dense S-SGD against Top-k and gTop-k sparsification (ρ = 0.001,
with the gTop-k paper's dense-to-sparse warm-up) on a 4-host 1 Gbit/s emulated cluster.

The whole gradient is aggregated at once after backward (``mode="model"``), as in the paper.
Each method trains in turn on the same cluster with the same seed, model, data, batch size and
learning rate, so the rows of the table and the curves of the figure differ only in how
gradients cross the network.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from gradwire.cluster import Cluster
from gradwire.errors import GradwireError
from gradwire.models import get_spec
from gradwire.report import TABLE_NOTE, plot_curves, results_table
from gradwire.train.job import TrainConfig, train_on

# Tuned on this 2-core machine (4 ranks share it): batch 8 keeps compute small next to the dense
# allreduce; at lr 0.02 every method's test accuracy settles by epoch 12-15 (at 0.05 gTop-k's
# swung by ±5 points from epoch to epoch). mode "model" (the paper's: one selection and one
# tree over the whole gradient) measured 32 ms an iteration for gTop-k against 57 ms in bucket
# mode, where the mlp's two buckets pay the tree's latency twice and the hook's thread competes
# with backward for the cores.
DEMO = TrainConfig(model="mlp", density=0.001, mode="model", warmup=True, epochs=20,
                   batch_size=8, lr=0.02, momentum=0.9)


def run_demo(cluster: Cluster, aggs: Sequence[str], base: TrainConfig, timeout: float,
             console: Console, plot: Path | None,
             keep: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Train ``base`` once per method in ``aggs``; print one table, write one figure.
    ``keep`` gets the results before the figure is drawn: a figure that cannot be written
    must not lose them; a GradwireError of ``keep`` (results it could not write where asked)
    does not cost the figure either. A method whose run fails does not cost the others
    theirs: the rest train, the table, ``keep`` and the figure show those that finished, and
    then one GradwireError names the methods that failed (and what the speed-ups are over,
    where the first method was one of them), any error of ``keep`` and a figure that could
    not be written."""
    warmup = "with the gTop-k warm-up" if base.warmup else "no warm-up"
    console.print(f"[bold]gradwire demo[/]: {base.model} on {get_spec(base.model).data}, "
                  f"{len(cluster.hosts)} ranks, {cluster.label}; {', '.join(aggs)}; density "
                  f"{base.density:g} {warmup}, mode {base.mode}; {base.epochs} epochs, batch "
                  f"{base.batch_size}/rank, lr {base.lr:g}, momentum {base.momentum:g}, "
                  f"seed {base.seed}", markup=True)
    results, failed = [], []
    for a in aggs:
        try:
            results.append(train_on(cluster, dataclasses.replace(base, agg=a), a, timeout,
                                    console))
        except GradwireError as e:
            failed.append(str(e))
            console.print(f"{e}" + ("; the other methods go on" if a != aggs[-1] else ""),
                          style="red", markup=False)
    if not results:
        raise GradwireError("; ".join(failed))
    r0 = results[0]
    title = (f"{r0['model']} ({r0['parameters'] / 1e6:.2f} M params), {r0['world_size']} ranks, "
             f"{cluster.label}, mode {base.mode}")
    console.print(results_table(results, title))
    console.print(TABLE_NOTE)
    problems = []
    if failed:
        # the speed-up column is over the first row: say so where that is not the first
        # method asked for (dense, in the demo's comparison), which failed
        base = results[0]["agg"]
        rebased = "" if base == aggs[0] else f"; their speed-ups are over {base}, not {aggs[0]}"
        problems.append(f"{len(failed)} of {len(aggs)} methods failed ({'; '.join(failed)}); "
                        f"the table and its files hold the {len(results)} that finished"
                        f"{rebased}")
    if keep is not None:
        try:
            keep(results)
        except GradwireError as e:  # saved elsewhere, it says where: the figure still drawn
            problems.append(str(e))
    if plot is not None:
        try:
            plot_curves(results, plot, title)
            console.print(f"wrote {plot}")
        except OSError as e:  # a full disk: said with, not instead of, the problems above
            # (where ``keep`` saved the results instead, which methods failed)
            problems.append(f"could not write {plot} ({e.strerror or e})")
    if problems:
        raise GradwireError("; ".join(problems))
    return results
