"""Run a schedule for every rank in one process: the executor's meaning, without a network.

For tests and what-if runs that would otherwise need P processes (property tests over
P = 1…17 run in milliseconds). ``buffers[r]`` is rank r's buffer. Steps run in order; within a
step every send reads its range before any receive of the step lands (the rule
:mod:`gradwire.schedules.check` holds schedules to), then receives are applied in the order
listed: ``copy`` overwrites, any other op calls ``combine[dst][op](into, received)``, the same
callback :func:`gradwire.collectives.executor.execute` calls on rank ``dst``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradwire.collectives.executor import COMBINE, Combine, unknown_op
from gradwire.errors import GradwireError
from gradwire.schedules.ir import Schedule


def execute_local(s: Schedule, buffers: Sequence[torch.Tensor],
                  combine: Sequence[dict[str, Combine]] | None = None) -> None:
    """Run ``s`` in place on ``buffers`` (one per rank); ``combine[r]``: rank r's custom ops."""
    p = s.world_size
    if len(buffers) != p:
        raise GradwireError(f"schedule is for {p} ranks, got {len(buffers)} buffers")
    for r, b in enumerate(buffers):
        if not isinstance(b, torch.Tensor):
            raise GradwireError(f"rank {r}: buffer must be a torch.Tensor, got "
                                f"{type(b).__name__}")
        if b.dim() != 1 or b.numel() != s.count:
            raise GradwireError(f"rank {r}: buffer has shape {tuple(b.shape)}, the schedule "
                                f"expects ({s.count},)")
    first = buffers[0]
    for r, b in enumerate(buffers):
        if (b.dtype, b.device) != (first.dtype, first.device):
            raise GradwireError(f"rank {r}: buffer is {b.dtype} on {b.device}, rank 0's is "
                                f"{first.dtype} on {first.device}; every rank's must match")
    _check_apart(buffers)
    if combine is not None and len(combine) != p:
        raise GradwireError(f"combine must have one entry per rank, {p} for this schedule, "
                            f"got {len(combine)}")
    ops = [{**COMBINE, **(combine[r] if combine else {})} for r in range(p)]
    for r in range(p):  # as the executor checks them: before any buffer changes
        op = unknown_op(s, ops[r])
        if op is not None:
            raise GradwireError(f"schedule {s.algo} uses combine op {op!r}; known on rank "
                                f"{r}: {', '.join(['copy', *ops[r]])}")
    for step in s.steps:
        sent = [(t, buffers[t.src][t.start : t.stop].clone()) for t in step.transfers]
        for t, data in sent:
            view = buffers[t.dst][t.start : t.stop]
            if t.op == "copy":
                view.copy_(data)
            elif t.op in ops[t.dst]:
                ops[t.dst][t.op](view, data)
            else:
                raise GradwireError(f"schedule {s.algo} uses combine op {t.op!r}; known on rank "
                                    f"{t.dst}: {', '.join(['copy', *ops[t.dst]])}")


def _check_apart(buffers: Sequence[torch.Tensor]) -> None:
    """Refuse buffers that share memory (``[buf] * p``): every rank's writes landed in the
    others' buffers, and an allreduce of ones gave 8 where it is 4, silently. So is a buffer
    whose own elements are one (``x.expand(n)``): its first write raised torch's RuntimeError.
    Buffers of one storage whose elements interleave without touching (``x[0::2]``,
    ``x[1::2]``) pass. The buffers are 1-D of one dtype (checked before)."""
    spans = []
    for r, b in enumerate(buffers):
        if b.numel() > 1 and b.stride(0) == 0:  # x.expand(n): every element is one
            raise GradwireError(f"rank {r}: buffer's elements share memory (stride 0, as "
                                "from .expand()): call .clone() first")
        if b.numel():
            lo, size, step = b.data_ptr(), b.element_size(), b.stride(0)
            spans.append((lo, lo + ((b.numel() - 1) * step + 1) * size, r, step, size))
    spans.sort()
    for i, (lo, hi, r, step, size) in enumerate(spans):
        for lo2, _, r2, step2, _ in spans[i + 1:]:
            if lo2 >= hi:
                break
            apart = (lo2 - lo) % (step * size) if step == step2 and step > 1 else 0
            if size <= apart <= (step - 1) * size:
                continue  # one stride, elements that never meet
            raise GradwireError(f"the buffers of ranks {min(r, r2)} and {max(r, r2)} share "
                                "memory: each rank needs a buffer of its own (e.g. not "
                                "[buf] * world_size)")
