"""Symbolic execution of a schedule on tokens: which ranks' data each element holds.

Each element of each rank's buffer is a vector of counts, one per rank ("this element holds
rank r's contribution c times") plus a last column for garbage (data that should never be
read). Copies move vectors, reductions add them. At the end the collective's postcondition is
compared element by element, and the first difference is reported the way a person reads it:
``rank 3 element 5 holds {0, 1, 2} but should hold {0, 1, 2, 3}``.
"""

from __future__ import annotations

import numpy as np

from gradwire.check import is_int
from gradwire.schedules.ir import Schedule, blocks


class ScheduleError(AssertionError):
    pass


def _root(s: Schedule) -> int:
    """The root of a broadcast or reduce, if it is a rank of ``s`` (0..p − 1: not None, not
    p, not −1 read as p − 1); else a one-line error."""
    if not is_int(s.root, 0, s.world_size - 1):
        raise ScheduleError(f"{s.algo} {s.collective} p={s.world_size}: root must be a rank "
                            f"in 0..{s.world_size - 1}, got {s.root!r}")
    return int(s.root)  # type: ignore[arg-type]


def initial_state(s: Schedule) -> np.ndarray:
    p, n = s.world_size, s.count
    state = np.zeros((p, n, p + 1), dtype=np.int64)
    root = _root(s) if s.collective in ("broadcast", "reduce") else None
    if s.collective in ("allreduce", "reduce", "reducescatter"):
        for r in range(p):
            state[r, :, r] = 1
    elif s.collective == "broadcast":
        state[:, :, p] = 1
        state[root, :, :] = 0
        state[root, :, root] = 1
    elif s.collective == "allgather":
        state[:, :, p] = 1
        for r, (start, size) in enumerate(blocks(n, p)):
            state[r, start : start + size, :] = 0
            state[r, start : start + size, r] = 1
    else:
        raise ScheduleError(f"unknown collective {s.collective!r}")
    return state


def expected_state(s: Schedule) -> list[tuple[int, slice, np.ndarray]]:
    """(rank, element range, the vector every element there must hold)."""
    p, n = s.world_size, s.count
    every = np.ones(p + 1, dtype=np.int64)
    every[p] = 0

    def one(r: int) -> np.ndarray:
        """Rank r's data alone. Made for the ranks asked for only: a (p + 1)-square identity
        for each rank made this O(p³), 3 s of a 1000-rank schedule of no elements."""
        v = np.zeros(p + 1, dtype=np.int64)
        v[r] = 1
        return v

    if s.collective == "allreduce":
        return [(r, slice(0, n), every) for r in range(p)]
    if s.collective == "reduce":
        return [(_root(s), slice(0, n), every)]
    if s.collective == "broadcast":
        root = one(_root(s))
        return [(r, slice(0, n), root) for r in range(p)]
    if s.collective == "allgather":
        owned = [(b0, bn, one(b)) for b, (b0, bn) in enumerate(blocks(n, p)) if bn]
        return [(r, slice(b0, b0 + bn), v) for r in range(p) for b0, bn, v in owned]
    if s.collective == "reducescatter":
        return [(r, slice(b0, b0 + bn), every) for r, (b0, bn) in enumerate(blocks(n, p))]
    raise ScheduleError(f"unknown collective {s.collective!r}")


def _describe(v: np.ndarray) -> str:
    p = len(v) - 1
    parts = [str(r) if c == 1 else f"{r}x{c}" for r, c in enumerate(v[:p]) if c]
    if v[p]:
        parts.append("garbage")
    return "{" + ", ".join(parts) + "}"


def run_symbolic(s: Schedule) -> np.ndarray:
    """Execute ``s`` on tokens and return the final state; raise on a rule violation."""
    state = initial_state(s)
    p = s.world_size
    for i, step in enumerate(s.steps):
        for t in step.transfers:
            if not (0 <= t.src < p and 0 <= t.dst < p) or t.src == t.dst:
                raise ScheduleError(f"{s.algo}: step {i} transfer {t} names a bad rank pair")
            if t.count < 0:  # its stop below its start: the range check below passed it
                raise ScheduleError(f"{s.algo}: step {i} transfer {t} has a negative count")
            if t.start < 0 or t.stop > s.count:
                raise ScheduleError(f"{s.algo}: step {i} transfer {t} is outside 0..{s.count}")
        # every send of a step reads the state before the step: what it sends is copied out
        # first (the ranges sent, not the whole state: p·n·(p + 1) a step at P = 1000)
        sent = [state[t.src, t.start : t.stop].copy() for t in step.transfers]
        for t, data in zip(step.transfers, sent, strict=True):
            if t.reduces:
                state[t.dst, t.start : t.stop] += data
            else:
                state[t.dst, t.start : t.stop] = data
    return state


def check(s: Schedule) -> None:
    """Raise :class:`ScheduleError` naming the first rank and element that is wrong."""
    state = run_symbolic(s)
    for rank, rng, want in expected_state(s):
        got = state[rank, rng]
        bad = np.nonzero((got != want).any(axis=1))[0]
        if len(bad):
            e = rng.start + int(bad[0])
            raise ScheduleError(
                f"{s.algo} {s.collective} p={s.world_size} n={s.count}: rank {rank} element "
                f"{e} holds {_describe(state[rank, e])} but should hold {_describe(want)}")
