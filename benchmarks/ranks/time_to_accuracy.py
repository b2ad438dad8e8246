"""One rank of benchmarks/time_to_accuracy.py: every model of the plan trained with each hook in
turn (same seed, same shards), the test set scored by rank 0 before the first epoch and after
every epoch with the training clock stopped; rank 0 prints one ROW line of JSON per (model,
hook) with the whole curve. A hook that raises on every rank becomes a ROW with its error and
the run goes on; one that fails on some ranks only leaves the others waiting for the process
group's timeout (300 s).

Environment: TTA_PLAN, JSON from the driver: {"seed", "seeds", "models": [{"model", "lr",
"momentum", "batch", "epochs", "seq_len"}], "hooks": [{"hook", "side", "method", "options",
"warmup", "momentum", "buckets"}], "lr_warmup"}. "seed" splits the data; each of "seeds"
(default [seed]) trains every hook once more, from its own initial weights, shard order and
hook seed, one ROW each: every hook from the first seed, then every hook from the next. With
a hook's "momentum", the hook keeps the model's momentum (momentum correction) and the
optimizer steps without. With "lr_warmup", a row with the density warm-up also ramps the
learning rate from lr/P to lr over the warm-up's epochs.
"""
import datetime
import gc
import json
import math
import os
import time
import traceback

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
from gradwire.data import shard_indices
from gradwire.hooks.warmup import DEFAULT_DENSITIES
from gradwire.models import build_model, get_spec
from gradwire.models.task import Task, evaluate, load_task, loss_fn, optimizer

PLAN = json.loads(os.environ["TTA_PLAN"])
SEED = int(PLAN["seed"])
SEEDS = [int(s) for s in PLAN.get("seeds", [SEED])]


def torch_bf16(state, bucket):
    """PyTorch's ``bf16_compress_hook``, called under another name: DDP refuses to register a
    hook of that name without CUDA and NCCL >= 2.10 (a guard for NCCL's bfloat16 reductions),
    and gloo reduces bfloat16 on the CPU."""
    return default_hooks.bf16_compress_hook(state, bucket)


def register(hook: dict, ddp: DDP, steps_per_epoch: int, momentum: float, seed: int
             ) -> object:
    """Register ``hook`` on ``ddp``; returns what keeps its state (None for DDP's own).
    ``momentum``: the hook's, with momentum correction (else the optimizer's)."""
    method, options = hook["method"], hook["options"]
    if hook["side"] == "torch":
        if method == "allreduce":
            return None
        if method == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            return None
        if method == "bf16":
            ddp.register_comm_hook(None, torch_bf16)
            return None
        # compressing from the second iteration: PyTorch's default, 1000, would train dense
        state = psgd.PowerSGDState(process_group=None, start_powerSGD_iter=2,
                                   matrix_approximation_rank=options["rank"],
                                   random_seed=seed)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        return state
    extra: dict[str, object] = {}
    if hook["warmup"]:
        extra.update(warmup=True, steps_per_epoch=steps_per_epoch)
    if hook.get("momentum"):
        extra["momentum"] = momentum
    state = gh.make(method, seed=seed, **options, **extra)
    state.register(ddp)
    return state


def score(model: torch.nn.Module, task: Task) -> tuple[float | None, float]:
    """(test loss, None if not finite; test accuracy) of the unwrapped model."""
    loss, accuracy = evaluate(model, task.test)
    return (loss if math.isfinite(loss) else None), accuracy


def run(spec: dict, hook: dict, task: Task, seed: int) -> dict | None:
    """Train ``spec['model']`` with ``hook`` from ``seed``; rank 0 returns the row, the others
    None."""
    rank, world = dist.get_rank(), dist.get_world_size()
    batch, epochs = int(spec["batch"]), int(spec["epochs"])
    iters = len(task.train) // world // batch
    net = build_model(spec["model"], seed, task.classes)
    cap = None  # DDP's default buckets; one bucket of every gradient for "one"
    if hook["buckets"] == "one":
        cap = sum(p.numel() * p.element_size() for p in net.parameters()) / 2**20 + 1
    # Gradients as views of DDP's buckets, as gradwire's trainer builds it (so zero, not None).
    ddp = DDP(net, gradient_as_bucket_view=True, bucket_cap_mb=cap)
    momentum = float(spec["momentum"])
    keep = register(hook, ddp, iters, momentum, seed)
    corrected = hook.get("momentum", False)  # the hook keeps the momentum: plain SGD here
    opt = optimizer(ddp.parameters(), float(spec["lr"]), 0.0 if corrected else momentum)
    ramp = None
    if hook["warmup"] and PLAN.get("lr_warmup"):
        ramp = torch.optim.lr_scheduler.LinearLR(
            opt, start_factor=1 / world, total_iters=len(DEFAULT_DENSITIES) * iters)
    wall0 = time.perf_counter()
    curve = []
    if rank == 0:
        loss, acc = score(net, task)
        curve.append({"epoch": 0, "train_seconds": 0.0, "samples": 0, "train_loss": None,
                      "test_accuracy": acc, "test_loss": loss})
    seconds, samples = 0.0, 0
    for epoch in range(epochs):
        idx = shard_indices(len(task.train), rank, world, epoch, seed)
        dist.barrier()  # rank 0's evaluation is over: every rank's clock starts together
        t0 = time.perf_counter()
        loss_sum = 0.0
        for it in range(iters):
            x, y = task.batch(task.train, idx[it * batch : (it + 1) * batch])
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(ddp(x), y)
            loss.backward()  # returns once the hook has averaged every bucket
            opt.step()
            if ramp is not None:
                ramp.step()
            loss_sum += loss.item()
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        sums = torch.tensor([loss_sum], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        dist.all_reduce(sums)
        seconds += took.item()
        samples += iters * batch * world
        if rank == 0:
            train_loss = sums.item() / (world * iters)
            loss, acc = score(net, task)
            curve.append({"epoch": epoch + 1, "train_seconds": seconds, "samples": samples,
                          "train_loss": train_loss if math.isfinite(train_loss) else None,
                          "test_accuracy": acc, "test_loss": loss})
    dist.barrier()
    row = None
    if rank == 0:
        row = {"model": spec["model"], "hook": hook["hook"], "side": hook["side"],
               "buckets": hook["buckets"], "options": hook["options"], "warmup": hook["warmup"],
               "seed": seed, "momentum_correction": corrected, "iterations_per_epoch": iters,
               "wall_seconds": time.perf_counter() - wall0, "curve": curve}
        if isinstance(keep, gh.HookState) and keep.stats["steps"]:
            steps = keep.stats["steps"]
            row["buckets_per_step"] = keep.stats["buckets"] / steps
            row["payload_bytes_per_step"] = keep.stats["sent"] / steps
    del ddp, keep, opt  # the hook's thread and the DDP go before the next hook's
    gc.collect()
    return row


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    torch.set_num_threads(1)
    for spec in PLAN["models"]:
        task = load_task(get_spec(spec["model"]), SEED, int(spec["seq_len"] or 64))
        # seed by seed, every hook in turn: a drift of the machine's speed over the run
        # reaches every hook alike
        for seed, hook in ((s, h) for s in SEEDS for h in PLAN["hooks"]):
            try:
                row = run(spec, hook, task, seed)
            except Exception as e:  # noqa: BLE001 (one hook's failure, on every rank, is a row)
                traceback.print_exc()
                row = {"model": spec["model"], "hook": hook["hook"], "side": hook["side"],
                       "buckets": hook["buckets"], "options": hook["options"],
                       "warmup": hook["warmup"], "seed": seed,
                       "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
                del e
                gc.collect()
                if dist.get_rank() != 0:
                    row = None
            if row is not None:
                print("ROW " + json.dumps(row), flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
