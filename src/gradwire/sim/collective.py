"""Host-based aggregation: any library collective (ring-reduce, butterfly mixing, …) and any
compressor, with DDP-style bucketing — replayed from the schedules, never re-implemented.

Each worker, each iteration (§3.2: no pipelining of the forward pass with distribution):
1. forward: starts when the worker holds the whole model (its last collective of the previous
   iteration is done) and lasts its traced ``forward_s``;
2. backward: gradient i is ready at its traced time after the forward pass;
3. buckets: gradients are packed in the order they become ready into buckets of at most
   ``bucket_bytes`` (0: one bucket per parameter, the paper's ring-reduce "with messaging",
   every parameter split evenly over the workers by the schedule); a bucket's collective starts
   on a rank when its last gradient is ready, FIFO on the rank's one send port.
Dense buckets use the allreduce schedule of ``algo`` on the bucket's bytes; a compressor sends
``wire_bytes`` instead: an allreduce when it is associative, else an allgather of every rank's
payload. A ring (every rank one peer) is computed by :func:`~gradwire.sim.replay.dataflow`,
anything else by :class:`~gradwire.sim.replay.Replay` in the event engine.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.schedules.ir import blocks
from gradwire.sim.cluster import SimCluster, SimResult, choices, finish
from gradwire.sim.engine import Engine, Network
from gradwire.sim.replay import Replay, dataflow, single_peer, step_arrays
from gradwire.sim.trace import Trace


@dataclass(frozen=True)
class CollectiveOptions:
    algo: str = "ring"
    bucket_bytes: int = 0
    compressor: str | None = None
    compressor_params: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)  # the schedule's own (pipeline=, block=, ...)
    multicast: bool = False  # ring+multicast: the second ring is IP multicast


def buckets(trace: Trace, bucket_bytes: int) -> list[list[int]]:
    """Parameters in the order their gradients become ready, packed into buckets of at most
    ``bucket_bytes`` (a parameter larger than that gets a bucket of its own)."""
    out: list[list[int]] = []
    size = 0
    for i in trace.backward_order():
        n = trace.params[i].bytes
        if out and size + n <= bucket_bytes:
            out[-1].append(i)
            size += n
        else:
            out.append([i])
            size = n
    return out


def bucket_spec(nbytes: int, p: int, o: CollectiveOptions) -> tuple[str, str | None, int, dict]:
    """(collective, algorithm, count, params) of the schedule that moves one bucket of
    ``nbytes``: counted in float32 elements when ``nbytes`` is a multiple of 4 (so blocks split
    where they split a real gradient's), else in bytes; ``params["itemsize"]`` says which."""
    if o.compressor is None:
        item = 4 if nbytes % 4 == 0 else 1
        return "allreduce", o.algo, nbytes // item, {**o.params, "itemsize": item}
    import torch

    from gradwire import compress

    comp = compress.get(o.compressor, **o.compressor_params)
    wire = comp.wire_bytes(max(nbytes // 4, 1), torch.float32)
    if comp.associative:
        return "allreduce", o.algo, wire, {"itemsize": 1, **o.params}
    algo = o.algo if o.algo in [a.name for a in registry.algorithms("allgather")] else None
    return "allgather", algo, p * wire, {"itemsize": 1}


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Millions of small transfers (a ring at P = 1024 has 2 M) trigger the cyclic collector
    over and over; none of them is in a cycle. Measured: 5.0 s → 3.1 s for that ring."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _start(trace: Trace, groups: list[list[int]], pick: np.ndarray, eng: Engine,
           timeline: list[dict] | None, replay: Replay, it: int, r: int) -> None:
    """Rank r begins iteration ``it`` now: its forward pass, then each bucket is ready for
    ``replay`` when its last gradient is (collective ``it·buckets + b``)."""
    rec = trace.iterations[pick[r, it]]
    t0 = eng.now
    if timeline is not None:
        timeline.append({"name": f"forward {it}", "ph": "X", "pid": r, "tid": 0,
                         "ts": t0 * 1e6, "dur": rec.forward_s * 1e6})
        timeline.append({"name": f"backward {it}", "ph": "X", "pid": r, "tid": 0,
                         "ts": (t0 + rec.forward_s) * 1e6, "dur": rec.backward_s * 1e6})
    for b, g in enumerate(groups):
        t = t0 + rec.forward_s + max(rec.backward[i] for i in g)
        eng.at(t, lambda b=b: replay.ready(it * len(groups) + b, r))


def _run(replay: Replay, scheds: list, specs: list, iterations: int,
         start_iteration: Callable[[int, int], None], left: np.ndarray, name: str) -> float:
    """Queue every bucket's schedule for every iteration, start iteration 0 on every rank, run
    the engine; ``left`` (buckets unfinished per iteration and rank) must end all zero."""
    for it in range(iterations):
        for b, s in enumerate(scheds):
            replay.add(s, f"bucket {b} iter {it}", specs[b][3]["itemsize"])
    for r in range(len(replay.hosts)):
        replay.eng.at(0.0, lambda r=r: start_iteration(0, r))
    end = replay.eng.run()
    if left.any():
        raise GradwireError(f"{name}: replay stopped with buckets unfinished (a deadlock: "
                            "report this)")
    return end


def simulate_collective(trace: Trace, c: SimCluster, o: CollectiveOptions, name: str = "ring",
                        record: bool = False, fast: bool = True) -> SimResult:
    """Run ``c.iterations`` iterations of host-based aggregation ``o`` on ``c.workers`` hosts."""
    p = c.workers
    groups = buckets(trace, o.bucket_bytes)
    specs = [bucket_spec(sum(trace.params[i].bytes for i in g), p, o) for g in groups]
    pick = choices(c, len(trace.iterations))
    net = Network.uniform(p, c.bytes_per_s, c.latency)
    compute = [it.forward_s + it.backward_s for it in trace.iterations]
    mean_compute = float(np.mean([compute[k] for k in pick.ravel()]))
    hosts = list(range(p))

    def ready_times(it: int, start: np.ndarray) -> np.ndarray:
        """[bucket, rank] ready times of iteration ``it`` for forward starts ``start``."""
        out = np.empty((len(groups), p))
        for r in range(p):
            rec = trace.iterations[pick[r, it]]
            b0 = start[r] + rec.forward_s
            out[:, r] = [b0 + max(rec.backward[i] for i in g) for g in groups]
        return out

    if fast and not record:
        with _no_gc():
            tables = [registry.table(coll, algo, p, n, **kw) for coll, algo, n, kw in specs]
        if single_peer(tables):
            eng = Engine(net)
            compiled = {id(t): step_arrays(t, kw["itemsize"])  # equal sizes share a table
                        for t, (_, _, _, kw) in zip(tables, specs, strict=True)}
            arrays = [compiled[id(t)] for t in tables]
            start, port, ends = np.zeros(p), None, []
            for it in range(c.iterations):
                done, port = dataflow(arrays, ready_times(it, start), net, hosts, c.alpha,
                                      c.gamma, port, eng.carried)
                start = done.max(axis=0)
                ends.append(float(start.max()))
            return finish(name, ends, mean_compute, eng, p, ends[-1], [])

    with _no_gc():
        scheds = [registry.schedule(coll, algo, p, n, **kw) for coll, algo, n, kw in specs]
    eng = Engine(net, record)
    timeline: list[dict] = []
    left = np.zeros((c.iterations, p), dtype=np.int64)
    ends = [0.0] * c.iterations

    def start_iteration(it: int, r: int) -> None:
        _start(trace, groups, pick, eng, timeline if record else None, replay, it, r)

    def done(ci: int, r: int, t: float) -> None:
        it = ci // len(groups)
        left[it, r] -= 1
        if left[it, r] == 0:
            ends[it] = max(ends[it], t)
            if it + 1 < c.iterations:
                start_iteration(it + 1, r)

    replay = Replay(eng, hosts, 1, c.alpha, c.gamma, done)
    left[:] = len(scheds)
    end = _run(replay, scheds, specs, c.iterations, start_iteration, left, name)
    return finish(name, ends, mean_compute, eng, p, end, timeline)



def simulate_ring_multicast(trace: Trace, c: SimCluster, o: CollectiveOptions,
                            name: str = "ring+multicast", record: bool = False) -> SimResult:
    """Ring-reduce whose second ring is IP multicast (the network-operator paper §8.3, Table
    6's middle column): each bucket is reduce-scattered by the library's ring schedule; as soon
    as a rank holds its reduced block it multicasts it to every other worker (one flow over its
    up link and their down links); a rank has the bucket when its own reduce-scatter is done
    and the P − 1 other blocks have arrived. Iterations as in :func:`simulate_collective`."""
    p = c.workers
    groups = buckets(trace, o.bucket_bytes)
    specs = [bucket_spec(sum(trace.params[i].bytes for i in g), p, o) for g in groups]
    with _no_gc():
        scheds = [registry.schedule("reducescatter", "ring", p, n, **kw)
                  for _, _, n, kw in specs]
    block = [[size * kw["itemsize"] for _, size in blocks(n, p)] for _, _, n, kw in specs]
    pick = choices(c, len(trace.iterations))
    net = Network.uniform(p, c.bytes_per_s, c.latency)
    eng = Engine(net, record)
    compute = [it.forward_s + it.backward_s for it in trace.iterations]
    mean_compute = float(np.mean([compute[k] for k in pick.ravel()]))
    nb = len(groups)
    scattered = np.zeros((c.iterations * nb, p), dtype=bool)
    arrived = np.zeros((c.iterations * nb, p), dtype=np.int64)
    left = np.full((c.iterations, p), nb, dtype=np.int64)
    ends = [0.0] * c.iterations
    timeline: list[dict] = []

    def start_iteration(it: int, r: int) -> None:
        _start(trace, groups, pick, eng, timeline if record else None, replay, it, r)

    def check(ci: int, r: int) -> None:
        if scattered[ci, r] and arrived[ci, r] == p - 1:
            arrived[ci, r] = -1  # reported
            it = ci // nb
            left[it, r] -= 1
            if left[it, r] == 0:
                ends[it] = max(ends[it], eng.now)
                if it + 1 < c.iterations:
                    start_iteration(it + 1, r)

    def multicast_in(ci: int, src: int) -> None:
        for x in range(p):
            if x != src:
                arrived[ci, x] += 1
                check(ci, x)

    def done(ci: int, r: int, t: float) -> None:
        scattered[ci, r] = True
        if p > 1:
            links = (net.up(r), *(net.down(x) for x in range(p) if x != r))
            lat = float(net.latency[r] + net.latency.max())
            eng.send(links, block[ci % nb][r], lambda t: multicast_in(ci, r),
                     f"multicast {ci % nb} iter {ci // nb}", lat + c.alpha)
        check(ci, r)

    replay = Replay(eng, list(range(p)), 1, c.alpha, c.gamma, done)
    end = _run(replay, scheds, specs, c.iterations, start_iteration, left, name)
    return finish(name, ends, mean_compute, eng, p, end, timeline)
