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

from gradwire.collectives.executor import COMBINE, Combine
from gradwire.errors import GradwireError
from gradwire.schedules.ir import Schedule


def execute_local(s: Schedule, buffers: Sequence[torch.Tensor],
                  combine: Sequence[dict[str, Combine]] | None = None) -> None:
    """Run ``s`` in place on ``buffers`` (one per rank); ``combine[r]``: rank r's custom ops."""
    p = s.world_size
    if len(buffers) != p:
        raise GradwireError(f"schedule is for {p} ranks, got {len(buffers)} buffers")
    for r, b in enumerate(buffers):
        if b.dim() != 1 or b.numel() != s.count:
            raise GradwireError(f"rank {r}: buffer has shape {tuple(b.shape)}, the schedule "
                                f"expects ({s.count},)")
    ops = [{**COMBINE, **(combine[r] if combine else {})} for r in range(p)]
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
