"""PowerSGD's accuracy beside PyTorch's PowerSGD hook: the digits MLP (64-1024-1024-10), SGD
lr 0.1, momentum 0.9, batch 32 per rank, 6 epochs, one DDP bucket (PyTorch's hook aborts
over gloo with several; gradwire's also with DDP's default buckets, "/default"), test
accuracy after the last epoch, at P = 2 and 4 and ranks 1 and 4, dense alongside.

    python benchmarks/powersgd_accuracy.py        # loopback ranks: accuracy, not speed

Writes results/powersgd_accuracy/latest.json with the machine, command, commit and date.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gradwire.bench import provenance
from gradwire.check import parse_int
from gradwire.cli.options import write_json
from gradwire.cluster import loopback_cluster
from gradwire.jsonfile import out_file
from gradwire.launcher import launch

HERE = Path(__file__).parent
OUT = HERE / "results" / "powersgd_accuracy" / "latest.json"
# What the ranks train with, as the result records it: handed to them, not left to their
# defaults, which an inherited BATCH, LR or MOMENTUM in the environment would override.
BATCH, LR, MOMENTUM = 32, 0.1, 0.9


def whole_numbers(ap: argparse.ArgumentParser, option: str, text: str, least: int) -> list[int]:
    """A comma list of whole numbers >= ``least``, else argparse's one-line error: "x" had
    failed with int()'s traceback, and a rank of 0 in the ranks, after they started."""
    values = [parse_int(v) for v in text.split(",")]
    if any(v is None or v < least for v in values):
        ap.error(f"{option} must be a comma list of whole numbers >= {least}, got {text!r}")
    return [v for v in values if v is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--ranks", default="1,4")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--out", type=out_file, default=OUT)
    args = ap.parse_args()
    worlds = whole_numbers(ap, "--worlds", args.worlds, 1)
    ranks = whole_numbers(ap, "--ranks", args.ranks, 1)
    if args.epochs < 1:  # 0 recorded an untrained model's accuracy as the hooks'
        ap.error(f"--epochs must be >= 1, got {args.epochs}")
    rows = []
    for p in worlds:
        hooks = ["dense"] + [h for r in ranks
                             for h in (f"torch:powersgd-r{r}", f"gradwire:powersgd-r{r}",
                                       f"gradwire:powersgd-r{r}/default")]
        lines: list[str] = []
        res = launch(loopback_cluster(p), [sys.executable, str(HERE / "ranks" /
                                                               "powersgd_accuracy.py")],
                     timeout=3000, sink=lines.append,
                     extra_env={"HOOKS": ",".join(hooks), "EPOCHS": str(args.epochs),
                                "BATCH": str(BATCH), "LR": str(LR), "MOMENTUM": str(MOMENTUM),
                                "OMP_NUM_THREADS": "1"})
        if res.returncode != 0:
            sys.exit("\n".join(lines[-30:] + [res.message]))
        for x in lines:
            if "] ROW " in x:
                row = {"world": p, **json.loads(x.partition("ROW ")[2])}
                rows.append(row)
                print(f"P={p} {row['hook']:<22} accuracy {row['test_accuracy']:.4f}", flush=True)
    doc = {**provenance.stamp(provenance.script_command(), "cpu"),
           "model": "mlp", "data": "digits",
           "epochs": args.epochs, "batch_per_rank": BATCH, "lr": LR, "momentum": MOMENTUM,
           "torch_start_powerSGD_iter": 2, "rows": rows}
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
