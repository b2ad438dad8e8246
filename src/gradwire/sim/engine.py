"""The discrete-event core: timers, and flows that share links max-min fairly.

Hosts hang off one non-blocking switch; host h has an up link (h → switch) and a down link
(switch → h), each with its own rate. A flow is a number of bytes over a set of links: a unicast
uses its source's up link and its destination's down link, a multicast one up link and many
down links, a flow into or out of the switch (in-network aggregation) one link. Between events
the rates are the max-min fair allocation (progressive filling: raise every unfrozen flow's
rate together; a link that fills freezes its flows), so incast at a parameter server and
staggered backprop emerge from the simulation, not from a formula.

Determinism: events at equal times run in the order they were scheduled (a sequence number
breaks ties, as SimPy does), and flows finishing within ``EPS`` of each other finish together,
in the order they were started.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# Flows whose finish times differ by less than this (relative) finish in the same event:
# rates × times accumulate rounding, and a flow left with 1e-13 bytes must not cost an event.
EPS = 1e-9


def maxmin(flow_links: Sequence[Sequence[int]], capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows (each a list of link indices) on links of ``capacity``.

    Progressive filling: every unfrozen flow gets the same increment until some link is full;
    that link's flows freeze at their rate. Each round freezes at least one link.
    """
    nf = len(flow_links)
    rates = np.zeros(nf)
    if nf == 0:
        return rates
    lens = np.fromiter((len(x) for x in flow_links), dtype=np.int64, count=nf)
    fid = np.repeat(np.arange(nf), lens)
    lid = np.fromiter((lk for x in flow_links for lk in x), dtype=np.int64, count=int(lens.sum()))
    nl = len(capacity)
    left = capacity.astype(float).copy()
    active = np.ones(nf, dtype=bool)
    level = 0.0
    while active.any():
        on = active[fid]
        users = np.bincount(lid[on], minlength=nl)
        used = users > 0
        share = np.full(nl, np.inf)
        share[used] = left[used] / users[used]
        inc = share.min()
        level += inc
        left -= inc * users
        full = used & (left <= EPS * capacity)
        hit = np.zeros(nf, dtype=bool)
        hit[fid[on & full[lid]]] = True
        rates[hit & active] = level
        active &= ~hit
    return rates


@dataclass
class Flow:
    links: tuple[int, ...]
    remaining: float
    done: Callable[[float], None]
    seq: int
    label: str = ""
    started: float = 0.0
    size: float = 0.0


class Network:
    """Link capacities (bytes/s): up link of host h is ``h``, its down link ``hosts + h``; an
    optional one-way latency per host is paid once per flow, before its first byte moves."""

    def __init__(self, up: Sequence[float], down: Sequence[float],
                 latency: Sequence[float] | None = None) -> None:
        self.hosts = len(up)
        self.capacity = np.array([*up, *down], dtype=float)
        self.latency = np.zeros(self.hosts) if latency is None else np.asarray(latency, float)

    @classmethod
    def uniform(cls, hosts: int, bytes_per_s: float, latency: float = 0.0) -> Network:
        return cls([bytes_per_s] * hosts, [bytes_per_s] * hosts, [latency] * hosts)

    def up(self, h: int) -> int:
        return h

    def down(self, h: int) -> int:
        return self.hosts + h


class Engine:
    """Timers and flows on a :class:`Network`; ``run()`` until nothing is left to happen.

    ``record`` keeps (label, links, start, end, bytes) of every finished flow for timelines and
    link utilisation.
    """

    def __init__(self, net: Network, record: bool = False) -> None:
        self.net = net
        self.now = 0.0
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._flows: list[Flow] = []
        self._seq = 0
        self._dirty = True
        self._rates = np.zeros(0)
        self.record = record
        self.log: list[tuple[str, tuple[int, ...], float, float, float]] = []
        self.carried = np.zeros(len(net.capacity))  # bytes per link, for utilisation

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` at time ``t`` (no earlier than now)."""
        self._seq += 1
        heapq.heappush(self._timers, (max(t, self.now), self._seq, fn))

    def send(self, links: Sequence[int], nbytes: float, done: Callable[[float], None],
             label: str = "", latency: float = 0.0) -> None:
        """Start a flow of ``nbytes`` over ``links`` after ``latency``; ``done(t)`` when the
        last byte arrives."""
        def start() -> None:
            self._seq += 1
            f = Flow(tuple(links), float(nbytes), done, self._seq, label, self.now, float(nbytes))
            if nbytes <= 0:
                self._finish(f)
                return
            self._flows.append(f)
            self._dirty = True

        if latency > 0:
            self.at(self.now + latency, start)
        else:
            start()

    def unicast(self, src: int, dst: int, nbytes: float, done: Callable[[float], None],
                label: str = "") -> None:
        lat = float(self.net.latency[src] + self.net.latency[dst])
        self.send((self.net.up(src), self.net.down(dst)), nbytes, done, label, lat)

    def _finish(self, f: Flow) -> None:
        if self.record:
            self.log.append((f.label, f.links, f.started, self.now, f.size))
        f.done(self.now)

    def run(self, until: float = float("inf")) -> float:
        """Process events up to ``until``; returns the time of the last one."""
        while self._timers or self._flows:
            if self._dirty:
                self._rates = maxmin([f.links for f in self._flows], self.net.capacity)
                self._dirty = False
            t_flow = np.inf
            if self._flows:
                rem = np.fromiter((f.remaining for f in self._flows), float, len(self._flows))
                with np.errstate(divide="ignore"):
                    eta = np.where(self._rates > 0, rem / self._rates, np.inf)
                t_flow = self.now + eta.min()
            t_timer = self._timers[0][0] if self._timers else np.inf
            t = min(t_flow, t_timer)
            if t > until or t == np.inf:
                break
            dt = t - self.now
            if self._flows and dt > 0:
                moved = self._rates * dt
                for f, m in zip(self._flows, moved, strict=True):
                    f.remaining -= m
                    self.carried[list(f.links)] += m
            self.now = t
            if t_flow <= t_timer * (1 + EPS):
                limit = EPS * max(t, 1e-9)
                done = [f for f, r in zip(self._flows, self._rates, strict=True)
                        if r > 0 and f.remaining / r <= limit]
                if done:
                    ids = {id(f) for f in done}
                    self._flows = [f for f in self._flows if id(f) not in ids]
                    self._dirty = True
                    for f in done:
                        self.carried[list(f.links)] += max(f.remaining, 0.0)
                        self._finish(f)
                    continue
            while self._timers and self._timers[0][0] <= self.now:
                _, _, fn = heapq.heappop(self._timers)
                fn()
        return self.now
