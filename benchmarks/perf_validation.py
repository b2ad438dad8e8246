"""Performance model against measured training on the emulated cluster.

Calibrates one emulated cluster per link rate and P, trains every aggregation on it, and puts
the model's prediction beside each measured iteration; how is in :mod:`gradwire.bench.validation`.

    flock /tmp/gradwire-bench.lock python benchmarks/perf_validation.py   # about 65 minutes
    python benchmarks/perf_validation.py --rates 1gbit --workers 2 --aggs dense,fp16 --out v.json
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rich.console import Console

from gradwire.bench.validation import CPU_ESTIMATES, FAST_S, write_report

HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--workers", default="2,4,8")
    ap.add_argument("--aggs", default="dense,fp16,topk,gtopk,powersgd,signsgd")
    ap.add_argument("--repeats", type=int, default=3,
                    help="training runs per configuration, interleaved; the median run is kept")
    ap.add_argument("--fast-repeats", type=int, default=5,
                    help=f"training runs for configurations the model guesses under "
                         f"{FAST_S * 1e3:.0f} ms per iteration (at least --repeats)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "perf_validation.json")
    ap.add_argument("--repredict", type=Path, metavar="JSON",
                    help="run nothing: predict this earlier run's measurements again with the "
                         "model as it is now, into --out and its plot")
    ap.add_argument("--cpu", choices=CPU_ESTIMATES, default="hooks",
                    help="a row's CPU per rank: 'hooks' (the training thread's CPU from the "
                         "other methods' runs, plus the method's hook CPU that calibrate "
                         "measured on the cluster; the default) or 'dense' (a rank's own CPU "
                         "from the dense runs less the model's charge, plus the model's coding "
                         "and collective CPU)")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                    help="run nothing: join these results of earlier runs (say, one per rate, "
                         "each inside a time limit) into --out and its plot")
    a = ap.parse_args()
    if a.repeats < 1 or a.fast_repeats < 1:
        raise SystemExit(f"--repeats and --fast-repeats must be >= 1, got {a.repeats} and "
                         f"{a.fast_repeats}")
    write_report(a.out, Console(), rates=a.rates.split(","),
                 workers=[int(p) for p in a.workers.split(",")], aggs=a.aggs.split(","),
                 repeats=a.repeats, fast_repeats=a.fast_repeats, cpu=a.cpu,
                 merge_from=a.merge, repredict_from=a.repredict,
                 command="python benchmarks/perf_validation.py " + shlex.join(sys.argv[1:]))


if __name__ == "__main__":
    main()
