"""Public calls named and shaped like c10d's, with ``algo=`` choosing the schedule.

Example::

    import gradwire.collectives as gc
    gc.all_reduce(grad, op="avg", algo="ring")            # like dist.all_reduce
    gc.broadcast(params, src=0, algo="lp", block=65536)   # linear pipeline, 64 Ki-element blocks

Every call accepts ``transport=`` (a :class:`~gradwire.transport.Transport`) to read byte
counters afterwards, and ``async_op=True`` (the collective then runs on a helper thread and the
returned handle's ``wait()`` joins it).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from gradwire.collectives.agree import agree
from gradwire.collectives.executor import execute
from gradwire.collectives.pool import BufferPool
from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.transport import Transport, resolve

# what a reduction sums in; int8 wraps on overflow, which its one user (the int8 method of
# gradwire.catalogue) rules out by the levels it sends
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8)


class Handle:
    """What ``async_op=True`` returns: ``wait()`` blocks until done and re-raises errors."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # handed to wait()
            self._error = e

    def is_completed(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return not self._thread.is_alive()


def _op(op: object, buf: torch.Tensor) -> str:
    names = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", "sum": "sum", "avg": "avg"}
    try:
        how = names[op]  # type: ignore[index]
    except (KeyError, TypeError):
        raise GradwireError(f"reduction op {op!r} is not supported: expected 'sum' or 'avg' "
                            "(or dist.ReduceOp.SUM / AVG)") from None
    if how == "avg" and not buf.is_floating_point():
        raise GradwireError(f"op 'avg' needs a float tensor, got {buf.dtype}: sum it and "
                            "divide")
    return how


def _flat(tensor: torch.Tensor, what: str, moved_only: bool = False) -> torch.Tensor:
    """``tensor`` as a 1-D view; a collective that only moves data (``moved_only``: broadcast,
    allgather) takes any dtype, one that reduces one of :data:`DTYPES` (the floats and
    int8)."""
    if not isinstance(tensor, torch.Tensor):
        raise GradwireError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPES and not moved_only:
        raise GradwireError(f"{what} has dtype {tensor.dtype}: expected one of "
                            f"{', '.join(str(d) for d in DTYPES)}")
    if not tensor.is_contiguous():
        raise GradwireError(f"{what} must be contiguous: call .contiguous() first")
    return tensor.view(-1)


# reduce_scatter_tensor reduces out of its input into a work buffer. A fresh buffer per call
# costs more than the reduction's own passes (a 64 MiB clone took 29 ms here, a copy into a
# reused buffer 5 ms: first-touch page faults), so each call is lent one from this pool and
# gives it back; calls running at once (async_op) are lent different ones.
WORK_KEEP_BYTES = 256 * 2**20
WORK_BUFFERS = BufferPool(WORK_KEEP_BYTES)


def _run(collective: str, algo: str | None, buf: torch.Tensor, root: int,
         group: dist.ProcessGroup | None, transport: Transport | None, async_op: bool,
         after: Callable[[torch.Tensor], None] | None, params: dict,
         whole: tuple[int, int] | None = None) -> Handle | None:
    """Agree on the call, run the schedule on ``buf``, then ``after(buf)``.

    With ``whole`` = (start, stop), run out of place instead: ``buf`` is the input, left as it
    is (the executor's ``source``). The schedule runs on a work buffer lent by WORK_BUFFERS;
    its ``[start:stop]``, the part ``after`` reads, is made whole, then ``after(work)`` runs,
    and the work buffer goes back to the pool however the call ends.
    """
    if not isinstance(async_op, bool):
        raise GradwireError(f"async_op must be True or False, got {async_op!r}")
    t = resolve(transport, group, collective)
    params = {"itemsize": buf.element_size(), **params}  # so a block chosen in bytes fits dtype
    s = registry.schedule(collective, algo, t.world_size, buf.numel(), root, **params)
    call = [("call", collective), ("algo", s.algo), ("elements", buf.numel()),
            ("dtype", buf.dtype), ("root", root),
            ("params", ",".join(f"{k}={v}" for k, v in sorted(params.items())))]

    def in_place() -> None:
        agree(t, call)
        execute(s, buf, t)
        if after is not None:
            after(buf)

    def out_of_place(lo: int, hi: int) -> None:
        with WORK_BUFFERS.lend(buf.numel(), buf) as work:
            agree(t, call)
            unwritten = execute(s, work, t, source=buf)
            for a, b in unwritten.within(lo, hi):  # type: ignore[union-attr]
                work[a:b].copy_(buf[a:b])  # nothing arrived for it (P = 1)
            if after is not None:
                after(work)

    go = in_place if whole is None else functools.partial(out_of_place, *whole)
    if async_op:
        return Handle(go)
    go()
    return None


def all_reduce(tensor: torch.Tensor, op: object = "sum", group: dist.ProcessGroup | None = None,
               async_op: bool = False, algo: str | None = None,
               transport: Transport | None = None, **params: object) -> Handle | None:
    """Every rank ends with the sum (or average) of ``tensor`` over ranks, in place."""
    buf = _flat(tensor, "tensor")
    how = _op(op, buf)
    t = resolve(transport, group, "all_reduce")
    after = (lambda b: b.div_(t.world_size)) if how == "avg" else None
    return _run("allreduce", algo, buf, 0, group, t, async_op, after, params)


def reduce(tensor: torch.Tensor, dst: int = 0, op: object = "sum",
           group: dist.ProcessGroup | None = None, async_op: bool = False,
           algo: str | None = None, transport: Transport | None = None,
           **params: object) -> Handle | None:
    """Rank ``dst`` ends with the sum (or average); other ranks' buffers are scratch."""
    buf = _flat(tensor, "tensor")
    how = _op(op, buf)
    t = resolve(transport, group, "reduce")
    after = (lambda b: b.div_(t.world_size)) if how == "avg" and t.rank == dst else None
    return _run("reduce", algo, buf, dst, group, t, async_op, after, params)


def broadcast(tensor: torch.Tensor, src: int = 0, group: dist.ProcessGroup | None = None,
              async_op: bool = False, algo: str | None = None,
              transport: Transport | None = None, **params: object) -> Handle | None:
    """Every rank ends with rank ``src``'s ``tensor``."""
    return _run("broadcast", algo, _flat(tensor, "tensor", moved_only=True), src, group,
                transport, async_op, None, params)


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor,
                           group: dist.ProcessGroup | None = None, async_op: bool = False,
                           algo: str | None = None, transport: Transport | None = None,
                           **params: object) -> Handle | None:
    """``output`` (P × input elements) ends with every rank's ``input``, in rank order."""
    out, inp = _flat(output, "output", True), _flat(input, "input", True)
    t = resolve(transport, group, "all_gather_into_tensor")
    if out.numel() != t.world_size * inp.numel() or out.dtype != inp.dtype:
        raise GradwireError(f"output must have world_size × input = {t.world_size} × "
                            f"{inp.numel()} elements of {inp.dtype}, got {out.numel()} of "
                            f"{out.dtype}")
    out[t.rank * inp.numel() : (t.rank + 1) * inp.numel()].copy_(inp)
    return _run("allgather", algo, out, 0, group, t, async_op, None, params)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: object = "sum",
                          group: dist.ProcessGroup | None = None, async_op: bool = False,
                          algo: str | None = None, transport: Transport | None = None,
                          **params: object) -> Handle | None:
    """``output`` ends with this rank's block of the sum of every rank's ``input``, which is
    left as it was. The sum is formed out of place (no copy of the input) in a work buffer
    that WORK_BUFFERS lends for the call."""
    out, inp = _flat(output, "output"), _flat(input, "input")
    how = _op(op, inp)
    t = resolve(transport, group, "reduce_scatter_tensor")
    if inp.numel() != t.world_size * out.numel() or out.dtype != inp.dtype:
        raise GradwireError(f"input must have world_size × output = {t.world_size} × "
                            f"{out.numel()} elements of {out.dtype}, got {inp.numel()} of "
                            f"{inp.dtype}")
    n = out.numel()

    def after(work: torch.Tensor) -> None:
        out.copy_(work[t.rank * n : (t.rank + 1) * n])
        if how == "avg":
            out.div_(t.world_size)

    return _run("reducescatter", algo, inp, 0, group, t, async_op, after, params,
                whole=(t.rank * n, (t.rank + 1) * n))
