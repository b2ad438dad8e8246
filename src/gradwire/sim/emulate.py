"""Run the simulator's mechanisms for real, on the emulated cluster, to check the simulator.

Every rank replays the trace's compute as waits — each simulated (worker, iteration) replays
the recorded iteration the simulator draws for it with the same seed — and moves the real
bytes over the transport, in the order the simulator moves them:

- collectives (``ring``, ``butterfly``, any allreduce algorithm, ``bucket=``): the forward
  pass, then each bucket's gradient is ready at its traced time and is all-reduced by the
  library's executor with the bucket's schedule (the one the simulator replays), one at a
  time in ready order; the next forward pass starts when the rank's last collective ends;
- parameter servers (``ps`` with any ``order``, ``sharding``, ``--servers``; barrier on):
  ranks ``0 … W−1`` are workers and ``W … W+S−1`` servers. A server sends its pieces in the
  simulator's distribution order, receives every worker's pushes and sums them; a worker uses
  parameter i at its traced forward time but not before it has arrived, then pushes each
  gradient piece when it is ready, in ready order, one send at a time; the servers end an
  iteration together (a one-byte barrier among them) before distributing the next.

An iteration ends when its last collective ends on any rank (PS: when the last server has
every push), on the machine-wide monotonic clock that all namespaces share; the steady
iteration time is the simulator's (mean interval between ends after the first). Collectives
run without the header exchange (``check_calls=False``): the simulator moves the mechanism's
bytes only, and the transport's data counters are compared with its link bytes.

Multicast, in-network aggregation, compressors and ``barrier=off`` have no real counterpart
here and are refused with a one-line error.

Rank program::

    python -m gradwire.sim.emulate --trace T --mechanism ring --workers 4 --iterations 5 --out F
    python -m gradwire.sim.emulate --stream-alpha --out F    # part of calibrate()
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

from rich.console import Console

from gradwire.errors import GradwireError
from gradwire.jsonfile import dumps
from gradwire.sim.cluster import SimCluster, choices, steady
from gradwire.sim.collective import bucket_spec, buckets
from gradwire.sim.mechanisms import Mechanism
from gradwire.sim.mechanisms import parse as parse_mechanism
from gradwire.sim.ps import PSOptions, distribution, pieces
from gradwire.sim.trace import Trace
from gradwire.sim.trace import load as load_trace

RENDEZVOUS_S = 120  # how long a rank waits for the others to join the process group


def check(m: Mechanism) -> None:
    """Refuse what the emulated cluster cannot run, in one line."""
    o = m.options
    if isinstance(o, PSOptions):
        if o.multicast or o.ina:
            raise GradwireError(f"mechanism {m.label!r} cannot run on the emulated cluster: it "
                                "has no IP multicast or in-network aggregation (ps, ring, "
                                "butterfly and the allreduce algorithms can)")
        if not o.barrier:
            raise GradwireError(f"mechanism {m.label!r} cannot run on the emulated cluster: "
                                "only barrier=on is emulated")
    elif o.multicast:
        raise GradwireError(f"mechanism {m.label!r} cannot run on the emulated cluster: it "
                            "has no IP multicast (ps, ring, butterfly and the allreduce "
                            "algorithms can)")
    elif o.compressor is not None:
        raise GradwireError(f"mechanism {m.label!r} cannot run on the emulated cluster: "
                            "compressed mechanisms are simulated only")


def calls(trace: Trace, m: Mechanism, p: int) -> list[tuple[list[int], str, int, dict]]:
    """A collective mechanism's buckets as (parameters, algorithm, float32 count, schedule
    params); a bucket that is not a whole number of float32 elements is refused."""
    o = m.options
    out = []
    for g in buckets(trace, o.bucket_bytes):
        _, algo, n, kw = bucket_spec(sum(trace.params[i].bytes for i in g), p, o)
        if kw["itemsize"] != 4:
            raise GradwireError(f"{m.label}: the bucket of parameters {g} is not a whole number "
                                "of float32 elements; the emulated run moves float32 gradients")
        out.append((g, algo, n, {k: v for k, v in kw.items() if k != "itemsize"}))
    return out


def check_trace(trace: Trace, m: Mechanism, c: SimCluster) -> None:
    """:func:`check`, the hosts it needs must fit one emulated cluster
    (:func:`check_hosts`), and a collective's buckets must be whole float32s: before any rank
    starts."""
    check(m)
    check_hosts(m, c)
    if not isinstance(m.options, PSOptions):
        calls(trace, m, c.workers)


def hosts(m: Mechanism, c: SimCluster) -> int:
    return c.workers + (c.servers if isinstance(m.options, PSOptions) else 0)


def check_hosts(m: Mechanism, c: SimCluster) -> None:
    """Refuse, in one line, a mechanism whose workers (and servers) one emulated cluster cannot
    hold: before the calibration and the mechanisms before it have run, and naming what the
    user gave (the cluster's own error names a --hosts they never typed)."""
    from gradwire.cluster.state import MAX_HOSTS

    n = hosts(m, c)
    if n > MAX_HOSTS:
        servers = (f" and {c.servers} server{'' if c.servers == 1 else 's'}"
                   if isinstance(m.options, PSOptions) else "")
        raise GradwireError(f"{m.label} with {c.workers} workers{servers} needs {n} emulated "
                            f"hosts: an emulated cluster holds at most {MAX_HOSTS}")


# ------------------------------------------------------------------------------ rank side
def _until(t: float) -> None:
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)


def _alpha(m: Mechanism, c: SimCluster, t) -> float:
    """Seconds per message of ``m`` on this cluster, measured in its run before its iterations
    (reported beside the measurement as ``run_alpha_s``; never simulated with: see
    :func:`validate`): parameter servers stream messages, :func:`_stream_alpha` from server
    0 to worker 0; collectives wait on each step, so theirs is a P-element call of the
    mechanism's own schedule divided by its steps (5 runs of 40 calls, median)."""
    from gradwire.collectives.probe import step_alpha

    if not isinstance(m.options, PSOptions):
        _, algo, _, kw = bucket_spec(4 * t.world_size, t.world_size, m.options)
        return step_alpha(t, algo, **kw)
    return _stream_alpha(t, c.workers)


def _stream_alpha(t, src: int) -> float:
    """A sender's software overhead per message of a stream: 200 back-to-back 8-byte sends
    from rank ``src`` to rank 0, then one back (median of 5), on every rank."""
    import torch
    import torch.distributed as dist

    from gradwire.transport import wait_all

    n, msg = 200, torch.zeros(8, dtype=torch.uint8)
    runs = []
    for _ in range(5):
        dist.barrier()
        t0 = time.perf_counter()
        if t.rank == src:
            for _ in range(n):
                t.send(msg, 0)
            t.recv(msg, 0)
        elif t.rank == 0:
            wait_all([t.irecv(torch.zeros_like(msg), src) for _ in range(n)])
            t.send(msg, src)
        runs.append((time.perf_counter() - t0) / n)
    per = torch.tensor([statistics.median(runs)])
    dist.broadcast(per, 0)
    t.reset_counters()
    return float(per)


def _stream_probe(out: str) -> int:
    """``python -m gradwire.sim.emulate --stream-alpha --out F``: :func:`_stream_alpha` from
    the last rank to rank 0, to F as ``{"alpha_stream_s": ...}`` (part of :func:`calibrate`)."""
    import torch.distributed as dist

    from gradwire.rendezvous import join_world
    from gradwire.transport import Transport

    join_world("gloo", RENDEZVOUS_S, prog="python -m gradwire.sim.emulate")
    t = Transport(check_calls=False)
    alpha = _stream_alpha(t, t.world_size - 1)
    if t.rank == 0:
        Path(out).write_text(dumps({"alpha_stream_s": alpha}))
    dist.destroy_process_group()
    return 0


def _collective_rank(trace: Trace, c: SimCluster, m: Mechanism, t, pick) -> list[float]:
    import torch

    import gradwire.collectives as gc

    r = t.rank
    todo = [(torch.ones(n), algo, params, g) for g, algo, n, params in calls(trace, m, c.workers)]
    ends = []
    start = time.monotonic()
    for it in range(c.iterations):
        rec = trace.iterations[pick[r, it]]
        b0 = start + rec.forward_s
        for buf, algo, params, g in todo:
            _until(b0 + max(rec.backward[i] for i in g))
            gc.all_reduce(buf, op="sum", algo=algo, transport=t, **params)
        start = time.monotonic()
        ends.append(start)
    return ends


def _ps_rank(trace: Trace, c: SimCluster, o: PSOptions, t, pick) -> list[float]:
    import torch

    from gradwire.transport import wait_all

    w_count, s_count = c.workers, c.servers
    pcs = pieces(trace, s_count, o.sharding)
    of_param: list[list[int]] = [[] for _ in trace.params]
    for k, (i, _, _) in enumerate(pcs):
        of_param[i].append(k)
    buf = [torch.ones(n, dtype=torch.uint8) for _, _, n in pcs]
    order = [distribution([k for k, pc in enumerate(pcs) if pc[1] == s], w_count, o)
             for s in range(s_count)]
    ends: list[float] = []
    if t.rank >= w_count:  # a server
        s = t.rank - w_count
        push = {(w, k): torch.empty_like(buf[k]) for w in range(w_count) for k, pc in
                enumerate(pcs) if pc[1] == s}
        flag = torch.zeros(1, dtype=torch.uint8)
        for it in range(c.iterations):
            recvs = []
            for w in range(w_count):
                for i in trace.iterations[pick[w, it]].ready_order():
                    recvs += [(w, k, t.irecv(push[w, k], w)) for k in of_param[i]
                              if pcs[k][1] == s]
            for k, w in order[s]:
                t.send(buf[k], w)
            for w, k, h in recvs:
                h.wait()
                buf[k].add_(push[w, k])  # the aggregation (uint8: the bytes matter, not sums)
            ends.append(time.monotonic())
            with t.control():  # every server has everything before the next distribution
                others = [w_count + x for x in range(s_count) if x != s]
                wait_all([t.isend(flag, h) for h in others] +
                         [t.irecv(torch.zeros_like(flag), h) for h in others])
        return ends
    w = t.rank
    free = time.monotonic()
    n = len(trace.params)
    for it in range(c.iterations):
        rec = trace.iterations[pick[w, it]]
        got = {k: t.irecv(buf[k], w_count + s) for s in range(s_count)
               for k, dst in order[s] if dst == w}
        last = free
        for i in range(n):
            target = last + rec.forward[i] - (rec.forward[i - 1] if i else 0.0)
            _until(target)
            for k in of_param[i]:
                got[k].wait()
            last = max(target, time.monotonic())
        bstart = last + rec.forward_s - (rec.forward[-1] if n else 0.0)
        for i in rec.ready_order():
            _until(bstart + rec.backward[i])
            for k in of_param[i]:
                t.send(buf[k], w_count + pcs[k][1])
        free = bstart + rec.backward_s
    return ends


def main(argv: list[str] | None = None) -> int:
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--stream-alpha", action="store_true")
    probe.add_argument("--out")
    known, _ = probe.parse_known_args(argv)
    if known.stream_alpha:
        return _stream_probe(known.out)
    ap = argparse.ArgumentParser(description="rank side of gradwire simulate --emulate")
    ap.add_argument("--trace", required=True, type=Path)
    ap.add_argument("--mechanism", required=True)
    ap.add_argument("--workers", required=True, type=int)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    from gradwire.rendezvous import join_world
    from gradwire.transport import Transport

    trace = load_trace(a.trace)
    m = parse_mechanism(a.mechanism)
    check(m)
    c = SimCluster(a.workers, 1.0, a.servers, iterations=a.iterations, seed=a.seed)
    pick = choices(c, len(trace.iterations))
    join_world("gloo", RENDEZVOUS_S, prog="python -m gradwire.sim.emulate")
    t = Transport(check_calls=False)
    if t.world_size != hosts(m, c):
        raise GradwireError(f"{m.label} with {c.workers} workers needs {hosts(m, c)} ranks, "
                            f"got {t.world_size}")
    alpha = _alpha(m, c, t)
    dist.barrier()
    if isinstance(m.options, PSOptions):
        ends = _ps_rank(trace, c, m.options, t, pick)
    else:
        ends = _collective_rank(trace, c, m, t, pick)
    mine = torch.tensor([*(ends or [float("nan")] * c.iterations), sum(t.bytes_sent),
                         sum(t.bytes_received)], dtype=torch.float64)
    rows = [torch.empty_like(mine) for _ in range(t.world_size)]
    dist.all_gather(rows, mine)
    if t.rank == 0:
        table = torch.stack(rows)
        ended = table[:, : c.iterations]
        ended = ended[~ended[:, 0].isnan()]
        ends = ended.max(dim=0).values
        ends = (ends - ends[0]).tolist()
        w = c.workers
        sent, recv = table[:, c.iterations], table[:, c.iterations + 1]
        link = {"worker up": sent[:w].sum(), "worker down": recv[:w].sum()}
        if t.world_size > w:
            link |= {"server up": sent[w:].sum(), "server down": recv[w:].sum()}
        Path(a.out).write_text(dumps({
            "mechanism": m.label, "ends": ends, "iteration_s": steady(ends), "alpha_s": alpha,
            "link_bytes": {k: float(v) for k, v in link.items()}}))
    dist.destroy_process_group()
    return 0


# ------------------------------------------------------------------------------ driver
def run(trace_path: Path, c: SimCluster, mechanisms: list[Mechanism], bandwidth: str,
        console: Console, loopback: bool = False, timeout: float | None = None) -> list[dict]:
    """Each mechanism for real on its own emulated cluster of ``bandwidth`` links; per
    mechanism the measured steady iteration time, iteration ends and bytes per link kind."""
    from gradwire.cluster import ephemeral_cluster
    from gradwire.jobs import build_progress, run_ranks

    for m in mechanisms:
        check(m)
        check_hosts(m, c)
    out = []
    for m in mechanisms:
        args = ["--trace", str(trace_path), "--mechanism", m.label, "--workers",
                str(c.workers), "--servers", str(c.servers), "--iterations",
                str(c.iterations), "--seed", str(c.seed)]
        with ephemeral_cluster(hosts(m, c), bandwidth, loopback,
                               progress=build_progress(console, hosts(m, c))) as cl:
            out.append(run_ranks(cl, "gradwire.sim.emulate", args, f"emulate {m.label}",
                                 timeout, console))
    return out


def calibrate(workers: int, bandwidth: str, console: Console, loopback: bool = False) -> dict:
    """What :func:`validate` simulates with, measured on an emulated cluster of ``workers``
    hosts of ``bandwidth`` before any run it is compared with: ``gradwire calibrate``'s
    result (CPU ranks over gloo) and ``alpha_stream_s``, a sender's cost per message of a
    stream (:func:`_stream_alpha`, from the last host to the first)."""
    from gradwire.cluster import ephemeral_cluster
    from gradwire.jobs import build_progress, run_ranks

    with ephemeral_cluster(workers, bandwidth, loopback,
                           progress=build_progress(console, workers)) as cl:
        cal = run_ranks(cl, "gradwire.bench.calibrate", ["--device", "cpu", "--model",
                                                         "resnet20"],
                        f"calibrate {workers} hosts", None, console)
        stream = run_ranks(cl, "gradwire.sim.emulate", ["--stream-alpha"],
                           "α of a stream of messages", None, console)
    return {**cal, **stream}  # type: ignore[dict-item]


def calibrated_alpha(m: Mechanism, cal: dict) -> float:
    """α per message of ``m`` from the calibration ``cal`` (:func:`calibrate`), the same for
    every mechanism of a kind: parameter servers stream their messages, so a stream's cost
    per message (``alpha_stream_s``); collectives wait on each step, so α per step of
    gradwire's executor's ring allreduce of P elements (``alpha_transport_s``; ``alpha_s``
    in a file without it). Latency included: the simulation adds none."""
    if isinstance(m.options, PSOptions):
        if "alpha_stream_s" not in cal:
            raise GradwireError("the calibration has no 'alpha_stream_s' (a stream's cost per "
                                "message), which a parameter server is simulated with: "
                                "measure it with gradwire.sim.emulate.calibrate")
        return float(cal["alpha_stream_s"])
    alpha = cal.get("alpha_transport_s")
    return float(cal["alpha_s"] if alpha is None else alpha)


def validate(trace_path: Path, workers: int, servers: int, bandwidth: str,
             mechanisms: list[Mechanism], console: Console, iterations: int = 5,
             seed: int = 0, loopback: bool = False,
             calibration: dict | None = None) -> tuple[list[dict], dict]:
    """Simulate each mechanism on the trace, then run it for real and measure it; returns
    (rows, calibration).

    A validation predicts; it does not refit. Every mechanism is simulated before any of them
    runs, from what :func:`calibrate` measured on ``workers`` hosts of ``bandwidth`` before
    them: the link rate (β), γ and α (:func:`calibrated_alpha`: one per kind of mechanism,
    not per mechanism), and this machine's TCP send-buffer ceiling (``tcp_wmem``'s maximum,
    a setting). Not the hosts' own, lower ceiling (4 ms of the link): beside its socket's
    buffer, a sender has the receiver's and the links' queues to hand bytes to. Nothing a
    run measures goes in: not its iterations, nor the α it probes with the mechanism's own
    schedule before them (``run_alpha_s`` in its row, for comparison).
    ``calibration``: a result of :func:`calibrate` to use instead of measuring one."""
    from gradwire.cluster.netns import machine_send_buffer

    trace = load_trace(trace_path)
    c = SimCluster(workers, 1.0, servers, iterations=iterations, seed=seed)
    if iterations < 2:  # the measured time is the interval between iteration ends
        raise GradwireError(f"--emulate measures the time between iteration ends: it needs "
                            f"--iterations >= 2, got {iterations}")
    for m in mechanisms:
        check_trace(trace, m, c)
        check(m)
        check_hosts(m, c)
    cal = calibrate(workers, bandwidth, console, loopback) if calibration is None else calibration
    c = SimCluster(workers, 8 / cal["beta_s_per_byte"], servers, latency=0.0,
                   gamma=cal["gamma_s_per_byte"], iterations=iterations, seed=seed,
                   send_buffer=machine_send_buffer())
    alphas = [calibrated_alpha(m, cal) for m in mechanisms]
    sims = [m.run(trace, dataclasses.replace(c, alpha=a), False)  # before any measured run
            for m, a in zip(mechanisms, alphas, strict=True)]
    measured = run(trace_path, c, mechanisms, bandwidth, console, loopback)
    rows = []
    for m, alpha, sim, real in zip(mechanisms, alphas, sims, measured, strict=True):
        rows.append({
            "mechanism": m.label, "workers": workers,
            "servers": servers if isinstance(m.options, PSOptions) else 0,
            "alpha_s": alpha, "run_alpha_s": real["alpha_s"], "send_buffer": c.send_buffer,
            "simulated_s": sim.iteration_s,
            "measured_s": real["iteration_s"], "error": sim.iteration_s / real["iteration_s"] - 1,
            "simulated_ends": sim.ends, "measured_ends": real["ends"],
            "simulated_link_bytes": sim.link_bytes, "measured_link_bytes": real["link_bytes"]})
    cal = {**cal, "link_bps": c.bandwidth_bps, "send_buffer": c.send_buffer}
    return rows, cal


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except GradwireError as e:  # a rendezvous that failed, a world of the wrong size
        raise SystemExit(f"python -m gradwire.sim.emulate: error: {e}") from None
