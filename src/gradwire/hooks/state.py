"""The hook state (what a user tunes, what the hook keeps, what it measured), the DDP hook, and
:func:`make`, which builds the state from what a user chose.

The state's per-bucket path lives in the modules it is assembled from: :mod:`.intake` (DDP's
buckets coming in), :mod:`.direct` (buckets issued from the hook), :mod:`.aggregate` (one
aggregation and the step it belongs to); its checkpoint in :mod:`.checkpoint`.

No ``from __future__ import annotations`` here: DDP's ``register_comm_hook`` compares the hook's
``bucket`` and return annotations with the real ``dist.GradBucket`` and ``Future[Tensor]``.
"""

import inspect
import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from gradwire.catalogue import MODES, Started
from gradwire.catalogue import get as get_method
from gradwire.check import check_fraction, check_int, is_real
from gradwire.compress import ErrorFeedback
from gradwire.errors import GradwireError, did_you_mean
from gradwire.hooks import checkpoint, layout
from gradwire.hooks.aggregate import Aggregation, one_dtype
from gradwire.hooks.comm import Comm, Deferred, Worker
from gradwire.hooks.config import METHODS, HookConfig, call_name, caller
from gradwire.hooks.direct import Direct
from gradwire.hooks.flight import Flight
from gradwire.hooks.intake import DENSE_ONLY, Intake
from gradwire.hooks.warmup import parse
from gradwire.schedules import registry
from gradwire.transport import check_group

STATS = ("compress", "communicate", "header", "tail", "sent", "steps", "buckets", "dense",
         "issued", "cpu")


def hook(state: "HookState", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``ddp.register_comm_hook(state, hook)``; the future's value is the
    bucket holding the average gradient (see :class:`HookState`)."""
    return state.on_bucket(bucket)


class HookState(Intake, Direct, Aggregation):
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
    compressor's options: :func:`~gradwire.hooks.config.call_name`), its size, dtype and
    density. Once a step has agreed on its buckets, a later bucket that matches the agreed
    list (same place, size and dtype) needs no header: nothing in it can differ between ranks
    that agreed before. With a density warm-up (``warmup=``), whose density ``set_epoch``
    moves on each rank, the ranks also exchange one header per step, before its first
    aggregation, naming the density and the previous step's buckets. Methods whose status
    cannot travel with their data (qsgd, signsgd, …:
    :meth:`~gradwire.catalogue.Path.in_band`) exchange a header per bucket, with the status. On
    a GPU the hot path never waits for the device, but once per step:
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
        self.call_name = call_name(config, self.compressor)
        self.caller = caller(config)
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
            one_dtype({(p.dtype.to_real() if p.is_complex() else p.dtype)
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
        return checkpoint.save(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved. All or nothing: a state that is refused
        (another method, a residual of the wrong size, a missing or malformed field) leaves
        this hook's counters, residuals and compressor memory as they were."""
        checkpoint.load(self, state)


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
