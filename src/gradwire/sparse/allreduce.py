"""TopKAllReduce and gTopKAllReduce, each an existing schedule over one packed byte buffer.

A :class:`Plan` is one rank's part of an aggregation: the schedule, the buffer it runs on, the
custom combine ops, and what to read from the buffer afterwards. The same plans run over a
transport (:func:`topk_allreduce`, :func:`gtopk_allreduce`, :func:`sparse_allreduce`) or, for
all ranks in one process, under :func:`gradwire.sparse.local.simulate`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

import gradwire.collectives as gc
from gradwire.check import is_int
from gradwire.collectives.agree import agree_status
from gradwire.collectives.api import in_turn, refused_together
from gradwire.collectives.executor import Combine, execute
from gradwire.compress import feedback
from gradwire.compress.select import SELECTORS
from gradwire.dtypes import FLOATS, acc_dtype
from gradwire.errors import GradwireError, PeerError
from gradwire.schedules import butterfly, registry
from gradwire.schedules.cost import CostParams, cost
from gradwire.schedules.ir import Schedule
from gradwire.sparse import topk as merging
from gradwire.sparse import wire
from gradwire.sparse.topk import merge_following, top_merge
from gradwire.sparse.wire import STATUS_BYTES, Entries, entry_bytes, pack, unpack
from gradwire.syncfree import on_host
from gradwire.transport import Transport, resolve

METHODS = ("topk", "gtopk")
GTOPK_OP = "gtopk"  # the tree's combine op: the ⊤ merge instead of a sum
GTOPK_ALGOS = ("rd", "tree")


def gtopk_algo(algo: object, where: str = "sparse_allreduce") -> str:
    """gTop-k's allreduce schedule: "rd" (None: the butterfly) or "tree" (the paper's);
    anything else is a one-line error that starts with ``where``."""
    if algo is None:
        return "rd"
    if algo not in GTOPK_ALGOS:
        raise GradwireError(f"{where}: gtopk runs on the butterfly ('rd', the default) "
                            f"or the paper's binomial tree ('tree'), got algo={algo!r}")
    return str(algo)


@dataclass(frozen=True)
class SparseResult:
    """What every rank holds after an aggregation; identical on every rank.

    ``entries``: the sum over ranks of what is applied, as distinct indices in ascending order
    (gtopk: the global top-k of the merged selections, whose indices are Algorithm 3's mask;
    topk: every rank's selection added up). ``schedule``: what ran, for traffic() and cost().
    Dense forms on request: the aggregation itself costs O(P·k), never O(numel).
    """

    entries: Entries
    numel: int
    world_size: int
    schedule: Schedule
    # the sums at ``entries.indices`` in acc_dtype, divided by ``scale`` (gtopk's
    # wire_scale), before their cast to the values' dtype, so that average() divides a sum
    # that overflows before casting it (as sparse_allreduce does): two fp16 ranks' 60 000
    # average to 60 000, not inf; and topk's ``divided`` (merging.rank_sums), for the sums
    # that overflow acc_dtype itself (two fp32 ranks' 3e38)
    sums: torch.Tensor | None = None
    scale: int = 1
    divided: torch.Tensor | None = None

    @property
    def indices(self) -> torch.Tensor:
        return self.entries.indices

    def total(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Dense Σ over ranks (in ``out`` if given, which is overwritten)."""
        return self._dense(self.entries.values, out)

    def average(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Dense total / P, element for element (in ``out`` if given)."""
        if self.sums is not None:
            mean = merging.mean(self.sums, self.entries.values.dtype, self.world_size,
                                self.scale, self.divided)
            return self._dense(mean, out)
        return self._dense(self.entries.values / self.world_size, out)

    def mask(self) -> torch.Tensor:
        m = torch.zeros(self.numel, dtype=torch.bool, device=self.indices.device)
        return m.index_fill_(0, self.indices, True)  # no host copy of True, as m[...] = True

    def _dense(self, values: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if out is None:
            out = torch.zeros(self.numel, dtype=values.dtype, device=values.device)
        elif out.shape != (self.numel,) or out.dtype != values.dtype:
            raise GradwireError(f"out must be a 1-D tensor of {self.numel} {values.dtype}, got "
                                f"{tuple(out.shape)} {out.dtype}")
        else:
            out.zero_()
        out[self.indices] = values
        return out


@dataclass(frozen=True)
class Plan:
    """One rank's part: run ``schedule`` on ``buffer`` with ``combine``; then ``worst()``, the
    worst status byte of any rank (a 0-d uint8 tensor, read by nobody here), and, when that is
    OK, ``finish()`` (the result, its padding dropped: on the device path that reads the host)
    or ``average(out)`` (its dense average, on either path, with no host read). Both first add
    what this rank's merges dropped to its residual."""

    schedule: Schedule
    buffer: torch.Tensor
    combine: dict[str, Combine]
    finish: Callable[[], SparseResult]
    average: Callable[[torch.Tensor], torch.Tensor]
    worst: Callable[[], torch.Tensor]


def topk_algo(world_size: int) -> str:
    """Top-k's default allgather: "rd" (recursive doubling) at P a power of two, else "bruck"
    (⌈lg P⌉ steps, (P−1)/P of the data, like rd at a power of two; rd's fold would carry up
    to twice the data: the cost model gives it 2.3× Bruck's time at P = 48)."""
    return "rd" if world_size & (world_size - 1) == 0 else "bruck"


def spec(method: str, world_size: int, numel: int, k: int, dtype: torch.dtype = torch.float32,
         algo: str | None = None) -> tuple[str, str, int, dict[str, object]]:
    """(collective, algorithm, count, parameters) of ``method``'s schedule; counts are bytes
    (a list of k packed entries and its status byte, :mod:`gradwire.sparse.wire`).

    topk: allgather (``algo``, default :func:`topk_algo`) of P·k packed entries. gtopk: an
    allreduce of k packed entries with op "gtopk", on ``algo`` "rd" (default: the butterfly,
    every rank merges at every step; lg P steps for P a power of two, ⌊lg P⌋ + 2 otherwise,
    fewer than the tree's) or "tree"
    (the paper's: binomial reduce to rank 0, binomial broadcast).
    """
    if not is_int(numel, 0):
        raise GradwireError(f"sparse schedule: numel must be an integer >= 0, got {numel!r}")
    if not is_int(world_size, 1):  # topk_algo would fail on it with a TypeError
        raise GradwireError(f"sparse schedule: world_size must be an integer >= 1, got "
                            f"{world_size!r}")
    if not is_int(k, 0):
        raise GradwireError(f"sparse schedule: k (entries per rank) must be an integer >= 0, "
                            f"got {k!r}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise GradwireError(f"sparse schedule: dtype must be a float torch.dtype, got {dtype!r}")
    # Python ints: a numpy integer passes the checks, and np.uint8(200) · 8 bytes wraps
    numel, world_size, k = int(numel), int(world_size), int(k)
    nbytes = min(k, numel) * entry_bytes(numel, dtype) + STATUS_BYTES
    if method == "topk":
        return "allgather", algo or topk_algo(world_size), world_size * nbytes, {"itemsize": 1}
    if method == "gtopk":
        return "allreduce", gtopk_algo(algo), nbytes, {"op": GTOPK_OP}
    raise GradwireError(f"sparse method must be one of {', '.join(METHODS)}, got {method!r}")


def schedule(method: str, world_size: int, numel: int, k: int,
             dtype: torch.dtype = torch.float32, algo: str | None = None) -> Schedule:
    """The schedule of ``method`` over k entries per rank (:func:`spec`); its elements are
    bytes."""
    collective, name, count, params = spec(method, world_size, numel, k, dtype, algo)
    return registry.schedule(collective, name, world_size, count, **params)


def estimate(method: str, world_size: int, numel: int, k: int, params: CostParams,
             dtype: torch.dtype = torch.float32, algo: str | None = None) -> float:
    """Predicted seconds (``params.beta`` per byte). With β_e per 4-byte element, fp32 and
    CostParams(α, β_e/4): topk (rd, P a power of two) lg P·α + 2(P−1)kβ_e, (bruck, other P)
    at most (2⌈lg P⌉−1)α + 2(P−1)kβ_e; gtopk on the tree 2⌈lg P⌉α + 4k⌈lg P⌉β_e (Table I of
    the gTop-k paper), on the butterfly (the default, P a power of two) lg P·α + 2k·lg P·β_e;
    each list also carries its status byte."""
    if not isinstance(params, CostParams):  # cost() would fail on it with an AttributeError
        raise GradwireError(f"sparse estimate: params must be a CostParams (α s, β s/byte), "
                            f"e.g. CostParams.for_link(10e9), got {params!r}")
    return cost(schedule(method, world_size, numel, k, dtype, algo), params, itemsize=1)


def topk_plan(e: Entries, k: int, numel: int, rank: int, world_size: int,
              algo: str | None = None, status: int | torch.Tensor = 0) -> Plan:
    """TopKAllReduce (Algorithm 1, lines 12–21): everyone gathers every rank's k entries and
    adds them up in rank order. Everything sent is applied; nothing returns to a residual.
    ``status``: this rank's status byte (:mod:`gradwire.compress.feedback`), sent beside."""
    dtype, k = e.values.dtype, min(k, numel)  # distinct indices: never more than numel
    s = schedule("topk", world_size, numel, k, dtype, algo)
    b = s.count // world_size
    buf = torch.zeros(s.count, dtype=torch.uint8, device=e.values.device)
    buf[rank * b : (rank + 1) * b - STATUS_BYTES] = pack(e, k, numel)
    buf[(rank + 1) * b - 1] = status

    def lists() -> list[Entries]:
        return [unpack(buf[r * b : (r + 1) * b - STATUS_BYTES], k, numel, dtype)
                for r in range(world_size)]

    def average(out: torch.Tensor) -> torch.Tensor:
        if on_host(buf):
            # from the sums in acc_dtype, as average_into: an fp16 sum of ranks' 60 000s is
            # inf, their mean is not (merging.mean, in SparseResult.average)
            return finish().average(out)
        return merging.average_into(lists(), numel, world_size, out)

    def finish() -> SparseResult:
        got_lists = [_real(got) for got in lists()]
        where, slot = torch.unique(torch.cat([got.indices for got in got_lists]), sorted=True,
                                   return_inverse=True)
        sums, divided = merging.rank_sums(got_lists, slot, where.numel(), world_size)
        return SparseResult(Entries(sums.to(dtype), where), numel, world_size, s, sums,
                            divided=divided)

    return Plan(s, buf, {}, finish, average, lambda: buf.view(world_size, b)[:, -1].max())


def gtopk_plan(e: Entries, k: int, numel: int, residual: torch.Tensor, rank: int,
               world_size: int, algo: str | None = None,
               status: int | torch.Tensor = 0) -> Plan:
    """gTopKAllReduce (Algorithm 3), any P: each merge keeps a ⊤ b, and what it drops goes back
    to residuals, so no gradient mass is lost.

    On the tree ("tree") one rank makes each merge and keeps what it drops (a partial sum of
    its subtree). On the butterfly ("rd") the 2d ranks of an aligned group all make the same
    merge at distance d (⊤ does not depend on the order of its operands), so each rank sees
    every merge on its path and takes back its *own* entries that a merge dropped: the
    paper's per-worker residual, ε += G̃ ⊙ ¬mask, made lossless (an entry dropped at an inner
    merge whose index still reaches the final set through another group goes back too).
    For P a power of two the merges are the tree's, in lg P steps instead of 2 lg P. A rank
    that folds into its left neighbour (P not a power of two) hands that neighbour its
    entries: the fold's drops, and later those of the fold's kept sums, go to the neighbour.

    Keeping drops on the rank that made them (the tree) concentrates a whole subtree's dropped
    mass in one residual, which trains worse (docs/compression.md). The drops reach the
    residual when the result is taken (``finish``, ``average``): not at all when a rank's
    status sends the call dense instead. The status bytes merge by max.

    Values travel divided by :func:`~gradwire.sparse.topk.wire_scale` (2^⌈lg P⌉), so that no
    merge overflows where the average fits (fp16's 30 000 on four ranks, fp32's 3e38 on two);
    the result and the residuals get them back multiplied, and what the division rounds
    away (subnormals) goes back to this rank's residual.
    """
    dtype, k = e.values.dtype, min(k, numel)
    e = merging.in_index_order(e)
    scale = merging.wire_scale(dtype, world_size)
    owed: Entries | None = None  # what scaling rounded away (subnormals): this rank's
    if scale > 1:
        sent = e.values / scale
        # exact, both being on e's grid; 0 where e is ±inf (simulate sends it as it is)
        owed = Entries((e.values - sent * scale).nan_to_num(0.0), e.indices)
        e = Entries(sent, e.indices)
    s = schedule("gtopk", world_size, numel, k, dtype, algo)
    own_drops = s.algo != "tree"  # the tree: every merge is its maker's alone, drops too
    drops: list[Entries] = []
    end = -STATUS_BYTES
    ranks = butterfly.core(world_size) if own_drops else []
    folds = own_drops and rank in ranks and rank + 1 < world_size and rank + 1 not in ranks
    # The butterfly: the entries this rank answers for (its selection, or once it has folded
    # its neighbour in, the fold's kept sums), and where each sits in the list the merges
    # pass on: None before the first merge after they are set (they are that list's first
    # entries, in order), −1 once a merge dropped it.
    own: Entries | None = e if own_drops and rank in ranks else None
    at: torch.Tensor | None = None

    def merge(into: torch.Tensor, received: torch.Tensor) -> None:
        nonlocal own, at, folds
        a, b = unpack(into[:end], k, numel, dtype), unpack(received[:end], k, numel, dtype)
        if own is not None and not folds:
            kept, dropped, where = merge_following(a, b, k)
            at = where[: len(own)] if at is None else torch.where(
                at >= 0, where[at.clamp(min=0)], -1)
        else:
            kept, dropped = top_merge(a, b, k)
        if not own_drops or folds:  # the tree, or the fold: this rank answers for both after
            drops.append(dropped)
        if folds:
            own, at, folds = kept, None, False
        into[:end].copy_(pack(kept, k, numel))
        torch.maximum(into[end:], received[end:], out=into[end:])

    buf = torch.cat([pack(e, k, numel), torch.zeros(STATUS_BYTES, dtype=torch.uint8,
                                                    device=e.values.device)])
    buf[end] = status

    def unscaled(v: torch.Tensor) -> torch.Tensor:
        return v if scale == 1 else v * scale

    def keep_drops() -> None:
        nonlocal own, owed
        for d in drops:
            wire.add_into(residual, Entries(unscaled(d.values), d.indices))
        drops.clear()
        if owed is not None:
            wire.add_into(residual, owed)
            owed = None
        if own is not None and at is not None:  # its entries some merge dropped
            wire.add_into(residual, Entries(torch.where(at >= 0, -0.0, unscaled(own.values)),
                                            own.indices))
        own = None

    def average(out: torch.Tensor) -> torch.Tensor:
        if on_host(buf):
            return finish().average(out)
        keep_drops()
        return merging.average_into([unpack(buf[:end], k, numel, dtype)], numel, world_size,
                                    out, summed=True, scale=scale)

    def finish() -> SparseResult:
        keep_drops()
        got = _real(unpack(buf[:end], k, numel, dtype))
        i = got.indices
        if i.numel() > 1 and not bool((i[1:] > i[:-1]).all()):  # a merge's output: ascending
            order = i.argsort()  # P = 1: this rank's own selection, in the caller's order
            got = Entries(got.values[order], i[order])
        if scale == 1:
            return SparseResult(got, numel, world_size, s)
        sums = got.values.to(acc_dtype(dtype))
        return SparseResult(Entries((sums * scale).to(dtype), got.indices), numel, world_size,
                            s, sums, scale)

    return Plan(s, buf, {GTOPK_OP: merge}, finish, average, lambda: buf[end])


def _real(e: Entries) -> Entries:
    """``e`` without its padding entries: on the device path a masked selection (a host read;
    the result's size depends on the data), on the host path ``e`` itself (unpack dropped
    them)."""
    if on_host(e.indices):
        return e
    real = e.indices >= 0
    return Entries(e.values[real], e.indices[real])


def _run(plan: Plan, transport: Transport, method: str) -> SparseResult:
    try:
        execute(plan.schedule, plan.buffer, transport, plan.combine)
    except PeerError as e:
        raise e.within(f"{method} over {e.during}") from None
    return plan.finish()


def _shown(method: str, algo: str | None, world_size: int) -> str | None:
    """The algorithm a header names: each method's default (gtopk's butterfly, topk's
    :func:`topk_algo`) is named as no algorithm, so that ranks passing None and the default
    spelled out make one call, as they run one schedule."""
    if method == "gtopk":
        return None if gtopk_algo(algo) == "rd" else algo
    return None if algo == topk_algo(world_size) else algo


def _agree(t: Transport, call: str, method: str, algo: str | None, numel: int,
           dtype: torch.dtype, k: int, selector: str = "",
           status: int | Callable[[], int] = 0) -> int | None:
    """Every rank must be making this call (agree.py): checked before any state changes.
    Returns the worst ``status`` of any rank (None with the check off)."""
    return agree_status(t, [("call", call),
                            ("method", method if algo is None else f"{method}/{algo}"),
                            ("elements", numel), ("dtype", dtype), ("k", k),
                            ("selector", selector)], status)


def topk_allreduce(values: torch.Tensor, indices: torch.Tensor, numel: int, *,
                   k: int | None = None, algo: str | None = None,
                   transport: Transport | None = None,
                   group: dist.ProcessGroup | None = None) -> SparseResult:
    """Sum every rank's (values, indices) by gathering them (cost: log(P)α + 2(P−1)kβ).

    ``k`` (default: len(values)) entries per rank, the same on every rank; shorter lists are
    padded. ``algo``: the allgather, by default "rd" at P a power of two and "bruck" elsewhere
    (:func:`topk_algo`), or "ring" (or any registered one).
    """
    t = resolve(transport, group, "topk_allreduce")
    # in turn before the checks: they read the indices, which a call issued before this one
    # (async) may still be writing
    with in_turn(t.group):
        with refused_together(t):  # a rank's argument error fails every rank at once
            e = _entries("topk_allreduce", values, indices, numel)
            numel = int(numel)  # as _count's k: a numpy integer's products wrap
            # as given: duplicates summed must not lower it
            k = _count(e, len(values) if k is None else k)
        _agree(t, "topk_allreduce", "topk", _shown("topk", algo, t.world_size), numel,
               values.dtype, k)
        return _run(topk_plan(e, k, numel, t.rank, t.world_size, algo), t, "topk")


def gtopk_allreduce(values: torch.Tensor, indices: torch.Tensor, numel: int,
                    residual: torch.Tensor, *, k: int | None = None, algo: str | None = None,
                    transport: Transport | None = None,
                    group: dist.ProcessGroup | None = None) -> SparseResult:
    """The global top-k of the sum of every rank's (values, indices), on every rank
    (cost on the butterfly, the default, P a power of two: lg P·α + 2k·lg P·β; on the paper's
    tree, ``algo="tree"``: 2⌈lg P⌉α + 4k⌈lg P⌉β). What a merge on this rank keeps of its drops
    is added to ``residual`` (dense, numel elements, values' dtype) in place."""
    t = resolve(transport, group, "gtopk_allreduce")
    # in turn before the checks, as topk_allreduce's
    with in_turn(t.group):
        with refused_together(t):  # a rank's argument error fails every rank at once
            e = _entries("gtopk_allreduce", values, indices, numel)
            # checked here, not first after the exchange began on the others
            gtopk_algo(algo, "gtopk_allreduce")
            numel = int(numel)  # as _count's k: a numpy integer's products wrap
            # as given: duplicates summed must not lower it
            k = _count(e, len(values) if k is None else k)
            # checked before the exchange: a merge writes the residual only after it, when a
            # rank that failed then would have lost the entries it dropped
            if (not isinstance(residual, torch.Tensor) or residual.shape != (numel,)
                    or residual.dtype != values.dtype or residual.device != values.device):
                got = (f"{tuple(residual.shape)} {residual.dtype} on {residual.device}"
                       if isinstance(residual, torch.Tensor) else type(residual).__name__)
                raise GradwireError(f"gtopk_allreduce: residual must be ({numel},) "
                                    f"{values.dtype} on {values.device}, got {got}")
            if residual.numel() > 1 and residual.stride(0) == 0:
                raise GradwireError("gtopk_allreduce: residual is written in place, so its "
                                    "elements must not share memory (stride 0: an expand()ed "
                                    "tensor); pass residual.clone()")
        _agree(t, "gtopk_allreduce", "gtopk", _shown("gtopk", algo, t.world_size), numel,
               values.dtype, k)
        # written as data after the exchange (as sparse_allreduce's): in place on a residual
        # that requires grad, autograd would refuse it and the merges' drops would be lost
        return _run(gtopk_plan(e, k, numel, residual.detach(), t.rank, t.world_size, algo), t,
                    "gtopk")


def _entries(name: str, values: object, indices: object, numel: object) -> Entries:
    """Already selected (values, indices) of a ``numel``-element tensor, checked: a 1-D float
    values tensor, as many integer indices, each in [0, numel) (-1 would read as the wire's
    padding and be dropped). Values given at one index twice are summed (never dropped)."""
    if not is_int(numel, 0):
        raise GradwireError(f"{name}: numel must be an integer >= 0, got {numel!r}")
    if not (isinstance(values, torch.Tensor) and values.dim() == 1 and values.dtype in FLOATS):
        raise GradwireError(f"{name}: values must be a 1-D float tensor (fp16, bf16, fp32, "
                            f"fp64), got {getattr(values, 'dtype', type(values).__name__)}")
    if not (isinstance(indices, torch.Tensor) and indices.shape == values.shape
            and not indices.dtype.is_floating_point and not indices.dtype.is_complex
            and indices.dtype != torch.bool):
        raise GradwireError(f"{name}: indices must be an integer tensor of the values' "
                            f"{len(values)} entries")
    # int64 first: torch has no min/max of uint16/32/64; a uint64 of 2**63 or more turns
    # negative, out of range as it is
    indices = indices.long()
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= numel):
        raise GradwireError(f"{name}: indices must lie in [0, {numel}), got "
                            f"{int(indices.min())}..{int(indices.max())}")
    unique, at = torch.unique(indices, return_inverse=True)
    if unique.numel() < indices.numel():  # an index given twice: its values are summed
        # in acc_dtype, cast once: fp16's 60000 + 60000 − 60000 summed in fp16 is inf, and a
        # bf16 sum of small values rounds at every add
        wide = torch.zeros(unique.numel(), dtype=acc_dtype(values.dtype), device=values.device)
        values = wide.index_add_(0, at, values.to(wide.dtype)).to(values.dtype)
        indices = unique
    return Entries(values, indices)


def _count(e: Entries, k: int | None) -> int:
    if k is None:
        return len(e)
    if not is_int(k, len(e)):
        raise GradwireError(f"k (entries per rank) must be an integer >= the {len(e)} "
                            f"entries given, got {k!r}")
    return int(k)  # a numpy integer's products wrap (np.uint8(200) entries · 8 bytes)


def check_args(x: object, residual: object, k: object, method: object, selector: object,
               algo: object = None, out: object = None, timings: object = None) -> None:
    """One-line errors for what :func:`sparse_allreduce` accepts."""
    # written into after the residual has taken x: a list or a string there raised a
    # TypeError from deep in the call with x's mass in the residual and nothing sent
    if timings is not None and not isinstance(timings, MutableMapping):
        raise GradwireError(f"sparse_allreduce: timings must be None or a dict (it receives "
                            f"'select'), got {type(timings).__name__}")
    if method not in METHODS:
        raise GradwireError(f"sparse_allreduce: method must be one of "
                            f"{', '.join(map(repr, METHODS))}, got {method!r}")
    if method == "gtopk":
        gtopk_algo(algo)
    if method == "topk" and algo is not None:
        registry.get("allgather", str(algo))  # raises naming the known allgathers
    if not is_int(k, 1):
        raise GradwireError(f"sparse_allreduce: k must be an integer >= 1 (entries each rank "
                            f"selects; k >= numel sends everything), got {k!r}")
    if selector not in SELECTORS:
        raise GradwireError(f"sparse_allreduce: selector must be one of "
                            f"{', '.join(map(repr, SELECTORS))}, got {selector!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.dtype not in FLOATS:
        got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise GradwireError(f"sparse_allreduce: x must be a 1-D float tensor (fp16, bf16, fp32, "
                            f"fp64), got {got}")
    for name, t in (("residual", residual), ("out", out)):
        if t is None and name == "out":
            continue
        if (not isinstance(t, torch.Tensor) or t.shape != x.shape or t.dtype != x.dtype
                or t.device != x.device):
            got = (f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor)
                   else type(t).__name__)
            raise GradwireError(f"sparse_allreduce: {name} must match x ({tuple(x.shape)} "
                                f"{x.dtype} on {x.device}), got {got}")
    for name, t in (("residual", residual), ("out", out)):
        if isinstance(t, torch.Tensor) and t.numel() > 1 and t.stride(0) == 0:
            raise GradwireError(f"sparse_allreduce: {name} is written in place, so its elements "
                                f"must not share memory (stride 0: an expand()ed tensor); pass "
                                f"{name}.clone()")
    # The residual is state that outlives the call: nothing may be written over it, and x must
    # not be it (residual += x would double the gradient).
    if isinstance(residual, torch.Tensor) and residual.numel() and any(
            isinstance(t, torch.Tensor) and t.numel() and shares_memory(t, residual)
            for t in (x, out)):
        raise GradwireError("sparse_allreduce: residual must be a tensor of its own: x or out "
                            "shares its memory (out may be x, never the residual)")


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two 1-D tensors' bytes overlap (views of one buffer may sit side by side)."""
    def span(t: torch.Tensor) -> tuple[int, int]:
        lo = t.data_ptr()
        return lo, lo + ((t.numel() - 1) * abs(t.stride(0)) + 1) * t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def feed(x: torch.Tensor, residual: torch.Tensor, k: int, selector: str,
         keep: bool | torch.Tensor = True) -> Entries:
    """Error feedback and selection (:func:`gradwire.compress.feedback.feed`): what this rank
    sends, min(k, n) entries; ``residual`` keeps the rest."""
    return Entries(*feedback.feed(residual, x, k, selector, keep))


def plan(method: str, e: Entries, k: int, numel: int, residual: torch.Tensor, rank: int,
         world_size: int, algo: str | None = None, status: int | torch.Tensor = 0) -> Plan:
    """This rank's part of ``method`` (``residual`` receives gtopk's drops)."""
    if method == "topk":
        return topk_plan(e, k, numel, rank, world_size, algo, status)
    return gtopk_plan(e, k, numel, residual, rank, world_size, algo, status)


@dataclass
class Exchange:
    """One sparse aggregation after its messages, before its result is written: see
    :func:`exchange`."""

    x: torch.Tensor
    residual: torch.Tensor
    sent: Entries
    keep: bool | torch.Tensor
    plan: Plan
    who: str

    @property
    def worst(self) -> torch.Tensor:
        """The worst status of any rank (0-d uint8, on x's device; reading it on the host
        waits for the exchange)."""
        return self.plan.worst()

    def finish(self, worst: int, out: torch.Tensor | None,
               dense: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The result for ``worst`` (``int(self.worst)``): the sparse average (in ``out``),
        or, when some rank's status is not OK, the NaN/Inf policy's dense sum, averaged by
        ``dense`` (in place), with this rank's selection first put back into its residual."""
        if worst == feedback.Status.OK:
            if out is None:
                out = torch.zeros_like(self.x)
            return self.plan.average(out)
        self.residual.index_put_((self.sent.indices,), self.sent.values)  # acc again
        instead = dense(feedback.settle(worst, self.x, self.residual, self.residual, self.keep,
                                        self.who))
        return instead if out is None else out.copy_(instead)


def exchange(x: torch.Tensor, residual: torch.Tensor, k: int, method: str, selector: str,
             t: Transport, algo: str | None = None, timings: dict[str, float] | None = None,
             who: str = "sparse_allreduce") -> Exchange:
    """Steps 1 and 2 of :func:`sparse_allreduce` with this rank's NaN/Inf status beside the
    entries, and no host read: x is not modified; ``residual`` holds acc − sent (with e alone
    as acc where x + e would overflow) and, once the result is taken, gtopk's kept drops."""
    n = x.numel()
    mine, keep = feedback.local_status(x, residual)
    t0 = time.perf_counter()
    e = feed(x, residual, k, selector, keep)
    if timings is not None:
        timings["select"] = time.perf_counter() - t0
    p = plan(method, e, min(k, n), n, residual, t.rank, t.world_size, algo, mine)
    try:
        execute(p.schedule, p.buffer, t, p.combine)
    except PeerError as err:
        raise err.within(f"{method} over {err.during}") from None
    return Exchange(x, residual, e, keep, p, who)


def sparse_allreduce(x: torch.Tensor, residual: torch.Tensor, k: int, method: str = "gtopk", *,
                     selector: str = "exact", transport: Transport | None = None,
                     group: dist.ProcessGroup | None = None,
                     algo: str | None = None, out: torch.Tensor | None = None,
                     timings: dict[str, float] | None = None) -> torch.Tensor:
    """The average over ranks of what a sparse aggregation applies, with error feedback.

    1. acc = residual + x, in place in ``residual``; select min(k, n) entries of largest |acc|
       (``selector``: "exact", or "threshold" for about one pass over acc); residual −= sent.
    2. ``method`` "topk": TopKAllReduce, allgather (``algo``: default :func:`topk_algo`, or
       "ring") of every rank's entries, all applied; "gtopk": gTopKAllReduce on the butterfly
       (``algo`` "rd", default: every rank takes back into its ``residual`` its own entries
       that a merge dropped) or the paper's binomial tree ("tree": each merge's drops added to
       the ``residual`` of the rank that made it).
    3. Return total / P: dense, n elements, x's dtype, identical on every rank.

    Summed over ranks, Σ residual_after + P·result = Σ (residual_before + x).

    The NaN/Inf policy (:mod:`gradwire.compress.feedback`; each rank's status byte travels
    with its entries), with a RuntimeWarning: NaN or Inf in any rank's ``x``, every rank
    returns the dense average of residual + x instead, as a dense allreduce would (NaN/Inf
    where it has them), and its residual is cleared; residual + x overflowing x's dtype on
    some rank, every rank returns a dense average instead: of x alone from that rank, which
    keeps its residual, of x + residual from the others, which clear theirs. Either way no
    residual is left non-finite and no mass is lost.
    Cost (β per element, fp32): topk log(P)α + 2(P−1)kβ; gtopk on the butterfly (P a power of
    two) lg(P)α + 2k·lg(P)β, on the paper's tree 2lg(P)α + 4k·lg(P)β (Table I).

    ``out``: where to write the result (may be ``x`` itself, which is read until then): a fresh
    25 M-element fp32 tensor took 40–60 ms to allocate and zero here (page faults), zeroing an
    existing one 5 ms, against ~12 ms predicted for gTopKAllReduce's whole communication at P=8
    on 1 Gbit/s.

    ``x``, ``residual`` and ``out`` are read and written as data, as a dense allreduce does:
    autograd does not record the call, whether or not they require grad.

    ``timings``: if given, receives ``"select"``, the seconds of step 1 (error feedback and
    selection, this rank's work alone; the rest is communication and merging).

    Like any collective, every rank must make the same calls in the same order with the same
    n, k, dtype, method and selector: a header exchange before ``residual`` is touched makes
    a mismatch a :class:`~gradwire.collectives.agree.MismatchError` on every rank.
    """
    t = resolve(transport, group, "sparse_allreduce")
    with refused_together(t):  # a rank's argument error fails every rank at once
        if isinstance(x, torch.Tensor):  # first: a meta tensor's memory seems to overlap all
            t.check_device(x)
        check_args(x, residual, k, method, selector, algo, out, timings)
    k, n = int(k), x.numel()  # k: a numpy integer's products wrap (np.uint8(200) · 8 bytes)
    with in_turn(t.group):  # in issue order with the group's other calls, async ones too
        _agree(t, "sparse_allreduce", method, _shown(method, algo, t.world_size), n, x.dtype,
               k, selector)
        # Data, not part of autograd's graph (as in a dense allreduce): a tensor that
        # requires grad would stop the host's numpy selection, and tie the residual to the
        # graph.
        given = out
        x, residual = x.detach(), residual.detach()
        ex = exchange(x, residual, k, method, selector, t, algo, timings)
        got = ex.finish(int(ex.worst), None if out is None else out.detach(),
                        lambda y: gc.all_reduce(y, op="avg", transport=t) or y)
    return got if given is None else given
