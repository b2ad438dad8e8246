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
from gradwire.cli.options import write_json
from gradwire.cluster import loopback_cluster
from gradwire.launcher import launch

HERE = Path(__file__).parent
OUT = HERE / "results" / "powersgd_accuracy" / "latest.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--ranks", default="1,4")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = []
    for p in (int(v) for v in args.worlds.split(",")):
        hooks = ["dense"] + [h for r in args.ranks.split(",")
                             for h in (f"torch:powersgd-r{r}", f"gradwire:powersgd-r{r}",
                                       f"gradwire:powersgd-r{r}/default")]
        lines: list[str] = []
        res = launch(loopback_cluster(p), [sys.executable, str(HERE / "ranks" /
                                                               "powersgd_accuracy.py")],
                     timeout=3000, sink=lines.append,
                     extra_env={"HOOKS": ",".join(hooks), "EPOCHS": str(args.epochs),
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
           "epochs": args.epochs, "batch_per_rank": 32, "lr": 0.1, "momentum": 0.9,
           "torch_start_powerSGD_iter": 2, "rows": rows}
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
