"""Parameter servers, as the network-operator paper simulates them (§3, §5, §8.1, §9), with the
fabric mechanisms: IP multicast for distribution, in-network aggregation at the switch.

Hosts 0 … W−1 are workers, W … W+S−1 dedicated servers. One iteration:
1. distribution: each server sends its parameters to every worker, one message at a time:
   ``order="roundrobin"`` sends parameter 1 to worker 0, 1, …, then parameter 2 (TensorFlow,
   §9.4); ``order="block"`` sends worker 0 everything, then worker 1; ``multicast`` sends each
   parameter once to all workers (one flow over the server's up link and every worker's down
   link);
2. forward: a worker uses parameter i at its traced time, but not before it has arrived
   (forward pipelined with distribution, §3.2);
3. backward: gradient i is ready at its traced time after the forward pass ends; the worker
   queues its pieces (one per server holding part of it) on its one send port, FIFO;
4. aggregation: a server has parameter i when all W pieces arrived and it has added each
   to the sum (the cluster's γ per byte, one push after another); with ``ina`` the switch
   sums the W pieces (each crosses only the worker's up link) and sends one to the server.
With ``barrier`` the next distribution starts when every server has everything (synchronous
training, §3.3.1); without it a server forwards each parameter as soon as it is aggregated
(§9.3). Placement: ``sharding="tensor"`` puts parameter i whole on server i mod S (TensorFlow's
round-robin by tensor, §9.1), ``"even"`` splits every parameter into S equal pieces.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gradwire.errors import GradwireError
from gradwire.schedules.ir import blocks
from gradwire.sim.cluster import SimCluster, SimResult, choices, finish, steady_compute
from gradwire.sim.engine import (
    MAX_PS_REPLAYED,
    PS_REPLAY_RATE,
    Engine,
    Network,
    check_recordable,
    check_replayable,
)
from gradwire.sim.trace import Trace

ORDERS = ("roundrobin", "block")
SHARDINGS = ("tensor", "even")


@dataclass(frozen=True)
class PSOptions:
    multicast: bool = False
    ina: bool = False
    barrier: bool = True
    order: str = "roundrobin"
    sharding: str = "tensor"

    def __post_init__(self) -> None:
        # The mechanism's text is checked in gradwire.sim.mechanisms (barrier=on|off); options
        # built in Python are checked here: a truthy "off" would run with the barrier on.
        for name in ("multicast", "ina", "barrier"):
            if not isinstance(getattr(self, name), bool):
                raise GradwireError(f"{name} must be True or False, got "
                                    f"{getattr(self, name)!r}")
        if self.order not in ORDERS:
            raise GradwireError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.sharding not in SHARDINGS:
            raise GradwireError(f"sharding must be one of {', '.join(SHARDINGS)}, got "
                                f"{self.sharding!r}")
        if self.multicast and self.order != "roundrobin":
            # distribution(): one multicast per parameter, whatever the order
            raise GradwireError(f"order={self.order} is not taken with multicast: it sends "
                                "each parameter once to every worker (order is the unicast "
                                "distribution's)")
        if self.order == "block" and not self.barrier:
            raise GradwireError("block distribution needs the barrier (without it each "
                                "parameter is forwarded as soon as it is aggregated)")


def pieces(trace: Trace, servers: int, sharding: str) -> list[tuple[int, int, int]]:
    """(param, server, bytes) of every piece, in forward order: every parameter has at least
    one (a parameter of no bytes one of 0 bytes on server 0, as ``tensor`` gives it; without a
    piece its worker would wait for it for ever)."""
    if sharding == "tensor":
        return [(i, i % servers, p.bytes) for i, p in enumerate(trace.params)]
    return [(i, s, n) for i, p in enumerate(trace.params)
            for s, (_, n) in enumerate(blocks(p.bytes, servers)) if n > 0 or s == 0]


def flows(trace: Trace, c: SimCluster, o: PSOptions) -> int:
    """The flows a run of ``o`` on ``c`` makes the engine replay, counted without building
    :func:`pieces` (an even split of large parameters over thousands of servers is hundreds of
    millions): every iteration, each piece's distribution (one multicast, or one message per
    worker) and every worker's push of it, and with ``ina`` the switch's sum; a message whose
    tail waits in the send buffer is two flows (:meth:`_PS.transmit`)."""
    w, s = c.workers, c.servers
    per = 0
    for p in trace.params:
        n = p.bytes
        if o.sharding == "tensor" or n < 1:
            counts = [(1, n)]  # (pieces, bytes of each)
        else:
            q, r = divmod(n, s)
            counts = [(r, q + 1), (s - r, q)] if q else [(r, 1)]
        for k, size in counts:
            split = 2 if min(c.send_buffer, size) > 0 else 1
            per += k * (((1 if o.multicast else w) + w) * split + (1 if o.ina else 0))
    return per * c.iterations


def check_flows(trace: Trace, c: SimCluster, o: PSOptions, record: bool = False) -> None:
    """Refuse, before it starts, a run with more flows than the engine replays in some
    minutes (:data:`~gradwire.sim.engine.MAX_PS_REPLAYED`) or a timeline holds."""
    n = flows(trace, c, o)
    check_replayable(n, MAX_PS_REPLAYED, PS_REPLAY_RATE,
                     "fewer workers or iterations (or, with sharding=even, fewer servers)")
    if record:
        check_recordable(n)


def distribution(mine: list[int], workers: int, o: PSOptions) -> list[tuple[int, int | None]]:
    """(piece, worker) in the order a server sends its pieces ``mine``; worker None: one
    multicast to all."""
    if o.multicast:
        return [(k, None) for k in mine]
    if o.order == "roundrobin":
        return [(k, w) for k in mine for w in range(workers)]
    return [(k, w) for w in range(workers) for k in mine]


class _PS:
    def __init__(self, trace: Trace, c: SimCluster, o: PSOptions, record: bool) -> None:
        self.t, self.c, self.o = trace, c, o
        w, s = c.workers, c.servers
        self.net = Network.uniform(w + s, c.bytes_per_s, c.latency)
        self.eng = Engine(self.net, record)
        self.pieces = pieces(trace, s, o.sharding)
        self.of_param = [[] for _ in trace.params]
        for k, (i, _, _) in enumerate(self.pieces):
            self.of_param[i].append(k)
        self.pick = choices(c, len(trace.iterations))
        n = len(trace.params)
        self.arrived = np.full((w, n), np.nan)  # arrival of the current iteration's params
        self.missing = np.zeros((w, n), dtype=np.int64)
        self.next_fwd = [0] * w
        self.last_use = [0.0] * w
        self.compute_free = [0.0] * w
        self.iter_of = [0] * w
        self.queue: list[deque] = [deque() for _ in range(w)]
        self.busy = [False] * w
        self.server_q: list[deque] = [deque() for _ in range(s)]
        self.prepared = [0.0] * (w + s)  # when each host's CPU has readied its last message
        self.server_busy = [False] * s
        self.count: dict[tuple[int, int], int] = {}
        # per piece with ina: pushes begun, and when the latest first byte is at the switch
        self.started: dict[tuple[int, int], tuple[int, float]] = {}
        self.reducer_free = [0.0] * s  # when each server's sums of earlier pushes are done
        self.left: dict[int, int] = {}
        self.ends: list[float] = []
        self.timeline: list[dict] = []

    def overhead(self, host: int, queued: float) -> float:
        """Seconds from now until the next message of ``host``, queued at ``queued``, can
        start: the sender spends α on each message, one after another, while earlier
        messages' bytes are still on the wire (they wait in the socket's buffer), so a stream
        costs max(α, transfer) per message, not the sum; a lone message pays α."""
        self.prepared[host] = max(self.prepared[host], queued) + self.c.alpha
        return max(self.prepared[host] - self.eng.now, 0.0)

    def transmit(self, links: tuple[int, ...], nbytes: int, label: str, delay: float,
                 freed: Callable[[], None], arrived: Callable[[], None]) -> None:
        """Send one message after ``delay``: the sender's port is busy until all but its last
        ``send_buffer`` bytes have left (the rest waits in the socket's buffer and flows on
        its own while the port starts the next message); ``arrived()`` when the last byte is
        in. With no buffer the port is busy for the whole message."""
        tail = min(self.c.send_buffer, nbytes)

        def head_done(t: float) -> None:
            if tail == 0:
                arrived()
                freed()
                return
            self.eng.send(links, tail, lambda t: arrived(), label)
            freed()

        self.eng.send(links, nbytes - tail, head_done, label, delay)

    # -- distribution
    def distribute(self, it: int, ks: list[int]) -> None:
        """Queue pieces ``ks`` of iteration ``it`` at their servers, in the chosen order."""
        # grouped in one pass: a scan of every piece per server took 30 s at 4096 servers
        mine: dict[int, list[int]] = {}
        for k in ks:
            mine.setdefault(self.pieces[k][1], []).append(k)
        for s in sorted(mine):
            self.server_q[s].extend((it, k, w, self.eng.now) for k, w in
                                    distribution(mine[s], self.c.workers, self.o))
            self.pump_server(s)

    def pump_server(self, s: int) -> None:
        if self.server_busy[s] or not self.server_q[s]:
            return
        it, k, w, queued = self.server_q[s].popleft()
        self.server_busy[s] = True
        host = self.c.workers + s
        cpu = self.overhead(host, queued)
        nbytes = self.pieces[k][2]
        label = f"param {self.pieces[k][0]} iter {it}"

        def arrived() -> None:
            for dst in (range(self.c.workers) if w is None else (w,)):
                self.piece_arrived(dst, it, k)

        def freed() -> None:
            self.server_busy[s] = False
            self.pump_server(s)

        if w is None:
            links = (self.net.up(host), *(self.net.down(x) for x in range(self.c.workers)))
            lat = float(self.net.latency[host] + self.net.latency[: self.c.workers].max())
        else:
            links = (self.net.up(host), self.net.down(w))
            lat = float(self.net.latency[host] + self.net.latency[w])
        self.transmit(links, nbytes, label, lat + cpu, freed, arrived)

    # -- workers
    def piece_arrived(self, w: int, it: int, k: int) -> None:
        i = self.pieces[k][0]
        if self.missing[w, i] == 0:  # first piece of this parameter in a new iteration
            self.missing[w, i] = len(self.of_param[i])
        self.missing[w, i] -= 1
        if self.missing[w, i] == 0:
            self.arrived[w, i] = self.eng.now
            self.forward(w)

    def forward(self, w: int) -> None:
        """Advance worker w's forward pass over every parameter that has arrived."""
        it = self.iter_of[w]
        rec = self.t.iterations[self.pick[w, it]]
        n = len(self.t.params)
        k = self.next_fwd[w]
        while k < n and not np.isnan(self.arrived[w, k]):
            gap = rec.forward[k] - (rec.forward[k - 1] if k else 0.0)
            base = self.last_use[w] if k else self.compute_free[w]
            self.last_use[w] = max(self.arrived[w, k], base + gap)
            self.arrived[w, k] = np.nan
            k += 1
        self.next_fwd[w] = k
        if k < n:
            return
        start = self.compute_free[w]
        bstart = self.last_use[w] + rec.forward_s - (rec.forward[-1] if n else 0.0)
        if self.eng.record:
            self.timeline.append({"name": f"forward {it}", "ph": "X", "pid": w, "tid": 0,
                                  "ts": start * 1e6, "dur": (bstart - start) * 1e6})
            self.timeline.append({"name": f"backward {it}", "ph": "X", "pid": w, "tid": 0,
                                  "ts": bstart * 1e6, "dur": rec.backward_s * 1e6})
        self.compute_free[w] = bstart + rec.backward_s
        self.next_fwd[w] = 0
        self.iter_of[w] = it + 1
        for i in rec.ready_order():
            self.eng.at(bstart + rec.backward[i], lambda i=i: self.grad_ready(w, it, i))

    def grad_ready(self, w: int, it: int, i: int) -> None:
        self.queue[w].extend((it, k, self.eng.now) for k in self.of_param[i])
        self.pump_worker(w)

    def pump_worker(self, w: int) -> None:
        if self.busy[w] or not self.queue[w]:
            return
        it, k, queued = self.queue[w].popleft()
        self.busy[w] = True
        cpu = self.overhead(w, queued)
        _, s, nbytes = self.pieces[k]
        host = self.c.workers + s

        def freed() -> None:
            self.busy[w] = False
            self.pump_worker(w)

        label = f"grad {self.pieces[k][0]} iter {it}"
        if self.o.ina:  # to the switch only
            links, lat = (self.net.up(w),), float(self.net.latency[w])
            self.ina_started(it, k, self.eng.now + cpu + lat)
        else:
            links = (self.net.up(w), self.net.down(host))
            lat = float(self.net.latency[w] + self.net.latency[host])
        landed = self.push_arrived if self.o.ina else self.combine
        self.transmit(links, nbytes, label, lat + cpu, freed, lambda: landed(it, k))

    # -- aggregation
    def ina_started(self, it: int, k: int, first_byte: float) -> None:
        """The switch streams the sum to the server as the slowest contribution arrives (cut
        through): the sum's flow on the server's down link starts when the last worker's first
        byte of the piece is at the switch (``first_byte``: after that worker's α and its own
        latency) and pays the server's latency from there, as a unicast of the piece through
        the switch would; the piece is in when both that flow and every worker's are."""
        key = (it, k)
        count, last = self.started.get(key, (0, 0.0))
        count, last = count + 1, max(last, first_byte)
        if count < self.c.workers:
            self.started[key] = (count, last)
            return
        self.started.pop(key, None)
        host = self.c.workers + self.pieces[k][1]
        self.eng.send((self.net.down(host),), self.pieces[k][2], lambda t: self.push_arrived(it, k),
                      f"ina {self.pieces[k][0]}",
                      last - self.eng.now + float(self.net.latency[host]))

    def combine(self, it: int, k: int) -> None:
        """A worker's push of piece k is in at its server, which adds it to the sum: γ per
        byte on the server's one reducer, one push after another (the cluster's γ, as every
        mechanism's receiver pays it; with ``ina`` the switch sums at line rate instead)."""
        s = self.pieces[k][1]
        if self.c.gamma <= 0:
            self.push_arrived(it, k)
            return
        t = max(self.eng.now, self.reducer_free[s]) + self.c.gamma * self.pieces[k][2]
        self.reducer_free[s] = t
        self.eng.at(t, lambda: self.push_arrived(it, k))

    def push_arrived(self, it: int, k: int) -> None:
        """One of the W pushes of piece k (with ina: W + 1, the sum's own flow) is in."""
        key = (it, k)
        self.count[key] = self.count.get(key, 0) + 1
        if self.count[key] < self.c.workers + (1 if self.o.ina else 0):
            return
        del self.count[key]
        self.aggregated(it, k)

    def aggregated(self, it: int, k: int) -> None:
        self.left[it] = self.left.get(it, len(self.pieces)) - 1
        if not self.o.barrier and it + 1 < self.c.iterations:
            self.distribute(it + 1, [k])
        if self.left[it] == 0:
            self.ends.append(self.eng.now)
            if self.o.barrier and it + 1 < self.c.iterations:
                self.distribute(it + 1, list(range(len(self.pieces))))


def simulate_ps(trace: Trace, c: SimCluster, o: PSOptions, name: str = "ps",
                record: bool = False) -> SimResult:
    """Run ``c.iterations`` iterations of the parameter-server mechanism ``o``."""
    check_flows(trace, c, o, record)
    sim = _PS(trace, c, o, record)
    sim.distribute(0, list(range(len(sim.pieces))))
    end = sim.eng.run()
    if len(sim.ends) != c.iterations:
        raise GradwireError(f"{name}: simulation stopped after {len(sim.ends)} of "
                            f"{c.iterations} iterations (a deadlock: report this)")
    return finish(name, sim.ends, steady_compute(trace, sim.pick), sim.eng, c.workers, end,
                  sim.timeline)
