"""What ``gradwire whatif`` and ``gradwire advise`` are asked, read and checked: the model's
profile, the aggregation schemes, the codec table and the cluster's terms (α, γ, shared CPU,
nodes), then the sweep or the ranking made from them. Errors name the option at fault."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from gradwire import profiles
from gradwire.bandwidth import format_bandwidth
from gradwire.catalogue import METHODS
from gradwire.check import (
    MAX_ALPHA_US,
    MAX_GAMMA_NS,
    MAX_OVERLAP_SLOWDOWN,
    MAX_SECONDS,
    check_density,
    check_powersgd_rank,
    check_real,
    check_speedup,
    comma_items,
    distinct,
    parse_numbers,
    shown_number,
)
from gradwire.errors import GradwireError
from gradwire.perf import advise as adv
from gradwire.perf import codecs as codec_tables
from gradwire.perf import reference as reference_settings
from gradwire.perf import whatif as w
from gradwire.perf.calibration import Calibration
from gradwire.perf.codecs import CodecTable
from gradwire.perf.model import (
    MAX_WORKERS,
    Aggregation,
    ClusterModel,
    check_workers,
    parse_link,
)
from gradwire.profiles import Profile

# Compute speed-ups: a trace's range (gradwire.check.SPEEDUP_RANGE), and compute times
# (--compute-ms, sped up) within gradwire.check.MAX_SECONDS, as a profile's.


@dataclass(frozen=True)
class Scenario:
    """The options whatif and advise share, as given on the command line. ``agg``: a comma
    list of methods (advise: None or empty for every method); ``compute_ms``:
    ``FORWARD,BACKWARD`` in ms instead of the profile's. The cluster's terms (α, γ, the codec
    table, κ, how coding shares the device) come from ``calibration``, a ``gradwire
    calibrate`` file, or else from the named ``reference`` setting
    (:mod:`gradwire.perf.reference`); ``alpha_us``, ``gamma_ns``, ``codecs`` and
    ``overlap_slowdown``, where given, replace either's."""

    model: str = "resnet50"
    agg: str | None = None
    density: float = 0.001
    rank: int = 4
    mode: str = "bucket"
    bucket_mb: float = 25.0
    codecs: str | None = None  # None: the reference setting's (or the calibration's)
    compute_ms: str | None = None
    overlap_slowdown: float | None = None
    alpha_us: float | None = None
    gamma_ns: float | None = None
    ranks_per_node: int = 1
    intra_bandwidth: str = "100gbit"
    calibration: Path | None = None
    reference: str = reference_settings.DEFAULT


@dataclass(frozen=True)
class WhatIf:
    """:func:`whatif`'s answer: :func:`gradwire.perf.whatif.sweep`'s ``result`` for
    ``profile`` at each compute speedup of ``speedups``, and ``note``, the lines saying where
    every input came from (:func:`noted`)."""

    profile: Profile
    result: dict
    speedups: list[float]
    note: str


@dataclass(frozen=True)
class Advice:
    """:func:`advise`'s answer: the schemes fastest first on ``cluster`` (links of
    ``bandwidth``), those left out with why, where α and γ came from, and ``result``, all of
    it as --json records it."""

    profile: Profile
    cluster: ClusterModel
    bandwidth: str
    intra_bandwidth: str
    ranked: list[adv.Ranked]
    skipped: list[str]
    note: str
    result: dict  # what --json writes, less the command's provenance


def check_terms(s: Scenario) -> None:
    """The model's terms given on the command line are finite (NaN would pass every range
    check below, as they compare, and come out as NaN times) and within their bounds (the
    MAX_ constants above); the other ranges are checked where they are used."""
    for option, value in (("--bucket-mb", s.bucket_mb), ("--overlap-slowdown",
                          s.overlap_slowdown), ("--alpha-us", s.alpha_us),
                          ("--gamma-ns", s.gamma_ns)):
        if value is not None and not math.isfinite(value):
            raise GradwireError(f"{option} must be a finite number, got {value}")
    for option, value, low, high, why in (
            ("--alpha-us", s.alpha_us, 0.0, MAX_ALPHA_US, "1 s per step: slower than any "
             "network"),
            ("--gamma-ns", s.gamma_ns, 0.0, MAX_GAMMA_NS, "1 µs per byte reduced: slower than "
             "any processor"),
            ("--overlap-slowdown", s.overlap_slowdown, 1.0, MAX_OVERLAP_SLOWDOWN,
             f"backward {MAX_OVERLAP_SLOWDOWN:g} times slower: more than any device")):
        if value is not None and value < low:
            raise GradwireError(f"{option} must be >= {low:g}, got {shown_number(value)}")
        if value is not None and value > high:
            raise GradwireError(f"{option} must be at most {high:g} ({why}), got "
                                f"{shown_number(value)}")


def check_speedups(prof: Profile, speedups: list[float]) -> None:
    """Compute speed-ups in a trace's range that keep the profile's passes within
    :data:`~gradwire.check.MAX_SECONDS` (a speed-up below 1 slows them)."""
    for x in speedups:
        check_speedup("--compute-speedup", x)
        longest = max(prof.forward_s or 0.0, prof.backward_s or 0.0) / x
        if longest > MAX_SECONDS:
            raise GradwireError(f"--compute-speedup {x:g} would make a pass of {prof.model} "
                                f"take {longest:g} s: compute times go up to {MAX_SECONDS:g} s")


def read_calibration(s: Scenario) -> Calibration | None:
    """``s.calibration`` read and checked (None when there is none): once, for
    :func:`inputs` and :func:`setting` both."""
    return None if s.calibration is None else w.read_calibration(s.calibration)


def inputs(s: Scenario, cal: Calibration | None = None
           ) -> tuple[Profile, list[Aggregation], CodecTable]:
    """The profile (with ``compute_ms`` applied), one :class:`Aggregation` per method of
    ``s.agg`` and the codec table ``s.codecs`` names."""
    prof = profiles.load(s.model)
    if s.compute_ms is not None:
        prof = profiles.with_compute_ms(prof, s.compute_ms)
    if s.bucket_mb <= 0:
        raise GradwireError(f"--bucket-mb must be > 0, got {s.bucket_mb}")
    check_powersgd_rank(s.rank)
    check_density(s.density)  # as every other command names it: --density
    names = comma_items(s.agg or "")
    if not names:
        raise GradwireError("--agg needs at least one method")
    # a method named twice is one scheme: one row of whatif's tables, one place in the ranking
    aggs = distinct([Aggregation(n, density=s.density, rank=s.rank, mode=s.mode,
                                 bucket_mb=s.bucket_mb) for n in names], key=lambda a: a.label)
    if s.codecs is not None:
        table = codec_tables.load(s.codecs)
    elif s.calibration is not None:
        table = (cal or w.read_calibration(s.calibration)).codecs
    else:
        table = codec_tables.load(reference_settings.get(s.reference).codecs)
    return prof, aggs, table


def setting(s: Scenario, cal: Calibration | None = None) -> tuple[w.Setting, str]:
    """The cluster's terms, and a line saying where they came from: ``s.calibration`` (with
    its shared-CPU terms where it has them) or the reference setting ``s.reference``, with
    ``s.alpha_us``, ``s.gamma_ns`` and ``s.overlap_slowdown`` replacing theirs where given
    (a given γ moves every dtype's γ with it: each keeps its measured extra over fp32's; a
    given α moves gradwire's executor's α with it, which keeps its measured extra over the
    backend's).
    ``cal``: ``s.calibration`` already read (:func:`read_calibration`); read here if None."""
    if s.calibration is None:
        ref = reference_settings.get(s.reference)
        base = w.Setting(ref.alpha, ref.gamma, ref.overlap_slowdown,
                         coding_slowdown=ref.coding_slowdown)
        where = ref.describe(s.codecs)
    else:
        base = w.calibration_terms(cal or w.read_calibration(s.calibration), s.calibration)
        alpha_t, slowdown, cpu = base.alpha_transport, base.compute_slowdown, base.cpu
        coding = base.coding_slowdown
        # κ and the coding slowdown move every prediction as much as α and γ do: said as the
        # reference setting says them
        where = (f"α {base.alpha * 1e6:.0f} µs per step"
                 + (f" (gradwire's executor {alpha_t * 1e6:.0f} µs)" if alpha_t else "")
                 + f", γ {base.gamma * 1e9:.3g} ns/B"
                 + "".join(f" ({d} {g * 1e9:.3g})" for d, g in base.gamma_dtype)
                 + f", κ {base.overlap_slowdown:.2f}"
                 + (f", coding shares the device with backward (×{coding:.2f})"
                    if coding is not None else ", coding beside backward")
                 + (f", compute ×{slowdown:.2f} as the ranks run it" if slowdown != 1 else "")
                 + f" from {s.calibration}")
        if cpu is None:
            where += " (no CPU terms in it: cores of their own)"
        else:
            who = "every worker on one machine" if cpu.one_machine else "each node's ranks"
            where += f"; {who} sharing {cpu.cores:g} cores ({cpu.describe()})"
        if s.codecs is not None:
            where += f"; codecs {s.codecs} (given, for the calibration's)"
    if s.ranks_per_node < 1:
        raise GradwireError(f"--ranks-per-node must be >= 1, got {s.ranks_per_node}")
    if s.ranks_per_node > MAX_WORKERS:  # a node of more ranks than a cluster the model prices
        raise GradwireError(f"--ranks-per-node must be at most {MAX_WORKERS} (the most "
                            f"workers the model prices), got {s.ranks_per_node}")
    try:
        intra = parse_link(s.intra_bandwidth)
    except GradwireError as e:
        raise GradwireError(f"--intra-bandwidth: {e}") from None
    gamma = base.gamma if s.gamma_ns is None else s.gamma_ns * 1e-9
    alpha = base.alpha if s.alpha_us is None else s.alpha_us * 1e-6
    # the executor's steps cross the same links as the backend's, with its own software on top
    alpha_t = (None if base.alpha_transport is None
               else max(0.0, alpha + base.alpha_transport - base.alpha))
    # + 0.0: a typed "-0" is 0, not "-0 ns/B"
    given = [f"{name} {v + 0.0:g}{unit}" for name, v, unit in (
        ("α", s.alpha_us, " µs"), ("γ", s.gamma_ns, " ns/B"), ("κ", s.overlap_slowdown, ""))
        if v is not None]
    if s.alpha_us is not None and alpha_t is not None:  # it moved with the given α
        given[0] += f" (gradwire's executor {alpha_t * 1e6:.0f} µs)"
    if given:
        where += "; given: " + ", ".join(given)
    return replace(
        base, alpha=alpha, alpha_transport=alpha_t, gamma=gamma,
        # a half-precision sum keeps what it was measured to take over fp32's per byte
        gamma_dtype=tuple((d, gamma + g - base.gamma) for d, g in base.gamma_dtype),
        overlap_slowdown=(base.overlap_slowdown if s.overlap_slowdown is None
                          else s.overlap_slowdown),
        ranks_per_node=s.ranks_per_node, intra_bps=intra), where


def whatif(s: Scenario, workers: str, bandwidth: str, compute_speedup: str) -> WhatIf:
    """Every (aggregation, workers, link rate, compute speedup) of ``s``: ``workers`` as
    ``4:128``, ``4:128:4`` or a comma list, ``bandwidth`` and ``compute_speedup`` comma
    lists."""
    check_terms(s)
    cal = read_calibration(s)
    prof, aggs, table = inputs(s, cal)
    # a value given twice (1gbit,1000mbit is one rate) is one column, row or table; so are
    # rates that print alike, as the tables and the JSON name them by what they print
    rates = distinct([parse_link(b) for b in comma_items(bandwidth)],
                     key=format_bandwidth)
    if not rates:
        raise GradwireError(f"--bandwidth {bandwidth!r} names no link rate: expected a comma "
                            "list such as 1gbit,10gbit")
    speedups = distinct(parse_numbers("--compute-speedup", compute_speedup))
    check_speedups(prof, speedups)
    terms, where = setting(s, cal)
    result = w.sweep(prof, aggs, w.parse_workers(workers), rates, speedups, table, terms)
    per_node = (f"{s.ranks_per_node} ranks per node ({s.intra_bandwidth} inside); "
                if s.ranks_per_node > 1 else "")
    # a profile file that names no source for its times has none to print (as advise says)
    compute = (f"compute: {result['compute_source']}; " if result["compute_source"] else "")
    note, asked = noted(f"{where}; {per_node}{compute}encode/decode: {table.source}", s,
                        aggs, table)
    result.update(asked)
    return WhatIf(prof, result, speedups, note)


def advise(s: Scenario, workers: int, bandwidth: str, compute_speedup: float) -> Advice:
    """Every scheme of ``s`` (every method where ``s.agg`` is None or empty) ranked by its
    predicted iteration on ``workers`` workers with links of ``bandwidth``."""
    check_terms(s)
    check_real("--compute-speedup", compute_speedup, 0, above=True)
    if not s.agg:
        s = replace(s, agg=",".join(METHODS))
    cal = read_calibration(s)
    prof, aggs, table = inputs(s, cal)
    check_speedups(prof, [compute_speedup])
    try:
        check_workers(workers)
    except GradwireError as e:
        raise GradwireError(f"--workers {workers}: {e}") from None
    terms, where = setting(s, cal)
    bps = parse_link(bandwidth)
    cluster = terms.cluster(workers, bps)
    ranked, skipped = adv.rank(prof, cluster, aggs, table, compute_speedup,
                               terms.overlap_slowdown)
    compute = prof.sources.get("backward_s", "")
    note, asked = noted(where + (f"; compute: {compute}" if compute else ""), s, aggs, table)
    rate = format_bandwidth(bps)
    result = {**w.recorded(prof, table, terms), "workers": workers, "bandwidth": rate,
              "compute_speedup": compute_speedup, **asked,
              "ranked": [{**w.row(r.agg, r.prediction, workers, rate, compute_speedup),
                          "overhead_s": r.overhead} for r in ranked],
              "not_ranked": skipped}
    return Advice(prof, cluster, bandwidth, s.intra_bandwidth, ranked, skipped, note, result)


def noted(note: str, s: Scenario, aggs: list[Aggregation], table: CodecTable
          ) -> tuple[str, dict]:
    """The line saying where every input came from, with a line per method of ``aggs`` the
    table's times were measured for at another density or rank than asked (priced unchanged);
    and what whatif's and advise's --json record of the options asked and that line."""
    apart = [a for g in aggs if (a := table.measured_apart(g.method, g.density, g.rank))]
    note = "\n".join([note, *map(codec_tables.apart_line, apart)])
    return note, {"aggs": [g.label for g in aggs], "density": s.density, "rank": s.rank,
                  "mode": s.mode, "bucket_mb": s.bucket_mb,
                  "calibration": None if s.calibration is None else str(s.calibration),
                  "reference": None if s.calibration is not None else s.reference,
                  "note": note, "codec_params_apart": apart}
