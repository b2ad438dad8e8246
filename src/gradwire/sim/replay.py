"""Replaying schedules on the simulated network: any library collective, read from its steps.

Each rank follows its program the way the executor does, at the granularity of steps:
- one send port per rank: its sends go one at a time, in program order, across collectives
  (collectives are issued FIFO, as DDP issues buckets); each message pays α on the port, then
  its bytes share the links max-min fairly with everything else in flight;
- a send of step k waits for the rank's data (its bucket is ready) and for every receive of
  that collective in steps before k (the executor waits only for the overlapping range, so it
  can forward a sub-chunk early; here a step is the unit);
- a receive that combines ("sum" or a custom op) waits for the rank's own data and then costs
  γ per byte on the rank's one reducer.
With every transfer alone on its links this is the cost model's step sum exactly:
each step takes max(α·m_out + β·b_out, α·m_in + β·b_in) + γ·b_reduced on its slowest rank.

:class:`Replay` runs inside an :class:`~gradwire.sim.engine.Engine` and so shares links with
other traffic; :func:`dataflow` is the same replay computed step by step with numpy, valid (and
exact) when every rank sends to one peer and receives from one peer throughout (a ring): then
no two flows ever share a link, so each moves at min(up rate, down rate).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gradwire.schedules.ir import Schedule, Table
from gradwire.sim.engine import Engine, Network

Done = Callable[[int, int, float], None]  # (collective, rank, time)


class Replay:
    """A FIFO sequence of collectives over ranks mapped to hosts ``hosts[rank]``.

    ``add(schedule)`` appends a collective and returns its index; ``ready(c, rank)`` says that
    rank's data for collective ``c`` is ready now; ``on_done(c, rank, t)`` fires when the rank
    has finished every send and receive of ``c``.
    """

    def __init__(self, eng: Engine, hosts: Sequence[int], itemsize: int, alpha: float = 0.0,
                 gamma: float = 0.0, on_done: Done | None = None) -> None:
        self.eng, self.hosts, self.itemsize = eng, list(hosts), itemsize
        self.alpha, self.gamma = alpha, gamma
        self.on_done = on_done or (lambda c, r, t: None)
        p = len(hosts)
        self.sends: list[deque] = [deque() for _ in range(p)]
        self.busy = [False] * p
        self.reducer_free = [0.0] * p
        self.ready_c: list[set[int]] = [set() for _ in range(p)]
        self.deferred: dict[tuple[int, int], list[tuple[int, int, bool]]] = {}
        self.need: list[np.ndarray] = []  # [rank, step] receives per collective
        self.got: list[np.ndarray] = []
        self.upto: list[np.ndarray] = []  # first step with receives outstanding
        self.sends_left: list[np.ndarray] = []
        self.labels: list[str] = []

    def add(self, s: Schedule, label: str = "", itemsize: int | None = None) -> int:
        """Append ``s`` (its counts in elements of ``itemsize`` bytes, default the replay's)."""
        c, p = len(self.need), len(self.hosts)
        item = self.itemsize if itemsize is None else itemsize
        need = np.zeros((p, len(s.steps) + 1), dtype=np.int64)
        left = np.zeros(p, dtype=np.int64)
        for k, step in enumerate(s.steps):
            for t in step.transfers:
                self.sends[t.src].append((c, k, t.dst, t.count * item, t.reduces))
                need[t.dst, k] += 1
                left[t.src] += 1
        self.need.append(need)
        self.got.append(np.zeros_like(need))
        self.upto.append(np.zeros(p, dtype=np.int64))
        self.sends_left.append(left)
        self.labels.append(label or s.algo)
        for r in range(p):
            self._advance(c, r)
        return c

    def ready(self, c: int, rank: int) -> None:
        self.ready_c[rank].add(c)
        for k, nbytes, red in self.deferred.pop((c, rank), []):
            self._received(c, k, rank, nbytes, red)
        self._check_done(c, rank)
        self._pump(rank)

    def multicast(self, c: int, r: int, dsts: Sequence[int], nbytes: int,
                  done: Callable[[float], None], label: str = "") -> None:
        """Rank ``r`` multicasts ``nbytes`` of collective ``c`` to ranks ``dsts`` as its next
        message (ahead of its later collectives' sends): like any send it waits for the port,
        pays α on it and holds it until the last byte is in; one flow over its up link and
        their down links, paying the farthest receiver's latency. ``done(t)`` then.

        It goes behind the multicasts of earlier collectives still queued (several
        collectives can finish while the port sends one long message) and ahead of every
        other queued send, so a rank's multicasts leave in the order of their collectives."""
        q = self.sends[r]
        i = 0
        while i < len(q) and q[i][1] < 0 and q[i][0] < c:
            i += 1
        q.insert(i, (c, -1, tuple(dsts), nbytes, (done, label)))
        self._pump(r)

    def _advance(self, c: int, r: int) -> None:
        need, got, upto = self.need[c], self.got[c], self.upto[c]
        while upto[r] < need.shape[1] - 1 and got[r, upto[r]] >= need[r, upto[r]]:
            upto[r] += 1

    def _check_done(self, c: int, r: int) -> None:
        if (c in self.ready_c[r] and self.sends_left[c][r] == 0
                and self.upto[c][r] == self.need[c].shape[1] - 1):
            self.sends_left[c][r] = -1  # reported
            self.on_done(c, r, self.eng.now)

    def _pump(self, r: int) -> None:
        if self.busy[r] or not self.sends[r]:
            return
        c, k, dst, nbytes, red = self.sends[r][0]
        if c not in self.ready_c[r] or self.upto[c][r] < k:
            return
        self.sends[r].popleft()
        self.busy[r] = True

        def transmit() -> None:
            if k < 0:  # a multicast (:meth:`multicast`)
                net, src = self.eng.net, self.hosts[r]
                to = [self.hosts[d] for d in dst]
                links = (net.up(src), *(net.down(h) for h in to))
                lat = float(net.latency[src] + max(net.latency[h] for h in to))
                self.eng.send(links, nbytes, multicast_in, red[1], lat)
                return
            self.eng.unicast(self.hosts[r], self.hosts[dst], nbytes, arrived,
                             f"{self.labels[c]} {r}->{dst}")

        def multicast_in(t: float) -> None:
            self.busy[r] = False
            red[0](t)
            self._pump(r)

        def arrived(t: float) -> None:
            self.busy[r] = False
            self.sends_left[c][r] -= 1
            if c in self.ready_c[dst] or not red:
                self._received(c, k, dst, nbytes, red)
            else:
                self.deferred.setdefault((c, dst), []).append((k, nbytes, red))
            self._check_done(c, r)
            self._pump(r)

        if self.alpha > 0:
            self.eng.at(self.eng.now + self.alpha, transmit)
        else:
            transmit()

    def _received(self, c: int, k: int, r: int, nbytes: int, red: bool) -> None:
        def land() -> None:
            self.got[c][r, k] += 1
            self._advance(c, r)
            self._check_done(c, r)
            self._pump(r)

        if red and self.gamma > 0:
            t = max(self.eng.now, self.reducer_free[r]) + self.gamma * nbytes
            self.reducer_free[r] = t
            self.eng.at(t, land)
        else:
            land()


# ---------------------------------------------------------------- the ring fast path


@dataclass(frozen=True)
class StepArrays:
    """One step as arrays: the ranks that send, each one's peer, and its j-th message's bytes
    (``nbytes[j, i]``, 0 where sender i has fewer messages) and whether it is combined."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray  # [message, sender]
    sent: np.ndarray  # [message, sender] bool
    red: np.ndarray  # [message, sender] bool


def step_arrays(s: Schedule | Table, itemsize: int) -> list[StepArrays]:
    """``s`` as arrays, one :class:`StepArrays` per step, for :func:`dataflow`. Each sender's
    messages keep their order; a sender's peer is that of its first message (``dataflow``
    needs one peer per sender). One sort for the whole schedule; each step is then views."""
    t = s if isinstance(s, Table) else Table.of(s)
    n = len(t.step)
    if n == 0:
        return []
    key = t.step * t.world_size + t.src
    if (key[1:] >= key[:-1]).all():  # a ring's table is already in (step, sender) order
        order = slice(None)
    else:
        order = np.argsort(key, kind="stable")
        key = key[order]
    new = np.r_[True, key[1:] != key[:-1]]  # first message of each (step, sender)
    first = np.flatnonzero(new)
    if len(first) == n:  # one message per sender and step (a ring without sub-chunks)
        nbytes = (t.size[order] * itemsize)[None, :].astype(float)
        # every message is sent (read-only, no memory of its own); the table's column is
        # copied so that the table can go
        sent, reds = np.broadcast_to(np.True_, (1, n)), t.reduces[order][None, :].copy()
    else:
        group = np.cumsum(new) - 1
        row = np.arange(n) - first[group]
        shape = (int(row.max()) + 1, len(first))
        nbytes, sent, reds = np.zeros(shape), np.zeros(shape, bool), np.zeros(shape, bool)
        nbytes[row, group] = t.size[order] * itemsize
        sent[row, group] = True
        reds[row, group] = t.reduces[order]
    src, dst, step = t.src[order][first], t.dst[order][first], t.step[order][first]
    cuts = np.flatnonzero(np.r_[True, step[1:] != step[:-1], True])
    spans = list(zip(cuts[:-1], cuts[1:], strict=True))
    # A ring's steps all pair the same senders with the same peers: then every step gets the
    # same two arrays (the same objects), and dataflow derives what depends on them once.
    width = spans[0][1] - spans[0][0]
    if all(b - a == width for a, b in spans):
        s2, d2 = src.reshape(-1, width), dst.reshape(-1, width)
        if (s2 == s2[0]).all() and (d2 == d2[0]).all():
            # copies, so that the whole columns can go; and one object each (indexing again
            # would make new view objects)
            one_src, one_dst = s2[0].copy(), d2[0].copy()
            return [StepArrays(one_src, one_dst, nbytes[:, a:b], sent[:, a:b], reds[:, a:b])
                    for a, b in spans]
    return [StepArrays(src[a:b], dst[a:b], nbytes[:, a:b], sent[:, a:b], reds[:, a:b])
            for a, b in spans]


def single_peer(schedules: Sequence[Schedule | Table]) -> bool:
    """True when every rank sends to one peer and receives from one peer in all of them."""
    ts = {id(s): s if isinstance(s, Table) else Table.of(s) for s in schedules}.values()
    peers = Peers(max((t.world_size for t in ts), default=0))
    return all(peers.add(t) for t in ts)


class Peers:
    """:func:`single_peer` a table at a time, so that the tables need not all be kept."""

    def __init__(self, p: int) -> None:
        self.to, self.frm = np.full(p, -1), np.full(p, -1)

    def add(self, t: Table) -> bool:
        """True while every rank has had one peer each way in ``t`` and all tables before."""
        if not len(t.src):
            return True
        to, frm = self.to, self.frm
        # any one peer each (agreeing with earlier tables); then every transfer must agree
        to[t.src] = np.where(to[t.src] < 0, t.dst, to[t.src])
        frm[t.dst] = np.where(frm[t.dst] < 0, t.src, frm[t.dst])
        return not ((to[t.src] != t.dst).any() or (frm[t.dst] != t.src).any())


def dataflow(schedules: Sequence[list[StepArrays]], ready: np.ndarray, net: Network,
             hosts: Sequence[int], alpha: float = 0.0, gamma: float = 0.0,
             port: np.ndarray | None = None,
             carried: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The :class:`Replay` of ``schedules`` (FIFO, as :func:`step_arrays`) when
    ``single_peer`` holds, with numpy.

    ``ready[c, r]``: when rank r's data for collective c is ready; ``port[r]``: when its send
    port frees up (default 0); ``carried``: bytes per link of ``net``, added to. Returns
    (done[c, r], port) where done is when rank r finished collective c."""
    h = np.asarray(hosts)
    p = len(h)
    up, down = net.capacity[h], net.capacity[net.hosts + h]
    lat = net.latency[h]
    port = np.zeros(p) if port is None else port.copy()
    done = np.zeros((len(schedules), p))
    pair: tuple[np.ndarray, np.ndarray] | None = None  # the (src, dst) arrays derived below
    moved = np.zeros(0)  # bytes each sender of ``pair`` has sent, not yet in ``carried``

    def count() -> None:
        if carried is not None and pair is not None:
            carried[h[pair[0]]] += moved
            carried[net.hosts + h[pair[1]]] += moved  # one peer each: receivers are distinct

    for c, s in enumerate(schedules):
        rdy = ready[c]
        recv = rdy.copy()  # when every receive of the steps so far has landed
        red_free = rdy.copy()
        sent = np.full(p, -np.inf)
        for st in s:
            if pair is None or st.src is not pair[0] or st.dst is not pair[1]:
                count()
                pair, moved = (st.src, st.dst), np.zeros(len(st.src))
                rate = np.minimum(up[st.src], down[st.dst])
                per_msg = alpha + lat[st.src] + lat[st.dst]
                # every rank sends, in rank order: slices instead of gathers
                by = (slice(None) if len(st.src) == p and (st.src == np.arange(p)).all()
                      else st.src)
            end = np.maximum(np.maximum(port[by], recv[by]), rdy[by])
            if st.nbytes.shape[0] == 1 and not (gamma > 0 and st.red.any()):
                end = end + per_msg + st.nbytes[0] / rate  # one message each, nothing to sum
                port[by] = end
                sent[by] = end
                recv[st.dst] = np.maximum(recv[st.dst], end)
                moved += st.nbytes[0]
                continue
            landed = recv[st.dst].copy()
            reducer = red_free[st.dst]
            for j in range(st.nbytes.shape[0]):
                on = st.sent[j]
                end = np.where(on, end + per_msg + st.nbytes[j] / rate, end)
                combine = on & st.red[j]
                reducer = np.where(combine, np.maximum(np.maximum(end, reducer), rdy[st.dst])
                                   + gamma * st.nbytes[j], reducer)
                landed = np.maximum(landed, np.where(combine, reducer, np.where(on, end, 0.0)))
            port[by] = end
            sent[by] = end
            moved += st.nbytes.sum(axis=0)
            red_free[st.dst] = reducer
            recv[st.dst] = landed
        done[c] = np.maximum(np.maximum(recv, sent), rdy)
    count()
    return done, port
