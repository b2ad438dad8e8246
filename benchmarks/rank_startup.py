"""Rank start-up: wall time of one training rank, cold, from process start to its result.

Each run is a fresh interpreter running the training worker alone (WORLD_SIZE=1, loopback):
imports, the digits, the model, DDP, one short epoch of ``mlp-small`` and its evaluation, so
that start-up is most of it, as it is of every rank ``gradwire train``, ``demo`` and ``run``
start. One untimed run of each side first, so that both find their bytecode cached.
``--baseline-src DIR`` runs the same on another checkout's ``src`` (e.g. ``git worktree add
/tmp/base <commit>``), interleaved with this one, so the ratio is measured in one run.

    python benchmarks/rank_startup.py --baseline-src /tmp/base/src
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

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file
from gradwire.launcher import free_port

HERE = Path(__file__).parent
OUT = HERE / "results" / "rank_startup" / "latest.json"
SRC = HERE.parent / "src"
WORKER = ["-m", "gradwire.train.worker", "--model", "mlp-small", "--agg", "dense", "--epochs",
          "1", "--batch-size", "8"]


def timed(src: Path) -> float:
    """Wall seconds of one cold single-rank worker importing ``src``."""
    # bytecode cached as an installed package has it (both sides alike, whatever this
    # shell says), written by the untimed first run
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env = {**env, "PYTHONPATH": str(src), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "GLOO_SOCKET_IFNAME": "lo"}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *WORKER], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"the worker on {src} failed ({p.returncode}): {p.stderr[-500:]}")
    return wall


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="another checkout's src, run interleaved with this one")
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args(argv)
    sides = [("this checkout", SRC.resolve())]
    if a.baseline_src is not None:
        sides.append(("baseline", a.baseline_src.resolve()))
    runs: dict[str, list[float]] = {label: [] for label, _ in sides}
    for _, src in sides:  # untimed: writes the bytecode, warms the page cache
        timed(src)
    for _ in range(a.repeats):  # interleaved: a slow spell hits both sides
        for label, src in sides:
            runs[label].append(timed(src))
    rows = [{"code": label, "src": str(src), "commit": provenance.commit(src),
             "wall_s": runs[label], "median_s": statistics.median(runs[label])}
            for label, src in sides]
    for r in rows:
        print(f"{r['code']} ({r['commit']}): median {r['median_s']:.2f} s, runs "
              f"{' '.join(f'{x:.2f}' for x in r['wall_s'])}")
    out = {**provenance.stamp(provenance.script_command()),
           "worker": "python " + shlex.join(WORKER), "loadavg": os.getloadavg()[0],
           "rows": rows}
    if len(rows) == 2:
        out["saved_s"] = rows[1]["median_s"] - rows[0]["median_s"]
        out["baseline_over_this"] = rows[1]["median_s"] / rows[0]["median_s"]
        print(f"this checkout starts a rank {out['saved_s']:.2f} s sooner "
              f"({out['baseline_over_this']:.2f}x)")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, out)


if __name__ == "__main__":
    main()
