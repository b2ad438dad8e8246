"""One rank of benchmarks/ddp_hooks.py: PyTorch's built-in DDP hooks and gradwire's, on one model
and one process group, interleaved round by round; rank 0 prints one ROW line of JSON per
(round, hook) with the slowest rank's seconds of each timed iteration and the loss after them.

Environment: HOOKS (comma-separated names, see HOOKS below; "gradwire:<method>[-<density or
rN>][@<algo>][/nocheck|/one|/thread]"), MODEL, BATCH, WARMUP, ITERS, ROUNDS, DEVICE (cpu:
gloo; cuda: NCCL, every rank on GPU 0, as emulated hosts sharing it), PROFILE (after each
hook's timed steps, one more untimed step, profiled on rank 0: its top PROFILE ops).
"""
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
from gradwire.bench.codec_probe import sync
from gradwire.models import MODELS, build_model
from gradwire.models.resnet import resnet50

DEVICE = os.environ.get("DEVICE", "cpu")
DEV = torch.device(DEVICE, 0) if DEVICE == "cuda" else torch.device(DEVICE)
BATCH = int(os.environ.get("BATCH", "32"))
WARMUP = int(os.environ.get("WARMUP", "3"))
ITERS = int(os.environ.get("ITERS", "5"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
MODEL = os.environ.get("MODEL", "mlp14m")
CHECK_CALLS = os.environ.get("GRADWIRE_CHECK_CALLS", "1")
PROFILE = int(os.environ.get("PROFILE", "0"))  # >0: rank 0 prints that many top ops per hook


def model() -> tuple[nn.Module, tuple[int, ...]]:
    """(a model initialised from seed 0, the shape of one input sample)."""
    torch.manual_seed(0)
    if MODEL == "mlp14m":  # 3072-2048-2048-2048-10: 14.7 M parameters, 3 buckets of DDP's 25 MB
        widths = (3072, 2048, 2048, 2048)
        layers: list[nn.Module] = []
        for a, b in zip(widths, widths[1:], strict=False):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(widths[-1], 10)), (3072,)
    if MODEL == "resnet50":  # ImageNet width and stem, 25.6 M parameters, 3×224×224 inputs
        return resnet50(1000, 3), (3, 224, 224)
    if MODEL == "mlp-tiny":  # for a smoke run
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)), (64,)
    if MODEL in ("mlp", "resnet20"):  # the digits models of the time-to-accuracy table
        return build_model(MODEL, 0), MODELS[MODEL].input_shape
    raise SystemExit(f"MODEL must be mlp14m, resnet50, mlp, resnet20 or mlp-tiny, got {MODEL!r}")


def register(name: str, ddp: DDP) -> object:
    """Register hook ``name`` on ``ddp``; returns what keeps its state."""
    if name == "torch:allreduce":
        return None  # DDP's own allreduce, no hook
    if name == "torch:fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return None
    if name.startswith("torch:powersgd-r"):
        rank = int(name.removeprefix("torch:powersgd-r"))
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                   start_powerSGD_iter=2)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        return state
    spec, _, algo = name.removeprefix("gradwire:").partition("@")  # "gtopk-0.001@tree"
    method, _, arg = spec.partition("-")
    opts = ({"rank": int(arg.removeprefix("r"))} if method == "powersgd"
            else {"density": float(arg)} if arg else {})
    state = gh.make(method, warmup=False, algo=algo or None, **opts)
    state.register(ddp)
    return state


def run(name: str, x: torch.Tensor, y: torch.Tensor) -> tuple[list[float], float, float]:
    """(this rank's seconds per timed iteration, the loss at the last one, the seconds per
    timed iteration gradwire's hook spent in call-header exchanges, 0 for PyTorch's)."""
    net, _ = model()
    # "<hook>/nocheck": gradwire's hook with the call check off (GRADWIRE_CHECK_CALLS=0, read
    # when the hook sets itself up at its first bucket), for the check's cost in the same run;
    # "<hook>/one": the whole model in one DDP bucket (PyTorch's PowerSGD hook over gloo);
    # "<hook>/thread": every bucket handed to the hook's comm thread, none issued from the hook
    # (HookState._issue), for what issuing from the hook saves
    hook = name  # the full name ("<hook>/nocheck" too): what the profile is filed under
    name, _, variant = name.partition("/")
    ddp = DDP(net.to(DEVICE), bucket_cap_mb=2**20 if variant == "one" else None)
    os.environ["GRADWIRE_CHECK_CALLS"] = "0" if variant == "nocheck" else CHECK_CALLS
    keep = register(name, ddp)  # the hook's state lives as long as the DDP
    if variant == "thread" and isinstance(keep, gh.HookState):
        keep._issue = lambda *_: None  # noqa: SLF001
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        out = nn.functional.cross_entropy(ddp(x), y)
        out.backward()
        opt.step()
        sync(DEV)
        return out

    times, loss = [], 0.0
    for i in range(WARMUP + ITERS):
        if i == WARMUP and isinstance(keep, gh.HookState):
            keep.reset_stats()
        dist.barrier()
        sync(DEV)
        t0 = time.perf_counter()
        out = step()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    loss = float(out.detach())
    header = keep.stats["header"] / ITERS if isinstance(keep, gh.HookState) else 0.0
    if PROFILE:  # one more step on every rank, untimed; rank 0 profiles its own
        dist.barrier()
        profile(hook, step)
    return times, loss, header


def profile(name: str, step) -> None:  # noqa: ANN001
    """Run ``step`` once; on rank 0 under torch.profiler, printing the PROFILE ops that took
    most device time (CPU time without a GPU), one "PROF <hook> <line>" line each."""
    if dist.get_rank() != 0:
        step()
        return
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profiler(activities=acts) as prof:
        step()
    key = "self_cuda_time_total" if DEVICE == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=PROFILE, max_name_column_width=48)
    print(f"PROF {name} BEGIN", flush=True)  # the parent keeps the last table of each hook
    for line in table.splitlines():
        print(f"PROF {name} {line}", flush=True)


def gather(values: list[float], world: int) -> torch.Tensor:
    """Every rank's ``values``, one row a rank (on the CPU)."""
    mine = torch.tensor(values, dtype=torch.float64, device=DEVICE)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return torch.stack(every).cpu()


def main() -> None:
    backend = "nccl" if DEVICE == "cuda" else "gloo"
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=600))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank, world = dist.get_rank(), dist.get_world_size()
    _, shape = model()
    g = torch.Generator().manual_seed(1000 + rank)  # a fixed batch per rank
    x = torch.randn((BATCH, *shape), generator=g).to(DEVICE)
    y = torch.randint(0, 10, (BATCH,), generator=g).to(DEVICE)  # a class of every model
    hooks = os.environ["HOOKS"].split(",")
    for r in range(ROUNDS):
        order = hooks if r % 2 == 0 else hooks[::-1]  # interleaved, each side first in turn
        for name in order:
            times, loss, header = run(name, x, y)
            slowest = gather(times, world).max(dim=0).values.tolist()
            losses = gather([loss], world)[:, 0].tolist()
            header = float(gather([header], world).max())
            if rank == 0:
                print("ROW " + json.dumps({
                    "round": r, "hook": name, "slowest_s": slowest,
                    "median_s": statistics.median(slowest),
                    "loss": statistics.fmean(losses), "header_s": header}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
