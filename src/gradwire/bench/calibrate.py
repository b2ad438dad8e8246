"""``gradwire calibrate``: measure what the performance model needs on the ranks' own devices
and network, and write it as a calibration file (:mod:`gradwire.perf.calibration` says what
each field is, its unit and how it is measured).

The rank side runs wherever training runs, under torchrun or ``gradwire run``::

    torchrun --nproc-per-node 2 -m gradwire.bench.calibrate --out cal.json
    torchrun --nproc-per-node 2 --no-python gradwire calibrate --out cal.json

``--device cuda`` (the default where CUDA is available) runs over NCCL with each rank on
``cuda:LOCAL_RANK``; ``--device cpu`` over gloo. In order (:func:`measure`): α of the
backend and of gradwire's executor (every rank), β between nodes and within one (rank 0
and its peer), γ and the codecs (rank 0 alone, the others waiting at a barrier), κ (every
rank), the coding slowdown (rank 0 alone), the compute slowdown (rank 0 alone, then every
rank), and on CPU the shared-CPU terms (every rank). Rank 0 combines the ranks' results
and writes the file.

The host side (:func:`calibrate`, ``gradwire calibrate --hosts N --bandwidth B``) runs the
same rank side on an emulated cluster, adds the cluster's label, link rate and token bucket,
and saves in ``$GRADWIRE_HOME/calibration/<bandwidth>.json`` unless given ``--out``.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.distributed as dist

import gradwire
from gradwire import config
from gradwire.bench import codec_probe, provenance
from gradwire.bench.codec_probe import sync
from gradwire.bench.overlap_probe import (
    TARGET_S,
    StandIn,
    coding_slowdown,
    compute_stand_in,
    iteration_s,
    median_over_ranks,
    overlap_slowdown,
    under_ddp,
)
from gradwire.check import check_density, check_powersgd_rank
from gradwire.errors import GradwireError
from gradwire.jsonfile import check_writable, save_elsewhere
from gradwire.perf import calibration
from gradwire.perf.calibration import Calibration, Compute, Reduce
from gradwire.perf.codecs import CodecTable
from gradwire.profiles import Profile
from gradwire.rendezvous import JOIN_S, join_world
from gradwire.schedules.cost import CostParams

if TYPE_CHECKING:
    from rich.console import Console

    from gradwire.cluster import Cluster

T = TypeVar("T")
WINDOW = 16
STREAM_BYTES = 4 * 2**20
REDUCE_BYTES = 2 * 2**20  # per rank, of each dtype's allreduce (reduce_dtypes)
REDUCE_RUNS = 5
ALPHA_WARMUP, ALPHA_RUNS, ALPHA_CALLS = 20, 5, 40
BUCKET_NUMEL = 25 * 2**20 // 4  # DDP's default bucket, fp32
STEPS = 8  # progress steps of measure()


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_args(model: str, density: float, rank: int, device: str,
               out: str | Path | None) -> Profile:
    """The options of either side, checked before anything runs (one-line errors); the
    profile ``model`` names."""
    from gradwire import profiles
    from gradwire.bench.spec import check_device

    check_density(density)
    check_powersgd_rank(rank)
    check_device(device)
    check_writable(out, "--out")
    return profiles.load(model)


# ---- rank side


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gradwire.bench.calibrate",
                                 description="gradwire calibrate's rank side: run it on every "
                                             "rank (torchrun, gradwire run)")
    # a string, as typed: Path("out/") drops the slash that says a folder was meant
    ap.add_argument("--out", required=True, help="rank 0 writes the file here")
    ap.add_argument("--model", default="resnet50",
                    help="profile (built-in name or JSON) whose bucket the codecs are timed on")
    ap.add_argument("--density", type=float, default=0.001, help="sparsifiers' kept fraction")
    ap.add_argument("--rank", type=int, default=4, help="PowerSGD's rank")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=default_device(),
                    help="cuda: NCCL, cuda:LOCAL_RANK; cpu: gloo (default: cuda if there)")
    a = ap.parse_args(argv)
    first = os.environ.get("RANK", "0") == "0"
    try:
        prof = check_args(a.model, a.density, a.rank, a.device, a.out if first else None)
    except GradwireError as e:
        ap.error(str(e))
    a.out = Path(a.out)
    command = "python -m gradwire.bench.calibrate " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    try:
        cal = run(a.out, prof, a.model, a.density, a.rank, a.device, command)
    except Unsaved as e:  # minutes of measurement are not lost to a full disk
        raise SystemExit(f"{ap.prog}: error: {e}; {save_elsewhere(e.path, e.cal.dumps())}"
                         ) from None
    except GradwireError as e:
        raise SystemExit(f"{ap.prog}: error: {e}") from None
    if cal is not None:
        print(f"wrote {a.out}: {summary(cal)}", flush=True)
    return 0


def run(out: Path, prof: Profile, model: str, density: float, rank: int, device: str,
        command: str) -> Calibration | None:
    """The rank side on this process's rank of a torchrun-style job: join the process group,
    :func:`measure`, and on rank 0 write ``out``; rank 0 returns the calibration, the others
    None."""
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else (
        torch.device("cpu"))
    join_world("nccl" if device == "cuda" else "gloo", 600,
               prog="python -m gradwire.bench.calibrate", join=JOIN_S)
    try:
        if dist.get_world_size() < 2:  # α is per step of a ring of P ranks: 2(P − 1) steps
            raise GradwireError("gradwire calibrate needs at least 2 ranks, got 1")
        cal = measure(prof, model, density, rank, dev, command)
        if cal is not None:
            save(cal, out)
        return cal
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class Ranks:
    """This rank's device, and the group its barriers run on: on CUDA a gloo group, so that
    a rank waiting for rank 0 keeps no kernel on a GPU that ranks may share."""

    dev: torch.device
    waits: dist.ProcessGroup | None = None

    def barrier(self) -> None:
        sync(self.dev)
        dist.barrier(group=self.waits)


def measure(prof: Profile, model: str, density: float, rank: int, dev: torch.device,
            command: str) -> Calibration | None:
    """Every term, every rank taking part (rank 0 returns the calibration, the others None);
    the codecs on one DDP bucket of ``prof`` (or all of it where smaller)."""
    from gradwire.bench.sharing import cpu_terms
    from gradwire.transport import Transport

    p, me = dist.get_world_size(), dist.get_rank()
    r = Ranks(dev, dist.new_group(backend="gloo") if dev.type == "cuda" else None)
    per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    nodes = math.ceil(p / per_node)
    step = _progress()
    call = median_over_ranks(allreduce_call(r), dev)
    hop = median_over_ranks(transport_call(r), dev) / (2 * (p - 1))
    step("α (the backend's allreduce, the executor's steps)")
    beta = stream(0, per_node if nodes > 1 else 1, r)
    intra = stream(0, 1, r) if nodes > 1 and per_node > 1 else None
    step("β (streaming)")
    gamma = _broadcast(on_rank0(lambda: reduce_speed(dev), r), dev)
    halves = reduce_dtypes(r)
    step("γ and the dtypes' reductions")
    numel = min(BUCKET_NUMEL, prof.numel)
    codecs = on_rank0(lambda: codec_probe.measure(numel, 3, density, rank, dev), r)
    step("every method's encode and decode")
    stand = StandIn(dev)
    stand.set_batch(int(_broadcast(float(stand.size()), dev)))
    overlap = overlap_slowdown(stand, r.barrier)
    step("κ (backward beside communication)")
    coding = on_rank0(lambda: coding_slowdown(stand, numel, density), r)
    step("backward beside encoding")
    compute = compute_slowdown(prof, r)
    step("compute under DDP, every rank at once")
    cpu = cpu_terms(Transport(check_calls=False), gamma) if dev.type == "cpu" else None
    step("how the ranks share the cores" if cpu is not None else "(no CPU-sharing terms on a GPU)")
    if me != 0:
        return None
    assert beta is not None and codecs is not None and coding is not None  # rank 0 has them
    return Calibration(
        alpha_s=call / (2 * (p - 1)), alpha_call_s=call, beta_s_per_byte=beta,
        beta_between="nodes" if nodes > 1 else "ranks of one node",
        beta_intra_s_per_byte=intra, gamma_s_per_byte=gamma,
        overlap_slowdown=max(1.0, overlap.with_comm_s / overlap.backward_s), overlap=overlap,
        coding_slowdown=coding.together_s / (coding.backward_s + coding.encode_s),
        coding=coding,
        codecs=CodecTable("measured", codecs["numel"], codecs["methods"], codecs["source"]),
        cpu=cpu, world=p, ranks_per_node=per_node, nodes=nodes,
        backend=dist.get_backend(), device=_device_name(dev), model=model,
        gradwire=gradwire.__version__,
        **provenance.stamp(command, dev.type),
        network=os.environ.get("GRADWIRE_NETWORK"), alpha_transport_s=hop,
        compute_slowdown=max(1.0, compute.together_s / compute.alone_s), compute=compute,
        reduce=halves)


def allreduce_call(r: Ranks) -> float:
    """Seconds per call of the backend's own allreduce of P fp32 elements on this rank
    (:func:`_per_call`)."""
    buf = torch.zeros(dist.get_world_size(), device=r.dev)
    return _per_call(lambda: dist.all_reduce(buf), r)


def transport_call(r: Ranks) -> float:
    """Seconds per call of gradwire's own ring allreduce of P fp32 elements (its executor:
    point-to-point sends and receives on the backend, the call header off), timed as
    :func:`allreduce_call` times the backend's."""
    from gradwire.collectives import all_reduce
    from gradwire.transport import Transport

    t = Transport(check_calls=False)
    buf = torch.zeros(dist.get_world_size(), device=r.dev)
    return _per_call(lambda: all_reduce(buf, algo="ring", transport=t), r)


def _per_call(call: Callable[[], object], r: Ranks) -> float:
    """Seconds per ``call()`` on this rank: ``ALPHA_RUNS`` runs of ``ALPHA_CALLS`` calls after
    ``ALPHA_WARMUP``, each run after a barrier and synchronized at its end; the median run."""
    for _ in range(ALPHA_WARMUP):
        call()
    runs = []
    for _ in range(ALPHA_RUNS):
        r.barrier()
        t0 = time.perf_counter()
        for _ in range(ALPHA_CALLS):
            call()
        sync(r.dev)
        runs.append((time.perf_counter() - t0) / ALPHA_CALLS)
    return statistics.median(runs)


def compute_slowdown(prof: Profile, r: Ranks) -> Compute:
    """The compute slowdown's raw times: a stand-in of ``prof``'s size
    (:func:`~gradwire.bench.overlap_probe.compute_stand_in`), its batch sized on rank 0 alone
    so that backward takes ``prof``'s backward time (at most ``TARGET_S``, so that a slow
    model's probe stays short; ``TARGET_S`` where the profile has none); an iteration of it
    bare on rank 0 alone, then on every rank at once under DDP (the median over ranks)."""
    stand = compute_stand_in(r.dev, prof.numel)
    target = min(prof.backward_s or TARGET_S, TARGET_S)
    stand.set_batch(int(_broadcast(on_rank0(lambda: float(stand.size(target)), r), r.dev)))
    alone = _broadcast(on_rank0(lambda: iteration_s(stand), r), r.dev)
    together = median_over_ranks(iteration_s(stand, under_ddp(stand)), r.dev)
    return Compute(stand.name, alone, together)


def stream(src: int, dst: int, r: Ranks) -> float | None:
    """β from ``src`` to ``dst`` (osu_bw): ``src`` sends a window of ``WINDOW`` messages of
    ``STREAM_BYTES`` (isend/irecv on the backend), ``dst`` answers with 4 bytes; seconds per
    byte, the median of 3 windows after one. Every rank takes part in the barriers; ``src``
    returns the result, the others None."""
    me, dev = dist.get_rank(), r.dev
    bufs = [torch.zeros(STREAM_BYTES, dtype=torch.uint8, device=dev) for _ in range(WINDOW)
            ] if me in (src, dst) else []
    ack = torch.zeros(4, dtype=torch.uint8, device=dev)
    rates = []
    for _ in range(4):
        r.barrier()
        t0 = time.perf_counter()
        if me == src:
            _wait(dist.batch_isend_irecv([dist.P2POp(dist.isend, b, dst) for b in bufs]))
            dist.recv(ack, dst)
            sync(dev)
            rates.append((time.perf_counter() - t0) / (WINDOW * STREAM_BYTES))
        elif me == dst:
            _wait(dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, src) for b in bufs]))
            dist.send(ack, src)
            sync(dev)
    r.barrier()
    return statistics.median(rates[1:]) if me == src else None


def reduce_speed(dev: torch.device) -> float:
    """γ: ``a.add_(b)`` over 64 MiB of fp32 on ``dev``, seconds per byte of ``b``, the median
    of 5 after one."""
    a, b = torch.ones(16 * 2**20, device=dev), torch.ones(16 * 2**20, device=dev)
    runs = []
    for _ in range(6):
        sync(dev)
        t0 = time.perf_counter()
        a.add_(b)
        sync(dev)
        runs.append((time.perf_counter() - t0) / (b.numel() * 4))
    return statistics.median(runs[1:])


def reduce_dtypes(r: Ranks) -> Reduce:
    """The backend's allreduce of ``REDUCE_BYTES`` per rank as fp32, fp16 and bf16 (the same
    bytes: twice the elements in half precision), every rank at once, the dtypes in turn after
    a barrier, ``REDUCE_RUNS`` rounds after one: the median over ranks of each dtype's median.
    What a dtype takes beyond fp32 is its reduction (:meth:`Calibration.gamma_dtype`)."""
    bufs = {d: torch.zeros(REDUCE_BYTES // d.itemsize, dtype=d, device=r.dev)
            for d in (torch.float32, torch.float16, torch.bfloat16)}
    runs: dict[torch.dtype, list[float]] = {d: [] for d in bufs}
    for _ in range(REDUCE_RUNS + 1):
        for d, buf in bufs.items():
            buf.normal_()  # values to add, not zeros a backend might skip over
            r.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            sync(r.dev)
            runs[d].append(time.perf_counter() - t0)
    f32, f16, b16 = (median_over_ranks(statistics.median(runs[d][1:]), r.dev) for d in bufs)
    return Reduce(REDUCE_BYTES, f32, f16, b16)


def on_rank0(fn: Callable[[], T], r: Ranks) -> T | None:
    """``fn()`` on rank 0 alone, the others waiting at a barrier, so that ranks sharing its
    device do not run beside what it times; None on the others."""
    r.barrier()
    out = fn() if dist.get_rank() == 0 else None
    r.barrier()
    return out


def _broadcast(value: float | None, dev: torch.device) -> float:
    """Rank 0's ``value`` on every rank."""
    t = torch.tensor([value or 0.0], dtype=torch.float64, device=dev)
    dist.broadcast(t, 0)
    return float(t)


def _wait(works: list) -> None:
    for w in works:
        w.wait()


def _progress() -> Callable[[str], None]:
    """A step of rank 0's progress: ``GW_PROGRESS done total`` lines for the bar of gradwire's
    launcher; under another launcher (torchrun), one line on stderr per step, naming what was
    measured and the seconds so far, so that a run of a minute is not silent. Nothing on
    the other ranks."""
    from gradwire.launcher import PROGRESS

    done = [0]
    t0 = time.perf_counter()
    ours = "GRADWIRE_NETWORK" in os.environ

    def step(what: str) -> None:
        done[0] += 1
        if dist.get_rank() != 0:
            return
        if ours:
            print(f"{PROGRESS} {done[0]} {STEPS}", flush=True)
        else:
            print(f"gradwire calibrate: {done[0]}/{STEPS} done: {what} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    return step


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def summary(cal: Calibration) -> str:
    """One line of the headline terms."""
    return (f"α {cal.alpha_s * 1e6:.1f} µs/step, β {cal.beta_s_per_byte * 1e9:.3f} ns/B "
            f"({8 / cal.beta_s_per_byte / 1e9:.2f} Gbit/s, {cal.beta_between}), "
            f"γ {cal.gamma_s_per_byte * 1e9:.3f} ns/B"
            + "".join(f" ({d} {g * 1e9:.3f})" for d, g in cal.gamma_dtype().items())
            + f", κ {cal.overlap_slowdown:.2f}, "
            f"coding ×{cal.coding_slowdown:.2f}"
            + (f", executor α {cal.alpha_transport_s * 1e6:.1f} µs/step"
               if cal.alpha_transport_s else "")
            + f", compute ×{cal.compute_slowdown:.2f}, {cal.world} ranks on {cal.device} "
            f"({cal.backend})")


# ---- host side and saved calibrations


def calibration_dir() -> Path:
    return config.home() / "calibration"


def calibration_path(bandwidth: str) -> Path:
    return calibration_dir() / f"{bandwidth}.json"


def load(bandwidth: str) -> tuple[CostParams, dict] | None:
    """The saved calibration for links of ``bandwidth`` (α, β, γ and the token bucket for the
    cost model, and the file's fields), or None when there is none."""
    path = calibration_path(bandwidth)
    if not path.exists():
        return None
    d = calibration.load(path).to_json()
    return cost_params(d), d


def cost_params(d: dict) -> CostParams:
    """The cost model's parameters from a calibration's fields: α per step, β, γ and
    ``burst_bytes``, the token bucket the cluster shapes its links with. ``start_credit``
    stays 0: ``gradwire bench`` times calls back to back after a lead-in call, and its model
    column carries each link's credit from call to call
    (:func:`gradwire.schedules.cost.back_to_back`)."""
    return CostParams(float(d["alpha_s"]), float(d["beta_s_per_byte"]),
                      float(d["gamma_s_per_byte"]), burst=float(d.get("burst_bytes", 0.0)))


def calibrate(open_cluster: Callable[[], AbstractContextManager[Cluster]], out: Path | None,
              rank_args: list[str], command: str, timeout: float | None,
              console: Console) -> tuple[Calibration, Path]:
    """``gradwire calibrate`` on an emulated cluster: the rank side (with ``rank_args``) on
    every host of the cluster ``open_cluster`` opens, then the cluster's label, link rate
    and token bucket added; saved to ``out`` or, when None, where :func:`load` finds it (that
    folder checked first: a cluster's minutes are not spent on a result that cannot be
    kept). Returns the calibration and where it was saved."""
    from gradwire.jobs import run_ranks

    if out is None:
        folder = calibration_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise GradwireError(f"cannot save calibrations in {str(folder)!r} ({e.strerror}): "
                                "set GRADWIRE_HOME to a folder that can be written") from None
    with open_cluster() as c:
        doc = run_ranks(c, "gradwire.bench.calibrate", rank_args, "calibrate", timeout,
                        console, total=STEPS)
        key, label, bucket = c.link_key, c.label, c.burst_bytes
    doc |= {"network": label, "bandwidth": key, "burst_bytes": bucket, "command": command}
    cal = calibration.parse(doc, "gradwire calibrate's ranks' result")
    path = out if out is not None else calibration_path(key)
    save(cal, path)
    return cal, path


class Unsaved(GradwireError):
    """A calibration measured but not saved at ``path``: ``cal`` holds it, for the caller to
    keep elsewhere."""

    def __init__(self, cal: Calibration, path: Path, e: OSError) -> None:
        super().__init__(f"could not write {path} ({e.strerror or e})")
        self.cal, self.path = cal, Path(path)


def save(cal: Calibration, path: Path) -> None:
    """Save ``cal`` at ``path`` (:meth:`Calibration.save`: replaced whole); :class:`Unsaved`
    where it fails, holding what was measured."""
    try:
        cal.save(path)
    except OSError as e:
        raise Unsaved(cal, path, e) from None


if __name__ == "__main__":
    raise SystemExit(main())
