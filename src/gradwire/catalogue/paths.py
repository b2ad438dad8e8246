"""The six ways a method's payloads travel and combine. Each path says what one bucket sends
(:meth:`Path.plan`) and runs it (:meth:`Path.run`), so what is priced and simulated is what
runs.

Input of ``run``: x, this rank's local gradient (DDP's buckets are not divided by P). Output:
the average over ranks of what each rank's compressed x stands for (signSGD: the majority
vote) and the bytes of this rank's payload. With error feedback the residual of the bucket is
added first and keeps what was not applied, so Σ_ranks e_after + P·avg = Σ_ranks (e_before + x).
A bucket whose payload would be no smaller than the bucket itself (a small one, a high
density, a 16-bit bucket cast to 16 bits) goes dense, residual and all, as PowerSGD's hook
sends a matrix too small to compress as it is (where x + e would overflow: x alone, the
residual kept, :meth:`gradwire.compress.ErrorFeedback.flush`).

| path     | methods                         | collectives per bucket                      |
|----------|---------------------------------|---------------------------------------------|
| dense    | dense (and every fallback)      | allreduce of x·(1/P)                        |
| summed   | fp16, bf16, randomk             | allreduce of the payload's values           |
| gathered | dgc, signsgd, efsignsgd, qsgd,  | allgather of the packed payloads, then the  |
|          | terngrad                        | compressor's ``combine`` (average or vote)  |
| sparse   | topk, gtopk                     | TopKAllReduce / gTopKAllReduce              |
| lowrank  | powersgd                        | allreduce of P and the 1-D tensors, then of |
|          |                                 | Q (each weight its own matrix)              |
| scaled   | int8                            | allreduce of the int8 levels, each block's  |
|          |                                 | votes for its next step size, the status    |
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gradwire.catalogue.calls import (
    BucketPlan,
    CollectiveCall,
    allgather_algo,
    allreduce_algo,
    dense,
)
from gradwire.compress import (
    Compressor,
    ErrorFeedback,
    Payload,
    PowerSGDCompressor,
    blocks,
    feedback,
)
from gradwire.compress.base import select_count
from gradwire.compress.quantize import (
    INT8_BLOCK,
    INT8_MOVES,
    Int8,
    int8_adopt,
    int8_budget,
    int8_cap,
    int8_exponent,
    int8_exponent_limit,
    int8_quantize,
    int8_steps,
    int8_vote,
)
from gradwire.dtypes import acc_dtype
from gradwire.sparse.allreduce import GTOPK_ALGOS, exchange
from gradwire.sparse.allreduce import spec as sparse_spec
from gradwire.sparse.wire import entry_bytes

Shapes = tuple[tuple[int, ...], ...]

if TYPE_CHECKING:
    import torch.distributed as dist

    from gradwire.catalogue.methods import Method
    from gradwire.transport import Transport


class Comm(Protocol):
    """What a path needs of the process group (:class:`gradwire.hooks.comm.Comm` is one)."""

    world: int
    algo: str | None
    group: dist.ProcessGroup | None
    agreed: Transport | None
    seconds: float

    def all_reduce(self, t: torch.Tensor) -> None: ...

    def all_reduce_start(self, t: torch.Tensor) -> list[Any]: ...

    def wait(self, flying: list[Any]) -> None: ...

    def all_gather(self, payload: Payload) -> list[Payload]: ...


@dataclass
class AggregationCall:
    """One aggregation's inputs besides the gradient."""

    method: Method
    comm: Comm
    compressor: Compressor | None
    ef: ErrorFeedback | None
    density: float
    dense: bool  # warm-up: send x (plus any residual) uncompressed
    name: str  # the method as the call header shows it (HookState.call_name)
    # the shapes of the tensors the bucket holds, in order (None: one flat tensor); PowerSGD
    # compresses each weight as its own matrix
    shapes: Shapes | None = None
    # the call header's first field: "hook", and the hook's options that must match on every
    # rank but that no later step checks again (HookState: mode, dense steps)
    caller: str = "hook"


@dataclass
class Started:
    """One bucket's aggregation after its messages, before its result is taken.

    ``worst``: the ranks' worst NaN/Inf status (:mod:`gradwire.compress.feedback`) as it
    travelled with the data, a 0-d tensor on x's device that nothing has read yet (reading it
    waits for the device), or None where no status is needed. ``finish(int(worst))`` (0 for
    None) returns the average; until then x and the residual hold what the policy's dense
    fallback needs."""

    sent: int
    worst: torch.Tensor | None
    finish: Callable[[int], torch.Tensor]

    @staticmethod
    def done(avg: torch.Tensor, sent: int) -> Started:
        return Started(sent, None, lambda _worst: avg)

    def read(self) -> int:
        """``worst`` on the host (0 for None): on a device this waits for the exchange."""
        return 0 if self.worst is None else int(self.worst)

    def result(self) -> torch.Tensor:
        """The average, the status read here: for a caller with no later point to read it."""
        return self.finish(self.read())


@dataclass
class Issued:
    """One bucket's aggregation whose allreduces are in flight (:meth:`Path.issue`): once
    every one of ``flying`` has completed (:meth:`Comm.wait`, or their futures),
    ``finish(worst)`` returns the average for the ranks' worst NaN/Inf status.

    ``worst``: None where no status is needed, else what gives that status once the
    allreduces are in, a 0-d tensor on x's device that nothing has read yet (as
    :attr:`Started.worst`). For a status other than OK, ``finish`` takes the policy's dense
    path, which is one more allreduce: its caller must issue it in bucket order on every rank."""

    sent: int
    flying: list[Any]
    finish: Callable[[int], torch.Tensor]
    worst: Callable[[], torch.Tensor] | None = None

    def read(self) -> int:
        """The worst status on the host (0 where none is needed); the allreduces must be in."""
        return 0 if self.worst is None else int(self.worst())

    def wait(self, c: AggregationCall) -> tuple[torch.Tensor, int]:
        """(the average, bytes sent), once the allreduces are in."""
        c.comm.wait(self.flying)
        return self.finish(self.read()), self.sent

    def started(self, c: AggregationCall) -> Started:
        """The aggregation as :meth:`Path.start` returns it, once the allreduces are in."""
        c.comm.wait(self.flying)
        return Started(self.sent, None if self.worst is None else self.worst(), self.finish)


def no_smaller(payload: int, numel: int, dtype: torch.dtype) -> bool:
    """Whether a payload of ``payload`` bytes is no smaller than the bucket of ``numel``
    elements of ``dtype`` as it is: then the bucket goes dense (module docstring)."""
    return payload >= numel * dtype.itemsize


class Path:
    """How a method's payloads travel and combine."""

    name: str
    sums_payloads = False  # payloads are summed element-wise: their randomness must be shared
    on_transport = False  # runs on gradwire's transport (counted bytes, header exchange)

    def in_band(self, m: Method) -> bool:
        """Whether the NaN/Inf status needs no exchange before the data: it travels with the
        payload (:meth:`start`), or the method keeps no residual (NaN and Inf then go
        through as a dense allreduce would give them). Otherwise the status is agreed in the
        call's header exchange before the data (catalogue.methods.start)."""
        return not m.error_feedback

    def start(self, c: AggregationCall, x: torch.Tensor, key: object) -> Started:
        """Compress and communicate ``x``; the result is taken with ``finish``."""
        return Started.done(*self.run(c, x, key))

    def plan(self, m: Method, numel: int, world: int, dtype: torch.dtype,
             compressor: Compressor | None, density: float, algo: str | None,
             shapes: Shapes | None = None) -> BucketPlan:
        return dense(numel, dtype, algo)

    def run(self, c: AggregationCall, x: torch.Tensor, key: object
            ) -> tuple[torch.Tensor, int]:
        return dense_average(c, c.ef.flush(key, x) if c.ef is not None else x)

    def issuable(self, c: AggregationCall, x: torch.Tensor, key: object) -> bool:
        """Whether :meth:`issue` takes this call (:func:`gradwire.catalogue.issuer` asks):
        its collectives are allreduces that wait for nothing before or between them, and the
        status, where one is needed, travels with them. Nothing is changed by asking."""
        return False

    def issue(self, c: AggregationCall, x: torch.Tensor, key: object) -> Issued:
        """Compress and start the collectives without waiting for them (only where
        :meth:`issuable`; Scaled's first step of a bucket waits for its maxima)."""
        raise NotImplementedError(f"the {self.name} path issues nothing without waiting")


class Dense(Path):
    name = "dense"

    def issuable(self, c, x, key):  # type: ignore[override]
        return True

    def issue(self, c, x, key):  # type: ignore[override]
        return dense_issue(c, c.ef.flush(key, x) if c.ef is not None else x)


def dense_issue(c: AggregationCall, y: torch.Tensor) -> Issued:
    """:func:`dense_average`, started: y·(1/P), and its sum over ranks in flight."""
    y.mul_(1 / c.comm.world)
    return Issued(y.nbytes, c.comm.all_reduce_start(y), lambda _worst: y)


def dense_average(c: AggregationCall, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the average of every rank's ``y``, bytes sent), in ``y`` itself: y·(1/P), then the sum,
    bit for bit what DDP does without a hook ((y/P) is not, for P = 3). In place, as DDP's
    own allreduce is: ``y`` is the bucket (which the average replaces) or a tensor of the
    caller's, so no gradient-sized copy is made or written back."""
    return dense_issue(c, y).wait(c)


def _payload(c: AggregationCall, x: torch.Tensor, key: object) -> Payload:
    comp = c.compressor
    assert comp is not None
    if comp.takes_density:
        comp.density, comp.k = c.density, None  # type: ignore[attr-defined]
    return c.ef.compress(key, x) if c.ef is not None else comp.compress(x)


def _at_density(compressor: Compressor, density: float) -> Compressor:
    """``compressor`` as a call at ``density`` runs it (:func:`_payload` sets the density
    then). One that takes a density holds its last compressed call's, and a density warm-up
    moves the call's from epoch to epoch: a plan read from the compressor would price
    another k than the call sends, and one that went dense (so set no density) would stay
    dense at every lower density after it. A copy: the compressor itself may be compressing
    another bucket on the comm thread."""
    if not compressor.takes_density or (compressor.density == density  # type: ignore[attr-defined]
                                        and compressor.k is None):  # type: ignore[attr-defined]
        return compressor
    at = copy.copy(compressor)
    at.density, at.k = density, None  # type: ignore[attr-defined]
    return at


class Summed(Path):
    """Associative payloads (casts, shared-index values), each scaled by 1/P and summed."""

    name = "summed"
    sums_payloads = True

    def plan(self, m, numel, world, dtype, compressor, density, algo,  # type: ignore[override]
             shapes=None):
        assert compressor is not None
        compressor = _at_density(compressor, density)
        wire, item = compressor.wire_bytes(numel, dtype), compressor.wire_itemsize(dtype)
        if no_smaller(wire, numel, dtype):  # a 16-bit bucket cast to a 16-bit wire
            return dense(numel, dtype, algo)
        name, params = allreduce_algo(algo)
        return BucketPlan((CollectiveCall("allreduce", name, wire // item, item, "payload",
                                          params, compressor.summed_dtype(dtype)),), wire)

    def run(self, c, x, key):  # type: ignore[override]
        return self.issue(c, x, key).wait(c)

    def issuable(self, c, x, key):  # type: ignore[override]
        return True  # with error feedback (randomk) the status goes first: never in band

    def issue(self, c, x, key):  # type: ignore[override]
        scale = 1 / c.comm.world  # as DDP: scale before summing
        if c.ef is None:
            # A cast: x scaled in its own precision before it is rounded to the wire's, so
            # that a value past the wire's range whose share of the average is not (70000 in
            # fp32 over 2 ranks, cast to fp16) travels finite. x is the caller's to lose.
            payload = _payload(c, x.mul_(scale), key)
        else:
            # random-k's values keep x's dtype: scaled after selection, with the same
            # rounding, so the residual keeps what was not sent unscaled
            payload = _payload(c, x, key)
            for t in payload.tensors():
                t.mul_(scale)
        flying = []
        for t in payload.tensors():
            flying += c.comm.all_reduce_start(t)
        # the average goes into x (the bucket, or the caller's): no gradient-sized tensor
        return Issued(payload.nbytes, flying,
                      lambda _worst: c.compressor.decompress_into(payload, x))  # type: ignore


class Gathered(Path):
    """Every rank's payload gathered; the compressor combines them (average, or vote)."""

    name = "gathered"

    def in_band(self, m):  # type: ignore[override]
        return False  # a sign, a vote or a quantisation level may hide a NaN: agree first

    def plan(self, m, numel, world, dtype, compressor, density, algo,  # type: ignore[override]
             shapes=None):
        assert compressor is not None
        wire = _at_density(compressor, density).wire_bytes(numel, dtype)
        if no_smaller(wire, numel, dtype):
            return dense(numel, dtype, algo)
        name, params = allgather_algo(algo)
        return BucketPlan((CollectiveCall("allgather", name, world * wire, 1, "payload",
                                          params),), wire)

    def run(self, c, x, key):  # type: ignore[override]
        payload = _payload(c, x, key)
        payloads = c.comm.all_gather(payload)
        return c.compressor.combine(payloads, x.numel()), payload.nbytes  # type: ignore


class InBand(Path):
    """A path whose NaN/Inf status travels with its payload (:meth:`start` is its own)."""

    def in_band(self, m):  # type: ignore[override]
        return True

    def run(self, c, x, key):  # type: ignore[override]
        s = self.start(c, x, key)
        return s.result(), s.sent


def sparse_algo(method: str, algo: str | None) -> str | None:
    """The schedule a sparse method runs for the hook's ``algo``: gtopk on "rd" (its default,
    the butterfly) or "tree" (the paper's) when ``algo`` names one; otherwise its default."""
    return algo if method == "gtopk" and algo in GTOPK_ALGOS else None


class Sparse(InBand):
    """TopKAllReduce and gTopKAllReduce (:func:`gradwire.sparse.sparse_allreduce`), a status
    byte beside the entries; the hook's ``algo="tree"`` runs gTop-k on the paper's tree
    instead of the butterfly."""

    name = "sparse"
    on_transport = True

    def plan(self, m, numel, world, dtype, compressor, density, algo,  # type: ignore[override]
             shapes=None):
        k = select_count(numel, density, None)
        if no_smaller(k * entry_bytes(numel, dtype), numel, dtype):
            return dense(numel, dtype, algo)
        coll, name, count, params = sparse_spec(m.name, world, numel, k, dtype,
                                                sparse_algo(m.name, algo))
        return BucketPlan((CollectiveCall(coll, name, count, 1, "entries", params),),
                          k * entry_bytes(numel, dtype))

    def start(self, c, x, key):  # type: ignore[override]
        assert c.ef is not None and c.comm.agreed is not None
        k = select_count(x.numel(), c.density, None)
        residual = c.ef.residual(key, x)
        selector = getattr(c.compressor, "selector", "exact")
        t0, timings = time.perf_counter(), {}
        ex = exchange(x, residual, k, c.method.name, selector, c.comm.agreed,
                      sparse_algo(c.method.name, c.comm.algo), timings,
                      f"gradwire hook {c.method.name}")
        # error feedback and selection count as compression; messages and merges as
        # communication
        c.comm.seconds += time.perf_counter() - t0 - timings["select"]
        # The average is written over x, which is read until then (a fresh tensor of n
        # elements would cost page faults every step).
        return Started(min(k, x.numel()) * entry_bytes(x.numel(), x.dtype), ex.worst,
                       lambda worst: ex.finish(worst, x, lambda y: dense_average(c, y)[0]))


class LowRank(InBand):
    """PowerSGD in PyTorch's layout (:func:`gradwire.compress.lowrank.layout`): the tensors
    sent as they are and every P = M·Q summed in one allreduce, each P orthogonalised, every
    Q = Mᵀ·P summed in a second, each divided by P_ranks before it is summed; avg = P·Qᵀ per
    matrix, the rest as summed."""

    name = "lowrank"
    sums_payloads = True

    def plan(self, m, numel, world, dtype, compressor, density, algo,  # type: ignore[override]
             shapes=None):
        assert isinstance(compressor, PowerSGDCompressor)
        lay = compressor.layout(numel, shapes)
        if not lay.batches:  # no matrix worth compressing: the bucket as it is
            return dense(numel, dtype, algo)
        acc = acc_dtype(dtype)
        item = acc.itemsize
        name, params = allreduce_algo(algo)
        # the first carries one more element: the ranks' NaN/Inf statuses, summed (start)
        first = lay.plain_count + lay.p_count + 1
        if no_smaller((first + lay.q_count) * item, numel, dtype):
            # no smaller than the bucket as it is (a 16-bit bucket, summed in fp32)
            return dense(numel, dtype, algo)
        return BucketPlan((CollectiveCall("allreduce", name, first, item, "P", params, acc),
                           CollectiveCall("allreduce", name, lay.q_count, item, "Q", params,
                                          acc)),
                          (first + lay.q_count) * item)

    def start(self, c, x, key):  # type: ignore[override]
        assert isinstance(c.compressor, PowerSGDCompressor) and c.ef is not None
        ps, n, world = c.compressor.power, x.numel(), c.comm.world
        lay, dtype = c.compressor.layout(n, c.shapes), acc_dtype(x.dtype)
        keys = [(key, b.rows, b.cols) for b in lay.batches]  # each batch's warm start
        e = c.ef.residual(key, x)  # zeros at first, then kept from step to step
        mine, keep = feedback.local_status(x, e)
        # acc = e + x in place in the residual (e alone where that would overflow); x stays
        # as it is until the average replaces it
        acc = feedback.add_kept(e, x, keep)
        scratch = [c.compressor.scratch(k, b, x) for b, k in zip(lay.batches, keys, strict=True)]
        ms = [b.gather(acc, dtype, buf) for b, buf in zip(lay.batches, scratch, strict=True)]
        ps_ = [ps.p(mat, k) for mat, k in zip(ms, keys, strict=True)]
        wire = torch.cat([lay.gather_plain(acc, dtype), *(p.reshape(-1) for p in ps_),
                          status_code(mine, world, dtype, x.device)])
        # Divided before summing, as DDP does, so that a sum of P ranks' values cannot
        # overflow where each is finite; the statuses (last) are counted, not averaged. P's
        # scale does not matter: q() orthogonalises it.
        wire[:-1].div_(world)
        c.comm.all_reduce(wire)
        worst = worst_of(wire[-1], world)
        at = lay.plain_count
        for p in ps_:
            p.copy_(wire[at : at + p.numel()].view_as(p))
            at += p.numel()
        # each q() orthogonalises its summed p in place
        qs = [ps.q(mat, p, k) for mat, p, k in zip(ms, ps_, keys, strict=True)]
        q_wire = torch.cat([q.reshape(-1) for q in qs]).div_(world)
        c.comm.all_reduce(q_wire)
        at = 0
        for q, k in zip(qs, keys, strict=True):  # every rank keeps the same warm start
            ps.keep(q_wire[at : at + q.numel()].view_as(q), k)
            at += q.numel()

        def finish(worst: int) -> torch.Tensor:
            if worst == feedback.Status.OK:
                # The average over x (no longer needed): the uncompressed tensors as summed,
                # each matrix P·Qᵀ. Residual = acc − avg (as PyTorch's hook): Σ over ranks is
                # Σ (e + x) − P·avg.
                lay.scatter_plain(wire[: lay.plain_count], x)
                for b, p, k, buf in zip(lay.batches, ps_, keys, scratch, strict=True):
                    b.product_into(p, ps.memory[k], x, buf)
                feedback.unapplied(acc, x)
                return x
            instead = feedback.settle(worst, x, acc, e, keep,
                                      f"gradwire hook {c.method.name}")
            return dense_average(c, instead)[0]

        return Started(wire.nbytes + q_wire.nbytes, worst, finish)


def status_code(mine: int | torch.Tensor, world: int, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """This rank's NaN/Inf status as one element of ``dtype`` to travel summed with the data:
    NONFINITE counts world + 1 (more than every OVERFLOW together), OVERFLOW 1. In ``dtype``
    before world + 1 is put in (a uint8 status would wrap at 256 ranks)."""
    code = torch.as_tensor(mine, device=device).to(dtype)
    return torch.where(code == feedback.Status.NONFINITE, world + 1, code).reshape(1)


def worst_of(total: torch.Tensor, world: int) -> torch.Tensor:
    """The ranks' worst status (0-d uint8, not read) from the sum of their
    :func:`status_code`."""
    return ((total > world).to(torch.uint8) * int(feedback.Status.NONFINITE)
            + ((total > 0) & (total <= world)).to(torch.uint8))


def int8_wire(numel: int) -> int:
    """Elements of int8's one allreduce for a bucket of ``numel``: the levels, the votes of
    every block (INT8_MOVES of them) and the two status counts."""
    return numel + len(INT8_MOVES) * blocks.count(numel, INT8_BLOCK) + 2


class Scaled(InBand):
    """int8 summed on the wire in one allreduce. Each block of INT8_BLOCK elements has a step
    size 2^(E/2) that every rank knows; each rank sends its levels round((e + x)/step),
    clipped to ±⌊127/P⌋ (:func:`gradwire.compress.quantize.int8_budget`: their sum fits in
    int8; fewer where step·level would pass x's largest value, ``int8_cap``), and, in the
    same int8 tensor, per block its vote for the next E (the smallest of INT8_MOVES after
    which twice its max|e + x| would not be clipped), then its NaN/Inf status as two counts.
    avg = Σ levels·step/P; the residual keeps e + x − levels·step, the clipped part
    included. Each block then moves E by the largest move any rank voted for.

    A bucket's first step has no E yet: one allreduce of every rank's max|e + x| per block
    (and its status) comes first, and E starts where the sum S of those maxima would not be
    clipped (S ≥ each rank's max). The plan is the steady state."""

    name = "scaled"
    sums_payloads = True

    def plan(self, m, numel, world, dtype, compressor, density, algo,  # type: ignore[override]
             shapes=None):
        wire = int8_wire(numel)
        if no_smaller(wire, numel, dtype):
            return dense(numel, dtype, algo)
        int8_budget(world)  # a world it cannot serve is an error here, before anything runs
        name, params = allreduce_algo(algo)
        return BucketPlan((CollectiveCall("allreduce", name, wire, 1, "payload", params,
                                          torch.int8),), wire)

    def issuable(self, c, x, key):  # type: ignore[override]
        """Once the bucket has its E: its first step waits for the maxima first."""
        assert isinstance(c.compressor, Int8)
        exponent = c.compressor.exponents.get(key)
        return exponent is not None and exponent.numel() == blocks.count(x.numel(), INT8_BLOCK)

    def start(self, c, x, key):  # type: ignore[override]
        return self.issue(c, x, key).started(c)

    def issue(self, c, x, key):  # type: ignore[override]
        comp = c.compressor
        assert isinstance(comp, Int8) and c.ef is not None
        world, dtype, n = c.comm.world, acc_dtype(x.dtype), x.numel()
        budget, limit = int8_budget(world), int8_exponent_limit(x.dtype)
        e = c.ef.residual(key, x)  # zeros at first, then kept from step to step
        # the status and, per block, max|x| + max|e|, a bound on |e + x|, from the same passes
        mine, keep, bound = feedback.local_status_bound(x, e, INT8_BLOCK)
        acc = feedback.add_kept(e, x, keep)  # e + x in the residual (e alone: overflow)
        sent = 0
        if self.issuable(c, x, key):  # a checkpoint's E may have been loaded on another device
            exponent = comp.exponents[key].to(x.device)
        else:  # the bucket's first step
            head = torch.cat([bound.to(dtype), status_code(mine, world, dtype, x.device)])
            c.comm.all_reduce(head)
            exponent, sent = int8_exponent(head[:-1], budget, limit), head.nbytes
        step, inv = int8_steps(exponent, dtype)
        levels, wire = comp.scratch(key, x, int8_wire(n))
        # at most the budget, and no level whose step·level passes x's dtype: the average
        # of a bucket at its largest values stays finite
        int8_quantize(acc, inv, int8_cap(step, budget, x.dtype), (levels, wire[:n]))
        votes = wire[n:-2].view(-1, len(INT8_MOVES))
        votes.copy_(int8_vote(bound, exponent, budget, limit))
        code = torch.as_tensor(mine, device=x.device)
        wire[-2:].copy_(torch.stack([code == feedback.Status.NONFINITE,
                                     code == feedback.Status.OVERFLOW]))
        flying = c.comm.all_reduce_start(wire)

        def worst() -> torch.Tensor:
            return worst_of(wire[-2].to(dtype) * (world + 1) + wire[-1].to(dtype), world)

        def finish(worst: int) -> torch.Tensor:
            if worst == feedback.Status.OK:
                # the residual: what this rank's levels left out, the clipped part included
                blocks.sub_product_(acc, levels, step, INT8_BLOCK)
                comp.exponents[key] = int8_adopt(exponent, votes, limit)
                return blocks.mul(wire[:n], step.div_(world), INT8_BLOCK, out=x)
            instead = feedback.settle(worst, x, acc, e, keep,
                                      f"gradwire hook {c.method.name}")
            return dense_average(c, instead)[0]

        return Issued(sent + wire.nbytes, flying, finish, worst)


DENSE, SUMMED, GATHERED, SPARSE, LOWRANK, SCALED = (Dense(), Summed(), Gathered(), Sparse(),
                                                    LowRank(), Scaled())
