"""What-if speed: wall time and peak memory of whole ``gradwire whatif`` / ``advise`` commands.

The target (issue 5): what-if runs for 1024 workers × 10 link rates finish in seconds. Each
row is one cold command in a fresh interpreter (imports and schedule building included):
``whatif --model resnet50 --workers W --bandwidth 1gbit,…,10gbit`` with the six default
aggregations, and ``advise --model resnet50 --workers W``. ``--baseline-src DIR`` runs the same
commands on another checkout's ``src`` too (e.g. ``git worktree add /tmp/base <commit>``),
interleaved with this one, so the ratio is measured in one run.

    flock /tmp/gradwire-bench.lock python benchmarks/whatif_speed.py --baseline-src /tmp/base/src
    python benchmarks/whatif_speed.py --workers 64 --repeats 1 --out /tmp/quick.json
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file

HERE = Path(__file__).parent
OUT = HERE / "results" / "whatif_speed" / "latest.json"
SRC = HERE.parent / "src"
RATES = ",".join(f"{g}gbit" for g in range(1, 11))


def commands(workers: int) -> dict[str, list[str]]:
    return {"whatif ×10 rates": ["whatif", "--model", "resnet50", "--workers", str(workers),
                                 "--bandwidth", RATES],
            "advise": ["advise", "--model", "resnet50", "--workers", str(workers),
                       "--bandwidth", "1gbit"]}


def timed(args: list[str], src: Path) -> tuple[float, float]:
    """(wall seconds, peak resident MiB) of ``python -m gradwire.cli ARGS`` importing ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "gradwire.cli", *args], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode() if p.stderr else ""
    if p.returncode != 0:
        raise SystemExit(f"{shlex.join(args)} on {src} failed ({p.returncode}): {err[-500:]}")
    return wall, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1024,2048,4096", help="comma list")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="another checkout's src, run beside this one (at worker counts up "
                         "to 1024 only)")
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args(argv)
    console = Console(width=140)
    workers = [int(w) for w in a.workers.split(",")]
    sides = [("this checkout", SRC.resolve())]
    if a.baseline_src is not None:
        sides.append(("baseline", a.baseline_src.resolve()))
    rows = []
    for w in workers:
        for what, args in commands(w).items():
            # the baseline only where it finishes in reasonable time and memory
            runs = {label: [] for label, src in sides if label != "baseline" or w <= 1024}
            for _ in range(a.repeats):  # interleaved: a slow spell hits both sides
                for label, src in sides:
                    if label in runs:
                        runs[label].append(timed(args, src))
            for label, got in runs.items():
                rows.append({"command": "gradwire " + shlex.join(args), "what": what,
                             "workers": w, "code": label, "src": str(dict(sides)[label]),
                             "commit": provenance.commit(dict(sides)[label]),
                             "wall_s": [g[0] for g in got], "peak_mib": [g[1] for g in got],
                             "median_s": statistics.median(g[0] for g in got),
                             "loadavg": os.getloadavg()[0]})
                console.print(f"{what} W={w} {label}: {rows[-1]['median_s']:.2f} s, "
                              f"{max(rows[-1]['peak_mib']):.0f} MiB")
    t = Table("command", "workers", "code", "median s", "runs s", "peak MiB", "load avg",
              title="what-if speed, ResNet-50 (cold commands, imports included)")
    for r in rows:
        t.add_row(r["what"], str(r["workers"]), r["code"], f"{r['median_s']:.2f}",
                  " ".join(f"{x:.2f}" for x in r["wall_s"]), f"{max(r['peak_mib']):.0f}",
                  f"{r['loadavg']:.2f}")
    console.print(t)
    out = {**provenance.stamp(provenance.script_command()), "rows": rows}
    write_json(a.out, out)


if __name__ == "__main__":
    main()
