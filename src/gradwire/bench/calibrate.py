"""Measure α, β and γ for the cost model, OSU-style, and keep them for later predictions.

Rank side (ranks 0 and 1 of the launched job):
1. α — ping-pong of 8-byte messages, 200 round trips; one-way latency = t / (2·iters)
   (osu_latency). It includes gradwire's per-message software cost, which is what the
   executor pays per transfer.
2. β — streaming: a window of ``WINDOW`` sends of ``STREAM_BYTES`` each, then a 4-byte ack
   (osu_bw); β = t / (window · bytes).
3. γ — reduction speed on one rank: ``a.add_(b)`` over 64 MiB of float32, per byte of ``b``.
4. α per step with every rank taking part (:func:`step_alpha`): a P-element recursive-doubling
   allreduce without the call header (which the model charges apart), 5 runs of 40 calls,
   median, divided by its steps. It holds the collective call's own software cost, and P
   ranks share this machine's cores, which the two-rank ping-pong cannot see.

Stored as JSON in ``$GRADWIRE_HOME/calibration/<bandwidth>.json`` with the machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gradwire import config
from gradwire.bench import provenance
from gradwire.errors import GradwireError
from gradwire.schedules.cost import CostParams
from gradwire.transport import Transport, wait_all

WINDOW = 16
STREAM_BYTES = 4 * 2**20
PINGS = 200


def calibration_path(bandwidth: str) -> Path:
    return config.home() / "calibration" / f"{bandwidth}.json"


def load(bandwidth: str) -> tuple[CostParams, dict] | None:
    """The saved calibration for links of ``bandwidth``, or None when there is none."""
    path = calibration_path(bandwidth)
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text())
        return CostParams(float(d["alpha_s"]), float(d["beta_s_per_byte"]),
                          float(d["gamma_s_per_byte"])), d
    except (ValueError, KeyError) as e:
        raise GradwireError(f"calibration file {path} is unreadable ({e}): run "
                            "`gradwire calibrate` again or delete it") from None


def _pingpong(t: Transport) -> float:
    buf = torch.zeros(8, dtype=torch.uint8)
    peer = 1 - t.rank
    for i in range(PINGS + 10):
        if i == 10:
            t0 = time.perf_counter()
        if t.rank == 0:
            t.send(buf, peer)
            t.recv(buf, peer)
        else:
            t.recv(buf, peer)
            t.send(buf, peer)
    return (time.perf_counter() - t0) / (2 * PINGS)


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


def step_alpha(t: Transport, algo: str = "rd", **params: object) -> float:
    """Seconds per step of gradwire's ``algo`` allreduce on P elements, every rank of ``t``
    taking part (5 runs of 40 calls after 20, median; rank 0's value on every rank). With
    ``t.check_calls`` on, each call's header exchange is in it too."""
    import gradwire.collectives as gc
    from gradwire.schedules import registry

    p = t.world_size
    steps = len(registry.schedule("allreduce", algo, p, p, **params).steps)
    run = {k: v for k, v in params.items() if k != "itemsize"}
    buf = torch.ones(p)
    for _ in range(20):
        gc.all_reduce(buf, algo=algo, transport=t, **run)
    runs = []
    for _ in range(5):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(40):
            gc.all_reduce(buf, algo=algo, transport=t, **run)
        runs.append((time.perf_counter() - t0) / 40 / max(steps, 1))
    per = torch.tensor([statistics.median(runs)])
    dist.broadcast(per, 0)
    t.reset_counters()
    return float(per)


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
    a = ap.parse_args(argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    t = Transport()
    if t.world_size < 2:
        raise SystemExit("calibrate needs at least 2 ranks")
    if t.rank < 2:
        sub = dist.new_group([0, 1])
        tp = Transport(sub)
        alpha = _pingpong(tp)
        beta = _stream(tp)
    else:
        dist.new_group([0, 1])
    gamma = _reduce_speed()
    alpha_step = step_alpha(Transport(check_calls=False))  # the model charges headers apart
    if t.rank == 0:
        Path(a.out).write_text(json.dumps({"alpha_s": alpha, "beta_s_per_byte": beta,
                                           "gamma_s_per_byte": gamma,
                                           "alpha_step_s": alpha_step}))
    dist.destroy_process_group()
    return 0


def record(measured: dict, bandwidth: str, hosts: int, network: str) -> dict:
    """Add provenance to a measurement and save it where ``load`` finds it."""
    d = {**measured,
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
