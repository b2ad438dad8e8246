"""The mechanisms ``gradwire simulate`` compares, by name, with ``NAME:KEY=VALUE`` options.

| name | what |
|---|---|
| ps | parameter servers (TensorFlow: round-robin placement by tensor and distribution order) |
| multicast | ps with IP multicast for distribution |
| ina | ps with in-network aggregation at the switch |
| multicast+ina | both |
| ring | ring-reduce with messaging: one ring allreduce per parameter, split over the workers |
| ring+multicast | ring-reduce whose second ring (distribution) is one IP multicast per worker |
| butterfly | butterfly mixing: one recursive-doubling allreduce per parameter |
| any allreduce algorithm of the registry (rhd, lp, dbtree, tree, master, …) | per parameter |

Options: ps family ``order=roundrobin|block``, ``barrier=on|off``, ``sharding=tensor|even``;
collectives ``bucket=BYTES`` (fused buckets of at most BYTES, as ``--sizes`` reads them:
25000000, 64K, 25M; 0 = per parameter),
``compress=NAME`` with the compressor's own parameters (``compress=topk:density=0.01``), and
the schedule's parameters (``pipeline=4``). Example:
``ps:order=block``, ``ring:bucket=25000000:compress=fp16``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gradwire.check import comma_items, is_int
from gradwire.errors import GradwireError, did_you_mean
from gradwire.schedules import registry
from gradwire.schedules.registry import parse_params
from gradwire.sim.cluster import SimCluster, SimResult
from gradwire.sim.collective import (
    CollectiveOptions,
    check_collective,
    simulate_collective,
    simulate_ring_multicast,
)
from gradwire.sim.ps import PSOptions, check_flows, simulate_ps
from gradwire.sim.trace import Trace
from gradwire.sizes import parse_size

PS_FAMILY = {"ps": {}, "multicast": {"multicast": True}, "ina": {"ina": True},
             "multicast+ina": {"multicast": True, "ina": True}}
ALIASES = {"butterfly": "rd"}
RING_MULTICAST = "ring+multicast"
PAPER = ("ps", "multicast", "ina", "multicast+ina", "ring", "ring+multicast", "butterfly")
BASELINE = "ps"


@dataclass(frozen=True)
class Mechanism:
    """``run(trace, cluster, record)`` simulates it; ``check(trace, cluster, record)`` refuses,
    without simulating, what the run would refuse for its size (too many messages to replay
    or record), so that every mechanism and point of a request is checked before any runs."""

    label: str
    run: Callable[[Trace, SimCluster, bool], SimResult]
    options: PSOptions | CollectiveOptions
    check: Callable[[Trace, SimCluster, bool], None] = lambda t, c, rec: None


def _flag(label: str, key: str, v: object) -> bool:
    # 1 and 0 as whole numbers only: 1.0 and 0.0 (and True) compare equal to them; words in
    # any case (False, as Python spells it)
    whole = type(v) is int
    word = v.lower() if isinstance(v, str) else None
    if word in ("on", "true", "yes") or (whole and v == 1):
        return True
    if word in ("off", "false", "no") or (whole and v == 0):
        return False
    raise GradwireError(f"mechanism {label!r}: {key} must be on or off, got {v!r}")


def parse(text: str) -> Mechanism:
    """``ps:order=block`` → a runnable mechanism; unknown names and options say what is
    allowed, each error naming the mechanism (a ``--mechanism`` list has several)."""
    label = text.strip()
    try:
        return _parse(label)
    except GradwireError as e:
        msg = str(e)
        if msg.startswith(f"mechanism {label!r}") or msg.startswith("unknown mechanism"):
            raise
        raise GradwireError(f"mechanism {label!r}: {msg}") from None


def _parse(label: str) -> Mechanism:
    name, *rest = label.split(":")
    params = parse_params(rest, f"mechanism {label!r}: option")
    if name in PS_FAMILY:
        kw: dict = dict(PS_FAMILY[name])
        for key, v in params.items():
            if key == "barrier":
                kw["barrier"] = _flag(label, key, v)
            elif key == "order" and kw.get("multicast"):
                # ps.distribution: one multicast per parameter, whatever the order
                raise GradwireError(f"mechanism {label!r}: order={v} is not taken: order is "
                                    "the unicast distribution's (each parameter to worker 0, "
                                    "1, ... or each worker everything in turn), and "
                                    f"{name} sends each parameter once to every worker")
            elif key in ("order", "sharding"):
                kw[key] = v
            else:
                raise GradwireError(f"mechanism {label!r}: unknown option {key!r}"
                                    f"{did_you_mean(key, ['order', 'barrier', 'sharding'])}: "
                                    "expected order, barrier or sharding")
        opts = PSOptions(**kw)
        return Mechanism(label, lambda t, c, rec: simulate_ps(t, c, opts, label, rec), opts,
                         lambda t, c, rec: check_flows(t, c, opts, rec))
    if name == RING_MULTICAST:
        return _ring_multicast(label, params)
    algo = ALIASES.get(name, name)
    known = [a.name for a in registry.algorithms("allreduce")]
    if algo not in known:
        names = list(dict.fromkeys([*PS_FAMILY, RING_MULTICAST, *ALIASES, *known]))
        raise GradwireError(f"unknown mechanism {name!r}{did_you_mean(name, names)}: expected "
                            f"one of {', '.join(names)}")
    bucket = _bucket(label, params)
    comp = params.pop("compress", None)
    if comp is not None:
        _compressor_flags(label, comp, params)
    # CollectiveOptions checks the rest now (parse names the mechanism in its errors)
    with _also_takes("bucket= and compress="):
        opts2 = (CollectiveOptions(algo, bucket, None, {}, params) if comp is None
                 else CollectiveOptions(algo, bucket, comp, params))
    return Mechanism(label, lambda t, c, rec: simulate_collective(t, c, opts2, label, rec), opts2,
                     lambda t, c, rec: check_collective(t, c, opts2, rec))


def _compressor_flags(label: str, comp: object, params: dict) -> None:
    """A compressor's on/off options (powersgd's ``warm_start``), written as text in the
    mechanism (``warm_start=off``, ``False``, :func:`_flag`), as the bools its constructor
    takes."""
    import inspect

    from gradwire.catalogue import METHODS
    from gradwire.compress import COMPRESSORS

    method = METHODS.get(comp) if isinstance(comp, str) else None
    if method is None or method.compressor is None:
        return  # CollectiveOptions names what is wrong
    takes = inspect.signature(COMPRESSORS[method.compressor]).parameters
    for key, v in params.items():
        if key in takes and isinstance(takes[key].default, bool):
            params[key] = _flag(label, key, v)


@contextlib.contextmanager
def _also_takes(options: str) -> Iterator[None]:
    """A schedule parameter the algorithm lacks: its error lists the schedule's parameters
    only, and the mechanism takes ``options`` besides them."""
    try:
        yield
    except GradwireError as e:
        if " has no parameter " not in str(e):
            raise
        raise GradwireError(f"{e}; the mechanism also takes {options}") from None


def _bucket(label: str, params: dict) -> int:
    """``bucket=``: bytes as bench's ``--sizes`` reads them (25000000, 64K, 25M; K, M and G
    are powers of 1024), or 0 for a bucket per parameter."""
    bucket = params.pop("bucket", 0)
    if isinstance(bucket, str):
        with contextlib.suppress(GradwireError):  # refused below, as typed
            bucket = parse_size(bucket)
    if not is_int(bucket, 0):
        raise GradwireError(f"mechanism {label!r}: bucket must be a whole number of bytes "
                            f">= 0 (0: one per parameter) or a size like 64K or 25M (K, M, "
                            f"G: powers of 1024), got {bucket!r}")
    return bucket


def _ring_multicast(label: str, params: dict) -> Mechanism:
    bucket = _bucket(label, params)
    if "compress" in params:
        raise GradwireError(f"mechanism {label!r}: ring+multicast takes no compressor "
                            "(bucket= and pipeline= only)")
    with _also_takes("bucket="):
        opts = CollectiveOptions("ring", bucket, None, {}, params, multicast=True)  # checks
    return Mechanism(label, lambda t, c, rec: simulate_ring_multicast(t, c, opts, label, rec),
                     opts, lambda t, c, rec: check_collective(t, c, opts, rec))


def parse_list(text: str) -> list[Mechanism]:
    out = [parse(x) for x in comma_items(text)]
    if not out:
        raise GradwireError(f"--mechanism {text!r} names none: expected a comma list such as "
                            f"{','.join(PAPER)}")
    return out


def check(trace: Trace, cluster: SimCluster, mechanisms: list[Mechanism],
          record: bool = False) -> None:
    """Each mechanism's :attr:`Mechanism.check`, before any of them runs: a run past the
    bounds is refused at once, not after the mechanisms before it ran for minutes."""
    for m in mechanisms:
        with _named(m):
            m.check(trace, cluster, record)


@contextlib.contextmanager
def _named(m: Mechanism) -> Iterator[None]:
    """Say which mechanism of the list an error is from, as :func:`parse` does."""
    try:
        yield
    except GradwireError as e:
        msg = str(e)
        if msg.startswith((f"{m.label}:", f"mechanism {m.label!r}")):
            raise
        raise GradwireError(f"mechanism {m.label!r}: {msg}") from None


def run(trace: Trace, cluster: SimCluster, mechanisms: list[Mechanism],
        record: bool = False, on_start: Callable[[str], None] | None = None
        ) -> list[SimResult]:
    """Every mechanism on the same trace and cluster, each result with its wall time.
    ``on_start(text)``: told which mechanism starts (a progress line)."""
    out = []
    for i, m in enumerate(mechanisms):
        if on_start is not None:
            on_start(f"simulating {m.label} ({i + 1}/{len(mechanisms)}), {cluster.workers} "
                     f"workers")
        t0 = time.perf_counter()
        with _named(m):  # an error the trace brings out (pipeline= too fine for a tensor)
            r = m.run(trace, cluster, record)
        r.wall_s = time.perf_counter() - t0
        out.append(r)
    return out
