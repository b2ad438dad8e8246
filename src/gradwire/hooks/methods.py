"""What each method does with one flat gradient vector (a bucket, or the whole model): the table
of methods and the one aggregation step they share.

Input: x, this rank's local gradient (DDP's buckets are not divided by P). Output: the average
over ranks of what each rank's compressed x stands for (signsgd: the majority vote), and the
bytes of this rank's payload. With error feedback the residual e of the layout is added first
and keeps what was not applied, so Σ_ranks e_after + P·avg = Σ_ranks (e_before + x).

- dense, fp16, bf16: x·(1/P) (cast) summed by an allreduce: dense is exactly DDP without a hook.
- randomk: values at indices shared through the seed, summed by an allreduce.
- dgc, efsignsgd, qsgd, terngrad: payloads gathered, each decompressed, averaged.
- signsgd: sign payloads gathered, majority vote.
- topk, gtopk: :func:`gradwire.sparse.sparse_allreduce` (TopKAllReduce, gTopKAllReduce).
- powersgd: P = M·Q summed, orthogonalised, Q = Mᵀ·P summed, avg = P·Qᵀ/P_ranks.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch

from gradwire.collectives.agree import all_finite
from gradwire.compress import (
    DGC,
    Compressor,
    ErrorFeedback,
    PowerSGDCompressor,
    RandomK,
    from_matrix,
    majority_vote,
    matrix_shape,
    to_matrix,
)
from gradwire.compress.base import acc_dtype, index_dtype, select_count
from gradwire.hooks.comm import Comm
from gradwire.hooks.layout import Layout
from gradwire.sparse import sparse_allreduce


@dataclass(frozen=True)
class Method:
    name: str
    combine: str  # dense, allreduce, gather, vote, sparse, powersgd
    compressor: str | None = None  # name in gradwire.compress.COMPRESSORS
    feedback: bool = False  # biased: error feedback keeps what was not applied
    sparse: bool = False  # takes a density (and the warm-up schedule)
    own_seed: bool = False  # stochastic: each rank must draw its own numbers
    options: tuple[str, ...] = ()  # the compressor's parameters a user may set


TABLE: dict[str, Method] = {m.name: m for m in (
    Method("dense", "dense"),
    Method("fp16", "allreduce", "fp16"),
    Method("bf16", "allreduce", "bf16"),
    Method("topk", "sparse", "topk", feedback=True, sparse=True, options=("selector",)),
    Method("gtopk", "sparse", "topk", feedback=True, sparse=True, options=("selector",)),
    Method("randomk", "allreduce", "randomk", feedback=True, sparse=True),
    Method("dgc", "gather", "dgc", feedback=True, sparse=True,
           options=("sample", "passes", "slack")),
    Method("signsgd", "vote", "signsgd"),
    Method("efsignsgd", "gather", "efsignsgd", feedback=True),
    Method("qsgd", "gather", "qsgd", own_seed=True, options=("s",)),
    Method("terngrad", "gather", "terngrad", own_seed=True),
    Method("powersgd", "powersgd", "powersgd", feedback=True, options=("rank", "warm_start")),
)}


@dataclass
class Step:
    """One aggregation's inputs besides the gradient."""

    method: Method
    comm: Comm
    compressor: Compressor | None
    ef: ErrorFeedback | None
    density: float
    dense: bool  # warm-up: send x (plus any residual) uncompressed
    name: str  # the method as the call header shows it (HookState.call_name)


def aggregate(s: Step, x: torch.Tensor, key: Layout) -> tuple[torch.Tensor, int]:
    """(average, payload bytes) for this rank's gradient ``x`` of layout ``key``."""
    m, n = s.method, x.numel()
    # Before any residual changes: ranks that disagree fail here, all of them, naming why.
    # NaN/Inf on any rank: every rank goes dense, so the average holds them as DDP's would
    # (GradScaler then skips the step) and the residual is consumed, never left non-finite.
    finite = s.comm.agree([("call", "hook"), ("method", s.name),
                           ("dense", s.dense), ("elements", n), ("dtype", x.dtype),
                           ("density", f"{s.density:.6g}")],
                          finite=lambda: all_finite(x))
    if finite is False and m.combine != "dense":
        warnings.warn(f"gradwire hook {m.name}: a gradient bucket holds NaN or Inf on some "
                      "rank; aggregated dense this step (its residual applied and cleared)",
                      RuntimeWarning, stacklevel=2)
        return _dense(s, x, key)
    if s.dense or m.combine == "dense" or (m.sparse and select_count(n, s.density, None) == n):
        # Nothing would be dropped: the dense allreduce sends 4n bytes where the pairs send 8n.
        return _dense(s, x, key)
    if m.combine == "sparse":
        return _sparse(s, x, key)
    if m.combine == "powersgd":
        return _powersgd(s, x, key)
    c = s.compressor
    assert c is not None
    if isinstance(c, (RandomK, DGC)):
        c.density, c.k = s.density, None
    payload = s.ef.compress(key, x) if s.ef is not None else c.compress(x)
    if m.combine == "allreduce":
        for t in payload.tensors():  # values only (fp16, bf16, randomk)
            t.mul_(1 / s.comm.world)  # as DDP: scale before summing (and no fp16 overflow)
            s.comm.all_reduce(t)
        return c.decompress(payload, n), payload.nbytes
    payloads = s.comm.all_gather(payload)
    if m.combine == "vote":
        return majority_vote(payloads, n), payload.nbytes
    total = torch.zeros(n, dtype=acc_dtype(x.dtype), device=x.device)
    for p in payloads:
        total += c.decompress(p, n)
    return total.div_(s.comm.world).to(x.dtype), payload.nbytes


def _flush(s: Step, x: torch.Tensor, key: Layout) -> torch.Tensor:
    """x plus the residual of ``key``, which is then zero (all of it is being applied)."""
    if s.ef is None or key not in s.ef.residuals:
        return x
    return x + s.ef.residuals.pop(key).to(x.dtype)


def _dense(s: Step, x: torch.Tensor, key: Layout) -> tuple[torch.Tensor, int]:
    # x·(1/P), then the sum: bit for bit what DDP does without a hook ((x/P) is not, for P = 3).
    y = _flush(s, x, key).mul(1 / s.comm.world)
    s.comm.all_reduce(y)
    return y, y.nbytes


def _sparse(s: Step, x: torch.Tensor, key: Layout) -> tuple[torch.Tensor, int]:
    assert s.ef is not None
    n = x.numel()
    k = select_count(n, s.density, None)
    residual = s.ef.residuals.get(key)
    if residual is None:
        residual = s.ef.residuals[key] = torch.zeros_like(x)
    selector = getattr(s.compressor, "selector", "exact")
    t0, timings = time.perf_counter(), {}
    # x is spent once added to the residual, so the average is written over it (a fresh
    # tensor of n elements would cost page faults every step).
    avg = sparse_allreduce(x, residual, k, s.method.name, selector=selector,
                           transport=s.comm.agreed, group=s.comm.group, out=x,
                           timings=timings)
    # error feedback and selection count as compression; messages and merges as communication
    s.comm.seconds += time.perf_counter() - t0 - timings["select"]
    return avg, k * (index_dtype(n).itemsize + x.element_size())


def _powersgd(s: Step, x: torch.Tensor, key: Layout) -> tuple[torch.Tensor, int]:
    assert isinstance(s.compressor, PowerSGDCompressor) and s.ef is not None
    ps, n = s.compressor.power, x.numel()
    rows, cols = matrix_shape(n)
    r = ps.effective_rank(rows, cols)
    if (rows + cols) * r >= n:  # P and Q would be no smaller than the bucket itself
        return _dense(s, x, key)
    corrected = s.ef.correct(key, x)
    m = to_matrix(corrected)
    p = ps.p(m, key)
    s.comm.all_reduce(p)
    q = ps.q(m, p, key)  # orthogonalises the summed p in place
    s.comm.all_reduce(q)
    q.div_(s.comm.world)
    avg = from_matrix(ps.decompress(p, q, key), n, x.dtype)
    # Residual = corrected − avg (as PyTorch's hook): Σ over ranks is Σ corrected − P·avg.
    s.ef.update(key, corrected, avg)
    return avg, p.nbytes + q.nbytes
