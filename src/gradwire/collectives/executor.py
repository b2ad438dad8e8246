"""Run a schedule over the transport.

Each rank follows its program (``Schedule.program``) as dataflow, not lock-step:
- receives are posted ahead, in program order (so a peer's send never waits for this rank to
  reach its step): a copy whose range no unfinished earlier transfer touches lands directly in
  the buffer, anything else in a staging buffer until it is combined; staging holds what a
  rank receives before it can combine it, up to (P − 1) buffers at the root of ``master``,
  which receives every rank's at once;
- a send waits only for the receives that write the bytes it reads (read after write), and for
  this rank's sends of earlier steps to other peers (one port per rank, as the cost model
  assumes: a binomial root feeds its first child at full rate, not all children at a fraction);
- a received block is combined into the buffer only after every earlier send of an overlapping
  range has finished (write after read).
So a chunk that arrives can leave again while the rest of its step is still in flight: the ring
paper's sub-chunk pipelining, and LP's block pipeline, come from the schedule's granularity,
not from code here.
Out of place (``source=``, what reduce-scatter uses: c10d leaves its input as it was), the buffer
starts as if it held a copy of ``source`` without that copy being made: a send of a range this
rank has not written yet reads ``source``, and the first sum into a range is formed as source +
received straight into the buffer. On the emulated 1 Gbit/s cluster the up-front copy of a
64 MiB input had cost a 4-rank reduce-scatter 27 ms of its 466 (ring) and 479 (rhd).

Every wait is on an operation of an earlier step, or on a receive whose sender reaches it
without waiting on this rank, so no schedule that passes ``check`` deadlocks over gloo.

Over NCCL, receives posted ahead hung (a 2-rank ring allreduce finished nothing in 60 s; part d of
benchmarks/results/nccl_check/latest.json), likely because NCCL runs a pair's operations in
the order posted, on one stream, so a receive posted ahead holds up the send queued behind it on
both ranks. Over NCCL the executor goes step by step instead (:func:`_execute_steps`): each step's
sends and receives are posted as one NCCL group, and what arrived is combined after it. The
steps are the schedule's, so pipelined schedules (ring sub-chunks, LP blocks) still keep every
rank busy on a different piece at once.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from gradwire.collectives.pool import BufferPool
from gradwire.errors import GradwireError, PeerError
from gradwire.schedules.ir import Schedule, Transfer
from gradwire.transport import P2P, Transport, wait_all

# (into, received) -> None, in place; ``received`` is a staging buffer that is reused once the
# combine returns, so a combine keeps nothing that refers to it.
Combine = Callable[[torch.Tensor, torch.Tensor], None]


def _sum(into: torch.Tensor, received: torch.Tensor) -> None:
    into.add_(received)


COMBINE: dict[str, Combine] = {"sum": _sum}

# Backends executed step by step (_execute_steps); the others as dataflow.
STEPWISE = frozenset({"nccl"})

# Receives are posted ahead of the program (the peer's send can start at once) while their
# staging buffers total at most the buffer's size, or this much for small buffers.
LOOKAHEAD_MIN_BYTES = 4 * 2**20


# Staging buffers go back to a pool for the next receive, and the next call, instead of to the
# allocator: memory it hands back to the kernel returns as fresh pages, and each page's first
# touch is a fault. A 64 MiB ring allreduce faulted 512-10 208 times per rank per call without
# the pool, 0 with it, and took 0.41-0.45 s instead of 0.54-0.66 at P = 8 on loopback
# (benchmarks/staging.py); on the 1 Gbit/s emulated cluster the gain is within the spread.
# A run that fails drops the staging buffers of its pending receives instead: gloo keeps a
# receive posted after its wait failed or timed out, and a peer's late send would land in
# whatever a later receive had put there.
STAGING_KEEP_BYTES = 256 * 2**20
STAGING = BufferPool(STAGING_KEEP_BYTES)


def _overlaps(a: Transfer, b: Transfer) -> bool:
    return a.start < b.stop and b.start < a.stop


class Unwritten:
    """The ranges of a buffer this rank has not written yet, as sorted disjoint [start, stop)
    intervals: out of place, what they hold is still only in the source."""

    def __init__(self, count: int) -> None:
        self.starts: list[int] = [0] if count > 0 else []
        self.stops: list[int] = [count] if count > 0 else []

    def within(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The unwritten parts of [lo, hi), in order."""
        if lo >= hi:
            return []
        k = bisect.bisect_right(self.stops, lo)
        out = []
        while k < len(self.starts) and self.starts[k] < hi:
            out.append((max(lo, self.starts[k]), min(hi, self.stops[k])))
            k += 1
        return out

    def untouched(self, lo: int, hi: int) -> bool:
        """Whether none of [lo, hi) is written yet."""
        return self.within(lo, hi) == [(lo, hi)]

    def write(self, lo: int, hi: int) -> None:
        """Mark [lo, hi) written."""
        if lo >= hi:
            return
        k = bisect.bisect_right(self.stops, lo)
        j = k
        while j < len(self.starts) and self.starts[j] < hi:
            j += 1
        if k == j:
            return
        keep_s, keep_e = [], []
        if self.starts[k] < lo:
            keep_s.append(self.starts[k])
            keep_e.append(lo)
        if self.stops[j - 1] > hi:
            keep_s.append(hi)
            keep_e.append(self.stops[j - 1])
        self.starts[k:j], self.stops[k:j] = keep_s, keep_e


class Plan(NamedTuple):
    """``rank``'s program and, for each entry, the index of the latest earlier entry whose range
    overlaps it (``conflict``) and of the latest earlier receive that does (``last_recv``); -1
    where there is none."""

    program: list[tuple[int, str, Transfer]]
    conflict: list[int]
    last_recv: list[int]


def _latest_overlap(program: list[tuple[int, str, Transfer]], count: int,
                    kinds: tuple[str, ...]) -> list[int]:
    """For each entry, the index of the latest earlier entry of ``kinds`` whose range overlaps
    it (-1 if none): a sweep over range boundaries, not a pairwise scan, because LP's programs
    run to thousands of entries."""
    bounds, last = [0, count], [-1]  # segment k = [bounds[k], bounds[k+1]) last touched by
    out = []
    for i, (_, kind, t) in enumerate(program):
        for edge in (t.start, t.stop):
            k = bisect.bisect_right(bounds, edge) - 1
            if bounds[k] != edge:
                bounds.insert(k + 1, edge)
                last.insert(k + 1, last[k])
        lo, hi = bisect.bisect_left(bounds, t.start), bisect.bisect_left(bounds, t.stop)
        out.append(max(last[lo:hi], default=-1))
        if kind in kinds:
            last[lo:hi] = [i] * (hi - lo)
    return out


@functools.lru_cache(maxsize=256)
def _plan(s: Schedule, rank: int) -> Plan:
    """``rank``'s :class:`Plan` of ``s``, kept for the next call of the same schedule."""
    program = s.program(rank)
    return Plan(program, _latest_overlap(program, s.count, ("send", "recv")),
                _latest_overlap(program, s.count, ("recv",)))


@functools.lru_cache(maxsize=256)
def _reductions(s: Schedule) -> frozenset[str]:
    """The combine ops of every rank's receives in ``s`` ("copy" aside), kept for the next call
    of the same schedule."""
    return frozenset(t.op for _, t in s.transfers() if t.reduces)


def unknown_op(s: Schedule, ops: dict[str, Combine]) -> str | None:
    """The first (by name) combine op of ``s``'s receives that ``ops`` lacks, or None. Every
    rank checks them all, before anything is posted: one that found it at its first combine
    would fail alone, its peers waiting on it until the timeout."""
    missing = sorted(_reductions(s) - ops.keys())
    return missing[0] if missing else None


def execute(s: Schedule, buffer: torch.Tensor, transport: Transport,
            combine: dict[str, Combine] | None = None,
            source: torch.Tensor | None = None) -> Unwritten | None:
    """Run this rank's part of ``s`` in place on ``buffer`` (1-D, ``s.count`` elements).

    With ``source`` (shaped like ``buffer``, left as it is), run as if ``buffer`` had first been
    filled from it, and return the ranges this rank never wrote: the buffer holds the result
    everywhere else, and ``source`` holds it there. Without, return None.
    A peer that fails or stalls raises :class:`PeerError` naming it and this collective.
    """
    try:
        return _execute(s, buffer, transport, combine, source)
    except PeerError as e:
        raise e.within(f"{s.collective}/{s.algo} ({s.count} elements of "
                       f"{str(buffer.dtype).removeprefix('torch.')})") from None


def _execute(s: Schedule, buffer: torch.Tensor, transport: Transport,
             combine: dict[str, Combine] | None,
             source: torch.Tensor | None) -> Unwritten | None:
    if buffer.dim() != 1 or buffer.numel() != s.count:
        raise GradwireError(f"rank {transport.rank}: buffer has shape {tuple(buffer.shape)}, "
                            f"the schedule expects ({s.count},)")
    if transport.world_size != s.world_size:
        raise GradwireError(f"rank {transport.rank}: schedule is for {s.world_size} ranks, "
                            f"the group has {transport.world_size}")
    if source is not None and (source.shape != buffer.shape or source.dtype != buffer.dtype
                               or source.device != buffer.device):
        raise GradwireError(f"rank {transport.rank}: source is {tuple(source.shape)} "
                            f"{source.dtype} on {source.device}, expected the buffer's "
                            f"{tuple(buffer.shape)} {buffer.dtype} on {buffer.device}")
    # The transport sends and receives slices of both as their bytes: strided ones failed at
    # the first send, after receives were posted (into staging given back to the pool while
    # still posted), and a rank with nothing to send went on waiting for its peers.
    for name, x in (("buffer", buffer), ("source", source)):
        if x is not None and not x.is_contiguous():
            raise GradwireError(f"rank {transport.rank}: {name} must be contiguous, got "
                                f"stride {x.stride()}: call .contiguous() first")
    ops = {**COMBINE, **(combine or {})}
    op = unknown_op(s, ops)
    if op is not None:
        raise GradwireError(f"rank {transport.rank}: schedule {s.algo} uses combine op "
                            f"{op!r}; known: {', '.join(['copy', *ops])}")
    if transport.backend in STEPWISE:
        return _execute_steps(s, buffer, transport, ops, source)
    return _Dataflow(s, buffer, transport, ops, source).run()


class _Dataflow:
    """One rank's program run as dataflow (see the module's notes): receives posted ahead,
    each send issued once the bytes it reads have arrived, each received block combined once
    the sends that read its range have finished."""

    __slots__ = ("s", "buffer", "source", "transport", "ops", "program", "conflict", "last_recv",
                 "recvs", "budget", "fresh", "pending", "sending", "posted", "held", "cursor")

    def __init__(self, s: Schedule, buffer: torch.Tensor, transport: Transport,
                 ops: dict[str, Combine], source: torch.Tensor | None) -> None:
        # What runs: this rank's program, read only.
        self.s, self.buffer, self.source = s, buffer, source
        self.transport, self.ops = transport, ops
        self.program, self.conflict, self.last_recv = _plan(s, transport.rank)
        self.recvs = [i for i, (_, kind, _) in enumerate(self.program) if kind == "recv"]
        self.budget = max(buffer.numel() * buffer.element_size(), LOOKAHEAD_MIN_BYTES)
        # Where it stands.
        self.fresh = Unwritten(s.count) if source is not None else None
        # posted, not applied: (program index, transfer, work, staging buffer or None if direct)
        self.pending: deque[tuple[int, Transfer, object, torch.Tensor | None]] = deque()
        # sends not waited for yet: (start, stop, destination, step, work)
        self.sending: list[tuple[int, int, int, int, Any]] = []
        self.posted = 0  # receives posted so far (a prefix of ``recvs``)
        self.held = 0  # bytes of posted staged receives not yet applied
        self.cursor = 0  # program entries before this one have been issued

    def run(self) -> Unwritten | None:
        """Issue the program in order, then wait for everything; the ranges never written.
        Raising, it leaves the staging buffers of its pending receives out of the pool (see
        STAGING)."""
        self.post_receives(0)
        for i, (step, kind, t) in enumerate(self.program):
            self.cursor = i
            if kind == "send":
                self.send(i, step, t)
            else:
                self.post_receives(i + 1)
        self.cursor = len(self.program)
        self.apply_through(len(self.program))
        for x in self.sending:
            x[4].wait()
        return self.fresh

    def send(self, i: int, step: int, t: Transfer) -> None:
        """Send program entry ``i`` once the receives that write its bytes are applied and
        this rank's sends of earlier steps to other peers have finished."""
        # Receives are applied in program order: through the latest one before i that
        # overlaps t, every overlapping one is (a no-op where it already was).
        self.apply_through(self.last_recv[i])
        # One port: sends of earlier steps to other peers finish first (a binomial root
        # feeds its first child at full rate instead of all children at a fraction).
        dst = t.dst
        self.wait_sends([x for x in self.sending if x[3] < step and x[2] != dst])
        self.sending.append((t.start, t.start + t.count, t.dst, step,
                             self.transport.isend(self.outgoing(t), t.dst)))
        self.post_receives(0)

    def wait_sends(self, picked: list[tuple[int, int, int, int, Any]]) -> None:
        """Wait for ``picked``, outstanding sends in the order they were issued, and forget
        them. The list can hold many sends (gloo marks one done only once waited for), so
        callers pick with inline comparisons, and it is rebuilt only when one was picked."""
        if not picked:
            return
        for x in picked:
            x[4].wait()
        gone = {id(x) for x in picked}
        self.sending = [x for x in self.sending if id(x) not in gone]

    def outgoing(self, t: Transfer) -> torch.Tensor:
        """The bytes a send reads: the source while none of its range is written yet."""
        fresh = self.fresh
        if fresh is not None and fresh.untouched(t.start, t.stop):
            return self.source[t.start : t.stop]  # type: ignore[index]
        self.fill_from_source(t.start, t.stop)
        return self.buffer[t.start : t.stop]

    def fill_from_source(self, lo: int, hi: int) -> None:
        """Out of place: copy what [lo, hi) holds only in the source into the buffer."""
        fresh = self.fresh
        if fresh is not None:
            for a, b in fresh.within(lo, hi):
                self.buffer[a:b].copy_(self.source[a:b])  # type: ignore[index]
            fresh.write(lo, hi)

    def post_receives(self, upto: int) -> None:
        """Post receives in program order: every one before program index ``upto``, then more
        while their staging buffers stay within ``budget``."""
        program, recvs, buffer = self.program, self.recvs, self.buffer
        while self.posted < len(recvs):
            i = recvs[self.posted]
            t = program[i][2]
            if self.lands_in_place(i, t):
                self.pending.append((i, t, self.transport.irecv(buffer[t.start : t.stop], t.src),
                                     None))
                if self.fresh is not None:
                    self.fresh.write(t.start, t.stop)
                self.posted += 1
                continue
            if i >= upto and t.op == "copy":
                break  # it may land in the buffer once what touches its range has finished
            nbytes = t.count * buffer.element_size()
            if i >= upto and self.held + nbytes > self.budget:
                break
            tmp = STAGING.take(t.count, buffer)
            try:
                work = self.transport.irecv(tmp, t.src)
            except BaseException:
                # refused at once (gloo, when the peer's connection is already closed): nothing
                # was posted into ``tmp``, so it may go back
                STAGING.give(tmp)
                raise
            self.pending.append((i, t, work, tmp))
            self.posted += 1
            self.held += nbytes

    def lands_in_place(self, i: int, t: Transfer) -> bool:
        """Whether receive ``i`` may land in the buffer: a copy, and every earlier entry that
        touches its range is issued and finished (no overlapping receive is pending, and every
        overlapping send belongs to an earlier step than the current one)."""
        if t.op != "copy":
            return False
        conflict = self.conflict[i]
        if conflict < 0:
            return True
        if conflict >= self.cursor:
            return False
        start, stop = t.start, t.start + t.count
        for j, r, _, _ in self.pending:
            if j > conflict:
                break
            if r.start < stop and start < r.start + r.count:
                return False
        # gloo marks a send done only when it is waited for: sends of steps before the current
        # one are waited for here (their bytes left long ago, or this rank is behind anyway).
        cursor, program = self.cursor, self.program
        now = program[cursor][0] if cursor < len(program) else len(self.s.steps)
        late = [x for x in self.sending if x[0] < stop and start < x[1]]
        if any(x[3] >= now for x in late):
            return False
        self.wait_sends(late)
        return True

    def apply_through(self, last: int) -> None:
        """Wait for and combine the pending receives up to program index ``last``."""
        pending = self.pending
        while pending and pending[0][0] <= last:
            _, t, work, tmp = pending[0]
            work.wait()  # raising, the receive may still be posted: ``tmp`` is dropped
            if tmp is not None:
                self.combine_staged(t, tmp)
            pending.popleft()
            if tmp is not None:
                STAGING.give(tmp)
                self.held -= t.count * self.buffer.element_size()
                self.post_receives(0)

    def combine_staged(self, t: Transfer, tmp: torch.Tensor) -> None:
        """Combine a staged receive into the buffer once the sends reading its range are done
        (write after read); out of place, the first sum into a range reads the source."""
        self.finish_sends_overlapping(t)
        view = self.buffer[t.start : t.stop]
        fresh = self.fresh
        if (t.reduces and fresh is not None and self.ops.get(t.op) is _sum
                and fresh.untouched(t.start, t.stop)):
            torch.add(self.source[t.start : t.stop], tmp, out=view)  # type: ignore[index]
        else:
            if t.reduces:
                self.fill_from_source(t.start, t.stop)
            _apply(self.s, self.ops, view, t, tmp)
        if fresh is not None:
            fresh.write(t.start, t.stop)

    def finish_sends_overlapping(self, t: Transfer) -> None:
        """Wait for this rank's sends that read any of ``t``'s range (write after read)."""
        start, stop = t.start, t.start + t.count
        self.wait_sends([x for x in self.sending if x[0] < stop and start < x[1]])


def _apply(s: Schedule, ops: dict[str, Combine], view: torch.Tensor, t: Transfer,
           received: torch.Tensor) -> None:
    if t.op == "copy":
        view.copy_(received)
    elif t.op in ops:
        ops[t.op](view, received)
    else:
        raise GradwireError(f"schedule {s.algo} uses combine op {t.op!r}; known: "
                            f"{', '.join(['copy', *ops])}")


def _execute_steps(s: Schedule, buffer: torch.Tensor, transport: Transport,
                   ops: dict[str, Combine], source: torch.Tensor | None) -> Unwritten | None:
    """Step by step, each step's sends and receives one NCCL group (see the module's notes).

    A receive lands in the buffer directly when it is a copy whose range nothing else of its
    step touches; otherwise in a staging buffer, combined in listed order once the step is
    done (a step's sends read what the buffer held before it). Out of place, the buffer first
    takes a copy of ``source`` (on the GPU a copy costs little next to the transfers).
    """
    if source is not None:
        buffer.copy_(source)
    for _, entries in itertools.groupby(_plan(s, transport.rank).program, key=lambda e: e[0]):
        mine = list(entries)
        sends = [t for _, kind, t in mine if kind == "send"]
        recvs = [t for _, kind, t in mine if kind == "recv"]
        posted = [P2P("send", buffer[t.start : t.stop], t.dst) for t in sends]
        staged: list[tuple[Transfer, torch.Tensor]] = []
        for t in recvs:
            alone = t.op == "copy" and not any(
                _overlaps(t, u) for u in (*sends, *recvs) if u is not t)
            into = buffer[t.start : t.stop] if alone else STAGING.take(t.count, buffer)
            if not alone:
                staged.append((t, into))
            posted.append(P2P("recv", into, t.src))
        # raising, the step's receives may still be posted: their staging is dropped (STAGING)
        wait_all(transport.batch(posted))
        for t, tmp in staged:
            _apply(s, ops, buffer[t.start : t.stop], t, tmp)
            STAGING.give(tmp)
    return Unwritten(0) if source is not None else None
