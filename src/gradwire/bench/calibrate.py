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
6. How the ranks share their machines' cores (:func:`cpu_sharing`, in
   :mod:`gradwire.bench.sharing`): ranks and cores per machine, the share of the cores they
   keep busy, the wait per collective call, and how much more CPU memory-bound work takes
   with every rank running than alone.

7. Optionally (``--hook-buckets``, ``--hook-methods``), the CPU each aggregation method's
   hook spends per iteration on this cluster (:func:`hook_cpu`, in
   :mod:`gradwire.bench.hook_probe`): its own path on an iteration's buckets, every rank at
   once. ``--hooks-only`` measures this alone (seconds, not minutes), to measure it again
   later on the same cluster: the machine's speed drifts.

5 and 6 are what the performance model charges when ranks share cores (point 5 of
:mod:`gradwire.perf.model`), as every rank of an emulated cluster shares this machine's; 7,
where measured, stands in for the coding and collective CPU it derives for that method.

Host side (:func:`calibrate`, ``gradwire calibrate``): run the rank side on a cluster, add
each method's encode and decode time, and store the result as JSON in
``$GRADWIRE_HOME/calibration/<bandwidth>.json`` with the machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from gradwire import config
from gradwire.bench import provenance
from gradwire.bench.hook_probe import bucket_sizes, hook_cpu, method_names
from gradwire.bench.sharing import cpu_sharing
from gradwire.collectives.probe import step_alpha, step_times
from gradwire.errors import GradwireError
from gradwire.jsonfile import read_object
from gradwire.schedules.cost import CostParams
from gradwire.transport import Transport, wait_all

if TYPE_CHECKING:
    from rich.console import Console

    from gradwire.cluster import Cluster

WINDOW = 16
STREAM_BYTES = 4 * 2**20
PINGS = 40  # round trips per batch
PING_BATCHES = 5
# idle before burst()'s message: a 500 kB bucket refills in 4 ms at 1 Gbit/s, 256 KiB in 21 ms
# at 100 Mbit/s
BURST_IDLE_S = 0.05
BYTE_CPU_ELEMENTS = 2**20  # 4 MiB: 0.6 s a call at P = 8 on 100 Mbit/s links
BYTE_CPU_CALLS = 9


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


def _reduce_speed() -> float:
    a, b = torch.ones(16 * 2**20), torch.ones(16 * 2**20)
    a.add_(b)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        a.add_(b)
        runs.append((time.perf_counter() - t0) / (b.numel() * 4))
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rank side of gradwire calibrate")
    ap.add_argument("--out", required=True)
    ap.add_argument("--hook-buckets", type=bucket_sizes, default=[],
                    help="elements of each bucket of an iteration, comma-separated: measure "
                         "the hooks' CPU per iteration on them")
    ap.add_argument("--hook-methods", type=method_names, default=[],
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


def calibrate(open_cluster: Callable[[], AbstractContextManager[Cluster]], codec_numel: int,
              timeout: float | None, console: Console) -> dict:
    """``gradwire calibrate``: points 1-6 on every host of the cluster ``open_cluster`` opens
    (and closes before anything else runs), then every compressor's encode and decode on
    ``codec_numel`` elements here (0: skip; under ``"codecs"``), saved by :func:`record`. The
    folder it saves in is checked first: a cluster's minutes are not spent on a result that
    cannot be kept."""
    from gradwire.bench import codec_probe
    from gradwire.jobs import run_ranks

    folder = calibration_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GradwireError(f"cannot save calibrations in {str(folder)!r} ({e.strerror}): set "
                            "GRADWIRE_HOME to a folder that can be written") from None
    with open_cluster() as c:
        measured = run_ranks(c, "gradwire.bench.calibrate", [], "calibrate", timeout, console)
        key = c.link_key
        n_hosts, label, bucket = len(c.hosts), c.label, c.burst_bytes
    if codec_numel:
        measured["codecs"] = codec_probe.measure(codec_numel)
    return record(measured, key, n_hosts, label, bucket)


if __name__ == "__main__":
    raise SystemExit(main())
