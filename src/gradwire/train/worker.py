"""One rank of a data-parallel training run; start it under ``gradwire run`` or ``torchrun``.

    gradwire run --hosts 4 --bandwidth 1gbit -- python -m gradwire.train.worker --epochs 5

Rank 0 prints ``GW_PROGRESS done total`` lines (the CLI turns them into a progress bar) and
writes the run's result as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gradwire.data import digits, shard_indices
from gradwire.launcher import PROGRESS
from gradwire.models import build_model, num_parameters
from gradwire.train.aggregate import AGGREGATORS, get_aggregator
from gradwire.train.wire import tx_bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # argparse, not typer: this module is the rank-side entry point torchrun starts directly.
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp")
    p.add_argument("--agg", default="dense", choices=sorted(AGGREGATORS))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per iteration")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="rank 0 writes the result JSON here")
    p.add_argument("--timeout", type=float, default=60.0, help="collective timeout, seconds")
    a = p.parse_args(argv)
    for name in ("epochs", "batch_size"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    return a


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _set_grad(model: torch.nn.Module, flat: torch.Tensor) -> None:
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p))
        offset += n


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return (model(x).argmax(1) == y).float().mean().item()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    train, test = digits(args.seed)
    model = build_model(args.model, args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    aggregate = get_aggregator(args.agg)
    iters_per_epoch = (len(train) // world) // args.batch_size
    if iters_per_epoch == 0:
        raise SystemExit(f"--batch-size {args.batch_size} is larger than a rank's share "
                         f"({len(train) // world} samples at {world} ranks)")
    total = iters_per_epoch * args.epochs
    t = {"compute": 0.0, "communicate": 0.0, "step": 0.0}
    losses, accs = [], []
    dist.barrier()
    tx0, wall0 = tx_bytes(), time.perf_counter()
    for epoch in range(args.epochs):
        idx = shard_indices(len(train), rank, world, epoch, args.seed)
        loss_sum = torch.zeros(1)
        for it in range(iters_per_epoch):
            b = idx[it * args.batch_size : (it + 1) * args.batch_size]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(train.x[b]), train.y[b])
            loss.backward()
            t1 = time.perf_counter()
            _set_grad(model, aggregate(_flat_grad(model)))
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            t["compute"] += t1 - t0
            t["communicate"] += t2 - t1
            t["step"] += t3 - t2
            loss_sum += loss.detach()
            if rank == 0:
                print(f"{PROGRESS} {epoch * iters_per_epoch + it + 1} {total}", flush=True)
        dist.all_reduce(loss_sum)
        losses.append(loss_sum.item() / (world * iters_per_epoch))
        accs.append(accuracy(model, test.x, test.y))
    wall = time.perf_counter() - wall0
    tx1 = tx_bytes()
    wire = -1.0 if tx0 is None or tx1 is None else float(tx1 - tx0)
    stats = torch.tensor([wall, t["compute"], t["communicate"], t["step"], wire])
    gathered = [torch.zeros_like(stats) for _ in range(world)]
    dist.all_gather(gathered, stats)
    if rank == 0 and args.out:
        per_rank = torch.stack(gathered)
        wall_max = per_rank[:, 0].max().item()
        wire_ok = bool((per_rank[:, 4] >= 0).all())
        result = {
            "agg": args.agg,
            "model": args.model,
            "parameters": num_parameters(model),
            "world_size": world,
            "network": os.environ.get("GRADWIRE_NETWORK", "unknown (not launched by gradwire)"),
            "epochs": args.epochs,
            "iterations": total,
            "batch_size_per_rank": args.batch_size,
            "samples_per_s": total * args.batch_size * world / wall_max,
            "seconds_per_iter": {k: per_rank[:, i + 1].mean().item() / total
                                 for i, k in enumerate(("compute", "communicate", "step"))},
            "wire_tx_bytes_per_iter_per_rank": (per_rank[:, 4].mean().item() / total
                                                if wire_ok else None),
            "loss": losses,
            "test_accuracy": accs,
            "wall_s": wall_max,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
