"""Public calls named and shaped like c10d's, with ``algo=`` choosing the schedule.

Example::

    import gradwire.collectives as gc
    gc.all_reduce(grad, op="avg", algo="ring")            # like dist.all_reduce
    gc.broadcast(params, src=0, algo="lp", block=65536)   # linear pipeline, 64 Ki-element blocks

Every call accepts ``transport=`` (a :class:`~gradwire.transport.Transport`) to read byte
counters afterwards, and ``async_op=True`` (the collective then runs on a helper thread and the
returned handle's ``wait()`` joins it). As in c10d, a group's calls run in the order they were
issued, async or not, roots (``src``, ``dst``) are global ranks, and a rank outside ``group``
does nothing. A call whose arguments one rank refuses (a dtype, a size, an op) fails on every
rank at once: the others raise :class:`~gradwire.collectives.agree.RefusedError` naming that
rank and why (:func:`refused_together`).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import threading
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from gradwire.check import is_int, is_real
from gradwire.collectives.agree import agree, refuse
from gradwire.collectives.executor import Combine, execute
from gradwire.collectives.pool import BufferPool
from gradwire.errors import GradwireError, PeerError
from gradwire.schedules import registry
from gradwire.transport import Transport, as_wire, is_default_group, resolve

# what a reduction combines in: the floats and the integers, which wrap on overflow as c10d's
# do (the int8 method of gradwire.catalogue rules that out by the levels it sends)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64)


def _max(into: torch.Tensor, received: torch.Tensor) -> None:
    torch.maximum(into, received, out=into)


def _min(into: torch.Tensor, received: torch.Tensor) -> None:
    torch.minimum(into, received, out=into)


def _product(into: torch.Tensor, received: torch.Tensor) -> None:
    into.mul_(received)


# A reduction's schedule combines what it receives with its "sum" op; the other ops replace
# that combine (each is associative and commutative, which is all a schedule's order assumes)
COMBINES: dict[str, dict[str, Combine]] = {"max": {"sum": _max}, "min": {"sum": _min},
                                           "product": {"sum": _product}}
OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MAX: "max",
       dist.ReduceOp.MIN: "min", dist.ReduceOp.PRODUCT: "product"}


class _Turns:
    """The order of one process group's calls: each takes a ticket when it is issued (on the
    caller's thread, so in program order) and runs when the calls before it are done. Every
    rank issues a group's calls in the same order, so every rank runs them in that order too,
    however their threads are scheduled: two calls in flight at once would otherwise post
    their messages on the same pairs of ranks in an order that differs between ranks. A call
    issued from inside one of the group's calls (on the thread running it) runs inside it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._issued = self._serving = 0
        self._owner: int | None = None
        self._dropped: set[int] = set()  # tickets whose caller stopped waiting (Ctrl-C)

    def take(self) -> int | None:
        if self._owner == threading.get_ident():
            return None
        with self._cond:
            self._issued += 1
            return self._issued - 1

    @contextlib.contextmanager
    def turn(self, ticket: int | None) -> Iterator[None]:
        if ticket is None:
            yield
            return
        with self._cond:
            try:
                self._cond.wait_for(lambda: self._serving == ticket)
            except BaseException:
                # interrupted while waiting (KeyboardInterrupt): its turn is skipped, or every
                # later call of the group would wait for it forever
                self._dropped.add(ticket)
                self._next(0)
                raise
            self._owner = threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._next(1)

    def _next(self, done: int) -> None:
        """Serve the next ticket (``done``: the one served now ended), past dropped ones."""
        self._serving += done
        while self._serving in self._dropped:
            self._dropped.discard(self._serving)
            self._serving += 1
        self._cond.notify_all()


# Subgroups' turns are held weakly: a strong reference to a process group would outlive
# destroy_process_group (see gradwire.transport._UPSTREAM).
_DEFAULT_TURNS = _Turns()
_GROUP_TURNS: weakref.WeakKeyDictionary[dist.ProcessGroup, _Turns] = weakref.WeakKeyDictionary()
_TURNS_LOCK = threading.Lock()


def _turns(group: dist.ProcessGroup | None) -> _Turns:
    if is_default_group(group):
        return _DEFAULT_TURNS
    with _TURNS_LOCK:
        return _GROUP_TURNS.setdefault(group, _Turns())  # type: ignore[arg-type]


@contextlib.contextmanager
def in_turn(group: dist.ProcessGroup | None) -> Iterator[None]:
    """Run the block as one of ``group``'s calls: after every call issued on it before (async
    ones included), and before every call issued after; inside the call this thread is
    already running, if any. For aggregations built on the transport outside this module
    (:func:`gradwire.sparse.sparse_allreduce`), whose messages would otherwise interleave with
    an async call's in flight."""
    turns = _turns(group)
    with turns.turn(turns.take()):
        yield


@contextlib.contextmanager
def refused_together(t: Transport) -> Iterator[None]:
    """Check a call's arguments in the block. One refused here raises on this rank after the
    call's header exchange, in the call's turn, has shown the reason to the other ranks: they
    raise at once naming this rank (:func:`~gradwire.collectives.agree.refuse`) instead of
    waiting on it until the timeout."""
    try:
        yield
    except Exception as e:
        reason = str(e) if isinstance(e, GradwireError) else f"{type(e).__name__}: {e}"
        turns = _turns(t.group)
        # a peer lost meanwhile is not news: this rank's own error says what it did wrong
        with contextlib.suppress(PeerError), turns.turn(turns.take()):
            refuse(t, reason)
        raise


def _outside(group: object) -> bool:
    """Whether this rank is not in ``group`` (``dist.new_group`` gives it no group): c10d's
    collectives do nothing there, and so do these."""
    return group is dist.GroupMember.NON_GROUP_MEMBER


def _root(t: Transport, rank: object, what: str) -> object:
    """A root given as c10d takes it, a global rank, as ``t``'s group numbers it (the
    registry refuses what is not a rank, a bool too, which ``in`` and ``index`` would take
    for rank 0 or 1; numpy's integers are ranks here as there)."""
    if is_default_group(t.group) or not is_int(rank):
        return rank
    members = dist.get_process_group_ranks(t.group)
    if rank not in members:
        raise GradwireError(f"{what}={rank} is not in the group: {what} is a global rank, as "
                            f"in torch.distributed, and the group's are {members}")
    return members.index(rank)


class Handle:
    """What ``async_op=True`` returns, as c10d's ``Work``: ``wait()`` blocks until done and
    re-raises errors, ``is_completed()``, and ``get_future()``, a ``torch.futures.Future``
    whose value is ``[tensor]``, the tensor the call writes (what a DDP communication hook
    returns), or whose ``wait()`` raises the call's error."""

    def __init__(self, fn: Callable[[], None], result: torch.Tensor) -> None:
        self._error: BaseException | None = None
        self._future: torch.futures.Future = torch.futures.Future()
        self._result = result
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # handed to wait() and to the future
            self._error = e
            # a future takes an Exception only: a SystemExit left it unfinished, its waiters
            # blocked for good
            self._future.set_exception(e if isinstance(e, Exception) else RuntimeError(
                f"the call stopped: {type(e).__name__}: {e}"))
        else:
            self._future.set_result([self._result])
        self._result = None  # the future holds it

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        # done once the future is: its waiters may look before the thread has exited
        return self._future.done()

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        if isinstance(timeout, datetime.timedelta):  # as c10d's Work.wait takes it
            timeout = timeout.total_seconds()
        if timeout is not None and not is_real(timeout, 0.0):  # join() raised a TypeError
            raise GradwireError(f"wait: timeout must be None, a timedelta or a number of "
                                f"seconds >= 0, got {timeout!r}")
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return self._future.done()


def _op(op: object, buf: torch.Tensor) -> str:
    # an instance, dist.ReduceOp(dist.ReduceOp.SUM): its type. The type itself
    # (dist.ReduceOp.SUM, c10d's usual spelling) passes isinstance too, and has no .op.
    if isinstance(op, dist.ReduceOp):
        op = getattr(op, "op", op)
    names = {**OPS, **{name: name for name in OPS.values()}}
    try:
        how = names[op]  # type: ignore[index]
    except (KeyError, TypeError):
        raise GradwireError(f"reduction op {op!r} is not supported: expected 'sum', 'avg', "
                            "'max', 'min' or 'product' (or dist.ReduceOp.SUM, AVG, MAX, MIN, "
                            "PRODUCT)") from None
    if how == "avg" and not buf.is_floating_point():
        raise GradwireError(f"op 'avg' needs a float tensor, got {buf.dtype}: sum it and "
                            "divide")
    return how


def _sum_may_overflow(x: torch.Tensor, p: int) -> bool:
    """Whether ``p`` ranks' values as large as ``x``'s largest could sum past ``x``'s dtype's
    largest finite value (what :func:`_body` asks of an average's input). Inf is; NaN is not
    (its sum is NaN either way)."""
    if p == 1 or x.numel() == 0:
        return False
    lo, hi = torch.aminmax(x)  # one pass, no |x| made: 2.5 ms on 25 M fp32 here, abs().max() 37
    return float(torch.maximum(-lo, hi)) * p > torch.finfo(x.dtype).max


def _overlap_in_part(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether 1-D contiguous ``a`` and ``b`` share memory without being the same elements."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    lo_a, lo_b = a.data_ptr(), b.data_ptr()
    hi_a, hi_b = lo_a + a.numel() * a.element_size(), lo_b + b.numel() * b.element_size()
    return lo_a < hi_b and lo_b < hi_a and (lo_a, hi_a) != (lo_b, hi_b)


def _flat(tensor: torch.Tensor, what: str, moved_only: bool = False) -> torch.Tensor:
    """``tensor`` as a 1-D view; a collective that only moves data (``moved_only``: broadcast,
    allgather) takes any dtype, one that reduces one of :data:`DTYPES` (the floats and the
    integers)."""
    if not isinstance(tensor, torch.Tensor):
        raise GradwireError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPES and not moved_only:
        # short enough that a peer sees it whole in a refused call's header (agree.py)
        raise GradwireError(f"{what} has dtype {tensor.dtype}: expected one of "
                            f"{', '.join(str(d).removeprefix('torch.') for d in DTYPES)}")
    if tensor.layout != torch.strided:  # sparse: .contiguous() does not make it dense
        raise GradwireError(f"{what} must be a dense tensor, got layout {tensor.layout}: "
                            "call .to_dense() first")
    if not tensor.is_contiguous():
        raise GradwireError(f"{what} must be contiguous: call .contiguous() first")
    # what the transport refuses to send (a conjugate or negative view, a quantized tensor),
    # refused here, before the call's header exchange: found at a rank's first send, it failed
    # that rank alone, and a peer's receive posted for the data took the next call's header
    try:
        as_wire(tensor)
    except GradwireError as e:
        raise GradwireError(f"{what}: {e}") from None
    # detached, as c10d writes into a parameter that requires grad
    return tensor.detach().view(-1)


# reduce_scatter_tensor reduces out of its input into a work buffer. A fresh buffer per call
# costs more than the reduction's own passes (a 64 MiB clone took 29 ms here, a copy into a
# reused buffer 5 ms: first-touch page faults), so each call is lent one from this pool and
# gives it back; calls running at once (async_op) are lent different ones.
WORK_KEEP_BYTES = 256 * 2**20
WORK_BUFFERS = BufferPool(WORK_KEEP_BYTES)


def shown_params(params: dict) -> str:
    """A call's schedule parameters as its header names them: a list and a tuple of the same
    numbers are the same parameter (the registry takes either), so they read alike."""
    return ",".join(f"{k}={tuple(v) if isinstance(v, list) else v}"
                    for k, v in sorted(params.items()))


# Inputs that only choose a parameter the schedule records (ring.pick_pipeline, lp.pick_block):
# ranks that chose the same value run one schedule, however each chose it.
CHOOSERS = {"pipeline": ("itemsize",), "block": ("itemsize", "alpha", "beta", "sndbuf")}


def run_params(given: dict, recorded: dict, itemsize: int) -> dict:
    """The parameters a call runs with, as its header compares them: the schedule's
    ``recorded`` ones as it resolved them (ring's pipeline, lp's and dbtree's block, given or
    chosen), then the ``given`` ones it does not record, less those that only chose a recorded
    one and an itemsize that is the dtype's (the header names the dtype). So a default spelled
    out on one rank and left out on another is one call, and the header has room to name
    each parameter as it is."""
    out = {k: v for k, v in given.items() if k not in recorded}
    for k in recorded:
        for c in CHOOSERS.get(k, ()):
            out.pop(c, None)
    if out.get("itemsize") == itemsize:
        del out["itemsize"]
    return {**out, **recorded}


def _body(collective: str, algo: str | None, buf: torch.Tensor, root: int, t: Transport,
          async_op: bool, after: Callable[[torch.Tensor], None] | None, params: dict,
          whole: tuple[int, int] | None = None,
          before: Callable[[], None] | None = None, op: str | None = None,
          mean: tuple[int, int] | None = None) -> Callable[[], None]:
    """The call, checked: agree on it, ``before()``, run the schedule on ``buf``, then
    ``after(buf)``; :func:`_issue` runs it in the call's turn, so a call issued after an async
    one that writes its input reads it written.

    With ``whole`` = (start, stop), run out of place instead: ``buf`` is the input, left as it
    is (the executor's ``source``). The schedule runs on a work buffer lent by WORK_BUFFERS;
    its ``[start:stop]``, the part ``after`` reads, is made whole, then ``after(work)`` runs,
    and the work buffer goes back to the pool if the call ends well (one that failed may have
    left receives posted into it).

    ``op``: a reduction's op ("sum", "avg", "max", "min", "product"), named in the header
    beside the parameters: ranks that reduce with different ops exchange the same messages,
    and would end with different results (the sum on some, the max on others) instead of
    failing.

    ``op="avg"``: the sum is divided by P in ``[mean]`` (start, stop) of the result, before
    ``after`` runs (None: this rank's result is scratch, a reduce's non-root). Where a rank's
    values, P of them summed, could pass its dtype's largest finite value (fp16's 65 504 is
    three ranks' 30 000), every rank divides its input by P before the sum instead, as c10d's
    NCCL average does: summed first, the mean came out inf. The ranks learn it in the header
    exchange (the status digit, :func:`~gradwire.collectives.agree.agree`), so all take the
    same path; with the call check off they cannot, and sum first.
    """
    if not isinstance(async_op, bool):
        raise GradwireError(f"async_op must be True or False, got {async_op!r}")
    t.check_device(buf)
    params = {"itemsize": buf.element_size(), **params}  # so a block chosen in bytes fits dtype
    s = registry.schedule(collective, algo, t.world_size, buf.numel(), root, **params)
    ran = run_params(params, s.params, buf.element_size())
    shown = shown_params(ran if op is None else {**ran, "op": op})
    call = [("call", collective), ("algo", s.algo), ("elements", buf.numel()),
            ("dtype", buf.dtype), ("root", root), ("params", shown)]

    p = t.world_size
    combine = COMBINES.get(op or "sum")

    def agreed() -> bool:
        """Agree on the call; whether to divide by P before the sum (an average at risk)."""
        if op != "avg":
            agree(t, call)
            return False
        return agree(t, call, lambda: not _sum_may_overflow(buf, p)) is False

    def in_place() -> None:
        first = agreed()
        if before is not None:
            before()
        if first:
            buf.div_(p)
        execute(s, buf, t, combine=combine)
        if op == "avg" and not first and mean is not None:
            buf[mean[0] : mean[1]].div_(p)
        if after is not None:
            after(buf)

    def out_of_place(lo: int, hi: int) -> None:
        with WORK_BUFFERS.lend(buf.numel(), buf) as work:
            if agreed():  # the input, divided, is the work buffer's start: run in place
                execute(s, torch.div(buf, p, out=work), t)
            else:
                unwritten = execute(s, work, t, combine=combine, source=buf)
                for a, b in unwritten.within(lo, hi):  # type: ignore[union-attr]
                    work[a:b].copy_(buf[a:b])  # nothing arrived for it (P = 1)
                if op == "avg" and mean is not None:
                    work[mean[0] : mean[1]].div_(p)
            if after is not None:
                after(work)

    return in_place if whole is None else functools.partial(out_of_place, *whole)


def _issue(t: Transport, body: Callable[[], None], async_op: bool, written: torch.Tensor,
           result: torch.Tensor) -> Handle | None:
    """Run ``body`` in its turn among ``t``'s group's calls: now, or on a helper thread.
    ``written``: the (flat) tensor the call writes; ``result``: the caller's, which the
    handle's future holds."""
    turns = _turns(t.group)
    ticket = turns.take()
    # inference mode is the calling thread's: the helper thread writes the caller's tensors
    # (inference tensors, in it) in the same mode. An inference tensor written outside the
    # mode (made under torch.inference_mode, reduced after it: c10d takes it) is written in
    # the mode too, where torch refused the in-place update from deep in the schedule.
    inference = torch.is_inference_mode_enabled() or written.is_inference()

    def go() -> None:
        with turns.turn(ticket):
            body()

    def go_in_mode() -> None:
        with torch.inference_mode(inference):
            go()

    if async_op:
        return Handle(go_in_mode, result)
    (go_in_mode if inference else go)()
    return None


def all_reduce(tensor: torch.Tensor, op: object = "sum", group: dist.ProcessGroup | None = None,
               async_op: bool = False, algo: str | None = None,
               transport: Transport | None = None, **params: object) -> Handle | None:
    """Every rank ends with the reduction of ``tensor`` over ranks, in place: ``op`` "sum",
    "avg", "max", "min" or "product" (or the ``dist.ReduceOp``)."""
    if _outside(group):
        return None
    t = resolve(transport, group, "all_reduce")
    with refused_together(t):
        buf = _flat(tensor, "tensor")
        how = _op(op, buf)
        body = _body("allreduce", algo, buf, 0, t, async_op, None, params, op=how,
                     mean=(0, buf.numel()))
    return _issue(t, body, async_op, buf, tensor)


def reduce(tensor: torch.Tensor, dst: int = 0, op: object = "sum",
           group: dist.ProcessGroup | None = None, async_op: bool = False,
           algo: str | None = None, transport: Transport | None = None,
           **params: object) -> Handle | None:
    """Rank ``dst`` ends with the reduction (``op`` as :func:`all_reduce`'s); other ranks'
    buffers are scratch."""
    if _outside(group):
        return None
    t = resolve(transport, group, "reduce")
    with refused_together(t):
        buf = _flat(tensor, "tensor")
        how = _op(op, buf)
        dst = _root(t, dst, "dst")  # type: ignore[assignment]
        body = _body("reduce", algo, buf, dst, t, async_op, None, params, op=how,
                     mean=(0, buf.numel()) if t.rank == dst else None)
    return _issue(t, body, async_op, buf, tensor)


def broadcast(tensor: torch.Tensor, src: int = 0, group: dist.ProcessGroup | None = None,
              async_op: bool = False, algo: str | None = None,
              transport: Transport | None = None, **params: object) -> Handle | None:
    """Every rank ends with rank ``src``'s ``tensor``."""
    if _outside(group):
        return None
    t = resolve(transport, group, "broadcast")
    with refused_together(t):
        buf = _flat(tensor, "tensor", moved_only=True)
        body = _body("broadcast", algo, buf, _root(t, src, "src"), t,  # type: ignore[arg-type]
                     async_op, None, params)
    return _issue(t, body, async_op, buf, tensor)


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor,
                           group: dist.ProcessGroup | None = None, async_op: bool = False,
                           algo: str | None = None, transport: Transport | None = None,
                           **params: object) -> Handle | None:
    """``output`` (P × input elements) ends with every rank's ``input``, in rank order."""
    if _outside(group):
        return None
    t = resolve(transport, group, "all_gather_into_tensor")
    with refused_together(t):
        out, inp = _flat(output, "output", True), _flat(input, "input", True)
        if out.numel() != t.world_size * inp.numel() or out.dtype != inp.dtype:
            raise GradwireError(f"output must have world_size × input = {t.world_size} × "
                                f"{inp.numel()} elements of {inp.dtype}, got {out.numel()} of "
                                f"{out.dtype}")
        mine = out[t.rank * inp.numel() : (t.rank + 1) * inp.numel()]
        # torch refuses a copy between tensors that overlap in part (an input sliced from the
        # output a few elements off this rank's block): a RuntimeError on this rank alone,
        # after the header exchange, its peers waiting on it
        partly = _overlap_in_part(mine, inp)
        body = _body("allgather", algo, out, 0, t, async_op, None, params,
                     before=lambda: mine.copy_(inp.clone() if partly else inp))
    return _issue(t, body, async_op, out, output)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: object = "sum",
                          group: dist.ProcessGroup | None = None, async_op: bool = False,
                          algo: str | None = None, transport: Transport | None = None,
                          **params: object) -> Handle | None:
    """``output`` ends with this rank's block of the reduction (``op`` as :func:`all_reduce`'s)
    of every rank's ``input``, which is left as it was. The reduction is formed out of place
    (no copy of the input) in a work buffer that WORK_BUFFERS lends for the call."""
    if _outside(group):
        return None
    t = resolve(transport, group, "reduce_scatter_tensor")
    with refused_together(t):
        out, inp = _flat(output, "output"), _flat(input, "input")
        how = _op(op, inp)
        if inp.numel() != t.world_size * out.numel() or out.dtype != inp.dtype:
            raise GradwireError(f"input must have world_size × output = {t.world_size} × "
                                f"{out.numel()} elements of {out.dtype}, got {inp.numel()} of "
                                f"{inp.dtype}")
        n = out.numel()
        mine = (t.rank * n, (t.rank + 1) * n)

        def after(work: torch.Tensor) -> None:
            out.copy_(work[mine[0] : mine[1]])

        body = _body("reducescatter", algo, inp, 0, t, async_op, after, params,
                     whole=mine, op=how, mean=mine)
    return _issue(t, body, async_op, out, output)
