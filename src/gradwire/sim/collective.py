"""Host-based aggregation: any library collective (ring-reduce, butterfly mixing, …) and any
compressor, with gradients fused into buckets — replayed from the schedules, never re-implemented.

Each worker, each iteration (§3.2: no pipelining of the forward pass with distribution):
1. forward: starts when the worker holds the whole model (its last collective of the previous
   iteration is done) and lasts its traced ``forward_s``;
2. backward: gradient i is ready at its traced time after the forward pass;
3. buckets: gradients are packed in the order they become ready into buckets of at most
   ``bucket_bytes``, as Horovod's tensor fusion packs them (DDP instead closes a bucket once
   it reaches its cap, as :mod:`gradwire.perf.model` prices it); 0: one bucket per parameter,
   the paper's ring-reduce "with messaging", every parameter split evenly over the workers by
   the schedule. A bucket's collective starts on a rank when its last gradient is ready, FIFO
   on the rank's one send port.
Dense buckets use the allreduce schedule of ``algo`` on the bucket's bytes; a compressed one
runs what :mod:`gradwire.catalogue` says its method sends (PowerSGD: two allreduces, each
weight its own matrix where the trace gives every shape in the bucket; top-k:
the recursive-doubling allgather of packed entries; gTop-k: the butterfly with the ⊤ merge), the
allreduces on ``algo``, chained into one schedule per bucket. A ring (every rank one peer)
is computed by :func:`~gradwire.sim.replay.dataflow`,
anything else by :class:`~gradwire.sim.replay.Replay` in the event engine.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from gradwire.check import is_int
from gradwire.errors import GradwireError, did_you_mean
from gradwire.schedules import registry
from gradwire.schedules.ir import Schedule, Step, Table, blocks, chain, split
from gradwire.sim.cluster import SimCluster, SimResult, choices, finish, steady_compute
from gradwire.sim.engine import Engine, Network, check_recordable, check_replayable
from gradwire.sim.replay import Peers, Replay, dataflow, step_arrays
from gradwire.sim.trace import Trace

Shapes = tuple[tuple[int, ...], ...]  # as gradwire.catalogue.Shapes (no torch import here)


@dataclass(frozen=True)
class CollectiveOptions:
    algo: str = "ring"
    bucket_bytes: int = 0
    # an aggregation method of gradwire.catalogue (None: the dense allreduce of ``algo``) and
    # its parameters (density=, rank=, ...)
    compressor: str | None = None
    compressor_params: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)  # the schedule's own (pipeline=, block=, ...)
    multicast: bool = False  # ring+multicast: the second ring is IP multicast

    def __post_init__(self) -> None:
        """Every option checked when made, built in Python or parsed from a mechanism's text
        (:mod:`gradwire.sim.mechanisms`): a one-line error here, not a TypeError in a run."""
        if not is_int(self.bucket_bytes, 0):
            raise GradwireError(f"bucket_bytes must be bytes >= 0 (an integer; 0: one bucket "
                                f"per parameter), got {self.bucket_bytes!r}")
        if not isinstance(self.multicast, bool):
            raise GradwireError(f"multicast must be True or False, got {self.multicast!r}")
        for name in ("compressor_params", "params"):
            if not isinstance(getattr(self, name), dict):
                raise GradwireError(f"{name} must be a dict of options, got "
                                    f"{getattr(self, name)!r}")
        if "itemsize" in self.params:  # bucket_spec would replace it, silently
            raise GradwireError(f"option 'itemsize' is not taken: the simulator counts a "
                                f"bucket in its own elements (bytes where its size is no "
                                f"multiple of them), got itemsize={self.params['itemsize']!r}")
        if self.compressor is None and self.compressor_params:  # no compressor to take them
            raise GradwireError(f"compressor_params are a compressor's options: give "
                                f"compressor too, got compressor_params="
                                f"{self.compressor_params!r} and no compressor")
        if self.multicast:
            check_ring_multicast(self)
            registry.schedule("reducescatter", "ring", 2, 2, **self.params)
        elif self.compressor is None:
            registry.schedule("allreduce", self.algo, 2, 2, **self.params)
        else:
            from gradwire.catalogue import METHODS

            registry.get("allreduce", self.algo)  # raises naming the known ones
            if not isinstance(self.compressor, str) or self.compressor not in METHODS:
                raise GradwireError(f"unknown compressor {self.compressor!r}"
                                    f"{did_you_mean(str(self.compressor), METHODS)}: expected "
                                    f"an aggregation method, one of {', '.join(METHODS)}")
            if self.params:  # a compressed bucket runs the method's calls, not these
                raise GradwireError(f"params (the dense allreduce's) are not taken with "
                                    f"compressor {self.compressor!r}: give its options in "
                                    f"compressor_params, got params={self.params!r}")
            METHODS[self.compressor].compressor_from(self.compressor_params)


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


# Bytes per element → the float dtype a compressed bucket is priced in (torch's name).
FLOAT_ITEMSIZES = {2: "float16", 4: "float32", 8: "float64"}


def bucket_itemsize(trace: Trace, group: list[int]) -> int:
    """Bytes per element of the bucket ``group``'s gradients: bytes / elements of its tensors'
    shapes, where every one has a shape and all agree on a float's size (a DDP bucket holds
    one dtype: 2 for an fp16 or bf16 trace); else 4 (the trace does not say: float32)."""
    sizes = set()
    for i in group:
        shape = trace.params[i].shape
        if shape is None:
            return 4
        numel = math.prod(shape)
        if numel:  # a tensor of no elements (a Trace made in Python) says nothing of its dtype
            sizes.add(trace.params[i].bytes // numel)
    return sizes.pop() if len(sizes) == 1 and sizes <= FLOAT_ITEMSIZES.keys() else 4


def bucket_shapes(trace: Trace, group: list[int]) -> Shapes | None:
    """The shapes of the bucket ``group``'s tensors in its order, for the catalogue's plan:
    None unless every one has a shape and :func:`bucket_itemsize` bytes per element, and
    they hold an element at least (:func:`bucket_calls` prices a bucket of none as one)."""
    item = bucket_itemsize(trace, group)
    shapes = [trace.params[i].shape for i in group]
    if any(s is None or trace.params[i].bytes != item * math.prod(s)
           for i, s in zip(group, shapes, strict=True)):
        return None
    if not any(math.prod(s) for s in shapes):  # type: ignore[arg-type]
        return None
    return tuple(shapes)  # type: ignore[arg-type]


def bucket_spec(nbytes: int, p: int, o: CollectiveOptions) -> tuple[str, str, int, dict]:
    """(collective, algorithm, count, params) of the dense allreduce that moves one bucket of
    ``nbytes``: counted in float32 elements when ``nbytes`` is a multiple of 4 (so blocks split
    where they split a real gradient's), else in bytes; ``params["itemsize"]`` says which."""
    item = 4 if nbytes % 4 == 0 else 1
    return "allreduce", o.algo, nbytes // item, {**o.params, "itemsize": item}


def bucket_calls(nbytes: int, p: int, o: CollectiveOptions, shapes: Shapes | None = None,
                 itemsize: int = 4) -> tuple[list, int]:
    """The collectives one bucket of ``nbytes`` runs, in order, and the unit the replay counts
    them in: the dense allreduce of ``o.algo``, or the catalogue's plan of method
    ``o.compressor`` for a bucket of ``itemsize``-byte floats (:func:`bucket_itemsize`: the
    plan's dtype, and ⌈nbytes / itemsize⌉ elements, so that a byte count no float divides
    loses none) (its allreduces on ``o.algo``, as a hook with ``algo=o.algo`` runs them)
    holding tensors of ``shapes`` (:func:`bucket_shapes`; None: one flat tensor). The unit is
    the calls' element size, or 1 (bytes) where their element sizes differ (int8's scale and
    levels): :func:`call_table` counts a call in it."""
    from gradwire.catalogue import CollectiveCall

    if o.compressor is None:
        coll, algo, count, kw = bucket_spec(nbytes, p, o)
        item = kw.pop("itemsize")
        return [CollectiveCall(coll, algo, count, item, "gradient", kw)], item
    import torch

    from gradwire import catalogue

    m = catalogue.get(o.compressor)
    compressor, density = m.compressor_from(o.compressor_params)
    if itemsize not in FLOAT_ITEMSIZES:
        raise GradwireError(f"bucket itemsize must be one of {sorted(FLOAT_ITEMSIZES)} "
                            f"(bytes of a float), got {itemsize!r}")
    numel = max(-(-nbytes // itemsize), 1)
    dtype = getattr(torch, FLOAT_ITEMSIZES[itemsize])
    plan = m.plan(numel, p, dtype, compressor, density, o.algo, shapes)
    items = {c.itemsize for c in plan.calls}
    return plan.calls, items.pop() if len(items) == 1 else 1


def call_table(call, p: int, unit: int, cached: bool = True) -> Table:  # type: ignore[no-untyped-def]
    """The transfers of ``call`` on ``p`` ranks counted in units of ``unit`` bytes (the
    :func:`bucket_calls` unit, which divides the call's element size); ``cached=False``: built
    afresh and not kept."""
    return call.table(p, cached).scaled(call.itemsize // unit)


def call_schedule(call, p: int, unit: int) -> Schedule:  # type: ignore[no-untyped-def]
    """:func:`call_table` as a schedule."""
    s, f = call.schedule(p), call.itemsize // unit
    if f == 1:
        return s
    steps = tuple(Step(tuple(t._replace(start=t.start * f, count=t.count * f)
                             for t in st.transfers)) for st in s.steps)
    return replace(s, count=s.count * f, steps=steps)


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


class _Loop:
    """Iterations of host-based aggregation in the event engine: rank r begins its forward
    pass now (:meth:`start`), each bucket is ready for the replay when its last gradient is
    (collective ``it·buckets + b``), and the rank begins iteration ``it + 1`` when its last
    bucket of ``it`` is done (:meth:`bucket_done`); ``ends[it]`` is the latest such time."""

    def __init__(self, trace: Trace, c: SimCluster, groups: list[list[int]], pick: np.ndarray,
                 eng: Engine, record: bool) -> None:
        self.trace, self.c, self.groups, self.pick, self.eng = trace, c, groups, pick, eng
        self.timeline: list[dict] | None = [] if record else None
        self.left = np.full((c.iterations, c.workers), len(groups), dtype=np.int64)
        self.ends = [0.0] * c.iterations
        self.replay: Replay | None = None

    def start(self, it: int, r: int) -> None:
        rec = self.trace.iterations[self.pick[r, it]]
        t0 = self.eng.now
        if self.timeline is not None:
            self.timeline.append({"name": f"forward {it}", "ph": "X", "pid": r, "tid": 0,
                                  "ts": t0 * 1e6, "dur": rec.forward_s * 1e6})
            self.timeline.append({"name": f"backward {it}", "ph": "X", "pid": r, "tid": 0,
                                  "ts": (t0 + rec.forward_s) * 1e6,
                                  "dur": rec.backward_s * 1e6})
        nb = len(self.groups)
        for b, g in enumerate(self.groups):
            t = t0 + rec.forward_s + max(rec.backward[i] for i in g)
            self.eng.at(t, lambda b=b: self.replay.ready(it * nb + b, r))

    def bucket_done(self, ci: int, r: int, t: float) -> None:
        it = ci // len(self.groups)
        self.left[it, r] -= 1
        if self.left[it, r] == 0:
            self.ends[it] = max(self.ends[it], t)
            if it + 1 < self.c.iterations:
                self.start(it + 1, r)

    def run(self, replay: Replay, scheds: list, items: list[int], name: str) -> float:
        """Queue every bucket's schedule for every iteration, start iteration 0 on every rank,
        run the engine; every bucket of every iteration must end done."""
        self.replay = replay
        for it in range(self.c.iterations):
            for b, s in enumerate(scheds):
                replay.add(s, f"bucket {b} iter {it}", items[b])
        for r in range(self.c.workers):
            self.eng.at(0.0, lambda r=r: self.start(0, r))
        end = self.eng.run()
        if self.left.any():
            raise GradwireError(f"{name}: replay stopped with buckets unfinished (a deadlock: "
                                "report this)")
        return end


def simulate_collective(trace: Trace, c: SimCluster, o: CollectiveOptions, name: str = "ring",
                        record: bool = False, fast: bool = True) -> SimResult:
    """Run ``c.iterations`` iterations of host-based aggregation ``o`` on ``c.workers`` hosts
    (``o.multicast``: ring+multicast, :func:`simulate_ring_multicast`)."""
    if o.multicast:
        return simulate_ring_multicast(trace, c, o, name, record)
    p = c.workers
    groups = buckets(trace, o.bucket_bytes)
    specs = _bucket_specs(trace, groups, p, o)
    items = [item for _, item in specs]
    pick = choices(c, len(trace.iterations))
    net = Network.uniform(p, c.bytes_per_s, c.latency)
    compute = steady_compute(trace, pick)
    hosts = list(range(p))

    def ready_times(it: int, start: np.ndarray) -> np.ndarray:
        """[bucket, rank] ready times of iteration ``it`` for forward starts ``start``."""
        out = np.empty((len(groups), p))
        for r in range(p):
            rec = trace.iterations[pick[r, it]]
            b0 = start[r] + rec.forward_s
            out[:, r] = [b0 + max(rec.backward[i] for i in g) for g in groups]
        return out

    if record:
        _check_messages(specs, p, c.iterations, check_recordable)
    if fast and not record and o.algo == "ring" and o.compressor is None:
        _check_dense_ring(trace, c, o)  # before its tables are built
    arrays = _ring_arrays(specs, p) if fast and not record else None
    if arrays is not None:
        check_ring_steps(c.iterations * sum(len(a) for a in arrays))
        eng = Engine(net)
        start, port, ends = np.zeros(p), None, []
        for it in range(c.iterations):
            done, port = dataflow(arrays, ready_times(it, start), net, hosts, c.alpha,
                                  c.gamma, port, eng.carried)
            start = done.max(axis=0)
            ends.append(float(start.max()))
        return finish(name, ends, compute, eng, p, ends[-1], [])

    _check_messages(specs, p, c.iterations, check_replayable)
    with _no_gc():
        scheds = [chain([call_schedule(call, p, item) for call in calls])
                  for calls, item in specs]
    eng = Engine(net, record)
    loop = _Loop(trace, c, groups, pick, eng, record)
    end = loop.run(Replay(eng, hosts, 1, c.alpha, c.gamma, loop.bucket_done), scheds, items,
                   name)
    return finish(name, loop.ends, compute, eng, p, end, loop.timeline or [])


def _bucket_specs(trace: Trace, groups: list[list[int]], p: int,
                  o: CollectiveOptions) -> list[tuple[list, int]]:
    """:func:`bucket_calls` of every bucket of ``groups``."""
    return [bucket_calls(sum(trace.params[i].bytes for i in g), p, o, bucket_shapes(trace, g),
                         bucket_itemsize(trace, g)) for g in groups]


def check_collective(trace: Trace, c: SimCluster, o: CollectiveOptions,
                     record: bool = False) -> None:
    """Refuse what :func:`simulate_collective` would refuse for its messages (a timeline too
    large, a replay too long, a ring computed with numpy of too many steps or transfers),
    without running it, so that a list of mechanisms or a sweep is refused before the first of
    them runs. A ring's steps and transfers are counted from its shape, dense
    (:func:`_check_dense_ring`) or compressed (:func:`_check_ring_shape`), not from tables
    that take minutes to build at thousands of workers."""
    if o.multicast:
        _ring_multicast_specs(trace, c, o, record)
        return
    if o.algo == "ring" and not record and o.compressor is None:
        _check_dense_ring(trace, c, o)
        return
    specs = _bucket_specs(trace, buckets(trace, o.bucket_bytes), c.workers, o)
    if o.algo == "ring" and not record and _on_numpy(specs, c.workers):
        _check_ring_shape(specs, c)
        return
    _check_messages(specs, c.workers, c.iterations,
                    check_recordable if record else check_replayable)


def _on_numpy(specs: list[tuple[list, int]], p: int) -> bool:
    """Whether :func:`simulate_collective` computes the buckets of ``specs`` with numpy
    (:func:`_ring_arrays`: every rank one peer in all of them), told from the calls alone:
    ring calls pair each rank with its neighbours, and on two ranks or one every schedule
    has one peer each way. A compressed ring's other calls (top-k's allgather, gTop-k's
    butterfly) are replayed message by message."""
    return p <= 2 or all(call.algo == "ring" for calls, _ in specs for call in calls)


# The steps of each phase of a ring call (:data:`gradwire.schedules.ring.ALLREDUCE` and the
# others): a reduce-scatter, then an allgather for the allreduce.
_RING_PHASES = {"allreduce": 2, "reducescatter": 1, "allgather": 1}


def _ring_shape(calls: list, p: int, unit: int) -> tuple[int, int]:
    """(steps, transfers) of the chained tables of ``calls`` on ``p`` ranks, as
    :func:`_ring_arrays` would compile them: ring calls from the ring's shape (their tables
    take minutes to build at thousands of workers), others (at P ≤ 2: a handful of transfers)
    from their tables, built afresh and dropped."""
    steps = held = 0
    for call in calls:
        if call.algo == "ring" and call.count > 0:
            phases = _RING_PHASES[call.collective]
            kw = call.schedule_params
            steps += phases * (p - 1)
            held += _ring_held(p, call.count, kw.get("pipeline"), kw["itemsize"], phases)
        elif call.algo != "ring":
            t = call_table(call, p, unit, cached=False)
            steps += len(np.unique(t.step))
            held += len(t.src)
    return steps, held


def _check_ring_shape(specs: list[tuple[list, int]], c: SimCluster) -> None:
    """What :func:`_ring_arrays` and :func:`check_ring_steps` would refuse for buckets of
    ``specs`` computed with numpy (:func:`_on_numpy`), before any table is built, so that a
    compressed ring on thousands of workers is refused before the mechanisms ahead of it
    run."""
    shape: dict[str, tuple[int, int]] = {}
    steps = 0
    for calls, item in specs:
        key = repr((calls, item))
        if key not in shape:
            shape[key] = _ring_shape(calls, c.workers, item)
            _check_ring_memory(sum(held for _, held in shape.values()), len(shape))
        steps += shape[key][0]
    check_ring_steps(c.iterations * steps)


def _check_messages(specs: list[tuple[list, int]], p: int, iterations: int,
                    check: Callable[[int], None]) -> None:
    """``check`` the messages the buckets of ``specs`` send over ``iterations``, before any
    schedule is built: counted from each distinct bucket's table, built afresh and dropped,
    until the count passes ``check``'s bound."""
    sizes: dict[str, int] = {}
    total = 0
    for calls, item in specs:
        key = repr((calls, item))
        if key not in sizes:
            sizes[key] = sum(len(call_table(call, p, item, cached=False).src) for call in calls)
        total += sizes[key] * iterations
        check(total)


# The ring's numpy path: steps it computes, about 75 000 a second (some 8 minutes; a ring on
# 4096 workers has 8190 a bucket, ResNet-50's 161 buckets 1.3 M an iteration), and transfers
# whose steps it holds, about 9 bytes each (5.4 GB; each distinct bucket size of 4096 elements
# or more holds 33.5 M at 4096 workers). Without them a ring on 4096 workers ran for hours at
# 1000 iterations, and one over 200 tensors of distinct sizes was killed for memory.
MAX_RING_STEPS = 36_000_000
MAX_RING_TRANSFERS = 600_000_000


def check_ring_steps(steps: int) -> None:
    """Refuse a ring that computes more than :data:`MAX_RING_STEPS` steps, in one line."""
    if steps > MAX_RING_STEPS:
        raise GradwireError(f"the ring is computed step by step, about 75,000 a second, and "
                            f"this run has {steps:,} steps (2(P - 1) for each ring allreduce of "
                            f"a bucket, every iteration), more than {MAX_RING_STEPS:,}: simulate "
                            f"fewer workers or iterations, or larger buckets (bucket=)")


def _check_dense_ring(trace: Trace, c: SimCluster, o: CollectiveOptions) -> None:
    """What :func:`_ring_arrays` and :func:`check_ring_steps` would refuse for a dense ring,
    from the ring's shape instead of its tables (which take minutes to build at thousands of
    workers): an allreduce is 2(P - 1) steps, and in each phase every one of the
    buffer's chunks is sent P - 1 times, as its sub-chunks (:func:`_ring_held`)."""
    p = c.workers
    groups = buckets(trace, o.bucket_bytes)
    check_ring_steps(c.iterations * len(groups) * 2 * (p - 1))
    held: dict[tuple[int, int], int] = {}
    for g in groups:
        _, _, count, kw = bucket_spec(sum(trace.params[i].bytes for i in g), p, o)
        key = (count, kw["itemsize"])
        if key not in held:
            held[key] = _ring_held(p, count, kw.get("pipeline"), kw["itemsize"])
            _check_ring_memory(sum(held.values()), len(held))


def _ring_held(p: int, count: int, pipeline: object, itemsize: int, phases: int = 2) -> int:
    """Transfers of a ring call of ``count`` elements on ``p`` ranks, from its shape: in each
    of its ``phases`` every one of the buffer's chunks is sent P - 1 times, as its
    sub-chunks (``schedules.ring.ring_table``)."""
    from gradwire.schedules.ring import pick_pipeline

    cut = pick_pipeline(p, count, pipeline, itemsize)
    return phases * (p - 1) * sum(len(split(c0, n, cut)) for c0, n in blocks(count, p))


def _check_ring_memory(transfers: int, sizes: int) -> None:
    """Refuse compiled ring steps of more than :data:`MAX_RING_TRANSFERS` transfers."""
    if transfers > MAX_RING_TRANSFERS:
        raise GradwireError(f"the ring's steps of {sizes} distinct bucket sizes hold more than "
                            f"{MAX_RING_TRANSFERS:,} transfers, 9 bytes each in memory: "
                            f"simulate fewer workers, or buckets of fewer distinct sizes "
                            f"(bucket=)")


def _ring_arrays(specs: list[tuple[list, int]], p: int) -> list | None:
    """Each bucket's :func:`step_arrays` where every rank sends to one peer and receives
    from one in all of them (:func:`single_peer`: the ring), else None. Equal buckets share
    one; each table is built afresh and dropped once compiled, so that one lives at a time (a
    ring at 4096 ranks is 33 M transfers a bucket)."""
    compiled: dict[str, list] = {}
    held = 0  # transfers in the compiled steps
    peers = Peers(p)
    arrays = []
    for calls, item in specs:
        key = repr((calls, item))
        if key not in compiled:
            with _no_gc():
                t = Table.chain([call_table(call, p, item, cached=False) for call in calls])
            if not peers.add(t):
                return None
            held += len(t.src)
            _check_ring_memory(held, len(compiled) + 1)
            compiled[key] = step_arrays(t, item)
            del t
        arrays.append(compiled[key])
    return arrays


def check_ring_multicast(o: CollectiveOptions) -> None:
    """Ring+multicast runs the ring's reduce-scatter, dense: another algorithm or a compressor
    in ``o`` would not run, and is refused."""
    if o.algo != "ring" or o.compressor is not None:
        raise GradwireError(f"multicast runs ring+multicast, and ring+multicast runs the "
                            f"ring's reduce-scatter, dense: expected algo 'ring' and no "
                            f"compressor, got algo={o.algo!r}, compressor={o.compressor!r}")


def _ring_multicast_specs(trace: Trace, c: SimCluster, o: CollectiveOptions, record: bool
                          ) -> tuple[list[list[int]], list[tuple[str, str, int, dict]]]:
    """The buckets of a ring+multicast run and each one's :func:`bucket_spec`, once its
    messages (each reduce-scatter's and its P multicasts) are counted within the bounds."""
    check_ring_multicast(o)
    p = c.workers
    groups = buckets(trace, o.bucket_bytes)
    specs = [bucket_spec(sum(trace.params[i].bytes for i in g), p, o) for g in groups]
    sizes: dict[int, int] = {}  # a bucket's reduce-scatter and its P multicasts
    total = 0
    for _, _, n, kw in specs:
        if n not in sizes:
            sizes[n] = len(registry.table("reducescatter", "ring", p, n, cached=False,
                                          **kw).src) + p
        total += sizes[n] * c.iterations
        check_replayable(total)
        if record:
            check_recordable(total)
    return groups, specs


def simulate_ring_multicast(trace: Trace, c: SimCluster, o: CollectiveOptions,
                            name: str = "ring+multicast", record: bool = False) -> SimResult:
    """Ring-reduce whose second ring is IP multicast (the network-operator paper §8.3, Table
    6's middle column): each bucket is reduce-scattered by the library's ring schedule; as soon
    as a rank holds its reduced block it multicasts it to every other worker (one flow over its
    up link and their down links); a rank has the bucket when its own reduce-scatter is done
    and the P − 1 other blocks have arrived. Iterations as in :func:`simulate_collective`.
    ``o`` is the ring's: another algorithm or a compressor is refused (it would not run)."""
    p = c.workers
    groups, specs = _ring_multicast_specs(trace, c, o, record)
    with _no_gc():
        scheds = [registry.schedule("reducescatter", "ring", p, n, **kw)
                  for _, _, n, kw in specs]
    items = [kw["itemsize"] for *_, kw in specs]
    block = [[size * kw["itemsize"] for _, size in blocks(n, p)] for _, _, n, kw in specs]
    pick = choices(c, len(trace.iterations))
    net = Network.uniform(p, c.bytes_per_s, c.latency)
    eng = Engine(net, record)
    loop = _Loop(trace, c, groups, pick, eng, record)
    nb = len(groups)
    scattered = np.zeros((c.iterations * nb, p), dtype=bool)
    arrived = np.zeros((c.iterations * nb, p), dtype=np.int64)

    def check(ci: int, r: int) -> None:
        if scattered[ci, r] and arrived[ci, r] == p - 1:
            arrived[ci, r] = -1  # reported
            loop.bucket_done(ci, r, eng.now)

    def multicast_in(ci: int, src: int) -> None:
        for x in range(p):
            if x != src:
                arrived[ci, x] += 1
                check(ci, x)

    def done(ci: int, r: int, t: float) -> None:
        scattered[ci, r] = True
        if p > 1:  # the rank's next message, on its send port (α there, as every send)
            replay.multicast(ci, r, [x for x in range(p) if x != r], block[ci % nb][r],
                             lambda t: multicast_in(ci, r), f"multicast {ci % nb} iter {ci // nb}")
        check(ci, r)

    replay = Replay(eng, list(range(p)), 1, c.alpha, c.gamma, done)
    end = loop.run(replay, scheds, items, name)
    return finish(name, loop.ends, steady_compute(trace, pick), eng, p, end, loop.timeline or [])
