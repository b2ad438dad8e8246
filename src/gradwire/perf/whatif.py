"""What-if sweeps and the two questions of the compression-utility paper's §5.

:func:`sweep` predicts every (aggregation, workers, link rate, compute speedup), and lists the
(aggregation, workers) points the model refuses (int8 beyond 127 workers) with why; link rates
are one array per call of :func:`gradwire.perf.model.predict`, so 1024 workers × 10 rates is one
schedule summary per collective.

- Required compression for near-linear scaling (§5, "Compression for perfect scalability"):
  with all communication overlapped in one bucket, an all-reducible compressor of ratio c
  scales linearly when ring_allreduce(bytes/c) ≤ t_b, t_b the backward that
  :func:`gradwire.perf.model.predict` lets communication hide behind: κ times the profile's
  backward times the compute slowdown (point 10), over the compute speedup. The ring's time is
  A + B·bytes (α part and β, γ part, both read from its schedule summary), so
  c = B·bytes/(t_b − A); none exists when the α part alone, A, exceeds t_b.
- Encode+decode budget (§5, "Bounding encoding time"): what backward does not hide of the
  predicted dense (synchronous SGD) iteration, t_iter − t_f − κ·t_b − t_step; a compressor
  whose encode+decode exceeds it cannot help even if its messages were free.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gradwire.bandwidth import format_bandwidth
from gradwire.check import check_real
from gradwire.errors import GradwireError
from gradwire.jsonfile import read_object, save_figure
from gradwire.perf import calibration, comm
from gradwire.perf.codecs import CodecTable
from gradwire.perf.model import (
    DTYPES,
    MAX_WORKERS,
    Aggregation,
    ClusterModel,
    Prediction,
    check_compute,
    check_workers,
    predict,
)
from gradwire.profiles import Profile
from gradwire.sizes import FORMS, parse_sizes

WORKER_FORMS = (f"a worker count like 4, 64, 1K, a range 4:128 or 4:4K:4, or a comma list of "
                f"them, from 1 to {MAX_WORKERS}")


def parse_workers(text: str) -> list[int]:
    """``4:128`` (doubling), ``4:128:4`` (×4) or ``2,3,8``: worker counts the model can
    price (ascending, a count given twice once), all checked before any is priced; a defect
    is one line naming --workers, with examples the model accepts (not message sizes')."""
    try:
        counts = parse_sizes(text)
    except GradwireError as e:
        why = str(e).replace(FORMS, WORKER_FORMS).replace("size", "worker count")
        raise GradwireError(f"--workers {text!r}: {why}") from None
    for p in counts:
        try:
            check_workers(p)
        except GradwireError as e:
            raise GradwireError(f"--workers {text!r}: {e}") from None
    return counts


@dataclass(frozen=True)
class Setting:
    alpha: float  # α, s per schedule step
    gamma: float  # γ, s per byte reduced
    overlap_slowdown: float = 1.0
    ranks_per_node: int = 1
    intra_bps: float = 100e9
    cpu: CpuSetting | None = None  # shared cores, from a calibration (calibration_terms)
    coding_slowdown: float | None = None  # coding shares the device with backward (model: 8)
    alpha_transport: float | None = None  # gradwire's executor's α (model: 9); None: alpha
    compute_slowdown: float = 1.0  # compute as the ranks run it / the profile's (model: 10)
    gamma_dtype: tuple[tuple[str, float], ...] = ()  # γ of half-precision sums (model: 11)

    def cluster(self, workers: int, link: np.ndarray | float) -> ClusterModel:
        extra = {} if self.cpu is None else self.cpu.fields(workers)
        return ClusterModel(workers, link, self.alpha, self.gamma,
                            ranks_per_node=self.ranks_per_node, intra_bps=self.intra_bps,
                            coding_slowdown=self.coding_slowdown,
                            alpha_transport=self.alpha_transport,
                            compute_slowdown=self.compute_slowdown,
                            gamma_dtype=self.gamma_dtype, **extra)


@dataclass(frozen=True)
class CpuSetting:
    """The shared-CPU terms of a calibration (point 5 of :mod:`gradwire.perf.model`).
    ``one_machine``: every rank of the calibrated cluster ran on one machine (an emulated
    cluster), so every worker of a what-if shares its cores too; otherwise each node's
    ``ranks_per_node`` ranks share ``cores``."""

    cores: float
    one_machine: bool
    step: float
    byte: float
    share: float
    sync: float
    slowdown: float = 1.0
    call: float = 0.0

    @classmethod
    def from_calibration(cls, d: dict, hosts: int) -> CpuSetting:
        """The terms of a calibration's fields ``d``, measured on ``hosts`` ranks (KeyError,
        ValueError or TypeError where they are missing or malformed; a calibration file's
        ``cpu`` object has them all). The wait per schedule step is ``cpu_sync_step_s``, or,
        where that is missing, ``cpu_sync_s`` (per call of calibrate's probe) over that
        probe's steps."""
        sync = (float(d["cpu_sync_step_s"]) if "cpu_sync_step_s" in d
                else float(d["cpu_sync_s"]) / sync_probe_steps(hosts))
        return cls(float(d["cores_per_machine"]), int(d["cpu_ranks_per_machine"]) >= hosts,
                   float(d["cpu_step_s"]), float(d["cpu_byte_s"]), float(d["cpu_share"]),
                   sync, float(d.get("cpu_slowdown", 1.0)), float(d.get("cpu_call_s", 0.0)))

    def __post_init__(self) -> None:
        check_real("cores_per_machine", self.cores, above=True)
        for name, v in (("cpu_step_s", self.step), ("cpu_byte_s", self.byte),
                        ("cpu_sync_s", self.sync), ("cpu_call_s", self.call)):
            check_real(name, v)
        check_real("cpu_share", self.share, above=True, high=1.0)
        check_real("cpu_slowdown", self.slowdown, 1.0)

    def fields(self, workers: int) -> dict[str, object]:
        """:class:`ClusterModel`'s shared-CPU arguments for ``workers`` ranks."""
        return {"cores": self.cores, "cpu_ranks": workers if self.one_machine else None,
                "cpu_step": self.step, "cpu_byte": self.byte, "cpu_share": self.share,
                "cpu_sync": self.sync, "cpu_slowdown": self.slowdown, "cpu_call": self.call}

    def describe(self) -> str:
        call = (f"{self.call * 1e6:.0f} µs per backend call" if self.call
                else "backend calls per step")
        return (f"CPU {self.step * 1e6:.0f} µs per step, {call}, {self.byte * 1e9:.2f} ns/B, "
                f"{self.share:.0%} busy, {self.sync * 1e6:.0f} µs wait per step, coding CPU "
                f"×{self.slowdown:.2f}")


def sync_probe_steps(hosts: int) -> float:
    """Steps a rank takes in ``gradwire calibrate``'s sync probe at ``hosts`` ranks: a
    recursive-doubling allreduce of one element per rank."""
    return max(comm.steps("allreduce", "rd", hosts, hosts), 1.0)


def read_calibration(path: Path) -> calibration.Calibration:
    """The ``gradwire calibrate`` file at ``path`` (:mod:`gradwire.perf.calibration`);
    every defect is one line naming ``--calibration`` and the field."""
    where = f"--calibration {path}"
    return calibration.parse(read_object(path, where), where)


def calibration_terms(cal: calibration.Calibration, path: Path) -> Setting:
    """The cluster's terms in the calibration ``cal`` read from ``path``: α per step, γ (and
    the half-precision dtypes' where measured), κ, the shared-CPU terms where its ranks shared
    a machine's cores, the coding slowdown where coding shares the device with backward
    (measured at or above 1), the executor's α where measured, and the compute slowdown."""
    cpu = None
    if cal.cpu is not None:
        try:
            cpu = CpuSetting.from_calibration(dataclasses.asdict(cal.cpu), cal.world)
        except GradwireError as e:
            raise GradwireError(f"--calibration {path}: field {e}") from None
    return Setting(cal.alpha_s, cal.gamma_s_per_byte, cal.overlap_slowdown, cpu=cpu,
                   coding_slowdown=cal.coding_slowdown if cal.coding_slowdown >= 1 else None,
                   alpha_transport=cal.alpha_transport_s,
                   compute_slowdown=cal.compute_slowdown,
                   gamma_dtype=tuple(cal.gamma_dtype().items()))


def sweep(profile: Profile, aggs: list[Aggregation], workers: list[int], rates: list[float],
          speedups: list[float], codecs: CodecTable, setting: Setting) -> dict:
    """Every prediction as rows, plus the §5 answers per (workers, rate, speedup), the worker
    counts swept (``workers``), and the (aggregation, workers) points the model refuses, under
    ``not_predicted`` (:func:`not_predicted`); a one-line error where it refuses every
    point."""
    link = np.asarray(rates, dtype=float)
    rows, answers, refused = [], [], {}
    for x in speedups:
        # what every point shares (the profile's times, the speed-up, κ) fails the command,
        # as in advise's ranking, not one point at a time
        check_compute(profile, x, setting.overlap_slowdown)
        for p in workers:
            cluster = setting.cluster(p, link)
            dense = None
            for agg in aggs:
                try:
                    r = predict(profile, cluster, agg, codecs, x, setting.overlap_slowdown)
                except GradwireError as e:
                    # a method this cluster cannot run (int8 beyond 127 ranks) or the table
                    # cannot price: the other points are still predicted, as advise ranks
                    # the other methods
                    refused.setdefault((agg.label, agg.method, p), str(e))
                    continue
                if agg.method == "dense":
                    dense = r
                rows += [row(agg, r, p, format_bandwidth(bps), x, i)
                         for i, bps in enumerate(rates)]
            if dense is None:  # bucketed as asked (--mode, --bucket-mb), not DDP's default
                dense = predict(profile, cluster, replace(aggs[0], method="dense"), codecs, x,
                                setting.overlap_slowdown)
            ratio = required_compression(profile, cluster, x, setting.overlap_slowdown)
            for i, bps in enumerate(rates):
                # None (JSON null) where no ratio fits: latency alone exceeds backward
                need = ratio[i] if math.isfinite(ratio[i]) else None
                answers.append({"workers": p, "bandwidth": format_bandwidth(bps),
                                "compute_speedup": x, "required_compression": need,
                                "coding_budget_s": float(dense.exposed[i])})
    skipped = not_predicted(refused)
    if not rows:
        raise GradwireError("no aggregation scheme could be predicted: "
                            + "; ".join(refusal(e, workers) for e in skipped))
    return {**recorded(profile, codecs, setting), "workers": sorted(set(workers)),
            "rows": rows, "answers": answers, "not_predicted": skipped}


def row(agg: Aggregation, r: Prediction, workers: int, bandwidth: str, speedup: float,
        i: int = 0) -> dict:
    """The prediction ``r`` at its ``i``-th link rate (``bandwidth``) as whatif's and advise's
    --json write it."""
    at = [float(np.atleast_1d(v)[i]) for v in (r.iteration, r.efficiency, r.communicate,
                                               r.exposed)]
    return {"agg": agg.label, "method": agg.method, "workers": workers, "bandwidth": bandwidth,
            "compute_speedup": speedup, "iteration_s": at[0], "efficiency": at[1],
            "communicate_s": at[2], "exposed_s": at[3], "coding_s": r.coding,
            "wire_bytes": r.wire_bytes}


def recorded(profile: Profile, codecs: CodecTable, setting: Setting) -> dict:
    """The model, the codec table and the cluster's terms predictions were made with, as
    whatif's and advise's --json record them."""
    return {"model": profile.model, "parameters": profile.numel, "alpha_s": setting.alpha,
            "alpha_transport_s": setting.alpha_transport, "gamma_s_per_byte": setting.gamma,
            "gamma_dtype_s_per_byte": dict(setting.gamma_dtype),
            "overlap_slowdown": setting.overlap_slowdown,
            "coding_slowdown": setting.coding_slowdown,
            "compute_slowdown": setting.compute_slowdown, "codec_table": codecs.name,
            "codecs": codecs.source, "ranks_per_node": setting.ranks_per_node,
            "intra_bps": setting.intra_bps,
            "shared_cpu": None if setting.cpu is None else vars(setting.cpu),
            "compute_source": profile.sources.get("backward_s", ""),
            "load_average": os.getloadavg()[0]}


def not_predicted(refused: dict[tuple[str, str, int], str]) -> list[dict]:
    """The points predict refused, ``{(label, method, workers): why}``, as one entry per
    aggregation and reason: ``{"agg", "workers", "reason"}``, the reason as said at the
    fewest workers, without the method's name in front. Reasons that differ only in the
    worker count they name (int8's "128 ranks", "256 ranks") are one."""
    out: dict[tuple[str, str], dict] = {}
    for (label, method, p), why in refused.items():
        why = why.removeprefix(f"{method}: ")
        entry = out.setdefault((label, re.sub(rf"\b{p}\b", "", why)),
                               {"agg": label, "workers": [], "reason": why})
        entry["workers"].append(p)
    return list(out.values())


# a longer list of refused worker counts is said as its first few, "…" and its last
_LISTED = 5
_FIRST = 3


def refusal(entry: dict, asked: list[int]) -> str:
    """One entry of :func:`not_predicted` as whatif says it, on one readable line: "every worker
    count asked" where the entry holds each of two or more of the counts ``asked``, otherwise
    its counts, a long list cut to its first few, "…" and its last."""
    n = sorted(set(entry["workers"]))
    asked = sorted(set(asked))
    if len(asked) > 1 and n == asked:
        where = f"every worker count asked ({n[0]} to {n[-1]})"
    elif len(n) > _LISTED:
        where = (f"{', '.join(map(str, n[:_FIRST]))}, …, {n[-1]} workers ({len(n)} of "
                 f"{len(asked)} asked)")
    else:
        where = f"{', '.join(map(str, n))} worker{'' if n == [1] else 's'}"
    return f"{entry['agg']} at {where}: {entry['reason']}"


def required_compression(profile: Profile, cluster: ClusterModel, speedup: float,
                         overlap_slowdown: float = 1.0) -> list[float]:
    """Smallest all-reducible compression ratio whose one-bucket ring allreduce fits in
    backward (inf where latency alone does not fit; 1 where dense already fits).

    Backward is the time :func:`gradwire.perf.model.predict` lets communication hide behind:
    the profile's, times the cluster's compute slowdown (compute as the ranks run it), over
    ``speedup``, and times ``overlap_slowdown`` (κ: backward slows while communication runs
    beside it). The ring sums in the profile's dtype, at that dtype's γ, as predict's dense
    allreduce does. Its inputs are checked as predict checks them (one-line errors)."""
    check_compute(profile, speedup, overlap_slowdown)
    p, n = cluster.workers, profile.numel
    if p == 1:
        return [1.0] * np.size(cluster.beta_s)
    budget = (overlap_slowdown * profile.backward_s  # type: ignore[operator]
              * cluster.compute_slowdown / speedup)
    gamma = cluster.gamma_of(DTYPES[profile.dtype])
    args = ("allreduce", "ring", p, n, profile.itemsize)
    node = cluster.node
    lat_node, vol_node = ((replace(node, beta=0.0), replace(node, alpha=0.0))
                          if node is not None else (None, None))
    latency = float(comm.seconds(*args, cluster.alpha, 0.0, 0.0, node=lat_node, pipeline=1))
    volume = comm.seconds(*args, 0.0, cluster.beta_s, gamma, node=vol_node, pipeline=1)
    if latency >= budget:
        return [float("inf")] * np.size(volume)
    return [max(1.0, float(v) / (budget - latency)) for v in np.atleast_1d(volume)]


def plot(result: dict, path: Path) -> Path:
    """Iteration time against workers, one panel per link rate, one colour per aggregation and
    one line style per compute speedup."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(dict.fromkeys(r["bandwidth"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 4), squeeze=False)
    for ax, bw in zip(axes[0], rates, strict=True):
        keys = dict.fromkeys((r["agg"], r["compute_speedup"]) for r in result["rows"])
        colours = {a: f"C{i % 10}" for i, a in enumerate(dict.fromkeys(a for a, _ in keys))}
        styles = {x: ("-", "--", ":", "-.")[i % 4]
                  for i, x in enumerate(dict.fromkeys(x for _, x in keys))}
        for agg, x in keys:
            pts = [(r["workers"], r["iteration_s"] * 1e3) for r in result["rows"]
                   if r["bandwidth"] == bw and r["agg"] == agg and r["compute_speedup"] == x]
            label = agg if x == 1 else f"{agg}, compute ×{x:g}"
            ax.plot(*zip(*pts, strict=True), marker="o", label=label, color=colours[agg],
                    linestyle=styles[x])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers")
        ax.set_ylabel("predicted iteration (ms)")
        ax.set_title(f"{result['model']}, {bw}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    return path
