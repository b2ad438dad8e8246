"""What a person reads from the performance model: the profiles, ``gradwire whatif``'s
predictions and §5 answers, and ``gradwire advise``'s ranking, as tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from gradwire import profiles
from gradwire.profiles import Profile
from gradwire.tables import wide_table

if TYPE_CHECKING:  # the model, for the types alone: listing the profiles imports no torch
    from gradwire.perf.scenario import Advice, WhatIf


def profiles_table() -> Table:
    """The built-in profiles, one row each."""
    t = wide_table(["profile", "parameters", "forward\n(ms)", "backward\n(ms)", "batch"])
    t.add_column("what", overflow="fold")  # the description, wrapped at its spaces
    for name in profiles.builtin_names():
        p = profiles.load(name)
        ms = [f"{v * 1e3:.1f}" if v is not None else "-" for v in (p.forward_s, p.backward_s)]
        t.add_row(name, f"{p.numel:,}", *ms, str(p.batch_size or "-"), p.description)
    return t


def profile_table(model: str, p: Profile) -> Table:
    """One profile measured here (``gradwire profile --model``)."""
    t = Table("model", "parameters", "tensors", "forward (ms)", "backward (ms)", "step (ms)",
              title=p.sources["forward_s"])
    t.add_row(model, f"{p.numel:,}", str(len(p.params)), f"{p.forward_s * 1e3:.2f}",
              f"{p.backward_s * 1e3:.2f}", f"{p.step_s * 1e3:.2f}")
    return t


def builtin_namesake(model: str, numel: int, instead: str = "give them this one as --model "
                     "FILE") -> str | None:
    """The line that tells a profile or trace of ``model`` measured here (``numel``
    parameters) from the built-in profile of its name (``resnet50``: gradwire's on digits,
    23.5 M parameters, not ImageNet's 25.6 M), where one exists and their parameters differ:
    ``--model NAME`` in whatif, advise and simulate is the built-in one; ``instead`` says how
    to give them the measured one."""
    if model not in profiles.builtin_names():
        return None
    builtin = profiles.load(model)
    if builtin.numel == numel:
        return None
    return (f"note: this is gradwire's {model} as it trains here ({numel:,} parameters); "
            f"whatif, advise and simulate --model {model} read the built-in profile of that "
            f"name ({builtin.description}); {instead}")


# Link rates (columns) in one of whatif's tables: six of the longest cells, a time of hours
# and its efficiency ("184166899.5 (99%)", wrapped at the space), beside the longest
# aggregation label fit 120 columns; more would fold the times in two.
RATES_PER_TABLE = 6


def whatif_tables(wi: WhatIf) -> list[Table]:
    """Per compute speedup, two tables: iteration time and scaling efficiency per
    (aggregation, workers) and link rate; then the compression needed for linear scaling and
    the encode+decode budget per workers and link rate. Past :data:`RATES_PER_TABLE` link
    rates, each of the two is several tables, the rates in the order given."""
    prof, result = wi.profile, wi.result
    bws = list(dict.fromkeys(r["bandwidth"] for r in result["rows"]))
    # as few tables as hold them, the rates shared evenly (7 rates: 4 and 3, not 6 and 1)
    per = -(-len(bws) // -(-len(bws) // RATES_PER_TABLE))
    groups = [bws[i:i + per] for i in range(0, len(bws), per)]
    tables = []
    for x in wi.speedups:
        title = (f"{prof.model} ({_params(prof.numel)}), compute ×{x:g}: predicted iteration "
                 "time and scaling efficiency")
        rows = [r for r in result["rows"] if r["compute_speedup"] == x]
        for k, group in enumerate(groups):
            t = wide_table(["aggregation", "workers", *(f"{b}\nms (eff.)" for b in group)],
                      title=title + _part(k, groups))
            for key in dict.fromkeys((r["agg"], r["workers"]) for r in rows):
                cells = [r for r in rows if (r["agg"], r["workers"]) == key
                         and r["bandwidth"] in group]
                t.add_row(key[0], str(key[1]), *(f"{r['iteration_s'] * 1e3:.1f} "
                                                  f"({r['efficiency']:.0%})" for r in cells))
            tables.append(t)
        ans = [r for r in result["answers"] if r["compute_speedup"] == x]
        for k, group in enumerate(groups):
            a = wide_table(["workers", *(f"{b}\nratio / budget" for b in group)], names=0,
                      title="compression an all-reducible scheme needs for linear scaling, and "
                            "the most encode+decode may cost (what backward does not hide of "
                            "dense's iteration)" + _part(k, groups))
            for p in dict.fromkeys(r["workers"] for r in ans):
                a.add_row(str(p), *(f"{_ratio(r['required_compression'])} / "
                                    f"{r['coding_budget_s'] * 1e3:.1f} ms"
                                    for r in ans if r["workers"] == p and r["bandwidth"] in group))
            tables.append(a)
    return tables


def _part(k: int, groups: list[list[str]]) -> str:
    """What the ``k``-th of whatif's tables of ``groups`` of link rates adds to the title:
    nothing where all fit one table, else the rates it holds."""
    return "" if len(groups) == 1 else f" ({k + 1} of {len(groups)}: {', '.join(groups[k])})"


def _params(numel: int) -> str:
    """A parameter count for a title: in millions from a million on, else as it is (a small
    model's 1,031 is not "0.00 M")."""
    if numel >= 1_000_000:
        return f"{numel / 1e6:.2f} M params"
    return f"{numel:,} param{'' if numel == 1 else 's'}"


def _ratio(need: float | None) -> str:
    """A required compression ratio; None: no ratio suffices (the allreduce's latency alone
    is longer than backward)."""
    return "none (α alone > backward)" if need is None else f"{need:.3g}×"


def advice_table(a: Advice) -> Table:
    """The ranking, fastest first: time, efficiency, what backward does not hide, coding,
    wire time and each rank's payload (what it compresses to, not what a schedule sends:
    a ring sends 2(P−1)/P of it, Top-k's allgather P−1 times it)."""
    g, p = a.cluster.ranks_per_node, a.cluster.workers
    t = wide_table(["#", "aggregation", "iteration\n(ms)", "efficiency", "not\nhidden\n(ms)",
               "encode+\ndecode\n(ms)", "wire\n(ms)", "payload/rank\n(MB)"], names=2,
              title=f"{a.profile.model}, {p} worker{'' if p == 1 else 's'}, {a.bandwidth}"
                    + (f", {g} per node ({a.intra_bandwidth} inside)" if g > 1 else ""))
    for i, r in enumerate(a.ranked, 1):
        p = r.prediction
        t.add_row(str(i), r.agg.label, f"{r.seconds * 1e3:.1f}", f"{float(p.efficiency):.0%}",
                  f"{r.overhead * 1e3:.1f}", f"{p.coding * 1e3:.1f}",
                  f"{float(p.communicate) * 1e3:.1f}", f"{p.wire_bytes / 1e6:.3g}")
    return t
