"""The five ways a method's payloads travel and combine. Each path says what one bucket sends
(:meth:`Path.plan`) and runs it (:meth:`Path.run`), so what is priced and simulated is what
runs.

Input of ``run``: x, this rank's local gradient (DDP's buckets are not divided by P). Output:
the average over ranks of what each rank's compressed x stands for (signSGD: the majority
vote) and the bytes of this rank's payload. With error feedback the residual of the bucket is
added first and keeps what was not applied, so Σ_ranks e_after + P·avg = Σ_ranks (e_before + x).

| path     | methods                         | collectives per bucket                      |
|----------|---------------------------------|---------------------------------------------|
| dense    | dense (and every fallback)      | allreduce of x·(1/P)                        |
| summed   | fp16, bf16, randomk             | allreduce of the payload's values           |
| gathered | dgc, signsgd, efsignsgd, qsgd,  | allgather of the packed payloads, then the  |
|          | terngrad                        | compressor's ``combine`` (average or vote)  |
| sparse   | topk, gtopk                     | TopKAllReduce / gTopKAllReduce              |
| lowrank  | powersgd                        | allreduce of P, then of Q                   |
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

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
    from_matrix,
    matrix_shape,
    to_matrix,
)
from gradwire.compress.base import select_count
from gradwire.dtypes import acc_dtype
from gradwire.sparse import sparse_allreduce
from gradwire.sparse.allreduce import spec as sparse_spec
from gradwire.sparse.wire import entry_bytes

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


class Path:
    """How a method's payloads travel and combine."""

    name: str
    sums_payloads = False  # payloads are summed element-wise: their randomness must be shared
    on_transport = False  # runs on gradwire's transport (counted bytes, header exchange)

    def plan(self, m: Method, numel: int, world: int, dtype: torch.dtype,
             compressor: Compressor | None, density: float, algo: str | None) -> BucketPlan:
        return dense(numel, dtype, algo)

    def run(self, c: AggregationCall, x: torch.Tensor, key: object
            ) -> tuple[torch.Tensor, int]:
        return dense_average(c, c.ef.flush(key, x) if c.ef is not None else x)


class Dense(Path):
    name = "dense"


def dense_average(c: AggregationCall, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the average of every rank's ``y``, bytes sent), in ``y`` itself: y·(1/P), then the sum,
    bit for bit what DDP does without a hook ((y/P) is not, for P = 3). In place, as DDP's
    own allreduce is: ``y`` is the bucket (which the average replaces) or a tensor of the
    caller's, so no gradient-sized copy is made or written back."""
    y.mul_(1 / c.comm.world)
    c.comm.all_reduce(y)
    return y, y.nbytes


def _payload(c: AggregationCall, x: torch.Tensor, key: object) -> Payload:
    comp = c.compressor
    assert comp is not None
    if comp.takes_density:
        comp.density, comp.k = c.density, None  # type: ignore[attr-defined]
    return c.ef.compress(key, x) if c.ef is not None else comp.compress(x)


class Summed(Path):
    """Associative payloads (casts, shared-index values), each scaled by 1/P and summed."""

    name = "summed"
    sums_payloads = True

    def plan(self, m, numel, world, dtype, compressor, density, algo):  # type: ignore[override]
        assert compressor is not None
        wire, item = compressor.wire_bytes(numel, dtype), compressor.wire_itemsize(dtype)
        name, params = allreduce_algo(algo)
        return BucketPlan((CollectiveCall("allreduce", name, wire // item, item, "payload",
                                          params),), wire)

    def run(self, c, x, key):  # type: ignore[override]
        payload = _payload(c, x, key)
        for t in payload.tensors():
            t.mul_(1 / c.comm.world)  # as DDP: scale before summing (and no fp16 overflow)
            c.comm.all_reduce(t)
        # the average goes into x (the bucket, or the caller's): no gradient-sized tensor
        return c.compressor.decompress_into(payload, x), payload.nbytes  # type: ignore


class Gathered(Path):
    """Every rank's payload gathered; the compressor combines them (average, or vote)."""

    name = "gathered"

    def plan(self, m, numel, world, dtype, compressor, density, algo):  # type: ignore[override]
        assert compressor is not None
        wire = compressor.wire_bytes(numel, dtype)
        name, params = allgather_algo(algo)
        return BucketPlan((CollectiveCall("allgather", name, world * wire, 1, "payload",
                                          params),), wire)

    def run(self, c, x, key):  # type: ignore[override]
        payload = _payload(c, x, key)
        payloads = c.comm.all_gather(payload)
        return c.compressor.combine(payloads, x.numel()), payload.nbytes  # type: ignore


class Sparse(Path):
    """TopKAllReduce and gTopKAllReduce (:func:`gradwire.sparse.sparse_allreduce`)."""

    name = "sparse"
    on_transport = True

    def plan(self, m, numel, world, dtype, compressor, density, algo):  # type: ignore[override]
        k = select_count(numel, density, None)
        coll, name, count, params = sparse_spec(m.name, world, numel, k, dtype)
        return BucketPlan((CollectiveCall(coll, name, count, 1, "entries", params),),
                          k * entry_bytes(numel, dtype))

    def run(self, c, x, key):  # type: ignore[override]
        assert c.ef is not None
        k = select_count(x.numel(), c.density, None)
        residual = c.ef.residual(key, x)
        selector = getattr(c.compressor, "selector", "exact")
        t0, timings = time.perf_counter(), {}
        # x is spent once added to the residual, so the average is written over it (a fresh
        # tensor of n elements would cost page faults every step).
        avg = sparse_allreduce(x, residual, k, c.method.name, selector=selector,
                               transport=c.comm.agreed, group=c.comm.group, out=x,
                               timings=timings)
        # error feedback and selection count as compression; messages and merges as
        # communication
        c.comm.seconds += time.perf_counter() - t0 - timings["select"]
        return avg, k * entry_bytes(x.numel(), x.dtype)


class LowRank(Path):
    """PowerSGD: P = M·Q summed, orthogonalised, Q = Mᵀ·P summed, avg = P·Qᵀ/P_ranks."""

    name = "lowrank"
    sums_payloads = True

    @staticmethod
    def _shape(compressor: Compressor | None, numel: int) -> tuple[int, int, int]:
        assert isinstance(compressor, PowerSGDCompressor)
        rows, cols = matrix_shape(numel)
        return rows, cols, compressor.power.effective_rank(rows, cols)

    def plan(self, m, numel, world, dtype, compressor, density, algo):  # type: ignore[override]
        rows, cols, r = self._shape(compressor, numel)
        if (rows + cols) * r >= numel:  # P and Q would be no smaller than the bucket itself
            return dense(numel, dtype, algo)
        item = acc_dtype(dtype).itemsize
        name, params = allreduce_algo(algo)
        return BucketPlan((CollectiveCall("allreduce", name, rows * r, item, "P", params),
                           CollectiveCall("allreduce", name, cols * r, item, "Q", params)),
                          (rows + cols) * r * item)

    def run(self, c, x, key):  # type: ignore[override]
        assert isinstance(c.compressor, PowerSGDCompressor) and c.ef is not None
        ps, n = c.compressor.power, x.numel()
        corrected = c.ef.correct(key, x)
        m = to_matrix(corrected)
        p = ps.p(m, key)
        c.comm.all_reduce(p)
        q = ps.q(m, p, key)  # orthogonalises the summed p in place
        c.comm.all_reduce(q)
        q.div_(c.comm.world)
        avg = from_matrix(ps.decompress(p, q, key), n, x.dtype)
        # Residual = corrected − avg (as PyTorch's hook): Σ over ranks is Σ corrected − P·avg.
        c.ef.update(key, corrected, avg)
        return avg, p.nbytes + q.nbytes


DENSE, SUMMED, GATHERED, SPARSE, LOWRANK = Dense(), Summed(), Gathered(), Sparse(), LowRank()
