"""Run a schedule over the transport.

Each rank follows its program (``Schedule.program``) as dataflow, not lock-step: receives are
posted as soon as they are reached, and a send waits only for the receives that write the bytes
it reads (read after write). A received block is combined into the buffer only after every
earlier send of an overlapping range has finished (write after read). So a chunk that arrives
can leave again while the rest of its step is still in flight: the ring paper's sub-chunk
pipelining, and LP's block pipeline, come from the schedule's granularity, not from code here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch

from gradwire.errors import GradwireError
from gradwire.schedules.ir import Schedule, Transfer
from gradwire.transport import Transport

Combine = Callable[[torch.Tensor, torch.Tensor], None]  # (into, received) -> None, in place


def _sum(into: torch.Tensor, received: torch.Tensor) -> None:
    into.add_(received)


COMBINE: dict[str, Combine] = {"sum": _sum}


def _overlaps(a: Transfer, b: Transfer) -> bool:
    return a.start < b.stop and b.start < a.stop


def execute(s: Schedule, buffer: torch.Tensor, transport: Transport,
            combine: dict[str, Combine] | None = None) -> None:
    """Run this rank's part of ``s`` in place on ``buffer`` (1-D, ``s.count`` elements)."""
    if buffer.dim() != 1 or buffer.numel() != s.count:
        raise GradwireError(f"rank {transport.rank}: buffer has shape {tuple(buffer.shape)}, "
                            f"the schedule expects ({s.count},)")
    if transport.world_size != s.world_size:
        raise GradwireError(f"rank {transport.rank}: schedule is for {s.world_size} ranks, "
                            f"the group has {transport.world_size}")
    ops = {**COMBINE, **(combine or {})}
    rank = transport.rank
    pending: deque[tuple[Transfer, object, torch.Tensor]] = deque()
    sending: list[tuple[Transfer, object]] = []

    def finish_sends(t: Transfer) -> None:
        for item in [x for x in sending if _overlaps(x[0], t)]:
            item[1].wait()
            sending.remove(item)

    def apply_through(last: int) -> None:
        for _ in range(last + 1):
            t, work, tmp = pending.popleft()
            work.wait()
            finish_sends(t)
            view = buffer[t.start : t.stop]
            if t.op == "copy":
                view.copy_(tmp)
            elif t.op in ops:
                ops[t.op](view, tmp)
            else:
                raise GradwireError(f"schedule {s.algo} uses combine op {t.op!r}; known: "
                                    f"{', '.join(['copy', *ops])}")

    for _, kind, t in s.program(rank):
        if kind == "send":
            hits = [i for i, (r, _, _) in enumerate(pending) if _overlaps(r, t)]
            if hits:
                apply_through(hits[-1])
            sending.append((t, transport.isend(buffer[t.start : t.stop], t.dst)))
        else:
            tmp = torch.empty(t.count, dtype=buffer.dtype, device=buffer.device)
            pending.append((t, transport.irecv(tmp, t.src), tmp))
    apply_through(len(pending) - 1)
    for _, work in sending:
        work.wait()
