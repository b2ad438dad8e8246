"""What the simulated cluster is and what a simulation returns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gradwire.check import MAX_GAMMA_NS, MAX_SECONDS, is_int, is_real, shown_number
from gradwire.errors import GradwireError
from gradwire.schedules.registry import MAX_WORLD
from gradwire.sim.engine import Engine
from gradwire.sim.trace import Trace

# Iterations a simulation runs: the steady state shows after two (the paper reports the mean
# of a few); each one replays every transfer of every worker, and a limitless count ran out
# of memory before the first event.
MAX_ITERATIONS = 1000

# The default host costs: a datacenter Ethernet (25 Gbit/s class, one switch, kernel TCP).
# The network-operator paper states no latency of its own: §5 describes the traces, not link,
# switch or NIC delays, and §8.1.2 says only that multicast receivers get a parameter "within
# minimal link latency". So these are named engineering defaults, not the paper's:
# - DEFAULT_LATENCY_S, one way per host, paid at each end of every flow (3 µs host to host):
#   the NIC and PCIe on one side (about 1 µs, including the first 1500-byte frame: 0.5 µs at
#   25 Gbit/s) and half of a cut-through switch hop and its cable (under 0.5 µs);
# - DEFAULT_ALPHA_S, per message on the sender's port: the kernel TCP send and receive path
#   (a system call, the protocol stack and an interrupt on each side, about 5 µs each).
# Together a small message takes 13 µs one way (26 µs round trip: the order of a TCP
# ping-pong between two hosts on one switch). docs/simulator.md shows how the paper's tables
# move with them; SimCluster(alpha=0, latency=0) is the ideal network.
DEFAULT_LATENCY_S = 1.5e-6
DEFAULT_ALPHA_S = 10e-6


@dataclass(frozen=True)
class SimCluster:
    """``workers`` hosts (and, for parameter-server mechanisms, ``servers`` more) on one
    non-blocking switch, every link ``bandwidth_bps`` bits/s each way.

    ``latency``: one-way seconds per host, paid by every flow at each end; ``alpha``: seconds a
    sender's port spends per message (the cost model's α); both default to a datacenter
    Ethernet (:data:`DEFAULT_LATENCY_S`, :data:`DEFAULT_ALPHA_S`; 0 for an ideal network);
    ``gamma``: seconds per byte combined;
    ``send_buffer``: bytes of a parameter-server message that may still be on the wire while
    its sender starts the next one (a TCP socket's send buffer; 0: one message at a time).
    ``iterations`` simulated per run; ``seed`` picks which recorded iteration each simulated
    (worker, iteration) replays.
    """

    workers: int
    bandwidth_bps: float
    servers: int = 1
    latency: float = DEFAULT_LATENCY_S
    alpha: float = DEFAULT_ALPHA_S
    gamma: float = 0.0
    iterations: int = 3
    send_buffer: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        whole = (self.workers, self.servers, self.iterations)
        if not all(is_int(v, 1) for v in whole):
            raise GradwireError(f"workers, servers and iterations must be whole numbers >= 1, "
                                f"got {self.workers}, {self.servers}, {self.iterations}")
        if self.iterations > MAX_ITERATIONS:
            raise GradwireError(f"iterations must be at most {MAX_ITERATIONS}, got "
                                f"{self.iterations}")
        if self.workers > MAX_WORLD:
            raise GradwireError(f"workers must be at most {MAX_WORLD} (the simulator replays "
                                f"every transfer, P² of them per ring), got {self.workers}")
        if self.servers > MAX_WORLD:
            raise GradwireError(f"servers must be at most {MAX_WORLD}, got {self.servers}")
        if not is_int(self.seed, 0):
            raise GradwireError(f"seed must be a whole number >= 0, got {self.seed!r}")
        # a NaN or infinite number would make the event loop spin for ever or return NaN
        if not is_real(self.bandwidth_bps, 0, above=True):  # a bool is no rate either
            raise GradwireError(f"bandwidth must be a finite rate > 0 bits/s, got "
                                f"{self.bandwidth_bps}")
        for name in ("latency", "alpha", "gamma", "send_buffer"):
            v = getattr(self, name)
            if not is_real(v, 0):
                unit = "bytes" if name == "send_buffer" else "seconds"
                raise GradwireError(f"{name} must be a finite number of {unit} >= 0, got {v}")
        # a time per message, as every time a trace or a profile gives (MAX_SECONDS), so that
        # the event loop's sums stay finite
        for name in ("latency", "alpha"):
            v = getattr(self, name)
            if v > MAX_SECONDS:
                raise GradwireError(f"{name} must be at most {MAX_SECONDS:g} seconds, got "
                                    f"{shown_number(v)}")
        # per byte, as whatif's --gamma-ns: 2**50 bytes at the bound stay finite seconds
        if self.gamma > MAX_GAMMA_NS * 1e-9:
            raise GradwireError(f"gamma must be at most {MAX_GAMMA_NS * 1e-9:g} seconds per "
                                f"byte, got {shown_number(self.gamma)}")

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_bps / 8.0


@dataclass
class SimResult:
    """One mechanism on one cluster. ``iteration_s``: the steady iteration time (mean interval
    between iteration ends after the first; the first iteration's end when only one ran);
    ``compute_s``: forward + backward of each iteration's slowest worker, over the same
    iterations (:func:`steady_compute`); ``exposed_s``: iteration minus compute, the
    communication the compute did not hide."""

    mechanism: str
    iteration_s: float
    ends: list[float]
    compute_s: float
    link_bytes: dict[str, float]  # total bytes per link kind (worker up/down, server up/down)
    utilisation: dict[str, float]  # mean busy fraction of each link kind over the run
    timeline: list[dict] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def exposed_s(self) -> float:
        return max(self.iteration_s - self.compute_s, 0.0)

    def to_json(self) -> dict:
        return {"mechanism": self.mechanism, "iteration_s": self.iteration_s,
                "compute_s": self.compute_s, "exposed_s": self.exposed_s, "ends": self.ends,
                "link_bytes": self.link_bytes, "utilisation": self.utilisation,
                "wall_s": self.wall_s}


def steady(ends: list[float]) -> float:
    """Mean interval between iteration ends after the first (the first end if only one)."""
    if len(ends) < 2:
        return float(ends[0])
    return float(ends[-1] - ends[0]) / (len(ends) - 1)


def steady_compute(trace: Trace, pick: np.ndarray) -> float:
    """The compute an iteration time is compared with (``SimResult.compute_s``): in each
    simulated iteration the slowest worker's forward + backward (``pick[worker, iteration]``
    the recorded iteration each replays), averaged over the iterations :func:`steady`
    averages. The mean over every worker and iteration counted a straggler's wait and the
    first iteration's compute as exposed communication: one worker on an ideal network
    showed 0.1 s of it, and iterations shorter than their compute."""
    per = np.array([it.forward_s + it.backward_s for it in trace.iterations])
    slowest = per[pick].max(axis=0)
    return float(slowest[1:].mean() if len(slowest) > 1 else slowest[0])


def choices(c: SimCluster, recorded: int) -> np.ndarray:
    """[worker, iteration] → index of the recorded iteration it replays (seeded)."""
    rng = np.random.default_rng(c.seed)
    return rng.integers(0, recorded, size=(c.workers, c.iterations))


def finish(name: str, ends: list[float], compute: float, eng: Engine, workers: int, end: float,
           timeline: list[dict]) -> SimResult:
    """Summarise a run: iteration time, bytes and utilisation per link kind, the timeline.
    An iteration end that is not finite is an error, not a result: the ring's numpy path
    (:func:`~gradwire.sim.replay.dataflow`) carries a NaN time through to its ends."""
    bad = next((e for e in ends if not math.isfinite(e)), None)
    if bad is not None:
        raise GradwireError(f"{name}: an iteration ended at {float(bad)} s: a time, size or "
                            "rate the simulation was given is not finite or so large that the "
                            "simulated time overflows")
    net = eng.net
    h = net.hosts
    kinds = {"worker up": range(0, workers), "worker down": range(h, h + workers),
             "server up": range(workers, h), "server down": range(h + workers, 2 * h)}
    link_bytes, util = {}, {}
    for kind, idx in kinds.items():
        idx = list(idx)
        if not idx:
            continue
        link_bytes[kind] = float(eng.carried[idx].sum())
        util[kind] = float(eng.carried[idx].sum() / (net.capacity[idx].sum() * max(end, 1e-12)))
    if eng.record:
        for label, links, t0, t1, nbytes in eng.log:
            host = links[0] % h
            timeline.append({"name": label, "ph": "X", "pid": host, "tid": 1, "ts": t0 * 1e6,
                             "dur": (t1 - t0) * 1e6, "args": {"bytes": nbytes}})
    return SimResult(name, steady(ends), [float(e) for e in ends], compute, link_bytes, util,
                     timeline)
