"""Where a hook's collectives run: a timed wrapper over one process group, and the single FIFO
thread that lets communication overlap the rest of backward.

Every collective of a hook state is issued in the order DDP handed the buckets over (bucket 0,
1, …, which is the same on every rank), from one thread at a time: the training thread for the
buckets a hook issues itself (dense, fp16, bf16 and int8 in steady state), then this thread for
the rest of the step (and for an int8 bucket's NaN/Inf fallback, after them); so ranks never
disagree on which collective comes next. Otherwise it goes as with PyTorch's PowerSGD hook,
whose two allreduces per bucket start from future callbacks: it aborted on gloo with several
buckets ("collective mismatch"; PyTorch's ``powerSGD_hook`` with 25 MB buckets on a 14.7
M-parameter MLP).
"""

from __future__ import annotations

import dataclasses
import datetime
import queue
import threading
import time
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist

import gradwire.collectives as gc
from gradwire import config
from gradwire.collectives.agree import Call, agree_status
from gradwire.compress import Payload
from gradwire.errors import GradwireError
from gradwire.transport import ALL_GATHER, Transport

Task = Callable[[], list[torch.Tensor]]
Futures = list[torch.futures.Future]


def complete(task: Task, futures: Futures) -> None:
    """Run ``task`` and set ``futures[i]`` to its i-th result, or every future to its error
    (DDP re-raises it from backward)."""
    try:
        results = task()
    except Exception as e:  # handed to the futures, which DDP waits on
        for f in futures:
            f.set_exception(e)
        return
    for f, r in zip(futures, results, strict=True):
        f.set_result(r)


def after_backward(fn: Callable[[], None]) -> bool:
    """Run ``fn`` at the end of the backward now running, after DDP has waited for every
    bucket's future and written the results into the gradients; False outside a backward.

    DDP queues its own end-of-backward callback once the last bucket is ready, after that
    bucket's hook ran, so a callback queued from a hook runs before DDP's; one queued from
    that callback runs after it (the engine runs callbacks queued while it runs them).
    """
    engine = torch.autograd.Variable._execution_engine
    try:
        engine.queue_callback(lambda: engine.queue_callback(fn))
    except RuntimeError:  # "Final callbacks can only be installed during backward pass"
        return False
    return True


def before_ddp_finishes(fn: Callable[[], None]) -> None:
    """Run ``fn`` at the end of the backward now running, before DDP waits for the buckets'
    futures (:func:`after_backward` says why it comes first); called from a hook."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


class Deferred:
    """The first error of one backward's aggregations, raised from ``backward()`` unchanged.

    DDP reads a hook's future as a Tensor: one completed with ``set_exception`` reaches the
    user as ``RuntimeError: Unable to cast <message> to Tensor`` (torch 2.13), its type lost;
    an error raised by the hook itself leaves DDP mid-reduction, and every later backward
    fails with PyTorch's ``INTERNAL ASSERT ... unmarked_param_indices``. So inside a backward
    a failing task completes its futures with the buckets as they are and keeps its error
    (:meth:`keep`), which is raised once DDP has finished the backward: the user catches the
    GradwireError itself (a MismatchError, a PeerError), the gradients of that backward are
    not averaged, and the next backward runs. Outside a backward (a hook called directly)
    the error goes to the futures, as :func:`complete` does.

    ``unaveraged``: the buckets of this backward completed as they were (not averaged), whose
    values must not be taken for averages (the hook's end-of-backward bookkeeping).

    Example::

        errors = Deferred()
        errors.begin()                                  # at each backward's first bucket
        worker.submit(errors.guard(task, [buf]), [fut])
    """

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.armed = False
        self.failed = False  # whether the backward begun last failed (its error kept)
        self.unaveraged: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def begin(self) -> None:
        """A backward starts: forget what an unfinished one left, raise at its end."""
        self.error, self.failed, self.unaveraged = None, False, []
        self.armed = after_backward(self._raise)

    def keep(self, error: BaseException, buffers: list[torch.Tensor]) -> None:
        """``error`` kept for the end of the backward (the backward's first one is raised;
        from any thread), and ``buffers`` completed as they are."""
        with self._lock:
            if self.error is None:
                self.error = error
            self.failed = True
            self.unaveraged.extend(buffers)

    def guard(self, task: Task, fallback: list[torch.Tensor]) -> Task:
        """``task``, returning ``fallback`` instead of raising while armed; once one task of
        this backward has failed, the later ones return ``fallback`` without running (each
        would otherwise wait out its own timeout on a lost peer).

        A KeyboardInterrupt is kept too: raised through the task's caller, it would leave the
        futures of the buckets the task completes (a model-mode step's, a step's last on a
        device) unset, and DDP would wait for them for ever."""
        def guarded() -> list[torch.Tensor]:
            if self.armed and self.error is not None:
                self.keep(self.error, fallback)
                return fallback  # after a failure, the backward's later buckets do not wait
            try:
                return task()
            except BaseException as e:
                if not self.armed:
                    raise
                self.keep(e, fallback)
                return fallback

        return guarded

    def _raise(self) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        try:
            complete(*job)
        except BaseException as e:  # the thread lives on: were it to end, every later task's
            _fail(job[1], e)  # futures, and so DDP and drain(), would wait for ever
        # not held while waiting for the next: a task holds its hook state (residuals, the
        # buckets), which would outlive its model, and the state holds this thread's Worker
        del job


def _fail(futures: Futures, error: BaseException) -> None:
    """Every future of ``futures`` not completed yet completed with ``error`` (one that is no
    Exception, which a future cannot hold, named in a GradwireError)."""
    if not isinstance(error, Exception):
        error = GradwireError(f"hooks: a task on the comm thread raised "
                              f"{type(error).__name__}: {error}")
    for f in futures:
        if not f.done():
            f.set_exception(error)


def _stop(jobs: queue.SimpleQueue, thread: threading.Thread) -> None:
    jobs.put(None)
    if thread is not threading.current_thread():  # collected there, by its last task: it ends
        thread.join(timeout=10)


class Worker:
    """One daemon thread running tasks first in, first out (what it costs and saves:
    docs/compression.md, "The comm thread")."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=_serve, args=(self._jobs,), daemon=True,
                                        name="gradwire-hook")
        self._thread.start()
        # Stopped and joined when the Worker is collected or at exit: a thread that used gloo
        # and is still alive when the process exits aborted it ("terminate called without an
        # active exception", about 1 run in 4 on loopback). The thread holds only the queue.
        weakref.finalize(self, _stop, self._jobs, self._thread)

    def submit(self, task: Task, futures: Futures) -> None:
        self._jobs.put((task, futures))

    def drain(self) -> None:
        """Wait until every task submitted so far has run."""
        done = threading.Event()

        def mark() -> list[torch.Tensor]:
            done.set()
            return []

        self._jobs.put((mark, []))
        done.wait()


@dataclasses.dataclass(frozen=True)
class InFlight:
    """A torch.distributed collective started and not waited for, and what it is (for the
    error that names it)."""

    work: dist.Work
    what: str


class Comm:
    """Sum-allreduce and allgather over ``group``, with the seconds spent in them.

    ``algo`` None: torch.distributed's own collectives (gloo's allreduce is a ring). A name:
    gradwire's allreduce schedule of that name and gradwire's default (ring) allgather, over a
    :class:`Transport` made here (so this must run on every rank at the same point).

    Call headers (:meth:`agree`) go over a transport of their own on the host: the group itself
    under gloo, a gloo group over the same ranks under NCCL, so that checking a call never
    waits for the GPU. None with the header exchange off (``GRADWIRE_CHECK_CALLS=0``).
    """

    def __init__(self, group: dist.ProcessGroup | None, algo: str | None,
                 transport: bool) -> None:
        self.group = group
        self.algo = algo
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        # Data calls follow a header that agreed on them: they exchange none of their own.
        self.agreed = (Transport(group, check_calls=False) if transport or algo is not None
                       else None)
        self.transport = (Transport(host_group(group), check_calls=True)
                          if config.check_calls() else None)
        self.seconds = 0.0
        self.header_seconds = 0.0  # the part of ``seconds`` spent in header exchanges
        self.headers = 0  # header exchanges made

    def _bounded(self, work: dist.Work, what: str) -> None:
        """Wait for a torch.distributed collective within GRADWIRE_TIMEOUT, not the process
        group's timeout (30 min by default for gloo); a failure names this rank and the call
        (c10d does not say which peer). A wait that returns False (the work did not complete
        in time) fails too, as :class:`~gradwire.transport.Pending` does."""
        timeout = self.transport.timeout if self.transport is not None else config.timeout()
        try:
            done = work.wait(datetime.timedelta(seconds=timeout))
            why = "not completed" if done is False else None
        except RuntimeError as e:
            why = (str(e).splitlines() or [type(e).__name__])[0][-200:]
        if why is not None:
            raise GradwireError(f"rank {self.rank}: torch.distributed {what} failed or timed "
                                f"out after {timeout:g} s (a rank died, stalled or skipped "
                                f"this call; GRADWIRE_TIMEOUT sets the limit): {why}") from None

    def agree(self, call: Call, status: int | Callable[[], int] = 0) -> int | None:
        """Fail on every rank, before any state changes, unless every rank makes ``call``;
        the worst ``status`` of any rank (None with the header exchange off)."""
        if self.transport is None:
            return None
        t0 = time.perf_counter()
        everywhere = agree_status(self.transport, call, status)
        self.headers += 1
        spent = time.perf_counter() - t0
        self.seconds += spent
        self.header_seconds += spent
        return everywhere

    def all_reduce(self, t: torch.Tensor) -> None:
        """``t`` becomes the sum over ranks, in place."""
        self.wait(self.all_reduce_start(t))

    def all_reduce_start(self, t: torch.Tensor) -> list[InFlight]:
        """Start summing ``t`` over ranks, in place; what is still in flight (nothing where
        ``algo`` runs gradwire's schedule, which returns when it is done), for :meth:`wait`."""
        t0 = time.perf_counter()
        if self.algo is None:
            flying = [InFlight(dist.all_reduce(t, group=self.group, async_op=True),
                               f"all_reduce of {t.numel()} elements")]
        else:
            gc.all_reduce(t, algo=self.algo, transport=self.agreed)
            flying = []
        self.seconds += time.perf_counter() - t0
        return flying

    def wait(self, flying: list[InFlight]) -> None:
        """Wait for every collective of ``flying``, each within GRADWIRE_TIMEOUT."""
        t0 = time.perf_counter()
        try:
            for f in flying:
                self._bounded(f.work, f.what)
        finally:
            self.seconds += time.perf_counter() - t0

    def all_gather(self, payload: Payload) -> list[Payload]:
        """Every rank's ``payload`` (same shapes on every rank), in rank order."""
        mine = pack(payload)
        n = mine.numel()
        t0 = time.perf_counter()
        if self.algo is None:
            out = torch.empty(self.world * n, dtype=torch.uint8, device=mine.device)
            self._bounded(ALL_GATHER(out, mine, group=self.group, async_op=True),
                          f"all_gather of {n} bytes")
        else:
            out = torch.empty(self.world * n, dtype=torch.uint8, device=mine.device)
            gc.all_gather_into_tensor(out, mine, transport=self.agreed)
        self.seconds += time.perf_counter() - t0
        return [unpack(payload, out[r * n : (r + 1) * n]) for r in range(self.world)]


# One gloo group per set of ranks, made once (every hook state of those ranks shares it): a new
# group per state would open a connection per pair each time. Weak references, as transport.py
# keeps its twin groups: c10d's registry owns them.
_HOST_GROUPS: dict[tuple[int, ...], tuple[weakref.ref, weakref.ref]] = {}  # ranks: (world, group)


def host_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """``group`` if its tensors live on the host (gloo), else a gloo group over the same ranks
    (made on each of them the first time: every rank must reach this at the same point)."""
    if dist.get_backend(group) == "gloo":
        return group
    world = dist.group.WORLD
    ranks = tuple(dist.get_process_group_ranks(group or world))
    known = _HOST_GROUPS.get(ranks)
    # the world it was made in must be this one (not one destroyed and made again)
    made = known[1]() if known is not None and known[0]() is world else None
    if made is None:
        made = dist.new_group(list(ranks), backend="gloo", use_local_synchronization=True)
        _HOST_GROUPS[ranks] = (weakref.ref(world), weakref.ref(made))
    return made


def pack(payload: Payload) -> torch.Tensor:
    """The bytes of the payload's wire tensors, in field order (uint8)."""
    parts = [t.reshape(-1).view(torch.uint8) for t in payload.tensors()]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def unpack(like: Payload, raw: torch.Tensor) -> Payload:
    """A payload shaped like ``like`` whose tensors are read from the bytes ``raw``."""
    values: dict[str, torch.Tensor] = {}
    offset = 0
    for f in dataclasses.fields(like):
        t = getattr(like, f.name)
        if isinstance(t, torch.Tensor):
            # clone(): a slice at an odd byte offset cannot be viewed as a wider dtype.
            chunk = raw[offset : offset + t.nbytes].clone()
            values[f.name] = chunk.view(t.dtype).reshape(t.shape)
            offset += t.nbytes
    return dataclasses.replace(like, **values)
