"""Where gTop-k's merge drops go, and what it does to training: the tree's placement (each
merge's drops to the rank that made it) against the butterfly's (each rank takes back its own
dropped entries), on the same merges.

For P a power of two the butterfly ("rd") and the tree make the same merges and apply the same
entries at every step; only the residual each dropped entry returns to differs. So both run
here in one process (``gradwire.sparse.local.simulate``, the plans the ranks run), from the same
seed, shards and hyper-parameters, as the time-to-accuracy benchmark trains the digits MLP:
P = 4 ranks, batch 32 per rank, SGD lr 0.1, momentum 0.9 (or, with ``--momentum-correction``,
the hook's momentum correction and SGD without), the whole model as one vector, density 0.001
after the gTop-k paper's warm-up (0.25, 0.0725, 0.015, 0.004 for the first four epochs).
Reported per epoch: test accuracy, training loss, and each rank's residual norm (where the
dropped mass sits). Accuracy, not speed: no network.

    python benchmarks/gtopk_drops.py                  # 10 epochs, both placements, ~3 min
    python benchmarks/gtopk_drops.py --momentum-correction --out /tmp/drops_mc.json

Writes results/gtopk_drops/latest.json with the machine, command, commit and date.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.compress.base import select_count
from gradwire.data import shard_indices
from gradwire.hooks.warmup import DEFAULT_DENSITIES, Warmup
from gradwire.jsonfile import out_file
from gradwire.models import build_model, get_spec
from gradwire.models.task import evaluate, load_task, loss_fn, optimizer
from gradwire.sparse.local import simulate

HERE = Path(__file__).parent
OUT = HERE / "results" / "gtopk_drops" / "latest.json"
SEED = 0
PLACEMENTS = {"tree": "each merge's drops to the rank that made it",
              "rd": "each rank takes back its own dropped entries"}


def train(algo: str, world: int, epochs: int, density: float, lr: float, momentum: float,
          batch: int, corrected: bool) -> dict:
    """Train the digits MLP with gTop-k on ``algo``'s placement; the curve and residuals."""
    task = load_task(get_spec("mlp"), SEED)
    net = build_model("mlp", SEED, task.classes)
    params = list(net.parameters())
    n = sum(p.numel() for p in params)
    opt = optimizer(params, lr, 0.0 if corrected else momentum)
    residuals = [torch.zeros(n) for _ in range(world)]
    velocities = [torch.zeros(n) for _ in range(world)]
    warmup = Warmup(DEFAULT_DENSITIES)
    iters = len(task.train) // world // batch
    curve = []
    for epoch in range(epochs):
        k = select_count(n, warmup.density(epoch, density), None)
        shards = [shard_indices(len(task.train), r, world, epoch, SEED) for r in range(world)]
        loss_sum = 0.0
        for it in range(iters):
            grads = []
            for r in range(world):
                x, y = task.batch(task.train, shards[r][it * batch : (it + 1) * batch])
                net.zero_grad()
                loss = loss_fn(net(x), y)
                loss.backward()
                loss_sum += loss.item()
                g = torch.cat([p.grad.reshape(-1) for p in params])
                if corrected:  # what HookState._correct does: send the velocity
                    g = velocities[r].mul_(momentum).add_(g).clone()
                grads.append(g)
            avg = simulate(grads, residuals, k, "gtopk", algo=algo)[0].average()
            offset = 0
            for p in params:
                p.grad = avg[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            opt.step()
        test_loss, accuracy = evaluate(net, task.test)
        norms = [round(float(r.norm()), 4) for r in residuals]
        curve.append({"epoch": epoch + 1, "k": k, "test_accuracy": accuracy,
                      "train_loss": loss_sum / (world * iters), "residual_norms": norms})
        print(f"{algo:5s} epoch {epoch + 1:2d}  k {k:6d}  accuracy {accuracy:.3f}  "
              f"residual norms {' '.join(f'{v:.2f}' for v in norms)}", flush=True)
    return {"algo": algo, "placement": PLACEMENTS[algo], "curve": curve,
            "final_accuracy": curve[-1]["test_accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--world", type=int, default=4, help="ranks, a power of two")
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--momentum-correction", action="store_true")
    ap.add_argument("--out", type=out_file, default=OUT)
    args = ap.parse_args()
    if args.world < 2 or args.world & (args.world - 1):
        sys.exit(f"gtopk_drops: --world must be a power of two >= 2 (the tree's and the "
                 f"butterfly's merges are the same only then), got {args.world}")
    if args.epochs < 1 or not 0 < args.density <= 1:
        sys.exit("gtopk_drops: --epochs must be >= 1 and --density in (0, 1]")
    torch.set_num_threads(1)
    settings = {"model": "mlp", "world": args.world, "epochs": args.epochs, "batch": 32,
                "lr": 0.1, "momentum": 0.9, "density": args.density,
                "warmup": list(DEFAULT_DENSITIES),
                "momentum_correction": args.momentum_correction, "seed": SEED}
    rows = [train(algo, args.world, args.epochs, args.density, 0.1, 0.9, 32,
                  args.momentum_correction) for algo in PLACEMENTS]
    command = provenance.script_command()
    doc = {**provenance.stamp(command), "settings": settings, "rows": rows,
           "summary": {r["algo"]: {"final_accuracy": r["final_accuracy"],
                                   "residual_norms": r["curve"][-1]["residual_norms"]}
                       for r in rows}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
