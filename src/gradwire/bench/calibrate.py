"""Measure α, β and γ for the cost model, OSU-style, and keep them for later predictions.

Rank side (1–3: ranks 0 and 1 of the launched job, the others waiting at a barrier, blocked,
so that ranks sharing the machine's cores do not run beside what is timed):
1. α — ping-pong of 8-byte messages, 5 batches of 40 round trips; one-way latency =
   t / (2·40), the median batch (osu_latency). It includes gradwire's per-message software
   cost, which is what the executor pays per transfer.
2. β — streaming: a window of ``WINDOW`` sends of ``STREAM_BYTES`` each, then a 4-byte ack
   (osu_bw); β = t / (window · bytes). Then the link's token bucket (:func:`burst`): one
   message after both ranks idled, against what α and β make of it.
3. γ — reduction speed on rank 0 alone: ``a.add_(b)`` over 64 MiB of float32, per byte of ``b``.
4. α per step with every rank taking part (:func:`step_alpha`): a P-element recursive-doubling
   allreduce without the call header (which the model charges apart), 5 runs of 40 calls,
   median, divided by its steps. It holds the collective call's own software cost, and P
   ranks share this machine's cores, which the two-rank ping-pong cannot see. The same runs
   give the CPU one rank spends per step (``cpu_step_s``). The same for torch.distributed's
   own allreduce (gloo's ring, which the hooks' allreduces run), per ring step
   (``alpha_step_builtin_s``): recorded, not yet used by the model.
5. CPU per byte moved (:func:`byte_cpu`), every rank taking part in a 4 MiB allreduce, the
   median of 9 calls.
6. How the ranks share their machines' cores (:func:`cpu_sharing`): ranks and cores per
   machine, the share of the cores they keep busy, the wait per collective call, and how much
   more CPU memory-bound work takes with every rank running than alone.

7. Optionally (``--hook-buckets``, ``--hook-methods``), the CPU each aggregation method's
   hook spends per iteration on this cluster (:func:`hook_cpu`): its own path on an
   iteration's buckets, every rank at once. ``--hooks-only`` measures this alone (seconds,
   not minutes), to measure it again later on the same cluster: the machine's speed drifts.

5 and 6 are what the performance model charges when ranks share cores (point 5 of
:mod:`gradwire.perf.model`), as every rank of an emulated cluster shares this machine's; 7,
where measured, stands in for the coding and collective CPU it derives for that method.

Stored as JSON in ``$GRADWIRE_HOME/calibration/<bandwidth>.json`` with the machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from gradwire import config
from gradwire.bench import provenance
from gradwire.errors import GradwireError
from gradwire.jsonfile import read_object
from gradwire.schedules.cost import CostParams
from gradwire.transport import Transport, wait_all

WINDOW = 16
STREAM_BYTES = 4 * 2**20
PINGS = 40  # round trips per batch
PING_BATCHES = 5
SHARING_BURSTS_MS = (0.0, 1.0, 2.0, 5.0, 10.0)
SHARING_ROUNDS = 4  # sweeps of every burst; share and sync are the medians of their fits
# idle before burst()'s message: a 500 kB bucket refills in 4 ms at 1 Gbit/s, 256 KiB in 21 ms
# at 100 Mbit/s
BURST_IDLE_S = 0.05
BYTE_CPU_ELEMENTS = 2**20  # 4 MiB: 0.6 s a call at P = 8 on 100 Mbit/s links
BYTE_CPU_CALLS = 9
HOOK_ITERATIONS = 15  # hook_cpu's iterations per method, after one


def calibration_dir() -> Path:
    return config.home() / "calibration"


def calibration_path(bandwidth: str) -> Path:
    return calibration_dir() / f"{bandwidth}.json"


def load(bandwidth: str) -> tuple[CostParams, dict] | None:
    """The saved calibration for links of ``bandwidth``, or None when there is none."""
    path = calibration_path(bandwidth)
    if not path.exists():
        return None
    try:
        d = read_object(path, f"calibration file {path}")
    except GradwireError as e:
        raise GradwireError(f"{e} (run `gradwire calibrate` again or delete it)") from None
    try:
        return cost_params(d), d
    except (ValueError, KeyError, TypeError) as e:
        raise GradwireError(f"calibration file {path} is unreadable ({e}): run "
                            "`gradwire calibrate` again or delete it") from None


def cost_params(d: dict) -> CostParams:
    """The cost model's parameters from a calibration's fields (KeyError, ValueError or
    TypeError where they are missing or malformed). ``burst_bytes`` is the token bucket the
    cluster shapes its links with (:func:`record`; files from before it have none: 0).
    ``start_credit`` stays 0: ``gradwire bench`` times calls back to back after a lead-in
    call, and its model column carries each link's credit from call to call
    (:func:`gradwire.schedules.cost.back_to_back`)."""
    return CostParams(float(d["alpha_s"]), float(d["beta_s_per_byte"]),
                      float(d["gamma_s_per_byte"]), burst=float(d.get("burst_bytes", 0.0)))


def _pingpong(t: Transport) -> float:
    """One-way latency: ``PING_BATCHES`` batches of ``PINGS`` round trips after 10, the
    median of the batches' means (rank 0's value on both ranks)."""
    buf = torch.zeros(8, dtype=torch.uint8)
    peer = 1 - t.rank

    def trips(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            if t.rank == 0:
                t.send(buf, peer)
                t.recv(buf, peer)
            else:
                t.recv(buf, peer)
                t.send(buf, peer)
        return (time.perf_counter() - t0) / (2 * n)

    trips(10)
    one_way = torch.tensor([statistics.median(trips(PINGS) for _ in range(PING_BATCHES))],
                           dtype=torch.float64)
    dist.broadcast(one_way, 0, group=t.group)
    return float(one_way)


def _stream(t: Transport) -> float:
    bufs = [torch.zeros(STREAM_BYTES, dtype=torch.uint8) for _ in range(WINDOW)]
    ack = torch.zeros(4, dtype=torch.uint8)
    rates = []
    for _ in range(3):
        dist.barrier(group=t.group)  # ranks 0 and 1 only: the others are not here
        t0 = time.perf_counter()
        if t.rank == 0:
            wait_all([t.isend(b, 1) for b in bufs])
            t.recv(ack, 1)
        else:
            wait_all([t.irecv(b, 0) for b in bufs])
            t.send(ack, 0)
        rates.append((time.perf_counter() - t0) / (WINDOW * STREAM_BYTES))
    return statistics.median(rates)


def burst(t: Transport, alpha: float, beta: float) -> float:
    """Bytes a link lets through at once after an idle spell: the token bucket of a link
    shaped by ``tc tbf`` (the emulated cluster's: 500 kB at 1 Gbit/s), about 0 on a plain
    one. Both ranks idle ``BURST_IDLE_S``, then rank 0 sends one message of n bytes (at least
    ``STREAM_BYTES``, and 50 ms of traffic at β) and rank 1 acks it: t = 2α + (n − burst)·β,
    median of 5, clamped to [0, n]."""
    size = torch.tensor([min(64 * 2**20, max(STREAM_BYTES, 0.05 / beta))], dtype=torch.float64)
    dist.broadcast(size, 0, group=t.group)  # the ranks' β differ in the last digits
    n = int(size)
    buf, ack = torch.zeros(n, dtype=torch.uint8), torch.zeros(4, dtype=torch.uint8)
    runs = []
    for _ in range(5):
        dist.barrier(group=t.group)
        time.sleep(BURST_IDLE_S)
        t0 = time.perf_counter()
        if t.rank == 0:
            t.send(buf, 1)
            t.recv(ack, 1)
        else:
            t.recv(buf, 0)
            t.send(ack, 0)
        runs.append(time.perf_counter() - t0)
    return float(min(max(n - (statistics.median(runs) - 2 * alpha) / beta, 0.0), n))


def byte_cpu(t: Transport, cpu_step: float, gamma: float) -> float:
    """CPU seconds per byte moved (its sender's and receiver's together, as
    :func:`gradwire.perf.comm.cpu_seconds` charges it): torch.distributed's allreduce (gloo's
    ring, which the hooks' dense allreduces run and the model costs as gradwire's ring) of
    ``BYTE_CPU_ELEMENTS`` float32 over ``t``'s ranks, ``BYTE_CPU_CALLS`` calls after 1, each
    timed alone: a rank's process CPU for the call, the mean over ranks, less what the ring's
    steps (``cpu_step``) and reductions (``gamma``) account for; the median call. One call in
    a few on a shaped link costs half as much again as the others (at 100 Mbit/s, P = 2: 0.85
    to 1.39 ns per byte for the mean of 3 calls, four times on one cluster; 0.81 and 0.89 for
    the median of 9, twice), and a dense run's megabytes multiply it."""
    from gradwire.perf import comm

    p, n = t.world_size, BYTE_CPU_ELEMENTS
    buf = torch.ones(n)
    dist.all_reduce(buf, group=t.group)
    spent = []
    for _ in range(BYTE_CPU_CALLS):
        dist.barrier(group=t.group)
        c0 = time.process_time()
        dist.all_reduce(buf, group=t.group)
        spent.append((time.process_time() - c0) / p)
    each = torch.tensor(spent, dtype=torch.float64)
    dist.all_reduce(each, group=t.group)
    args = ("allreduce", "ring", p, n, 4)
    known = comm.cpu_seconds(*args, cpu_step, 0.0, gamma, pipeline=1)
    per_byte = comm.cpu_seconds(*args, 0.0, 1.0, 0.0, pipeline=1)
    return max(statistics.median(each.tolist()) - known, 0.0) / per_byte


def hook_cpu(t: Transport, numels: list[int], methods: list[str]) -> dict[str, dict]:
    """CPU and wall seconds per iteration of each method's hook on ``t``'s ranks (torch's
    default group, which the hooks use): its own path (error feedback, encode, the call
    header, the collectives, decode, writing the bucket back; :func:`gradwire.perf.codecs.
    hook_path`) on one iteration's buckets of ``numels`` elements, in order, each refilled
    with this rank's gradient and out of the caches (``codecs.EVICT_BYTES`` written after
    it), as backward leaves it. CPU is the rank's process CPU over the bucket calls (the
    hook's thread and gloo's), the median of ``HOOK_ITERATIONS`` iterations after one, each
    after a barrier, the methods in turn; then the mean over ranks. What a rank spends
    waiting inside a call is in it, about 0.5 % of the wait here."""
    from gradwire.perf import codecs

    gen = torch.Generator().manual_seed(1000 + t.rank)
    grads = [torch.randn(n, generator=gen) for n in numels]
    evict = torch.zeros(codecs.EVICT_BYTES, dtype=torch.uint8)
    runs = {}
    for name in methods:
        state, plan = codecs.hook_path(name)
        params = [torch.empty(n) for n in numels]  # kept: the layout keys them by id()
        keys = [state.positions.layout([q]) for q in params]
        runs[name] = (state, plan, params, keys, [torch.empty(n) for n in numels], [], [])
    # Round-robin, an iteration of every method in turn, so that a slow spell of the machine
    # lands on every method alike.
    for _ in range(HOOK_ITERATIONS + 1):
        for state, plan, _, keys, bufs, cpus, walls in runs.values():
            dist.barrier(group=t.group)
            cpu = wall = 0.0
            for i, (buf, key, g) in enumerate(zip(bufs, keys, grads, strict=True)):
                buf.copy_(g)
                evict.add_(1)
                w0, c0 = time.perf_counter(), time.process_time()
                state._bucket(buf, key, plan, i == len(bufs) - 1)  # noqa: SLF001
                cpu += time.process_time() - c0
                wall += time.perf_counter() - w0
            cpus.append(cpu)
            walls.append(wall)
    out = {}
    for name, (*_, cpus, walls) in runs.items():
        got = torch.tensor([statistics.median(cpus[1:]), statistics.median(walls[1:])],
                           dtype=torch.float64) / t.world_size
        dist.all_reduce(got, group=t.group)
        out[name] = {"cpu_s": float(got[0]), "wall_s": float(got[1])}
    return out


def step_alpha(t: Transport, algo: str = "rd", **params: object) -> float:
    """Seconds per step of gradwire's ``algo`` allreduce on P elements (``"builtin"``:
    torch.distributed's, per step of a ring), every rank of ``t`` taking part (5 runs of 40
    calls after 20, median; rank 0's value on every rank). With
    ``t.check_calls`` on, each call's header exchange is in it too."""
    return step_times(t, algo, **params)[0]


def step_times(t: Transport, algo: str = "rd", **params: object) -> tuple[float, float]:
    """(wall, CPU) seconds per step of :func:`step_alpha`'s runs; CPU is what one rank's
    process spent (all its threads), the mean over ranks, the same on every rank."""
    import gradwire.collectives as gc
    from gradwire.schedules import registry

    p = t.world_size
    # "builtin": torch.distributed's allreduce (gloo's ring, which the hooks' allreduces run)
    steps = len(registry.schedule("allreduce", "ring" if algo == "builtin" else algo, p, p,
                                  **params).steps)
    run = {k: v for k, v in params.items() if k != "itemsize"}
    buf = torch.ones(p)

    def call() -> None:
        if algo == "builtin":
            dist.all_reduce(buf, group=t.group)
        else:
            gc.all_reduce(buf, algo=algo, transport=t, **run)

    for _ in range(20):
        call()
    runs, cpus = [], []
    for _ in range(5):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(40):
            call()
        runs.append((time.perf_counter() - t0) / 40 / max(steps, 1))
        cpus.append((time.process_time() - c0) / 40 / max(steps, 1))
    per = torch.tensor([statistics.median(runs)], dtype=torch.float64)
    dist.broadcast(per, 0)
    cpu = torch.tensor([statistics.median(cpus) / p], dtype=torch.float64)
    dist.all_reduce(cpu)
    t.reset_counters()
    return float(per), float(cpu)


def cpu_sharing(t: Transport) -> dict:
    """How the ranks share their machines' cores when they alternate compute with
    collectives, as training does.

    ``ranks``: the most ranks on one machine (ranks with the same host name: every rank of an
    emulated cluster); ``cores``: its cores. Then, for bursts of ``SHARING_BURSTS_MS`` of CPU
    (matrix products, one thread) each followed by a P-element allreduce, 30 iterations after
    5: wall seconds per iteration W against L·D, D the CPU a rank's process spent per
    iteration (the mean over ranks) and L = max(1, ranks/cores). A least-squares line
    W = L·D/share + sync gives ``share`` (at most 1), the share of the cores the ranks keep
    busy, and ``sync`` (at least 0), the seconds each collective call waits for ranks that
    the scheduler has not run yet; ``sync_step`` is that per step of the probe's allreduce
    (recursive doubling: ⌈log2 P⌉ steps at powers of two), what
    :class:`gradwire.perf.model.Cluster` charges per schedule step.
    ``SHARING_ROUNDS`` sweeps, one line each, give the medians: sync is where the line meets
    L·D = 0, and single sweeps of three bursts from 2 ms put it anywhere from 0.1 to 2.3 ms on
    one cluster (P = 2 and 8 at 1 Gbit/s); the bursts of 0 and 1 ms pin that end and the
    median of four sweeps keeps one slow sweep out (0.46–1.15 ms per sweep, same probe).
    """
    import gradwire.collectives as gc

    rows: list = [None] * t.world_size
    dist.all_gather_object(rows, (socket.gethostname(), _cores()), group=t.group)
    hosts: dict[str, list[int]] = {}
    for host, n in rows:
        hosts.setdefault(host, []).append(n)
    ranks = max(len(v) for v in hosts.values())
    cores = min(n for v in hosts.values() for n in v)
    load = max(1.0, ranks / cores)
    a, buf = torch.randn(192, 192, generator=torch.Generator().manual_seed(0)), torch.ones(
        t.world_size)

    def iteration(ms: float) -> None:
        c0 = time.thread_time()
        while time.thread_time() - c0 < ms / 1e3:
            a @ a
        gc.all_reduce(buf, algo="rd", transport=t)

    shares, syncs = [], []
    for _ in range(SHARING_ROUNDS):
        xs, ys = [], []
        for ms in SHARING_BURSTS_MS:
            for _ in range(5):
                iteration(ms)
            dist.barrier(group=t.group)
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(30):
                iteration(ms)
            got = torch.tensor([time.process_time() - c0, time.perf_counter() - w0],
                               dtype=torch.float64) / 30 / t.world_size
            dist.all_reduce(got, group=t.group)
            xs.append(load * float(got[0]))
            ys.append(float(got[1]))
        slope, sync = np.polyfit(xs, ys, 1)
        shares.append(min(1.0, 1.0 / max(slope, 1e-9)))
        syncs.append(max(sync, 0.0))
    from gradwire.perf.whatif import sync_probe_steps

    sync = float(statistics.median(syncs))
    return {"ranks": ranks, "cores": cores, "share": float(statistics.median(shares)),
            "sync": sync, "sync_step": sync / sync_probe_steps(t.world_size),
            "slowdown": _memory_slowdown(t)}


def _memory_slowdown(t: Transport) -> float:
    """How much more CPU memory-bound work (``a.add_(b)`` over 4 MiB of float32, as encode
    and decode do) takes when every rank runs it at once than when rank 0 runs it alone, the
    others waiting (median of 5 rounds; at least 1)."""
    a, b = torch.ones(2**20), torch.ones(2**20)

    def work() -> float:
        c0 = time.thread_time()
        for _ in range(20):
            a.add_(b)
        return time.thread_time() - c0

    work()
    alone, together = [], []
    for _ in range(5):
        dist.barrier(group=t.group)
        if t.rank == 0:
            alone.append(work())
        dist.barrier(group=t.group)
        together.append(work())
    mean = torch.tensor([statistics.median(together) / t.world_size], dtype=torch.float64)
    dist.all_reduce(mean, group=t.group)
    ratio = torch.tensor([float(mean) / statistics.median(alone) if t.rank == 0 else 0.0],
                         dtype=torch.float64)
    dist.broadcast(ratio, 0, group=t.group)
    return max(1.0, float(ratio))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _reduce_speed() -> float:
    a, b = torch.ones(16 * 2**20), torch.ones(16 * 2**20)
    a.add_(b)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        a.add_(b)
        runs.append((time.perf_counter() - t0) / (b.numel() * 4))
    return statistics.median(runs)


def _bucket_sizes(text: str) -> list[int]:
    """--hook-buckets: whole numbers >= 1, comma-separated."""
    try:
        sizes = [int(n) for n in text.split(",") if n]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected bucket sizes in elements (whole numbers "
                                         f">= 1), comma-separated, got {text!r}")
    return sizes


def _methods(text: str) -> list[str]:
    """--hook-methods: names of gradwire.hooks methods, comma-separated."""
    from gradwire.hooks.methods import TABLE

    names = [m for m in text.split(",") if m]
    bad = [m for m in names if m not in TABLE]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected methods from {', '.join(TABLE)}, "
                                         f"comma-separated, got {text!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rank side of gradwire calibrate")
    ap.add_argument("--out", required=True)
    ap.add_argument("--hook-buckets", type=_bucket_sizes, default=[],
                    help="elements of each bucket of an iteration, comma-separated: measure "
                         "the hooks' CPU per iteration on them")
    ap.add_argument("--hook-methods", type=_methods, default=[],
                    help="methods for --hook-buckets, comma-separated")
    ap.add_argument("--hooks-only", action="store_true",
                    help="measure only the hooks' CPU (needs --hook-buckets and "
                         "--hook-methods); the output holds hook_buckets and hook_s")
    a = ap.parse_args(argv)
    numels, methods = a.hook_buckets, a.hook_methods
    if a.hooks_only and not (numels and methods):
        ap.error("--hooks-only needs --hook-buckets and --hook-methods")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    t = Transport()
    if t.world_size < 2:
        raise SystemExit("calibrate needs at least 2 ranks")
    # the model charges headers apart
    plain = Transport(check_calls=False)
    found = {} if a.hooks_only else _cluster_terms(t, plain)
    if numels and methods:
        found |= {"hook_buckets": numels, "hook_s": hook_cpu(plain, numels, methods)}
    if t.rank == 0:
        Path(a.out).write_text(json.dumps(found))
    dist.destroy_process_group()
    return 0


def _cluster_terms(t: Transport, plain: Transport) -> dict:
    """Points 1-6 of the module docstring on ``t``'s ranks (``plain``: the same ranks without
    call headers): α, β, the token bucket, γ, α and CPU per step, CPU per byte, how the ranks
    share the cores. Every rank takes part; rank 0's result is the one kept."""
    sub = dist.new_group([0, 1])
    # The other ranks wait at the barrier (blocked, not spinning) while ranks 0 and 1 time the
    # link, and rank 0 times γ alone: ranks sharing the cores would otherwise be measured too.
    alpha = beta = bucket = 0.0
    if t.rank < 2:
        tp = Transport(sub)
        alpha = _pingpong(tp)
        beta = _stream(tp)
        bucket = burst(tp, alpha, beta)
    dist.barrier()
    gamma = torch.tensor([_reduce_speed() if t.rank == 0 else 0.0], dtype=torch.float64)
    dist.broadcast(gamma, 0)
    gamma = float(gamma)
    alpha_step, cpu_step = step_times(plain)
    alpha_builtin = step_alpha(plain, "builtin")
    cpu_byte = byte_cpu(plain, cpu_step, gamma)
    sharing = cpu_sharing(plain)
    return {"alpha_s": alpha, "beta_s_per_byte": beta, "gamma_s_per_byte": gamma,
            "burst_bytes_measured": bucket, "alpha_step_s": alpha_step,
            "alpha_step_builtin_s": alpha_builtin, "cpu_step_s": cpu_step,
            "cpu_byte_s": cpu_byte, "cpu_ranks_per_machine": sharing["ranks"],
            "cores_per_machine": sharing["cores"], "cpu_share": sharing["share"],
            "cpu_sync_s": sharing["sync"], "cpu_sync_step_s": sharing["sync_step"],
            "cpu_slowdown": sharing["slowdown"]}


def record(measured: dict, bandwidth: str, hosts: int, network: str,
           burst_bytes: float = 0.0) -> dict:
    """Add provenance and the links' token bucket (``burst_bytes``, what the cluster shapes
    them with; :func:`burst` measures it as a check) to a measurement and save it where
    ``load`` finds it."""
    d = {**measured, "burst_bytes": burst_bytes,
         "bandwidth": bandwidth, "hosts": hosts, "network": network,
         "link_gbit_per_s_measured": 8 / measured["beta_s_per_byte"] / 1e9,
         **provenance.stamp()}
    path = calibration_path(bandwidth)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(d, indent=1) + "\n")
    d["path"] = str(path)
    return d


if __name__ == "__main__":
    raise SystemExit(main())
