"""Performance model against measured training on the emulated cluster.

For each link rate and P: calibrate an emulated cluster, predict every method from that
calibration and the model's profile alone (as ``gradwire advise --calibration`` does), then
train every method on it and compare; how is in :mod:`gradwire.bench.validation`. As root.

    flock /tmp/gradwire-bench.lock python benchmarks/perf_validation.py   # about 25 minutes
    python benchmarks/perf_validation.py --rates 1gbit --workers 2 --aggs dense,topk \\
        --repeats 1 --out /tmp/pv.json                                     # about 2 minutes
    python benchmarks/perf_validation.py --repredict OLD.json --out NEW.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from gradwire.bench import provenance
from gradwire.bench.validation import FAST_S, parse_plan, write_report
from gradwire.errors import GradwireError
from gradwire.jsonfile import check_writable, out_file

HERE = Path(__file__).parent
OUT = HERE / "results" / "perf_validation" / "latest.json"


# What a run measures (the defaults of its options): --repredict measures nothing, so it
# takes none of them.
PLAN = {"rates": "10gbit,1gbit,100mbit", "workers": "2,4",
        "aggs": "dense,fp16,topk,gtopk,powersgd,signsgd", "repeats": 3, "fast_repeats": None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", help=f"link rates, a comma list (default {PLAN['rates']})")
    ap.add_argument("--workers", help=f"P, a comma list (each >= 2; default {PLAN['workers']})")
    ap.add_argument("--aggs", help=f"methods, a comma list (default {PLAN['aggs']})")
    ap.add_argument("--repeats", type=int,
                    help="training runs per configuration, interleaved; the median is kept "
                         f"(default {PLAN['repeats']})")
    ap.add_argument("--fast-repeats", type=int,
                    help=f"training runs where the model predicts under {FAST_S * 1e3:.0f} "
                         "ms per iteration (at least --repeats; default: --repeats)")
    ap.add_argument("--out", type=out_file, default=OUT,
                    help="the result (JSON); its figure goes beside it (.png)")
    ap.add_argument("--repredict", type=Path, metavar="JSON",
                    help="run nothing: predict this earlier result again with the model as it "
                         "is now, its measurements kept, into --out")
    a = ap.parse_args(argv)
    command = provenance.script_command(None if argv is None else [__file__, *argv])
    given = [f"--{k.replace('_', '-')}" for k in PLAN if getattr(a, k) is not None]
    if a.repredict and given:
        # they were parsed and dropped without a word: the result is the earlier run's plan
        raise SystemExit(f"perf_validation.py: error: --repredict runs nothing, so "
                         f"{', '.join(given)} would be ignored: the earlier result's "
                         "configurations are predicted again")
    for k, default in PLAN.items():
        if getattr(a, k) is None:
            setattr(a, k, default)
    try:
        check_writable(a.out, "--out")
        if a.out.suffix.lower() == ".png":  # the figure goes to the same name, with .png
            raise GradwireError(f"--out {a.out}: the result is JSON, and its figure would be "
                                "written over it: give a name ending in .json")
        plan = None if a.repredict else parse_plan(a.rates, a.workers, a.aggs, a.repeats,
                                                   a.fast_repeats)
        write_report(a.out, Console(), plan, a.repredict, command)
    except GradwireError as e:
        raise SystemExit(f"perf_validation.py: error: {e}") from None


if __name__ == "__main__":
    main()
