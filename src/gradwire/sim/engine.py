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
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gradwire.errors import GradwireError

# Flows whose finish times differ by less than this (relative) finish in the same event:
# rates × times accumulate rounding, and a flow left with 1e-13 bytes must not cost an event.
EPS = 1e-9
# Flows a recording engine keeps for a timeline: 2.1 M (a ring on 128 workers, 65 buckets)
# take 2 GB and make a 166 MB trace; a ring's grow as the workers squared.
MAX_RECORDED = 4_000_000
# Flows an engine replays one by one, about 60 000 a second on tens of workers (fewer with
# many flows in flight: a butterfly on 1024 workers, 20 000): some 8 minutes. A
# ring+multicast on 4096 workers sends 16.8 M a bucket.
MAX_REPLAYED = 30_000_000
REPLAY_RATE = 60_000
# A parameter server's flows cost more each (a message of a server's or a worker's queue, an
# arrival that drives the forward pass, and a start of its own after the hosts' latency):
# about 10 000 a second at 128 to 256 workers (sim_speed's ResNet-50), fewer at thousands.
# Their bound keeps a run to some 8 minutes at that rate: under the 30 M, a PS on 4096
# workers and 1000 iterations ran for hours first.
MAX_PS_REPLAYED = 5_000_000
PS_REPLAY_RATE = 10_000


def maxmin(flow_links: Sequence[Sequence[int]], capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows (each a list of link indices) on links of ``capacity``."""
    lens = np.fromiter((len(x) for x in flow_links), dtype=np.int64, count=len(flow_links))
    lid = np.fromiter((lk for x in flow_links for lk in x), dtype=np.int64, count=int(lens.sum()))
    return _fill(lens, lid, capacity)


def _fill(lens: np.ndarray, lid: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows that use ``lens[i]`` links each, listed one flow after
    another in ``lid``: :func:`_progressive`'s, directly for no flow or one (half of a parameter
    server's allocations: it distributes one message at a time; 5 µs, not 35)."""
    if len(lens) == 0:
        return np.zeros(0)
    if len(lens) == 1:
        return _alone(lid, capacity)
    return _progressive(lens, lid, capacity)


def _alone(lid: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """The rate of a flow alone on its links ``lid``: progressive filling's first round, the
    least of its links' capacity over the times it lists that link."""
    return np.minimum.reduce(capacity[lid] / np.bincount(lid)[lid], keepdims=True)


def _progressive(lens: np.ndarray, lid: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Progressive filling: every unfrozen flow gets the same increment until some link is
    full; that link's flows freeze at their rate. Each round freezes at least one link.

    Most events need one round: when every flow's tightest fair share (capacity / users) is
    on a link those shares fill, that is the max-min allocation, and it is returned at once.
    """
    nf = len(lens)
    nl = len(capacity)
    fid = np.arange(nf).repeat(lens)  # the flow of each entry of lid
    users = np.bincount(lid, minlength=nl)
    share = capacity[lid] / users[lid]  # of each entry's link, among the flows on it
    first = np.full(nf, np.inf)
    np.minimum.at(first, fid, share)  # each flow's least (reduceat: 9 µs at 256 flows, not 2)
    mine = first[fid]
    full = np.bincount(lid, weights=mine, minlength=nl) >= capacity * (1 - EPS)
    tight = (share <= mine) & full[lid]  # a full link on which the flow gets its share
    if np.bincount(fid, weights=tight, minlength=nf).all():  # every flow has one
        return first
    rates = np.zeros(nf)
    left = capacity.astype(float).copy()
    active = np.ones(nf, dtype=bool)
    on = np.ones(len(fid), dtype=bool)
    level = 0.0
    while True:
        users = np.bincount(lid[on], minlength=nl)
        used = users > 0
        share = np.divide(left, users, out=np.full(nl, np.inf), where=used)
        inc = share.min()
        if not math.isfinite(inc):  # else the loop never ends: no link freezes what is left
            raise ValueError("progressive filling over a flow of no links, or of no link of "
                             "finite capacity")
        level += inc
        left -= inc * users
        full = used & (left <= EPS * capacity)
        hit = np.zeros(nf, dtype=bool)
        hit[fid[on & full[lid]]] = True
        hit &= active
        rates[hit] = level
        active &= ~hit
        if not active.any():
            return rates
        on = active[fid]


def _out_of_range(what: str) -> str:
    return (f"the simulation reached {what}: a time, size or rate it was given is not finite "
            "or so large that the simulated time overflows")


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


def check_recordable(messages: int) -> None:
    """Refuse a timeline of more than :data:`MAX_RECORDED` messages, in one line."""
    if messages > MAX_RECORDED:
        raise GradwireError(f"a timeline holds at most {MAX_RECORDED:,} messages, and this run "
                            f"sends more (a ring on W workers sends 2(W-1)W a bucket): record "
                            f"fewer workers, iterations or buckets")


def check_replayable(messages: int, most: int | None = None, rate: int = REPLAY_RATE,
                     fewer: str = "fewer workers or iterations, or larger buckets (bucket=)"
                     ) -> None:
    """Refuse a run of more than ``most`` messages (default :data:`MAX_REPLAYED`) replayed one
    by one at about ``rate`` a second, in one line saying what to make ``fewer``, rather than
    run for hours."""
    most = MAX_REPLAYED if most is None else min(most, MAX_REPLAYED)
    if messages > most:
        raise GradwireError(f"this mechanism is replayed message by message, about {rate:,} "
                            f"a second, and this run sends more than {most:,}: simulate "
                            f"{fewer}")


class Engine:
    """Timers and flows on a :class:`Network`; ``run()`` until nothing is left to happen.

    ``record`` keeps (label, links, start, end, bytes) of every finished flow for timelines;
    ``carried`` counts the bytes each link has carried, for utilisation.
    """

    def __init__(self, net: Network, record: bool = False) -> None:
        self.net = net
        self.now = 0.0
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._flows: list[Flow] = []  # in flight, aligned with _rem and _rates
        self._new: list[Flow] = []  # started since the last allocation
        self._rem = np.zeros(0)
        self._rates = np.zeros(0)
        self._lens = np.zeros(0, dtype=np.int64)  # links of each flow in flight
        self._lid = np.zeros(0, dtype=np.int64)  # those links, flow after flow
        self._seq = 0
        self.record = record
        self.log: list[tuple[str, tuple[int, ...], float, float, float]] = []
        self.finished = 0  # flows
        self.carried = np.zeros(len(net.capacity))
        # A flow's rate is at least the least capacity over the link uses in flight (len(_lid):
        # progressive filling starts every flow at the least capacity / users), so while those
        # are no more than the least capacity, every rate is 1 byte/s or more and bytes / rate
        # is finite: run() divides without np.errstate (2 µs an event, 4 times the division).
        self._quiet_uses = float(net.capacity.min(initial=np.inf))

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` at time ``t`` (no earlier than now). A time that is not finite is an
        error: a NaN never compares due, so the loop would wait on it for ever, and an infinite
        one would end the run with work left undone."""
        if not math.isfinite(t):
            raise GradwireError(_out_of_range(f"an event at {float(t)} s"))
        self._seq += 1
        heapq.heappush(self._timers, (max(t, self.now), self._seq, fn))

    def send(self, links: Sequence[int], nbytes: float, done: Callable[[float], None],
             label: str = "", latency: float = 0.0) -> None:
        """Start a flow of ``nbytes`` over ``links`` after ``latency``; ``done(t)`` when the
        last byte arrives — never inside this call: a flow of no bytes and no latency is done
        at this time, but as an event of its own (called back from here, a chain of them
        recursed once per message)."""
        if not (math.isfinite(nbytes) and math.isfinite(latency)):
            raise GradwireError(_out_of_range(f"a flow of {float(nbytes)} bytes after "
                                              f"{float(latency)} s"))

        def start() -> None:
            self._seq += 1
            f = Flow(tuple(links), float(nbytes), done, self._seq, label, self.now, float(nbytes))
            if nbytes <= 0:
                self._finish(f)
            else:
                self._new.append(f)

        if latency > 0 or nbytes <= 0:
            self.at(self.now + max(latency, 0.0), start)
        else:
            start()

    def unicast(self, src: int, dst: int, nbytes: float, done: Callable[[float], None],
                label: str = "") -> None:
        lat = float(self.net.latency[src] + self.net.latency[dst])
        self.send((self.net.up(src), self.net.down(dst)), nbytes, done, label, lat)

    def _finish(self, f: Flow) -> None:
        self.carried[list(f.links)] += f.size
        self.finished += 1
        check_replayable(self.finished)  # a bound where none was checked before the run
        if self.record:
            check_recordable(len(self.log) + 1)
            self.log.append((f.label, f.links, f.started, self.now, f.size))
        f.done(self.now)

    def _allocate(self, gone: np.ndarray | None) -> None:
        """Drop finished flows (``gone`` True), add new ones, and share the links again."""
        if gone is not None:
            for k in reversed(gone.nonzero()[0].tolist()):
                del self._flows[k]
            keep = ~gone
            self._rem = self._rem[keep]
            self._lid = self._lid[keep.repeat(self._lens)]
            self._lens = self._lens[keep]
        if self._new:
            self._flows += self._new
            self._rem = np.concatenate([self._rem, [f.size for f in self._new]])
            self._lens = np.concatenate([self._lens, [len(f.links) for f in self._new]])
            self._lid = np.concatenate([self._lid, [lk for f in self._new for lk in f.links]])
            self._lid = self._lid.astype(np.int64, copy=False)
            self._lens = self._lens.astype(np.int64, copy=False)
            self._new = []
        self._rates = _fill(self._lens, self._lid, self.net.capacity)

    def run(self, until: float = float("inf")) -> float:
        """Process events up to ``until``; returns the time of the last one."""
        gone: np.ndarray | None = None
        dirty = True
        while self._timers or self._flows or self._new:
            if dirty or self._new:
                self._allocate(gone)
                gone, dirty = None, False
            eta = np.inf
            if self._flows:
                if len(self._lid) <= self._quiet_uses:  # every rate 1 byte/s or more
                    etas = self._rem / self._rates
                else:  # a rate of 0, or bytes / rate past the largest float: inf, see below
                    with np.errstate(divide="ignore", over="ignore"):
                        etas = self._rem / self._rates
                eta = float(np.minimum.reduce(etas))
            t_flow = self.now + eta
            t_timer = self._timers[0][0] if self._timers else np.inf
            t = min(t_flow, t_timer)
            if t == np.inf and self._flows:
                # flows left that never end (a rate of 0 from a bandwidth that underflows, or
                # bytes / rate past the largest float): not a run that finished
                k = int(np.argmax(etas))
                raise GradwireError(_out_of_range(
                    f"a flow of {self._rem[k]:g} bytes at {self._rates[k]:g} bytes/s that "
                    "never ends"))
            if t > until or t == np.inf:
                break
            if self._flows:
                self._rem -= self._rates * (t - self.now)
            self.now = t
            if t_flow <= t_timer * (1 + EPS):
                finished = self._rem <= self._rates * (EPS * max(t, 1e-9))
                done = finished.nonzero()[0]
                if len(done):
                    gone, dirty = finished, True
                    for k in done.tolist():
                        self._finish(self._flows[k])
                    continue
            while self._timers and self._timers[0][0] <= self.now:
                _, _, fn = heapq.heappop(self._timers)
                fn()
        return self.now
