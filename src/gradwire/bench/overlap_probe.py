"""How much backward slows when other work runs beside it, for :mod:`gradwire.bench.calibrate`.

- κ (:func:`overlap_slowdown`): backward beside a large allreduce in flight, every rank at
  once, against backward alone (the overlap factor of the compression-utility paper, §4.1).
- The coding slowdown (:func:`coding_slowdown`): backward and a Top-k encode at the same time
  against one after the other: they compete for the device (same paper, §3.1).
- The compute slowdown (:func:`iteration_s`, :func:`under_ddp`): a rank's forward, backward
  and step under DDP with every rank computing at once, against one rank alone and bare, as
  a profile is measured: DDP's own work per iteration and ranks that share a machine.

The first two time the stand-in model (:class:`StandIn`): :func:`gradwire.models.mlp` with 4
hidden layers of ``WIDTH`` (1024 on CPU, 4096 on CUDA), its batch sized so that one backward
takes about ``TARGET_S`` on the device; the third a stand-in of the profile's size
(:func:`compute_stand_in`: only its parameter count and backward time come from the
profile). Nothing of the model a user predicts for is timed.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from gradwire.bench.codec_probe import gradient, sync
from gradwire.catalogue import METHODS
from gradwire.models import mlp
from gradwire.perf.calibration import Coding, Overlap

WIDTH = {"cpu": 1024, "cuda": 4096}
DEPTH = 4
TARGET_S = 0.06  # backward time the stand-in's batch is sized for
MAX_BATCH = 16384
RUNS = 5  # timed runs of each kind; medians
COMM_NUMEL = 25 * 2**20 // 4  # the allreduce beside backward: one DDP bucket of fp32
MAX_COMM_CALLS = 32
COMPUTE_ITERS = 10  # iterations per timed run of the compute slowdown


class StandIn:
    """The stand-in model on ``device`` and one batch of input; :meth:`backward` times one
    backward pass (the forward before it untimed). ``width`` and ``depth``: the MLP's
    (default ``WIDTH`` and ``DEPTH``)."""

    def __init__(self, device: torch.device, batch: int = 64, width: int | None = None,
                 depth: int = DEPTH) -> None:
        self.device, self.width, self.depth = device, width or WIDTH[device.type], depth
        torch.manual_seed(0)
        self.model = mlp(self.width, 10, self.width, depth).to(device)
        self.set_batch(batch)

    def set_batch(self, batch: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.batch = batch
        self.x = torch.randn(batch, self.width, generator=gen).to(self.device)
        self.y = torch.randint(0, 10, (batch,), generator=gen).to(self.device)

    @property
    def name(self) -> str:
        return (f"gradwire.models.mlp {self.width}x{self.depth} hidden ({self.device.type}), "
                f"batch {self.batch}")

    def forward(self) -> torch.Tensor:
        """The loss, its forward done (on CUDA, on this stream only)."""
        self.model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        _stream_sync(self.device)
        return loss

    def backward(self, loss: torch.Tensor | None = None) -> float:
        """Seconds of one backward pass (from ``loss``, or a forward run first): on CUDA,
        until this stream's kernels are done (an allreduce on NCCL's stream is not waited
        for)."""
        loss = self.forward() if loss is None else loss
        t0 = time.perf_counter()
        loss.backward()
        _stream_sync(self.device)
        return time.perf_counter() - t0

    def size(self, target: float = TARGET_S) -> int:
        """Set the batch so that backward takes about ``target`` seconds; return it."""
        for _ in range(2):
            self.backward()
            took = statistics.median(self.backward() for _ in range(3))
            self.set_batch(max(1, min(MAX_BATCH, round(self.batch * target / took))))
        return self.batch


def overlap_slowdown(stand: StandIn, barrier: Callable[[], None]) -> Overlap:
    """κ on every rank at once: backward alone and with allreduces of ``COMM_NUMEL`` fp32
    elements in flight (async, enough calls to outlast it), ``RUNS`` of each in turn, each
    after a barrier. The median of each on this rank, then the median over ranks (every rank
    returns the same)."""
    dev = stand.device
    buf = torch.zeros(COMM_NUMEL, device=dev)  # zeros: sums stay finite however many calls
    calls = []
    for _ in range(3):
        barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        sync(dev)
        calls.append(time.perf_counter() - t0)
    backward = statistics.median(stand.backward() for _ in range(3))
    n = torch.tensor([min(MAX_COMM_CALLS, math.ceil(1.5 * backward / min(calls)) + 1)],
                     device=dev)
    dist.broadcast(n, 0)  # every rank must issue as many
    alone, beside = [], []
    for _ in range(RUNS):
        loss = stand.forward()
        barrier()
        alone.append(stand.backward(loss))
        loss = stand.forward()
        barrier()  # then the allreduces start, backward beside them
        works = [dist.all_reduce(buf, async_op=True) for _ in range(int(n))]
        beside.append(stand.backward(loss))
        for w in works:
            w.wait()
        sync(dev)
    b, c = median_over_ranks(statistics.median(alone), dev), median_over_ranks(
        statistics.median(beside), dev)
    return Overlap(stand.name, b, c, COMM_NUMEL * 4)


def coding_slowdown(stand: StandIn, numel: int, density: float) -> Coding:
    """Backward (b), a Top-k encode of ``numel`` fp32 elements (e) and both at once (t: the
    encode on a second thread, on CUDA on a second stream, backward on this one), on this
    rank alone; medians of ``RUNS`` after one, each kind in turn."""
    dev = stand.device
    c = METHODS["topk"].make_compressor(density)
    x = gradient(numel, 1, dev)
    side = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def encode() -> None:
        if side is None:
            c.compress(x)
        else:
            with torch.cuda.stream(side):
                c.compress(x)
            side.synchronize()

    def encode_s() -> float:
        sync(dev)
        t0 = time.perf_counter()
        encode()
        return time.perf_counter() - t0

    def together_s() -> float:
        loss = stand.forward()
        t0 = time.perf_counter()
        other = threading.Thread(target=encode)
        other.start()
        loss.backward()
        _stream_sync(dev)
        other.join()
        return time.perf_counter() - t0

    b, e, t = [], [], []
    for _ in range(RUNS + 1):
        b.append(stand.backward())
        e.append(encode_s())
        t.append(together_s())
    b_s, e_s, t_s = (statistics.median(v[1:]) for v in (b, e, t))
    return Coding("topk", numel, b_s, e_s, t_s)


def compute_stand_in(device: torch.device, numel: int) -> StandIn:
    """The compute slowdown's stand-in: an MLP of two hidden layers with about ``numel``
    parameters, so that DDP's bucket copies and hooks cost what the profiled model's do (its
    batch is sized by the caller, :meth:`StandIn.size`)."""
    return StandIn(device, 64, max(16, min(8192, round(math.sqrt(numel / 2)))), 2)


def iteration_s(stand: StandIn, model: torch.nn.Module | None = None) -> float:
    """Seconds of one training iteration of ``model`` (default the bare ``stand.model``) on
    ``stand``'s batch: zero_grad, forward, backward, SGD step with momentum. The median of
    ``RUNS`` runs of ``COMPUTE_ITERS`` iterations, after one."""
    model = stand.model if model is None else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    runs = []
    for _ in range(RUNS + 1):
        sync(stand.device)
        t0 = time.perf_counter()
        for _ in range(COMPUTE_ITERS):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(stand.x), stand.y).backward()
            opt.step()
        sync(stand.device)
        runs.append((time.perf_counter() - t0) / COMPUTE_ITERS)
    return statistics.median(runs[1:])


def under_ddp(stand: StandIn) -> torch.nn.Module:
    """``stand.model`` under DDP (every rank makes it at once) with a comm hook that sends
    nothing: DDP's copies and hooks, no communication."""
    dev = stand.device
    ddp = torch.nn.parallel.DistributedDataParallel(
        stand.model, device_ids=[dev.index] if dev.type == "cuda" else None)
    ddp.register_comm_hook(None, _keep_bucket)
    return ddp


def _keep_bucket(_state, bucket):  # type: ignore[no-untyped-def]
    """A DDP comm hook that sends nothing: the bucket completes as it is (unannotated: DDP
    checks a hook's annotations against its own classes, and these would be text here)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def median_over_ranks(value: float, dev: torch.device) -> float:
    """The median of every rank's ``value`` (the same on every rank)."""
    got = [torch.zeros(1, dtype=torch.float64, device=dev) for _ in range(dist.get_world_size())]
    dist.all_gather(got, torch.tensor([value], dtype=torch.float64, device=dev))
    return statistics.median(float(v) for v in got)


def _stream_sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()
