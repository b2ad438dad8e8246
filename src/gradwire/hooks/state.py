"""The hook state (what a user tunes, what the hook keeps, what it measured) and the DDP hook.

No ``from __future__ import annotations`` here: DDP's ``register_comm_hook`` compares the hook's
``bucket`` and return annotations with the real ``dist.GradBucket`` and ``Future[Tensor]``.
"""

import contextlib
import inspect
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from gradwire.catalogue import METHODS as CATALOGUE
from gradwire.catalogue import (
    MODES,
    AggregationCall,
    Method,
    Started,
    issuer,
    start,
)
from gradwire.catalogue import get as get_method
from gradwire.catalogue.methods import header as call_header
from gradwire.check import check_fraction, check_int, is_int, is_real
from gradwire.compress import COMPRESSORS, Compressor, ErrorFeedback
from gradwire.compress.feedback import MALFORMED
from gradwire.errors import GradwireError, did_you_mean
from gradwire.hooks import layout
from gradwire.hooks.comm import (
    Comm,
    Deferred,
    Worker,
    after_backward,
    before_ddp_finishes,
    complete,
)
from gradwire.hooks.flight import Flight
from gradwire.hooks.warmup import Warmup, parse
from gradwire.schedules import registry
from gradwire.syncfree import on_host
from gradwire.transport import check_group

METHODS: tuple[str, ...] = tuple(CATALOGUE)
DENSE_ONLY = ("gradwire's hooks need dense gradients: build embeddings with sparse=False "
              "(nn.Embedding, nn.EmbeddingBag)")


def _one_dtype(dtypes: set[torch.dtype]) -> None:
    """Refuse model mode over buckets of several dtypes: it aggregates one flat tensor."""
    if len(dtypes) > 1:
        raise GradwireError("hooks: mode='model' needs every trained parameter in one dtype, "
                            f"got {sorted(str(d) for d in dtypes)}: use mode='bucket' (DDP "
                            "buckets each dtype apart)")


STATS = ("compress", "communicate", "header", "tail", "sent", "steps", "buckets", "dense",
         "issued", "cpu")


@dataclass(frozen=True)
class HookConfig:
    """What a user chose; checked by :func:`make`."""

    method: Method
    density: float = 0.001
    mode: str = "bucket"
    warmup: Warmup = field(default_factory=lambda: Warmup(()))
    steps_per_epoch: int | None = None
    group: dist.ProcessGroup | None = None
    seed: int = 0
    algo: str | None = None
    overlap: bool = True
    options: dict[str, object] = field(default_factory=dict)
    momentum: float = 0.0


def hook(state: "HookState", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``ddp.register_comm_hook(state, hook)``; the future's value is the
    bucket holding the average gradient (see :class:`HookState`)."""
    return state.on_bucket(bucket)


class HookState:
    """State of one gradwire DDP hook; build it with :func:`make`.

    Per bucket, in bucket mode (``mode="bucket"``):

    1. name the bucket by its parameters' positions (stable across DDP's bucket rebuild);
    2. hand it to this state's comm thread (or, ``overlap=False``, run in the hook);
    3. there: add the error-feedback residual, compress, communicate, decompress, average,
       write the average into the bucket and complete its future.

    Dense, fp16, bf16 and int8, once a step has agreed on the buckets (and int8's bucket has
    its step sizes), skip the comm thread as PyTorch's own hooks do: the hook compresses the
    bucket, issues its allreduce and returns a future that gets the average when the
    collective completes (:meth:`_issue`); in model mode too, when the model is one bucket
    aggregated where it lies.

    In model mode (``mode="model"``, the gTop-k paper's setting) each bucket's future stays
    pending until the last bucket; then the whole model is aggregated at once and every
    future is completed with its slice. With several buckets the model is gathered in
    parameter-position order; a single bucket (DDP with ``bucket_cap_mb`` at least the model's
    size, as ``gradwire train`` builds it) is aggregated where it lies, in its own order, with
    no copy in or out. ``state_dict`` records that order and a resumed state's first
    aggregation keeps to it (a new DDP's first bucket has its construction order until DDP
    rebuilds it in gradient-ready order), so a resumed run repeats the uninterrupted one bit
    for bit; but for a state saved after the first step alone, whose order is that of DDP's
    first bucket: the uninterrupted run aggregates the next step in the rebuilt bucket's
    order, which no state saved before it knows (methods whose result depends on the order,
    int8 and PowerSGD, then take another step there).

    Checks and syncs: every bucket of the first step (and after DDP rebuilds its buckets,
    or after a step that failed) exchanges a call header before its data, naming the method
    and every option that must be equal on all ranks (the mode and dense steps, the
    compressor's options: :func:`_call_name`), its size, dtype and density. Once a step has
    agreed on its buckets, a later bucket that matches the agreed list (same place, size and
    dtype) needs no header: nothing in it can differ between ranks that agreed before. With
    a density warm-up (``warmup=``), whose density ``set_epoch`` moves on each rank, the
    ranks also exchange one header per step, before its first aggregation, naming the
    density and the previous step's buckets. Methods whose status cannot travel with their
    data (qsgd, signsgd, …: :meth:`~gradwire.catalogue.Path.in_band`) exchange a header per
    bucket, with the status. On a GPU the hot path never waits for the device, but once per step:
    Top-k, gTop-k and PowerSGD send each bucket's NaN/Inf status with its data
    (:mod:`gradwire.compress.feedback`), and the last bucket's task reads every bucket's
    worst status at once, then writes every bucket's average; the futures are completed
    then. int8 issued from the hook does the same at the end of backward (:meth:`_settle`).
    Dense, fp16 and bf16 need no status and read nothing. On the CPU each bucket's
    average is written as soon as its data is in (a host read costs nothing there).

    Tuned by the user: ``config`` (:class:`HookConfig`). Internal: ``epoch`` (the warm-up's,
    counted from ``step`` with ``steps_per_epoch``; ``set_epoch`` moves it), ``step`` (iterations
    aggregated; a step that failed is not counted), ``positions``, ``compressor``, ``ef``
    (error feedback, residuals per bucket layout). Stats: ``stats`` (see :meth:`reset_stats`).

    Example::

        state = gradwire.hooks.make("gtopk", density=0.001)   # 0.001 from the first step
        state.register(ddp_model)          # = ddp_model.register_comm_hook(state, state.hook)
        # (over a subgroup, register_comm_hook needs make(..., group=g); register() takes
        # DDP's group)
        # or with the paper's warm-up, counted by the hook: 0.25, 0.0725, 0.015, 0.004, then
        # 0.001, one epoch of len(loader) steps each
        state = gradwire.hooks.make("gtopk", density=0.001, warmup=True,
                                    steps_per_epoch=len(loader))

    Warning: every rank must make the same state (method, density, mode, seed) and register it
    on the same model; the collectives of all buckets are issued in bucket order, from one
    thread at a time (the training thread's first, then the comm thread's).

    Errors: what goes wrong while aggregating (a :class:`~gradwire.errors.GradwireError` such
    as a MismatchError or PeerError, a bucket the hook refuses, c10d's RuntimeError, a
    KeyboardInterrupt while the hook waits) is raised by ``backward()`` itself, unchanged,
    once DDP has finished that backward, whose gradients are then not averaged
    (:class:`~gradwire.hooks.comm.Deferred`); the next backward agrees on its buckets afresh
    and runs. Error feedback takes the buckets averaged before the failure as sent, as in any
    step, and leaves the residuals of those after it untouched.
    """

    hook = staticmethod(hook)

    def __init__(self, config: HookConfig) -> None:
        self.config = config
        m = config.method
        self.step = 0
        self._epoch_at = (0, 0)  # (epoch, the step it began at), moved by set_epoch
        self.positions = layout.Positions()
        self.compressor = m.make_compressor(config.density, config.seed, **config.options)
        self.ef = (ErrorFeedback(self.compressor)
                   if m.error_feedback and self.compressor is not None else None)
        # Momentum correction (momentum=): each layout's velocity, carried like its residual.
        self.velocities: dict[layout.Layout, torch.Tensor] = {}
        # the dicts (residuals, velocities) whose layouts layout.carry last found disjoint
        self._disjoint: dict[str, bool] = {}
        self.call_name = _call_name(config, self.compressor)
        self.caller = _caller(config)
        self._comm: Comm | None = None
        self._worker: Worker | None = None
        self._pending: list[tuple[torch.Tensor, layout.Layout, torch.futures.Future]] = []
        # Bucket mode on a device: buckets whose futures wait for the step's last bucket, and
        # (on the comm thread) their aggregations not yet finished.
        self._held: list[tuple[torch.Tensor, torch.futures.Future]] = []
        self._unfinished: list[tuple[torch.Tensor, Started]] = []
        # ids of this backward's buckets averaged although the step failed (_finish_started):
        # their futures are completed with the buckets, which hold the averages
        self._averaged: set[int] = set()
        # The per-step header: the previous step's (elements, dtype) per aggregation (what the
        # step's header agrees on; it changes only once the step has ended), this step's so
        # far, and whether this step's header was exchanged yet.
        self._layouts: list[tuple[int, str]] | None = None
        self._observed: list[tuple[int, str]] = []
        self._step_open = False
        # Model mode: the element order of the last whole-model aggregation, and the order a
        # loaded state_dict asks of the next one; see _model.
        self._order: layout.Layout | None = None
        self._resume_order: layout.Layout | None = None
        self._handoff = 0.0
        self._used: set[layout.Layout] = set()
        # loaded compressor state is keyed by the saved run's rebuilt buckets, which a new DDP
        # makes only after its first step: that step's end forgets nothing
        self._loaded = False
        self._errors = Deferred()  # raised from backward itself, not as DDP's "Unable to cast"
        # Bucket mode: whether every bucket of this step so far was issued from the hook
        # (_issue), and those buckets, which _settle waits for.
        self._direct_step = False
        self._flights: list[Flight] = []
        # the parameters of the models registered on, held weakly: their ids alone were
        # taken again by a new model's once the old one was freed, which then ran on its
        # residuals; ``_registered``: whether any model was, so that one gone is still told
        self._models: weakref.WeakValueDictionary[int, torch.Tensor] = (
            weakref.WeakValueDictionary())
        self._registered = False
        # Error feedback: this backward's buckets, for _reclaim at its end
        self._slots: list[tuple[torch.Tensor, layout.Layout, list[torch.Tensor]]] = []
        # whether a registered DDP may leave an unused parameter's gradient as it was where
        # one is there already (zero_grad(set_to_none=False)) and is no view of the bucket;
        # None until register() has seen DDP's options: a hook registered with
        # register_comm_hook itself sees no DDP, so any gradient may be stale (_reclaim)
        self._stale_unused: bool | None = None
        self.reset_stats()

    # --- what a user calls ---------------------------------------------------------------
    def register(self, ddp_model: torch.nn.parallel.DistributedDataParallel) -> None:
        """``ddp_model.register_comm_hook(self, self.hook)``, once it is known to be a
        DistributedDataParallel whose gradients are dense and that has no hook yet, and that
        this state runs no other model's hook (a new DDP of the same model is fine). The
        hook averages over DDP's process group where ``make`` was given no ``group``."""
        if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
            raise GradwireError("hooks: register() needs a model wrapped in torch.nn.parallel."
                                "DistributedDataParallel, got "
                                f"{type(ddp_model).__name__}: pass DistributedDataParallel(model)")
        for name, module in ddp_model.module.named_modules():
            if isinstance(module, torch.nn.Embedding | torch.nn.EmbeddingBag) and module.sparse:
                where = f"module {name!r}" if name else "the model"
                raise GradwireError(f"hooks: {where} ({type(module).__name__}) makes sparse "
                                    f"gradients; {DENSE_ONLY}")
        if self.config.mode == "model":  # else refused at the first backward, in DDP's hook
            # the parameters DDP buckets (not those it was told to ignore); a complex
            # parameter's bucket is its real view
            bucketed = getattr(ddp_model, "_module_parameters", None)
            _one_dtype({(p.dtype.to_real() if p.is_complex() else p.dtype)
                        for p in (ddp_model.parameters() if bucketed is None else bucketed)
                        if p.requires_grad})
        if getattr(ddp_model, "_comm_hooks", None):
            raise GradwireError("hooks: this DistributedDataParallel has a communication hook "
                                "already (DDP takes one): register a state once per model")
        params = list(ddp_model.parameters())
        if self._registered and params and not any(self._models.get(id(p)) is p
                                                   for p in params):
            raise GradwireError(f"hooks: this state already runs the hook of another model"
                                f"{'' if self._models else ' (since freed)'}; its step count "
                                "(warm-up, dense_steps), residuals and buckets are one "
                                "model's: make one state per model with "
                                "gradwire.hooks.make(...)")
        before = self.config
        self._adopt_group(getattr(ddp_model, "process_group", None))
        try:
            ddp_model.register_comm_hook(self, self.hook)
        except BaseException as e:
            self.config = before  # refused: the state runs no hook of that DDP's group
            if not isinstance(e, RuntimeError):
                raise
            # c10d's "... can only be called once." (a builtin hook registered already)
            why = (str(e).splitlines() or [type(e).__name__])[0]
            raise GradwireError(f"hooks: DDP refused the hook: {why}") from None
        self._models.update((id(p), p) for p in params)
        self._registered = self._registered or bool(params)
        self._stale_unused = bool(self._stale_unused) | (
            bool(getattr(ddp_model, "find_unused_parameters", False)
                 or getattr(ddp_model, "static_graph", False))
            and not getattr(ddp_model, "gradient_as_bucket_view", False))

    def _adopt_group(self, ddp_group: dist.ProcessGroup | None) -> None:
        """Average over the group DDP replicates the model on: DDP's own when ``make`` was
        given none (as DDP averages without a hook), and a ``group=`` over other ranks than
        DDP's is refused (its average would mix the wrong replicas)."""
        if ddp_group is None or not dist.is_initialized():
            return
        mine = self.config.group
        ranks = dist.get_process_group_ranks
        have = ranks(mine if mine is not None else dist.group.WORLD)
        if ranks(ddp_group) == have:
            return
        if mine is not None or self._comm is not None:
            raise GradwireError(f"hooks: the state averages over ranks {have}, the model's "
                                f"DistributedDataParallel over {ranks(ddp_group)}: pass "
                                "make(..., group=) the group DDP was given, or none")
        self.config = replace(self.config, group=ddp_group)

    def set_epoch(self, epoch: int) -> None:
        """Move the warm-up to ``epoch`` from the next iteration on (the hook counts epochs
        itself from ``steps_per_epoch``: calling this is never needed)."""
        self._epoch_at = (check_int("hooks", "epoch", epoch, 0), self.step)

    @property
    def epoch(self) -> int:
        """The warm-up epoch of the next iteration."""
        epoch, since = self._epoch_at
        per = self.config.steps_per_epoch
        return epoch + (self.step - since) // per if per else epoch

    @property
    def density(self) -> float:
        """The density the next iteration uses (1.0 while dense, or for non-sparse methods)."""
        c = self.config
        if c.warmup.dense(self.step) or not c.method.takes_density:
            return 1.0
        return c.warmup.density(self.epoch, c.density)

    def reset_stats(self) -> None:
        """Zero ``stats``: seconds ``compress`` (compress, decompress, error feedback, average)
        and ``communicate`` (in collectives; for buckets issued from the hook, from the issue to
        the collective's completion), and ``header``, the part of ``communicate`` spent in the
        call-header exchanges (agree.py); ``tail``, seconds from
        handing over an iteration's last bucket to its result (with overlap, the part of
        compress + communicate backward did not hide); ``sent``, payload bytes this rank
        contributed; counts of ``steps``, ``buckets`` and ``dense`` aggregations, and of
        those ``issued`` from the hook itself, with no comm thread (:meth:`_issue`); ``cpu``, CPU
        seconds of the thread that aggregates (the hook's own with overlap, else the training
        thread; the training thread's for buckets issued from the hook): coding, the calls'
        own work, not gloo's threads."""
        self.stats: dict[str, float] = dict.fromkeys(STATS, 0)

    def state_dict(self) -> dict[str, Any]:
        """Warm-up position, residuals and (with ``momentum=``) velocities per parameter
        position, compressor state (step counters, PowerSGD's Q memory). Call it between
        iterations."""
        numels = self.positions.numels
        residuals = layout.split(self.ef.residuals, numels) if self.ef else {}
        return {"method": self.config.method.name, "epoch": self.epoch, "step": self.step,
                # where the count of epochs stands: an epoch resumed half way ends on time
                "epoch_at": list(self._epoch_at), "residuals": residuals,
                "velocities": layout.split(self.velocities, numels),
                "order": self._resume_order or self._order,
                "compressor": self.compressor.state_dict() if self.compressor else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved. All or nothing: a state that is refused
        (another method, a residual of the wrong size, a missing or malformed field) leaves
        this hook's counters, residuals and compressor memory as they were."""
        self._disjoint = {}  # whether loaded or restored, the dicts are new
        saved = (self._epoch_at, self.step, self._resume_order, self.positions.counts(),
                 dict(self.ef.residuals) if self.ef is not None else None,
                 self.compressor.state_dict() if self.compressor is not None else None,
                 dict(self.velocities))
        try:
            self._load_state_dict(state)
        except Exception as e:  # an OverflowError too: int(inf) of a corrupt order or step
            self._epoch_at, self.step, self._resume_order = saved[:3]
            self.positions.restore(saved[3])
            if self.ef is not None:
                self.ef.residuals = saved[4]  # type: ignore[assignment]
            if self.compressor is not None:
                self.compressor.load_state_dict(saved[5])  # type: ignore[arg-type]
            self.velocities = saved[6]  # type: ignore[assignment]
            if not isinstance(e, (*MALFORMED, OverflowError)):
                raise
            raise GradwireError(f"hook state_dict is malformed ({type(e).__name__}: {e}): "
                                "expected what state_dict() returned") from None

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        name = self.config.method.name
        if state.get("method") != name:
            raise GradwireError(f"hook state_dict is for method {state.get('method')!r}, this "
                                f"hook runs {name!r}")
        step = state["step"]
        since = state.get("epoch_at")  # absent from a state saved before it was kept
        epoch, began = (state["epoch"], step) if since is None else tuple(since)
        if not all(is_int(v) for v in (step, epoch, began)):  # 2.7 or True is no count
            raise TypeError(f"step, epoch and epoch_at hold integers, got {step!r}, {epoch!r}, "
                            f"{began!r}")
        if not (step >= 0 and epoch >= 0 and 0 <= began <= step):
            raise GradwireError(f"hook state_dict: step {step}, epoch {epoch} from step {began}: "
                                "expected counts >= 0, the epoch begun at or before the step")
        self.step, self._epoch_at = step, (epoch, began)
        self.positions.take_parameters_counts()  # this state's residuals replace the last's
        order = state.get("order")
        if order is not None and not isinstance(order, list | tuple):  # a tensor: no bool()
            got = "a tensor" if isinstance(order, torch.Tensor) else repr(order)  # one line
            raise TypeError(f"order is a list of parameter positions, got {got}")
        if order:
            bad = next((p for p in order if not is_int(p, 0)), None)
            if bad is not None or len(set(order)) != len(order):
                what = f"holds {bad!r}" if bad is not None else "names a position twice"
                raise GradwireError(f"hook state_dict: order {what}: expected each parameter "
                                    "position (an integer >= 0) once")
        self._resume_order = tuple(int(p) for p in order) if order else None
        if self.ef is not None:
            self.ef.residuals = self._per_position(state["residuals"], "residual")
        # a state saved without momentum correction starts its velocities at zero
        self.velocities = (self._per_position(state.get("velocities", {}), "velocity")
                           if self.config.momentum else {})
        if self.compressor is not None:
            self.compressor.load_state_dict(state["compressor"])
        self._loaded = True

    def _per_position(self, saved: dict[Any, torch.Tensor], what: str
                      ) -> dict[layout.Layout, torch.Tensor]:
        """A state_dict's tensors per parameter position, as one-parameter layouts, checked
        against (and recording) each position's element count."""
        out = {}
        for pos, t in saved.items():
            if not is_int(pos, 0):
                raise GradwireError(f"hook state_dict: {what} of parameter {pos!r}: a "
                                    "parameter position is an integer >= 0")
            if self._resume_order is not None and pos not in self._resume_order:
                raise GradwireError(f"hook state_dict: {what} of parameter {pos}, a position "
                                    "its order does not name")
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise GradwireError(f"hook state_dict: {what} of parameter {pos} must be a "
                                    f"float tensor, got {got}")
            known = self.positions.numels.setdefault(int(pos), t.numel())
            if known != t.numel():
                raise GradwireError(f"hook state_dict: {what} of parameter {pos} has "
                                    f"{t.numel()} elements, the model's has {known}")
            out[(int(pos),)] = t.detach().reshape(-1).clone()  # flat, whatever shape it came in
        return out

    # --- the hook ------------------------------------------------------------------------
    def on_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """What :func:`hook` does with one bucket (see the class docstring). Inside a backward
        an error raised here is kept for ``backward()`` to raise once DDP has finished it
        (:meth:`_refuse`): raised from a hook, an error leaves DDP mid-reduction, and every
        later backward fails."""
        buf, index, last = bucket.buffer(), bucket.index(), bucket.is_last()
        if index == 0:  # a backward starts
            self._begin()
        fut: torch.futures.Future = torch.futures.Future()
        try:
            return self._take(bucket, buf, index, last, fut)
        except BaseException as e:  # a KeyboardInterrupt too: DDP must finish the backward
            if not self._errors.armed:
                raise
            return self._refuse(e, buf, last, fut)

    def _begin(self) -> None:
        """A backward starts: forget what one that did not finish left."""
        self._pending = []  # model mode: left over from a backward that did not finish
        self._held = []
        if self._step_open or self._errors.failed:  # agree on the buckets afresh
            self._layouts = None
        self._step_open = False  # the comm thread is done with every earlier step
        self._flights = []
        self._slots = []
        self._averaged = set()
        if self.ef is not None:  # before the deferred error is raised, which ends the backward
            after_backward(self._reclaim)
        self._errors.begin()
        self._direct_step = self._errors.armed and not self._density_moves

    def _refuse(self, error: BaseException, buf: torch.Tensor, last: bool,
                fut: torch.futures.Future) -> torch.futures.Future:
        """``fut``, completed with the bucket as it is, where the hook itself failed on it;
        ``error`` is raised by ``backward()`` once DDP has finished it. Handed to the comm
        thread in bucket order, so the buckets handed over before it are aggregated as ever
        and those after it are not (no rank then issues a collective another skips); at the
        step's last bucket, with every bucket still waiting for it."""
        self._direct_step = False  # the step's later buckets go to the guard, which skips them
        futures, buffers = [fut], [buf]
        if last:
            waiting = [(b, f) for b, _, f in self._pending] + self._held
            self._pending, self._held = [], []
            futures += [f for _, f in waiting if f is not fut]
            buffers += [b for b, f in waiting if f is not fut]

        def refused() -> list[torch.Tensor]:
            try:  # in bucket order: those started before it are averaged (_finish_started)
                self._finish_started()
            finally:
                self._errors.keep(error, buffers)
            return buffers

        self._dispatch(refused, futures, buffers, last)
        return fut

    def _take(self, bucket: dist.GradBucket, buf: torch.Tensor, index: int, last: bool,
              fut: torch.futures.Future) -> torch.futures.Future:
        comm = self._setup()
        if buf.layout != torch.strided:
            raise GradwireError(f"hooks: bucket {bucket.index()} holds sparse gradients; "
                                f"{DENSE_ONLY}")
        key = self.positions.layout(bucket.parameters())
        if self.positions.size(key) != buf.numel():
            raise GradwireError(f"bucket {bucket.index()} has {buf.numel()} elements, its "
                                f"parameters {self.positions.size(key)}: gradwire hooks need "
                                "dense gradients")
        call = AggregationCall(self.config.method, comm, self.compressor, self.ef, self.density,
                               dense=self.config.warmup.dense(self.step), name=self.call_name,
                               shapes=self.positions.shapes_of(key), caller=self.caller)
        if self.ef is not None:
            self._slots.append((buf, key, list(bucket.parameters())))
        if self.config.mode == "bucket":
            direct = self._issue(buf, key, call, index, last, fut)
            if direct is not None:
                return direct
            if on_host(buf):
                self._dispatch(lambda: [self._bucket(buf, key, call, index, last)], [fut],
                               [buf], last)
                return fut
            # On a device every future waits for the last bucket (the class docstring).
            self._held.append((buf, fut))
            held: list[torch.Tensor] = []  # the buffers the last bucket's task completes
            futures: list[torch.futures.Future] = []
            if last:
                held, futures = [b for b, _ in self._held], [f for _, f in self._held]
                self._held = []

            def task() -> list[torch.Tensor]:
                self._bucket(buf, key, call, index, last)
                return held

            self._dispatch(task, futures, held, last)
            return fut
        if index == 0 and last and self._resume_order is None and key == self._order:
            # one bucket in the order of the last whole-model aggregation: the bucket mode's
            # aggregation of it, so dense, fp16, bf16 and int8 are issued from the hook here too
            direct = self._issue(buf, key, call, index, last, fut)
            if direct is not None:
                return direct
        self._pending.append((buf, key, fut))
        if last:
            pending, self._pending = self._pending, []
            self._dispatch(lambda: self._model(pending, call), [f for *_, f in pending],
                           [b for b, *_ in pending], last)
        return fut

    def _reclaim(self) -> None:
        """At the end of a backward, once DDP has written the averages into the gradients:
        DDP leaves the gradient of a parameter that no rank used in this backward
        (``find_unused_parameters=True``, ``static_graph=True``) as it was, None, so what the
        average credited it goes back into the residual (each rank adds the average: summed
        over ranks, the P times the average the residuals gave up); no mass is lost. A
        gradient already there (``zero_grad(set_to_none=False)``) that is no view of the
        bucket is left as it was too: where it does not hold the average, the average goes
        back (element-wise, no host read; DDP copied it into every used one): one pass over
        the step's gradients, only for a DDP with ``find_unused_parameters`` or
        ``static_graph`` and without ``gradient_as_bucket_view``, which needs none (a hook
        registered with ``register_comm_hook`` itself sees none of DDP's options: every
        gradient that is no view of its bucket is compared). In a
        step that failed too (it runs before the error is raised), for the buckets that were
        averaged: a bucket completed as it was holds no average."""
        slots, self._slots = self._slots, []
        # registered with register_comm_hook itself (DDP's options unknown): any gradient that
        # is no view of its bucket may be one DDP left as it was
        unknown = self._stale_unused is None
        if self.ef is None or not (self._stale_unused or unknown
                                   or any(p.grad is None for _, _, ps in slots for p in ps)):
            return
        numels, residuals = self.positions.numels, self.ef.residuals
        found = layout.where(residuals, numels)
        unaveraged = {id(b) for b in self._errors.unaveraged} - self._averaged
        for buf, key, params in slots:
            if id(buf) in unaveraged:
                continue
            offset = 0
            for pos, p in zip(key, params, strict=True):
                n = numels[pos]
                stale = self._stale_unused or (unknown and not _views(p.grad, buf))
                if pos in found and (p.grad is None or stale):
                    held, at = found[pos]
                    avg, kept = buf[offset : offset + n], residuals[held][at : at + n]
                    if p.grad is not None:  # only where DDP did not copy the average in
                        g = torch.view_as_real(p.grad) if p.grad.is_complex() else p.grad
                        if p.is_contiguous():
                            g = g.reshape(-1)
                        else:  # element by element as DDP copied them: the bucket holds a
                            # dense parameter in its memory order (channels_last, transposed)
                            strides = layout.bucket_strides(
                                torch.view_as_real(p.detach()) if p.is_complex() else p)
                            avg = avg.as_strided(g.shape, strides)
                            kept = kept.as_strided(g.shape, strides)
                        avg = avg.where(g.ne(avg) & ~(g.isnan() & avg.isnan()), 0)
                    kept.add_(avg)
                offset += n

    def _setup(self) -> Comm:
        if self._comm is None:
            if not dist.is_initialized():
                raise GradwireError("torch.distributed is not initialized: call "
                                    "dist.init_process_group() before the first backward")
            c = self.config
            self._comm = Comm(c.group, c.algo, transport=c.method.path.on_transport)
            if c.method.per_rank_seed and self.compressor is not None:
                self.compressor.seed = c.seed * 2**20 + self._comm.rank
            if c.overlap:
                self._worker = Worker()
        return self._comm

    def _dispatch(self, task: Callable[[], list[torch.Tensor]],
                  futures: list[torch.futures.Future], buffers: list[torch.Tensor],
                  last: bool) -> None:
        """Run ``task`` (or hand it to the comm thread); ``buffers`` complete the futures, as
        they are, if it fails (:class:`~gradwire.hooks.comm.Deferred`)."""
        self._handed_over(last)
        guarded = self._errors.guard(task, buffers)

        def timed() -> list[torch.Tensor]:
            c0 = time.thread_time()
            try:
                return guarded()
            finally:
                self.stats["cpu"] += time.thread_time() - c0

        if self._worker is None:
            complete(timed, futures)
            return
        self._worker.submit(timed, futures)
        if last:
            # DDP issues collectives of its own on the group once the last bucket's hook has
            # returned (with find_unused_parameters=True, an allreduce of which parameters
            # were used); issued while the comm thread still issues the step's, they would
            # reach the ranks in different orders (gloo: "Received data size doesn't match",
            # or a hang). DDP waits for every bucket's future next, so this costs nothing.
            try:
                self._worker.drain()
            except BaseException as e:  # a KeyboardInterrupt: the futures are the task's now
                if not self._errors.armed:
                    raise
                self._errors.keep(e, [])

    # --- issued from the hook -----------------------------------------------------------
    def _issue(self, buf: torch.Tensor, key: layout.Layout, call: AggregationCall,
               index: int, last: bool, fut: torch.futures.Future) -> torch.futures.Future | None:
        """The bucket's future, its allreduces issued here, on the training thread, as
        PyTorch's own hooks issue theirs: no hand-over to the comm thread and back, which cost
        3–11 % of an iteration on the digits MLP and ResNet-20 at 4 × 1 Gbit/s
        (benchmarks/results/ddp_hooks/direct_*.json). None, and nothing done, unless every
        bucket of the step so far went this way, this one matches the agreed list (it needs
        no header) and its method is torch.distributed allreduces with nothing waited for
        before or between them (:func:`gradwire.catalogue.issuer`: dense, fp16, bf16, and
        int8 once the bucket has its step sizes).

        On the host the collectives' callbacks complete ``fut``, and :meth:`_settle` bounds the
        wait by GRADWIRE_TIMEOUT before DDP waits. On a device the future is the last
        collective's, chained as PyTorch's hooks chain theirs (NCCL's watchdog bounds it),
        unless the method's NaN/Inf status travels with its data (int8): then :meth:`_settle`
        reads every such bucket's status at once, the step's one read, and completes them.
        A status that needs the policy's dense fallback, another allreduce, has it issued from
        the comm thread, in bucket order, after the step's other collectives."""
        shape, trusted = self._agreed(buf, index)
        direct = self._direct_step and self._worker is not None and trusted
        path = issuer(call, buf, key) if direct else None
        if path is None:
            self._direct_step = False
            return None
        t0, c0 = time.perf_counter(), time.thread_time()
        if self.ef is not None:
            self._carry("residuals", self.ef.residuals, key, buf)
        if self.config.momentum:
            self._correct(buf, key)
        issued = path.issue(call, buf, key)
        if index == 0:  # the step's first: settled before DDP finishes the backward
            self._step_open, self._observed = True, []
            before_ddp_finishes(self._settle)
        self._counted(key, shape, issued.sent, call.dense)
        self.stats["issued"] += 1
        self._handed_over(last)
        chained = not on_host(buf) and issued.worst is None
        flight = Flight(buf, issued, None if chained else fut, t0)
        self._flights.append(flight)
        self.stats["compress"] += time.perf_counter() - t0
        self.stats["cpu"] += time.thread_time() - c0
        if chained:
            return issued.flying[-1].work.get_future().then(lambda _: flight.land())
        if on_host(buf):
            collective = torch.futures.collect_all([f.work.get_future() for f in issued.flying])
            collective.add_done_callback(flight.landed)
        return fut

    def _settle(self) -> None:
        """The step's buckets issued from the hook, before DDP waits for their futures: on the
        host each is waited for within GRADWIRE_TIMEOUT; on a device those with a status are
        read at once and completed; so too where a later bucket of the step failed. A failure
        here completes the rest with their buckets as they are and is raised by
        ``backward()`` once DDP is done (:class:`~gradwire.hooks.comm.Deferred`). Buckets
        whose status needs the policy's dense fallback go to the comm thread, and are waited
        for. Then the step ends, unless the comm thread ends it (a later bucket of the step
        went there) or it failed."""
        flights, self._flights = self._flights, []
        comm, errors = self._comm, self._errors
        assert comm is not None
        held = [f for f in flights if f.fut is not None]
        try:
            # Waited for and finished even where a later bucket of the step failed: these were
            # issued before it, and each residual already keeps what its bucket sent
            for f in held:
                comm.wait(f.issued.flying)
                f.wait_landed()
            unread = [f for f in held if not on_host(f.buf)]
            if unread:
                # The step's one host read: every bucket's worst status at once.
                worsts = torch.stack([f.issued.worst() for f in unread]).tolist()  # type: ignore[misc]
                for f, worst in zip(unread, worsts, strict=True):
                    f.finish(worst)
        except BaseException as e:  # c10d's RuntimeError, a KeyboardInterrupt: DDP must finish
            errors.keep(e, [])
        fallbacks = []
        for f in held:
            if f.error is not None:
                errors.keep(f.error, [f.buf])
            if f.fallback and errors.error is None:
                fallbacks.append(f)
            elif f.complete(f.buf):  # nothing if it is complete already
                errors.unaveraged.append(f.buf)
        for f in flights:
            self.stats["compress"] += f.finishing
            self.stats["communicate"] += max(f.landed_at - f.issued_at, 0.0)
        for f in fallbacks:  # every rank has the same, in bucket order
            self._dispatch(f.fall_back, [f.fut], [f.buf], last=False)  # type: ignore[list-item]
        if fallbacks and self._direct_step:
            # the step ends once they are in (a fallback that fails fails the step, which is
            # then not counted); DDP waits for their futures next, so this costs nothing
            assert self._worker is not None
            try:
                self._worker.drain()
            except BaseException as e:  # a KeyboardInterrupt: the futures are the tasks' now
                errors.keep(e, [])
        if self._direct_step and errors.error is None:
            self._end_step()

    # --- on the comm thread --------------------------------------------------------------
    def _start(self, x: torch.Tensor, key: layout.Layout, call: AggregationCall,
               index: int) -> Started:
        """Compress and communicate one aggregation (the step's header first, at its first)."""
        comm, s = call.comm, self.stats
        before, header, t0 = comm.seconds, comm.header_seconds, time.perf_counter()
        if not self._step_open:
            self._step_open, self._observed = True, []
            # else every aggregation has a header of its own
            if self._layouts is not None and self._density_moves:
                comm.agree(self._step_call(call))
        shape, trusted = self._agreed(x, index)
        if self.ef is not None:
            self._carry("residuals", self.ef.residuals, key, x)
        moved = None
        if self.config.momentum:
            # the velocity moves only once the ranks agree on the call, as the residual does
            in_band = call.method.path.in_band(call.method)
            if in_band and not trusted:  # a header without a status: exchanged first
                comm.agree(call_header(call, x.numel(), x.dtype))
                trusted = True
            moved = self._correct(x, key, commit=in_band)  # else: the header comes in start
        started = start(call, x, key, check=not trusted)
        if moved is not None:
            self.velocities[key] = moved.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        spent = comm.seconds - before
        s["compress"] += time.perf_counter() - t0 - spent
        s["communicate"] += spent
        s["header"] += comm.header_seconds - header
        self._counted(key, shape, started.sent, call.dense)
        return started

    def _carry(self, name: str, held: dict[layout.Layout, torch.Tensor], key: layout.Layout,
               like: torch.Tensor) -> None:
        """:func:`layout.carry` for bucket ``key``, told whether ``held`` (``name``) was
        disjoint when last seen."""
        was = self._disjoint.pop(name, False)  # not known, should carry raise part way
        self._disjoint[name] = layout.carry(held, key, self.positions.numels, like,
                                            disjoint=was)

    def _correct(self, x: torch.Tensor, key: layout.Layout,
                 commit: bool = True) -> torch.Tensor | None:
        """Momentum correction (Lin et al. 2018, DGC §3.2), in place: u = m·u + x, then x = u,
        so what is compressed, with its residual, is this rank's velocity rather than its
        gradient, and the optimizer steps without momentum. A NaN or Inf is sent as it is (the
        NaN/Inf policy sees it) and its element's velocity restarts at zero. Four passes over
        the bucket, no host read. ``commit`` False: u is left as it was and the new velocity
        returned, for the caller to keep once the call is agreed (a new tensor)."""
        self._carry("velocities", self.velocities, key, x)
        u = self.velocities.get(key)
        if not commit:
            v = torch.zeros_like(x) if u is None else u * self.config.momentum
            x.copy_(v.add_(x))
            return v
        if u is None:
            u = self.velocities[key] = torch.zeros_like(x)
        u.mul_(self.config.momentum).add_(x)
        x.copy_(u)
        u.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        return None

    def _agreed(self, x: torch.Tensor, index: int) -> tuple[tuple[int, str], bool]:
        """(x's elements and dtype, whether the step before agreed on them at ``index``: then
        its aggregation needs no header of its own)."""
        agreed, shape = self._layouts, (x.numel(), str(x.dtype).removeprefix("torch."))
        return shape, agreed is not None and index < len(agreed) and agreed[index] == shape

    def _counted(self, key: layout.Layout, shape: tuple[int, str], sent: int,
                 dense: bool) -> None:
        """One aggregation of this step made: its shape (the next step's agreed list), its
        layout (its PowerSGD memory kept), its bytes and counts in ``stats``."""
        self._observed.append(shape)
        self._used.add(key)
        s = self.stats
        s["sent"] += sent
        s["buckets"] += 1
        s["dense"] += dense

    def _handed_over(self, last: bool) -> None:
        """At the step's last bucket: the time its result waits from. The step is counted
        once it has ended (:meth:`_end_step`): a step that failed is not counted, so the
        warm-up and ``dense_steps`` count the iterations aggregated."""
        if last:
            self._handoff = time.perf_counter()

    @property
    def _density_moves(self) -> bool:
        """Whether a step can send another density than the step before on some rank: a
        density warm-up, which ``set_epoch`` moves on the rank that calls it. Everything
        else in a call's header is fixed once the first step agreed on it (the dense warm-up
        counts steps, which every rank takes together)."""
        return bool(self.config.warmup.densities) and self.config.method.takes_density

    def _step_call(self, call: AggregationCall) -> list[tuple[str, object]]:
        """The per-step header: what every rank's aggregations of this step must share."""
        buckets = ",".join(f"{n}:{d}" for n, d in self._layouts or ())
        return [("call", "hook step"), ("method", call.name), ("mode", self.config.mode),
                ("dense", call.dense), ("density", float(call.density)),
                ("buckets", buckets)]

    def _finish(self, x: torch.Tensor, started: Started, worst: int) -> None:
        """The average of one aggregation for the ranks' ``worst`` status, written into ``x``."""
        t0, before = time.perf_counter(), self._comm_seconds()
        avg = started.finish(worst)
        if avg is not x:  # the dense and sparse paths average in the bucket itself
            x.copy_(avg)
        spent = self._comm_seconds() - before
        self.stats["compress"] += time.perf_counter() - t0 - spent
        self.stats["communicate"] += spent

    def _comm_seconds(self) -> float:
        return self._comm.seconds if self._comm is not None else 0.0

    def _end_step(self) -> None:
        self.step += 1
        self.stats["steps"] += 1
        self.stats["tail"] += time.perf_counter() - self._handoff
        if self.compressor is not None and not self._loaded:  # what rebuilt buckets kept
            self.compressor.forget(self._used)  # (PowerSGD's Q, int8's step sizes, scratch)
        self._used, self._loaded = set(), False
        self._layouts, self._step_open = self._observed, False

    def _bucket(self, buf: torch.Tensor, key: layout.Layout, call: AggregationCall,
                index: int, last: bool) -> torch.Tensor:
        if index == 0:
            self._unfinished = []  # left by a step that failed
        try:
            started = self._start(buf, key, call, index)
        except BaseException:
            with contextlib.suppress(Exception):  # the error raised is the bucket's own
                self._finish_started()
            raise
        if started.worst is None or on_host(buf):
            self._finish(buf, started, started.read())
        else:
            self._unfinished.append((buf, started))
        if last:
            self._finish_started()  # the step's one host read
            self._end_step()
        return buf

    def _finish_started(self) -> None:
        """Every aggregation started and not finished yet (bucket mode on a device) finished:
        every bucket's worst status read at once, then each average written. At the step's
        last bucket, and where the step fails before it: the aggregations started before the
        failure have their messages in and their residuals keep what they sent, so they are
        averaged, as on the host (where each is finished as soon as its data is in); left
        as they were, DDP would write their gradients back as well (mass made)."""
        unfinished, self._unfinished = self._unfinished, []
        if not unfinished:
            return
        worsts = torch.stack([st.worst for _, st in unfinished]).tolist()  # type: ignore[misc]
        for (x, st), worst in zip(unfinished, worsts, strict=True):
            self._finish(x, st, worst)
            self._averaged.add(id(x))

    def _model(self, pending: list[tuple[torch.Tensor, layout.Layout, torch.futures.Future]],
               call: AggregationCall) -> list[torch.Tensor]:
        _one_dtype({buf.dtype for buf, _, _ in pending})
        views: dict[int, torch.Tensor] = {}
        for buf, key, _ in pending:
            offset = 0
            for pos in key:
                n = self.positions.numels[pos]
                views[pos] = buf[offset : offset + n]
                offset += n
        order, self._resume_order = self._resume_order, None
        if order is None:
            order = pending[0][1] if len(pending) == 1 else tuple(sorted(views))
        elif sorted(order) != sorted(views):
            raise GradwireError("hook state_dict's model order names parameter positions "
                                f"{sorted(order)}, this model's are {sorted(views)}")
        if len(pending) == 1 and pending[0][1] == order:
            x = pending[0][0]  # aggregated where it lies: no copy in, none back
        else:
            x = torch.cat([views[p] for p in order])
        self._order = order
        call = replace(call, shapes=self.positions.shapes_of(order))
        started = self._start(x, order, call, 0)
        self._finish(x, started, started.read())  # the step's one read
        avg = x
        if avg is not pending[0][0]:
            offset = 0
            for p in order:
                views[p].copy_(avg[offset : offset + views[p].numel()])
                offset += views[p].numel()
        self._end_step()
        return [buf for buf, _, _ in pending]


def _views(grad: torch.Tensor | None, buf: torch.Tensor) -> bool:
    """Whether ``grad`` lies in ``buf``'s memory (DDP's ``gradient_as_bucket_view=True``): the
    average written into the bucket is then the gradient, used or not."""
    return grad is not None and grad.untyped_storage().data_ptr() == (
        buf.untyped_storage().data_ptr())


def _caller(config: HookConfig) -> str:
    """The call header's first field: "hook", with the hook's options that must be equal on
    all ranks and that no later step checks again (the mode where not "bucket", the dense
    steps where any)."""
    shown = [f"mode={config.mode}"] if config.mode != "bucket" else []
    if config.warmup.dense_steps:
        shown.append(f"dense_steps={config.warmup.dense_steps}")
    return " ".join(["hook", *shown])


def _call_name(config: HookConfig, compressor: Compressor | None) -> str:
    """The method as the call header shows it: its name, the selector, and every option that
    must be equal on all ranks (``qsgd s=100``, ``powersgd rank=2 seed=0``), so that ranks
    made with different options fail naming them instead of averaging different things or
    sending messages of different lengths."""
    m = config.method
    params = inspect.signature(COMPRESSORS[m.compressor]).parameters if m.compressor else {}
    # every option at the value the compressor runs with, so that a rank that spells out a
    # default agrees with one that leaves it out
    shown = {k: config.options.get(k, params[k].default) for k in m.options
             if k != "selector" and k in params}
    if m.path.sums_payloads and "seed" in params:
        # the payloads are summed element by element, so the seed that draws random-k's
        # indices or PowerSGD's first Q must be the same everywhere (a top-k's sample of its
        # own gradient need not)
        shown["seed"] = config.seed
    if config.algo is not None:
        shown["algo"] = config.algo
    if config.momentum:
        shown["momentum"] = config.momentum
    selector = getattr(compressor, "selector", None)
    return m.name + (f"/{selector}" if selector else "") + "".join(
        f" {k}={v}" for k, v in sorted(shown.items()))


def make(method: str, *, density: float = 0.001, mode: str = "bucket",
         warmup: Sequence[float] | bool | None = None, steps_per_epoch: int | None = None,
         dense_steps: int = 0, group: dist.ProcessGroup | None = None, seed: int = 0,
         algo: str | None = None, overlap: bool = True, momentum: float = 0.0,
         **opts: object) -> HookState:
    """A hook state for ``method`` (one of :data:`METHODS`); see the package docstring.

    ``density``: the sparsifiers' fraction of elements (topk, gtopk, randomk, dgc), sent from
    the first step; the other methods select no elements and ignore it and ``warmup`` (their
    state's ``density`` is 1.0), so that one call can make any method. ``mode``: "bucket"
    (each bucket on its own, overlapping backward) or "model" (the whole model at once, after
    the last bucket). ``warmup``: None or False (the
    default) for none, True for the gTop-k paper's densities (0.25, 0.0725, 0.015, 0.004, then
    ``density``), or a list of densities, each lasting one epoch of ``steps_per_epoch`` steps
    (required with a warm-up; the hook counts them itself). ``dense_steps``: dense iterations
    before any compression. ``group``: the process group.
    ``seed``: shared randomness (randomk indices, PowerSGD's first Q; qsgd and terngrad add
    the rank). ``algo``: None for torch.distributed's collectives, or a gradwire allreduce
    algorithm (e.g. "ring"); for gtopk, "rd" (the butterfly, its default) or "tree" (the
    paper's binomial tree) also names the schedule of its entries. ``overlap``: False runs the
    aggregation inside the hook. ``momentum``: 0 (the default) for none, or m in (0, 1) for
    DGC's momentum correction with the methods that keep a residual: the hook accumulates each
    rank's velocity u = m·u + g and compresses u with error feedback; step the optimizer
    *without* momentum then (at density 1 this is exactly momentum SGD).
    ``opts``: the compressor's own parameters (topk/gtopk: selector; dgc: sample, passes,
    slack; qsgd: s; powersgd: rank, warm_start).
    """
    m = get_method(method)
    if mode not in MODES:
        raise GradwireError(f"hooks: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(overlap, bool):
        raise GradwireError(f"hooks: overlap must be True or False, got {overlap!r}")
    if algo is not None:
        registry.get("allreduce", algo)
    check_group(group, "hooks")
    for k in opts:
        if k not in m.options:  # a misspelt keyword of make's own lands here too (densty=)
            keywords = [p for p in inspect.signature(make).parameters if p not in
                        ("method", "opts")]
            raise GradwireError(f"{method}: unknown option {k!r}"
                                f"{did_you_mean(k, [*m.options, *keywords])}: {method}'s own: "
                                f"{', '.join(m.options) or 'none'}; make's: "
                                f"{', '.join(keywords)}")
    if not (is_real(momentum, 0, 1) and momentum < 1):
        raise GradwireError(f"hooks: momentum must be a number in [0, 1), got {momentum!r}")
    if momentum and not m.error_feedback:
        kept = ", ".join(n for n in METHODS if get_method(n).error_feedback)
        raise GradwireError(f"hooks: momentum= is momentum correction for the methods that keep "
                            f"a residual ({kept}); {method} keeps none: give the optimizer the "
                            f"momentum instead")
    config = HookConfig(m, check_fraction("hooks: density", density), mode,
                        parse(warmup, dense_steps, steps_per_epoch), steps_per_epoch, group,
                        check_int("hooks", "seed", seed, 0), algo, overlap, dict(opts),
                        float(momentum))
    return HookState(config)
