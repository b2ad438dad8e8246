"""Fingerprint of training with every hook method: the parameters after a fixed run, hashed.

Two checkouts that give the same fingerprints train bit for bit alike. Each method (and the
exact top-k selector) trains a small MLP on scikit-learn's digits for ``--steps`` SGD steps on
P ranks over gloo on loopback, with fixed seeds, one thread per rank, buckets of about one
layer, in both modes; the warm-up densities move on every ``--steps-per-epoch`` steps. The
JSON holds, per run, the SHA-256 of the final parameters and the loss at every step.

    python benchmarks/hook_equivalence.py --out benchmarks/results/hook_equivalence/latest.json
    python benchmarks/hook_equivalence.py --compare benchmarks/results/hook_equivalence/latest.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gradwire.jsonfile import out_file
from gradwire.launcher import free_port

RUNS = [("dense", {}), ("fp16", {}), ("bf16", {}), ("topk", {}),
        ("topk", {"selector": "exact"}), ("gtopk", {}), ("gtopk", {"selector": "exact"}),
        ("randomk", {}), ("dgc", {}), ("signsgd", {}), ("efsignsgd", {}), ("qsgd", {}),
        ("terngrad", {}), ("powersgd", {"rank": 2})]


def _label(method: str, opts: dict, mode: str) -> str:
    return " ".join([method, *(f"{k}={v}" for k, v in sorted(opts.items())), mode])


def _rank(rank: int, world: int, init: str, args: argparse.Namespace, out: str) -> None:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import gradwire.hooks as gh
    from gradwire.data import digits_arrays

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    pixels, labels = digits_arrays()
    xs = torch.tensor(pixels, dtype=torch.float32) / 16
    ys = torch.tensor(labels)
    results = {}
    for mode in ("bucket", "model"):
        for method, opts in RUNS:
            torch.manual_seed(0)
            net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                nn.Linear(64, 10))
            ddp = DistributedDataParallel(net, bucket_cap_mb=0.01)
            state = gh.make(method, density=0.01, mode=mode, seed=3, **opts)
            state.register(ddp)
            opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
            losses = []
            for step in range(args.steps):
                state.set_epoch(step // args.steps_per_epoch)
                at = (step * world + rank) * args.batch % (len(xs) - args.batch)
                loss = nn.functional.cross_entropy(ddp(xs[at : at + args.batch]),
                                                   ys[at : at + args.batch])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
            digest = hashlib.sha256()
            for p in net.parameters():
                digest.update(p.detach().numpy().tobytes())
            results[_label(method, opts, mode)] = {"sha256": digest.hexdigest(),
                                                   "losses": losses}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def fingerprint(args: argparse.Namespace) -> dict:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        mp.start_processes(_rank, args=(args.world, f"tcp://127.0.0.1:{port}", args, out),
                           nprocs=args.world, start_method="spawn")
        with open(out) as f:
            return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--steps-per-epoch", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", type=out_file, help="write the fingerprints here (JSON)")
    ap.add_argument("--compare", help="a JSON written by --out: print what differs")
    args = ap.parse_args()
    from gradwire.bench import provenance

    # read before this run writes --out: with --out and --compare naming one file, the run
    # would otherwise be compared with itself (and always be bit-identical)
    before = None
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)["runs"]
    runs = fingerprint(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**provenance.stamp(provenance.script_command()),
                       "world": args.world, "steps": args.steps, "runs": runs}, f, indent=1)
    if before is not None:
        same = [k for k in runs if before.get(k, {}).get("sha256") == runs[k]["sha256"]]
        for k in runs:
            if k not in same:
                diff = max(abs(a - b) for a, b in zip(runs[k]["losses"],
                                                      before.get(k, {}).get("losses", []),
                                                      strict=False)) if k in before else None
                print(f"DIFFERS {k}: largest loss difference {diff}")
        missing = [k for k in before if k not in runs]  # a run the earlier file has, not this
        for k in missing:
            print(f"MISSING {k}: in {args.compare}, not run here")
        print(f"{len(same)} of {len(runs)} runs bit-identical"
              + (f"; {len(missing)} of {args.compare}'s not run" if missing else ""))
        return 0 if len(same) == len(runs) and not missing else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
