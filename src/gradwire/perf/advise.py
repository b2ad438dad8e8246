"""``gradwire advise``: rank every aggregation scheme for one cluster and say why the winner wins.

Each method of :data:`gradwire.catalogue.METHODS` runs with the parameters given (density for the
sparsifiers, rank for PowerSGD) through :func:`gradwire.perf.model.predict`; methods the codec
table has no encode/decode time for, and methods the cluster cannot run (int8 beyond 127 ranks),
are listed as not ranked.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradwire import catalogue
from gradwire.catalogue import METHODS
from gradwire.catalogue.paths import DENSE
from gradwire.errors import GradwireError
from gradwire.perf.codecs import CodecTable
from gradwire.perf.model import (
    Aggregation,
    ClusterModel,
    Prediction,
    check_compute,
    predict,
)
from gradwire.profiles import Profile


@dataclass(frozen=True)
class Ranked:
    agg: Aggregation
    prediction: Prediction

    @property
    def seconds(self) -> float:
        return float(self.prediction.iteration)

    @property
    def overhead(self) -> float:
        """What the iteration costs beyond compute, exposed communication and coding: the
        prediction's ``exposed`` (what backward does not hide)."""
        return float(self.prediction.exposed)


def rank(profile: Profile, cluster: ClusterModel, aggs: list[Aggregation], codecs: CodecTable,
         compute_speedup: float = 1.0,
         overlap_slowdown: float = 1.0) -> tuple[list[Ranked], list[str]]:
    """Schemes fastest first, and the methods left out (with why)."""
    # what every scheme shares (the profile's times, the speed-up, κ) fails the command, not
    # one scheme
    check_compute(profile, compute_speedup, overlap_slowdown)
    ranked, unpriced, unrunnable = [], [], []
    for agg in aggs:
        # dense encodes nothing (predict never asks the table for it): a table of the
        # compressors alone still prices the baseline every compressor is measured against
        if agg.method not in codecs.methods and catalogue.get(agg.method).path is not DENSE:
            unpriced.append(agg.label)
            continue
        try:
            ranked.append(Ranked(agg, predict(profile, cluster, agg, codecs, compute_speedup,
                                              overlap_slowdown)))
        except GradwireError as e:
            # a method this cluster cannot run (int8 beyond 127 ranks): the others are still
            # ranked, as where the codec table cannot price one
            why = str(e)
            unrunnable.append(why if why.startswith(f"{agg.method}:") else f"{agg.label}: {why}")
    skipped = [f"{', '.join(unpriced)}: "
               + codecs.lacks("it" if len(unpriced) == 1 else "them")] if unpriced else []
    skipped += unrunnable
    if not ranked:
        raise GradwireError("no aggregation scheme could be predicted: " + "; ".join(skipped))
    # Equal times (one worker sends nothing, whatever the scheme) rank in the catalogue's
    # order, dense first: a compressor that saves nothing must not win on the order --agg
    # named it in, as it risks the accuracy training reaches.
    order = {m: i for i, m in enumerate(METHODS)}
    ranked.sort(key=lambda r: (r.seconds, order[r.agg.method], r.agg.label))
    return ranked, skipped


def default_schemes(density: float, rank_: int) -> list[Aggregation]:
    return [Aggregation(m, density=density, rank=rank_) for m in METHODS]


TIE = 5e-4  # a runner-up within this fraction of the winner's time ties with it (0.0 % at .1f)


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def explain(ranked: list[Ranked]) -> str:
    """Why the first scheme wins, against the runner-up and dense, in numbers."""
    w = ranked[0]
    p = w.prediction
    compute = p.forward + p.backward + p.step
    # backward beside communication takes κ times its own time: that part is communication's
    # cost, not the profile's compute, and the efficiency counts it so
    alone = p.backward if p.backward_alone is None else p.backward_alone
    slowed = (f" ({_ms(p.backward - alone)} of it backward slowed by the communication beside "
              f"it)" if p.backward - alone >= 0.05e-3 else "")  # as _ms rounds
    lines = [f"{w.agg.label} wins at {_ms(w.seconds)} per iteration: {_ms(compute)} of compute"
             f"{slowed} and {_ms(w.overhead)} that backward does not hide ({_ms(p.coding)} "
             f"encode+decode, {_ms(float(p.communicate))} on the wire in all, "
             f"{p.wire_bytes / 1e6:.3g} MB of payload per rank over {p.buckets} "
             f"bucket{'' if p.buckets == 1 else 's'})."]
    if p.cpu_bound >= float(w.seconds) - 1e-12 and p.cpu_bound > 0:
        lines.append(f"It is bound by the shared cores: {_ms(p.cpu)} of CPU per rank "
                     f"({_ms(p.cpu_comm)} of it in the collectives) and the waits of "
                     f"{p.steps:.0f} schedule steps ({p.calls} collective calls) make "
                     f"{_ms(p.cpu_bound)}.")
    if len(ranked) > 1:
        r = ranked[1]
        q = r.prediction
        parts = f"encode+decode {_ms(q.coding)}, wire {_ms(float(q.communicate))}"
        if r.seconds - w.seconds <= TIE * w.seconds:
            lines.append(f"{r.agg.label} ties with it at {_ms(r.seconds)}: {parts}.")
        else:
            more_coding, more_wire = q.coding - p.coding, float(q.communicate - p.communicate)
            why = ("more encode+decode" if more_coding > max(more_wire, 0.0)
                   else "more time on the wire" if more_wire > 0
                   else "less of its communication hidden by backward")
            lines.append(f"Runner-up {r.agg.label} takes {_ms(r.seconds)} "
                         f"({(r.seconds / w.seconds - 1) * 100:.1f} % slower), mostly {why}: "
                         f"{parts}.")
    dense = next((r for r in ranked if r.agg.method == "dense"), None)
    if dense is not None and dense is not w:
        lines.append(f"Dense takes {_ms(dense.seconds)} ({dense.seconds / w.seconds:.2f}× the "
                     f"winner): {_ms(float(dense.prediction.communicate))} on the wire, and "
                     f"{_ms(dense.overhead)} of its iteration beyond compute that backward "
                     f"does not hide.")
    elif dense is w:
        lines.append("No compressor saves more wire time than its encode+decode costs here.")
    if w.agg.method != "dense":
        lines.append("Ranked by time alone: a compressor can also change the accuracy training "
                     "reaches (at density 0.001 the sparsifiers missed the targets of "
                     "docs/training.md's time-to-accuracy runs); check yours with gradwire "
                     "train.")
    return "\n".join(lines)
