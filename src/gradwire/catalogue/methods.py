"""The table of aggregation methods and the one aggregation step they share."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from gradwire.catalogue.calls import BucketPlan
from gradwire.catalogue.paths import (
    DENSE,
    GATHERED,
    LOWRANK,
    SCALED,
    SPARSE,
    SUMMED,
    AggregationCall,
    Issued,
    Path,
    Shapes,
    Started,
    dense_average,
)
from gradwire.check import check_fraction, check_int
from gradwire.compress import COMPRESSORS, Compressor, feedback
from gradwire.compress import get as get_compressor
from gradwire.dtypes import FLOATS
from gradwire.errors import GradwireError, lookup

MODES = ("bucket", "model")


@dataclass(frozen=True)
class Method:
    """An aggregation method: its compressor (a name in ``gradwire.compress.COMPRESSORS``, or
    None for dense), the path its payloads take, and the compressor parameters a user may
    set. Whether it keeps a residual, takes a density or draws per-rank randomness is the
    compressor's to say."""

    name: str
    path: Path
    compressor: str | None = None
    options: tuple[str, ...] = ()

    def _flag(self, flag: str) -> bool:
        return self.compressor is not None and getattr(COMPRESSORS[self.compressor], flag)

    @property
    def error_feedback(self) -> bool:
        """Keeps a residual of what was not applied (biased compressors)."""
        return self._flag("error_feedback")

    @property
    def takes_density(self) -> bool:
        """Sends a fraction of the elements: ``density=`` and the warm-up apply."""
        return self._flag("takes_density")

    @property
    def per_rank_seed(self) -> bool:
        """Stochastic: each rank draws its own numbers (seed·2²⁰ + rank)."""
        return self._flag("per_rank_seed")

    def make_compressor(self, density: float = 0.001, seed: int = 0,
                        **options: Any) -> Compressor | None:
        """The compressor as this method runs it, from the user's options (checked)."""
        if self.compressor is None:
            if options:  # a typo, or another method's option, would be silently ignored
                raise GradwireError(f"{self.name}: unknown parameter {next(iter(options))!r}: "
                                    f"expected no parameters (it sends the bucket as it is)")
            return None
        params: dict[str, Any] = dict(options)
        if self.takes_density:
            params["density"] = density
        if "seed" in inspect.signature(COMPRESSORS[self.compressor]).parameters:
            params["seed"] = seed
        return get_compressor(self.compressor, **params)

    def compressor_from(self, params: dict[str, Any]) -> tuple[Compressor | None, float]:
        """(compressor, density) from parameters written as one dict (``density=`` among the
        compressor's own, as the simulator's ``compress=NAME:KEY=VALUE`` gives them)."""
        rest = dict(params)
        if "density" in rest and not self.takes_density:
            raise GradwireError(f"{self.name} takes no density (it sends every element)")
        density = rest.pop("density", 0.001)
        return self.make_compressor(density, **rest), density

    def plan(self, numel: int, world: int, dtype: torch.dtype = torch.float32,
             compressor: Compressor | None = None, density: float = 0.001,
             algo: str | None = None, shapes: Shapes | None = None) -> BucketPlan:
        """What one bucket of ``numel`` elements sends on ``world`` ranks: the collectives in
        order and this rank's payload bytes. ``compressor`` as :meth:`make_compressor` builds
        it (default: with ``density`` and default options; one of another kind is a one-line
        error); ``algo`` as the hook's;
        ``shapes``: the shapes of the bucket's tensors in order (None: one flat tensor), which
        PowerSGD compresses one matrix each.

        ``numel`` and ``world`` must be integers (>= 0 and >= 1), ``dtype`` a gradient's float
        dtype, and ``density`` a fraction in (0, 1] for a method that takes one; anything
        else is a one-line error (a negative numel planned negative bytes, world=0 an empty
        allgather, a string a TypeError)."""
        check_int(self.name, "numel (elements in the bucket)", numel, 0)
        check_int(self.name, "world (ranks)", world, 1)
        if dtype not in FLOATS:
            raise GradwireError(f"{self.name}: dtype must be a gradient's float dtype "
                                f"({', '.join(str(d) for d in FLOATS)}), got {dtype!r}")
        if self.takes_density:
            density = check_fraction(f"{self.name}: density", density)
        if compressor is None:
            compressor = self.make_compressor(density)
        elif self.compressor is None or not isinstance(compressor,
                                                       COMPRESSORS[self.compressor]):
            # another method's compressor was priced as if it were this one's (a qsgd plan
            # given a signsgd compressor: signsgd's wire), or failed an assert (powersgd's)
            want = "none" if self.compressor is None else f"the {self.compressor} compressor"
            raise GradwireError(f"{self.name}: expected {want} (as make_compressor builds "
                                f"it), got {compressor!r}")
        return self.path.plan(self, numel, world, dtype, compressor, density, algo, shapes)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("dense", DENSE),
    Method("fp16", SUMMED, "fp16"),
    Method("bf16", SUMMED, "bf16"),
    Method("topk", SPARSE, "topk", options=("selector",)),
    Method("gtopk", SPARSE, "topk", options=("selector",)),
    Method("randomk", SUMMED, "randomk"),
    Method("dgc", GATHERED, "dgc", options=("sample", "passes", "slack")),
    Method("signsgd", GATHERED, "signsgd"),
    Method("efsignsgd", GATHERED, "efsignsgd"),
    Method("qsgd", GATHERED, "qsgd", options=("s",)),
    Method("terngrad", GATHERED, "terngrad"),
    Method("int8", SCALED, "int8"),
    Method("powersgd", LOWRANK, "powersgd", options=("rank", "warm_start")),
)}


def get(name: str) -> Method:
    """The method ``name``; an unknown one is a one-line error listing the known."""
    return lookup(METHODS, name, "aggregation")


def start(c: AggregationCall, x: torch.Tensor, key: object, check: bool = True) -> Started:
    """Compress and communicate this rank's gradient ``x`` of bucket ``key``; the average is
    taken with :meth:`Started.finish`. ``x`` is the caller's to lose (the average is written
    over it, as DDP's allreduce does in the bucket).

    ``check``: exchange the call header first, so that ranks that disagree fail here, all of
    them, naming why, before any residual changes. A caller that has already agreed on this
    call passes False (the hooks: they exchange a bucket's header at its first call, after
    DDP rebuilds the buckets or a call fails, and every step during a density warm-up, and
    skip it while a bucket's calls repeat). Methods whose
    NaN/Inf status cannot travel with their data (:meth:`Path.in_band`) always exchange it in
    the header, and take the policy's path (:mod:`gradwire.compress.feedback`) before
    compressing."""
    m, n = c.method, x.numel()
    if not m.path.in_band(m):
        return Started.done(*_agreed_first(c, x, key))
    if check:
        c.comm.agree(header(c, n, x.dtype))
    if m.path is DENSE or _sent_dense(c, n, x.dtype):
        return Started.done(*DENSE.run(c, x, key))
    return m.path.start(c, x, key)


def issuer(c: AggregationCall, x: torch.Tensor, key: object) -> Path | None:
    """The path whose :meth:`Path.issue` starts this call, already agreed on (no header),
    without waiting: torch.distributed's allreduces that wait for nothing before or between
    them, the NaN/Inf status, where one is needed, travelling with them (dense; fp16 and bf16;
    int8 once the bucket has its step sizes). None for any other call (:func:`start` it).
    Nothing is changed by asking.

    A DDP hook can then return as PyTorch's own hooks do, with the collectives issued from
    the training thread in bucket order and their futures completing the bucket's."""
    m = c.method
    if c.comm.algo is not None or not m.path.in_band(m):
        return None
    if m.path is DENSE or _sent_dense(c, x.numel(), x.dtype):
        return DENSE
    return m.path if m.path.issuable(c, x, key) else None


def header(c: AggregationCall, numel: int, dtype: torch.dtype) -> list[tuple[str, object]]:
    """The call header of one aggregation (:mod:`gradwire.collectives.agree`)."""
    return [("call", c.caller), ("method", c.name), ("dense", c.dense), ("elements", numel),
            ("dtype", dtype), ("density", float(c.density))]


def _agreed_first(c: AggregationCall, x: torch.Tensor, key: object
                  ) -> tuple[torch.Tensor, int]:
    """The header with this rank's status, then the NaN/Inf policy's path for the worst."""
    m, n = c.method, x.numel()
    residual = c.ef.residuals.get(key) if c.ef is not None else None
    worst = c.comm.agree(header(c, n, x.dtype), status=lambda: feedback.status(x, residual))
    instead = feedback.fallback(worst, x, residual, f"gradwire hook {m.name}")
    if instead is not None:
        return dense_average(c, instead)
    if _sent_dense(c, n, x.dtype):
        return DENSE.run(c, x, key)
    return m.path.run(c, x, key)


def _sent_dense(c: AggregationCall, numel: int, dtype: torch.dtype) -> bool:
    """Whether this call goes dense: the warm-up's dense steps, or a plan that sends the
    bucket as it is (compressing would not make it smaller)."""
    return c.dense or c.method.plan(numel, c.comm.world, dtype, c.compressor, c.density,
                                    c.comm.algo, c.shapes).dense


__all__ = ["MODES", "METHODS", "AggregationCall", "Issued", "Method", "Started",
           "get", "issuer", "start"]
