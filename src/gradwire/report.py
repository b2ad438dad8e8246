"""Training results as a person reads them: one table, one figure of the curves.

Both take the result dicts the training worker writes (``gradwire.train.worker.summarize``);
a list of several compares methods row by row and curve by curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from rich import box
from rich.table import Table

from gradwire.jsonfile import save_figure
from gradwire.models.task import perplexity

SPARSIFIERS = ("topk", "gtopk", "randomk", "dgc")


def method_label(r: dict) -> str:
    """``gtopk ρ=0.001`` for a sparsifier (``gtopk ρ=0.25 warm-up`` where the run ended in its
    warm-up: the row's figures are its last epochs'), ``powersgd r=1`` for a PowerSGD (the
    rank it ran at: the hook's default, 4, where none was given); the method's name alone for
    the rest."""
    if r["agg"] in SPARSIFIERS:
        last = (r.get("density_per_epoch") or [r["density"]])[-1]
        if last != r["density"]:
            return f"{r['agg']} ρ={last:g} warm-up"
        return f"{r['agg']} ρ={r['density']:g}"
    rank = r.get("rank")
    if rank is None and r["agg"] == "powersgd":
        rank = _default_powersgd_rank()
    if rank is not None:
        return f"{r['agg']} r={rank}"
    return r["agg"]


def _default_powersgd_rank() -> int:
    """The rank a PowerSGD run without ``--rank`` sends at: its compressor's default."""
    import inspect

    from gradwire.compress import COMPRESSORS

    return inspect.signature(COMPRESSORS["powersgd"]).parameters["rank"].default


def _mb(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x / 1e6:.3f}" if x >= 1e4 else f"{x / 1e6:.5f}"


def _fixed(x: float | None, digits: int, f: Callable[[float], float] = float) -> str:
    """``f(x)`` to ``digits`` decimals; "nan" for a value that was not finite (a diverged
    run's loss: result files hold strict JSON, which has no NaN, so it reads None)."""
    return "nan" if x is None else f"{f(x):.{digits}f}"


def _curve(xs: Sequence[float | None]) -> list[float]:
    """A curve to plot, a lost value (None) a gap."""
    return [math.nan if x is None else x for x in xs]


def results_table(results: Sequence[dict], title: str) -> Table:
    """samples/s (and the speed-up over the first row, where there are others), bytes per
    iteration on the wire and as payload, the per-iteration time breakdown, the training time,
    and the final training loss and test accuracy (and perplexity, for text)."""
    text = any(r.get("data") == "text" for r in results)
    # no column rules, one space between columns, headers on two lines where they have a unit:
    # 13 columns fit 120 with no header or figure cut. A text model's 14, with a sparsifier
    # that ended in its warm-up (``randomk ρ=0.0725 warm-up``), do not: the method wraps at
    # its spaces first, being the widest, and where a terminal is narrower still, a figure
    # folds onto a second line; nothing is cut to "…"
    table = Table(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    several = len(results) > 1  # one row's speed-up over itself says nothing
    cols = ["method", "samples/s", *(["speed-up"] if several else []), "wire\nMB/iter",
            "payload\nMB/iter", "compute\nms", "compress\nms", "comm\nms", "step\nms",
            "wall\ns", "train\nloss", *(["test\nppl"] if text else []), "test\nacc"]
    for col in cols:
        table.add_column(col, justify="left" if col == "method" else "right", overflow="fold")
    base = results[0]["samples_per_s"]
    for r in results:
        s = r["seconds_per_iter"]
        ppl = [_fixed(r["test_loss"][-1], 3, perplexity)] if text else []
        table.add_row(method_label(r), f"{r['samples_per_s']:.0f}",
                      *([f"{r['samples_per_s'] / base:.2f}×"] if several else []),
                      _mb(r["wire_tx_bytes_per_iter_per_rank"]),
                      _mb(r["payload_bytes_per_iter_per_rank"]),
                      *(f"{s[k] * 1e3:.1f}" for k in ("compute", "compress", "communicate",
                                                      "step")),
                      f"{r['wall_s']:.1f}", _fixed(r["loss"][-1], 4), *ppl,
                      _fixed(r["test_accuracy"][-1], 1, lambda a: a * 100) + " %")
    return table


TABLE_NOTE = ("samples/s, bytes and times are per iteration over the epochs at the final "
              "density (after the sparsifiers' warm-up; every epoch for the others) but the "
              "run's first when others remain, averaged over ranks; wall s is the whole run's "
              "training time, warm-up included. wire MB = "
              "bytes leaving each host's interface (TCP/IP headers included), measured; payload "
              "MB = what the aggregation handed to the network per rank. compress and comm run "
              "on the hook's thread while backward goes on; compute = forward + backward less "
              "the part of them backward had to wait for.")


def plot_curves(results: Sequence[dict], path: Path, title: str) -> Path:
    """Loss and test accuracy against epoch and against training wall time, one line per
    result, written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex="col", sharey="row")
    for r in results:
        epochs = range(1, len(r["loss"]) + 1)
        label = method_label(r)
        for col, xs in enumerate((epochs, r["epoch_wall_s"])):
            axes[0][col].plot(xs, [a * 100 for a in _curve(r["test_accuracy"])], marker=".",
                              label=label)
            axes[1][col].plot(xs, _curve(r["loss"]), marker=".", label=label)
    for col, xlabel in enumerate(("epoch", "training wall time (s)")):
        axes[1][col].set_xlabel(xlabel)
        for row in range(2):
            axes[row][col].grid(alpha=0.3)
    # min_n_ticks=1: with the default 2 the locator gives up whole numbers where fewer than
    # two fit, as on one epoch's axis (ticks at 0.945, 0.960, ...)
    axes[1][0].xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    axes[0][0].set_ylabel("test accuracy (%)")
    axes[1][0].set_ylabel("training loss")
    axes[1][0].set_yscale("log")
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return path
