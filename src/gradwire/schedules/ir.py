"""The schedule: the one description of a collective algorithm that every consumer reads.

A schedule is a list of steps; a step is a set of transfers that may run at once; a transfer
moves ``count`` elements starting at ``start`` of the buffer from ``src`` to ``dst``, where they
either overwrite (``op="copy"``) or are combined into (``op="sum"``, or a named custom op) the
same range of ``dst``'s buffer. Every rank holds one buffer of ``count`` elements (in place, as
c10d's collectives are).

Rules, checked by :func:`gradwire.schedules.check.check`:
- within a step, what a rank sends is read before anything it receives in that step lands;
- transfers in a step of the same (src, dst) pair are delivered in the order listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from gradwire.errors import GradwireError

COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reducescatter")

# The most transfers a schedule may have: a ring allreduce's on 4096 ranks (registry.MAX_WORLD),
# 2·4095·4096, the largest schedule the cost model and the simulator are sized for (1.4 GB as
# a Table). Builders that could pass it check their count before they make any transfer.
MAX_TRANSFERS = 2 * 4095 * 4096


def check_transfers(collective: str, algo: str, p: int, count: int, n: int,
                    instead: str) -> None:
    """Refuse a schedule of ``n`` transfers past :data:`MAX_TRANSFERS`, in one line that says
    what to give ``instead``."""
    if n > MAX_TRANSFERS:
        raise GradwireError(f"{collective} {algo} on {p} ranks and {count} elements would have "
                            f"{n:,} transfers, and a schedule has at most {MAX_TRANSFERS:,} (a "
                            f"ring allreduce's on 4096 ranks): {instead}")


def combine_op(algo: str, op: object) -> str:
    """``op`` checked as the name of a combine (e.g. "sum", or gTop-k's merge "gtopk")."""
    if not isinstance(op, str) or op == "copy":
        raise GradwireError(f"{algo}: op must name a combine (e.g. 'sum'), got {op!r}")
    return op


class Transfer(NamedTuple):
    """A named tuple, not a frozen dataclass: building one costs ~0.3 us instead of ~2 us, and
    a ring allreduce at P = 1024 has 2 M of them (see
    benchmarks/results/sim_speed/latest.json)."""

    src: int
    dst: int
    start: int
    count: int
    op: str = "copy"  # "copy" overwrites; anything else combines (e.g. "sum")

    @property
    def stop(self) -> int:
        return self.start + self.count

    @property
    def reduces(self) -> bool:
        return self.op != "copy"


@dataclass(frozen=True)
class Step:
    transfers: tuple[Transfer, ...]


@dataclass(frozen=True)
class Schedule:
    """What runs (steps) and what it means (collective, root, block ownership)."""

    algo: str
    collective: str
    world_size: int
    count: int
    steps: tuple[Step, ...]
    root: int | None = None
    params: dict = field(default_factory=dict, compare=False)

    def __hash__(self) -> int:
        """The compared fields' hash, kept after the first call: every collective call looks
        its schedule up in the executor's caches, and hashing the steps is O(transfers)
        (200 µs for a ring at P = 64)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.algo, self.collective, self.world_size, self.count, self.steps,
                      self.root))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        """Pickled without the kept hash: string hashes differ between processes."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def transfers(self) -> Iterator[tuple[int, Transfer]]:
        """Every (step index, transfer) in order."""
        for i, s in enumerate(self.steps):
            for t in s.transfers:
                yield i, t

    def program(self, rank: int) -> list[tuple[int, str, Transfer]]:
        """What ``rank`` does, in order: per step its sends, then its receives.

        Sends of a step come before its receives, so a send never waits on data of its own
        step; a receive is combined only after every earlier send of the same range is done.
        """
        out: list[tuple[int, str, Transfer]] = []
        for i, s in enumerate(self.steps):
            out += [(i, "send", t) for t in s.transfers if t.src == rank and t.count > 0]
            out += [(i, "recv", t) for t in s.transfers if t.dst == rank and t.count > 0]
        return out


def blocks(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` contiguous (start, size) blocks, sizes differing by
    at most one, the larger ones first. The partition allgather and reduce-scatter use."""
    q, r = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        size = q + (1 if i < r else 0)
        out.append((start, size))
        start += size
    return out


def split(start: int, count: int, pieces: int) -> list[tuple[int, int]]:
    """``blocks`` of the range [start, start+count), dropping empty pieces."""
    return [(start + s, n) for s, n in blocks(count, pieces) if n > 0]


def build(algo: str, collective: str, p: int, count: int, steps: Iterable[Iterable[Transfer]],
          root: int | None = None, **params: object) -> Schedule:
    """Make a Schedule from lists of transfers, dropping empty transfers and empty steps."""
    kept = []
    for s in steps:
        ts = tuple(t for t in s if t.count > 0)
        if ts:
            kept.append(Step(ts))
    return Schedule(algo, collective, p, count, tuple(kept), root, dict(params))


class Rows(NamedTuple):
    """Transfers as arrays, in step order, as a builder makes them before they are a
    :class:`Table`: like the lists of transfers :func:`build` is given, a step may have none
    and a size may be 0."""

    step: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    start: np.ndarray
    size: np.ndarray
    reduces: np.ndarray

    @staticmethod
    def of(steps: list[list[Transfer]]) -> Rows:
        """A few transfers (a scatter's p − 1), given as steps, as rows."""
        rows = [(i, t.src, t.dst, t.start, t.count, t.reduces)
                for i, s in enumerate(steps) for t in s]
        a = np.array(rows, dtype=np.int64).reshape(-1, 6)
        return Rows(*(a[:, k] for k in range(5)), a[:, 5].astype(bool))

    def after(self, steps: int) -> Rows:
        """These rows ``steps`` steps later."""
        return self._replace(step=self.step + steps)


def overlay(phases: list[Rows]) -> Rows:
    """Phases that run side by side, step by step: step i of the result is step i of every
    phase, the first phase's transfers first, each phase's in the order it lists them (a
    phase's rows need not be in step order). ``phases`` is emptied as its columns are used,
    so that what it alone holds is freed as the result is made."""
    step = np.concatenate([ph.step for ph in phases])
    # a stable sort keeps each step's transfers in phase order; steps fit 16 bits in the
    # pipelines (at most MAX_BLOCKS + 2·4096), where numpy's stable sort is a radix sort
    key = step.astype(np.uint16) if len(step) and step.max() < 2**16 else step
    del step
    return concat(phases, np.argsort(key, kind="stable"))


def concat(parts: list[Rows], order: np.ndarray | None = None) -> Rows:
    """``parts`` one after another (each with later steps than the one before), or taken in
    ``order``; ``parts`` is emptied as in :func:`overlay`."""
    cols = [list(part) for part in parts]
    parts.clear()
    out = []
    for k in range(len(Rows._fields)):
        col = np.concatenate([c[k] for c in cols])
        for c in cols:
            c[k] = None
        out.append(col if order is None else col[order])
        del col
    return Rows(*out)


def as_table(p: int, count: int, rows: Rows) -> Table:
    """``rows`` as :func:`build` keeps them: empty transfers dropped, and the steps numbered
    0, 1, … with none empty."""
    if not rows.size.all():
        keep = rows.size > 0
        rows = Rows(*(col[keep] for col in rows))
    step = rows.step
    if len(step) and (step[0] != 0 or (np.diff(step) > 1).any()):
        step = np.concatenate([[0], np.cumsum(np.diff(step) > 0)])
    return Table(p, count, step.astype(np.int64, copy=False), *rows[1:])


def chain(parts: list[Schedule]) -> Schedule:
    """Schedules that run one after the other (a method's calls for one bucket) as one: each
    on its own range of one buffer, its steps after the previous schedule's. One schedule is
    returned as it is."""
    if len(parts) == 1:
        return parts[0]
    steps, offset = [], 0
    for s in parts:
        steps += [Step(tuple(t._replace(start=t.start + offset) for t in st.transfers))
                  for st in s.steps]
        offset += s.count
    return Schedule("+".join(s.algo for s in parts), "+".join(s.collective for s in parts),
                    parts[0].world_size, offset, tuple(steps))


@dataclass(frozen=True)
class Table:
    """A schedule's transfers as arrays, one entry per transfer in step order (within a step,
    in the order the schedule lists them): what large-P consumers (the simulator) read instead
    of millions of :class:`Transfer` objects. ``transfers_of`` turns it back into steps."""

    world_size: int
    count: int
    step: np.ndarray  # int64, non-decreasing
    src: np.ndarray
    dst: np.ndarray
    start: np.ndarray
    size: np.ndarray  # elements, all > 0
    reduces: np.ndarray  # bool

    @staticmethod
    def of(s: Schedule) -> Table:
        rows = [(i, t.src, t.dst, t.start, t.count, t.reduces) for i, t in s.transfers()]
        a = np.array(rows, dtype=np.int64).reshape(-1, 6)
        return Table(s.world_size, s.count, *(a[:, k] for k in range(5)), a[:, 5].astype(bool))

    def rows(self) -> Rows:
        return Rows(self.step, self.src, self.dst, self.start, self.size, self.reduces)

    def sent(self) -> np.ndarray:
        """Elements each rank sends over the whole schedule (int64, one per rank)."""
        return self._per_rank(self.src)

    def received(self) -> np.ndarray:
        """Elements each rank receives over the whole schedule (int64, one per rank)."""
        return self._per_rank(self.dst)

    def _per_rank(self, ranks: np.ndarray) -> np.ndarray:
        """``size`` summed per rank of ``ranks``, in int64: bincount's float64 weights
        rounded totals past 2**53 (rank 0 of a 12-rank master allreduce of 2**50 − 1)."""
        out = np.zeros(self.world_size, dtype=np.int64)
        np.add.at(out, ranks, self.size)
        return out

    @staticmethod
    def chain(parts: list[Table]) -> Table:
        """:func:`chain` for tables."""
        if len(parts) == 1:
            return parts[0]
        steps = np.cumsum([0] + [int(t.step[-1]) + 1 if len(t.step) else 0 for t in parts])
        starts = np.cumsum([0] + [t.count for t in parts])
        return Table(parts[0].world_size, int(starts[-1]),
                     np.concatenate([t.step + s for t, s in zip(parts, steps, strict=False)]),
                     np.concatenate([t.src for t in parts]),
                     np.concatenate([t.dst for t in parts]),
                     np.concatenate([t.start + s for t, s in zip(parts, starts, strict=False)]),
                     np.concatenate([t.size for t in parts]),
                     np.concatenate([t.reduces for t in parts]))

    def scaled(self, factor: int) -> Table:
        """The same transfers counted in units ``factor`` times smaller (elements of 4 bytes
        as bytes: ``scaled(4)``)."""
        if factor == 1:
            return self
        return Table(self.world_size, self.count * factor, self.step, self.src, self.dst,
                     self.start * factor, self.size * factor, self.reduces)

    def transfers_of(self, ops: tuple[str, str] = ("copy", "sum")) -> list[list[Transfer]]:
        """The steps as transfers; ``ops[reduces]`` names each transfer's op."""
        steps: list[list[Transfer]] = [[] for _ in range(int(self.step[-1]) + 1 if
                                                          len(self.step) else 0)]
        # A block of rows at a time, each number one shared int object: made afresh by
        # tolist, each would cost 32 bytes (1.7 M transfers of lp at P = 1024 took twice the
        # memory), where a schedule has few distinct ranks, starts and sizes
        ranks = np.array(range(self.world_size), dtype=object)
        same: dict[int, int] = {}
        for lo in range(0, len(self.step), _BLOCK):
            part = slice(lo, lo + _BLOCK)
            cols = [ranks[self.src[part]].tolist(), ranks[self.dst[part]].tolist(),
                    _shared(self.start[part], same), _shared(self.size[part], same)]
            for i, src, dst, start, size, red in zip(self.step[part].tolist(), *cols,
                                                      self.reduces[part].tolist(), strict=True):
                steps[i].append(Transfer(src, dst, start, size, ops[red]))
        return steps


def _shared(col: np.ndarray, same: dict[int, int]) -> list[int]:
    """``col.tolist()`` with each value one int object, the one ``same`` holds."""
    values, where = np.unique(col, return_inverse=True)
    return np.array([same.setdefault(v, v) for v in values.tolist()], dtype=object)[where].tolist()


_BLOCK = 2**16  # rows Table.transfers_of turns into Transfers at a time


@dataclass(frozen=True)
class Algorithm:
    """A registry entry: ``build(p, count, *, root=0, **params) -> Schedule``, and optionally
    ``table(p, count, **params) -> Table``, the same transfers as arrays (``build`` is then
    made from it, so the two cannot disagree)."""

    collective: str
    name: str
    build: Callable[..., Schedule]
    rooted: bool = False
    table: Callable[..., Table] | None = None

    @property
    def summary(self) -> str:
        doc = (self.build.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""
