"""The executor's staging pool (gradwire.collectives.executor.STAGING): ring allreduce with the
pool and with nothing kept, alternately, on loopback ranks (no shaping: what is measured is the
ranks' CPU, which the pool saves), P = 4 and 8, 64 MiB by default.

Received chunks that are combined land in staging buffers first. Freed to the allocator, 1 MiB
buffers go back to the kernel and come back as fresh pages: every call faults on each page again.

    python benchmarks/staging.py          # ~2 min; writes benchmarks/results/staging/latest.json
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ab import this_code

from gradwire.bench import provenance
from gradwire.jsonfile import out_file

HERE = Path(__file__).parent
OUT = HERE / "results" / "staging" / "latest.json"
RANK = HERE / "ranks" / "staging.py"
WORLDS = (4, 8)


def run(p: int, pool: bool, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="gradwire-staging-") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-m", "gradwire.cli", "run", "--loopback", "--hosts", str(p),
               "--timeout", "600", "--", sys.executable, str(RANK)]
        env = {**os.environ, "N": str(args.bytes // 4), "ITERS": str(args.iters),
               "POOL": "1" if pool else "0", "OUT": str(out)}
        print(f"$ POOL={env['POOL']} " + shlex.join(cmd), flush=True)
        if subprocess.run(cmd, env=env).returncode != 0 or not out.exists():
            raise SystemExit(f"P={p} pool={pool} failed")
        d = json.loads(out.read_text())
    faults = [f for rank in d["minor_faults_per_call_by_rank"] for f in rank]
    return {"world_size": p, "pool": pool, "time_s": statistics.median(d["times_s"]),
            "times_s": d["times_s"], "median_minor_faults_per_rank_call":
            statistics.median(faults), **d}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=64 * 2**20)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=out_file, default=OUT)
    args = ap.parse_args()
    runs = [run(p, pool, args) for _ in range(args.rounds) for p in WORLDS
            for pool in (False, True)]
    cores = os.cpu_count() or 1
    args.out.write_text(json.dumps({
        **provenance.stamp(provenance.script_command()),
        "code": this_code(), "network": "loopback, links not shaped",
        "note": f"P ranks share the machine's {cores} cores"
                + (provenance.contention(WORLDS, cores) or ", no CPU contention")
                + "; pool off and on alternate in each round",
        "runs": runs}, indent=1) + "\n")
    for r in runs:
        print(f"P={r['world_size']} pool={'on ' if r['pool'] else 'off'} "
              f"{r['time_s']:.3f} s/call, {r['median_minor_faults_per_rank_call']:.0f} faults "
              "per rank per call")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
