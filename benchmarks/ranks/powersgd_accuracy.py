"""One rank of benchmarks/powersgd_accuracy.py: the digits MLP trained with each hook in turn
(same seed, same shards, one bucket), test accuracy printed by rank 0 as one ROW
line of JSON per hook.

Environment: HOOKS (comma-separated: "dense", "gradwire:powersgd-rN", "torch:powersgd-rN";
a "/default" suffix runs DDP's default buckets instead of one), EPOCHS, BATCH, LR, MOMENTUM.
"""
import datetime
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
from gradwire.data import shard_indices
from gradwire.models import build_model, get_spec
from gradwire.models.task import evaluate, load_task, loss_fn, optimizer

EPOCHS = int(os.environ.get("EPOCHS", "6"))
BATCH = int(os.environ.get("BATCH", "32"))
LR, MOMENTUM = float(os.environ.get("LR", "0.1")), float(os.environ.get("MOMENTUM", "0.9"))
SEED = 0


def register(name: str, ddp: DDP) -> object:
    if name == "dense":
        return None
    side, _, spec = name.partition(":")
    rank = int(spec.removeprefix("powersgd-r").removesuffix("/default"))
    if side == "torch":
        # compression from the second iteration (PyTorch's default waits 1000 iterations,
        # longer than these runs, and would train dense)
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                   start_powerSGD_iter=2)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        return state
    state = gh.make("powersgd", rank=rank)
    state.register(ddp)
    return state


def run(name: str) -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = get_spec("mlp")
    task = load_task(spec, SEED)
    model = build_model("mlp", SEED, task.classes)
    # One bucket for the whole model (4.5 MB) unless "/default": PyTorch's hook issues its
    # allreduces from future callbacks, and with DDP's small first bucket its ranks waited on
    # each other forever over gloo (two buckets in flight).
    ddp = DDP(model) if name.endswith("/default") else DDP(model, bucket_cap_mb=64)
    keep = register(name, ddp)  # noqa: F841 (lives as long as the DDP)
    opt = optimizer(ddp.parameters(), LR, MOMENTUM)
    for epoch in range(EPOCHS):
        idx = shard_indices(len(task.train), rank, world, epoch, SEED)
        for i in range(0, len(idx) - BATCH + 1, BATCH):
            x, y = task.batch(task.train, idx[i : i + BATCH])
            opt.zero_grad(set_to_none=True)
            loss_fn(ddp(x), y).backward()
            opt.step()
    return evaluate(model, task.test)[1]


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    torch.set_num_threads(1)
    for name in os.environ["HOOKS"].split(","):
        accuracy = run(name)
        if dist.get_rank() == 0:
            print("ROW " + json.dumps({"hook": name, "test_accuracy": accuracy}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
