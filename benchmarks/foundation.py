"""Foundation benchmark: is the emulated network what it claims to be?

1. 2 hosts, one 64 MiB transfer each way, at 1gbit and at none (both in this run).
2. 4 hosts at 1gbit: torch.distributed.all_reduce (gloo) of 64 MiB through `gradwire run`,
   busbw by the nccl-tests convention.

    python benchmarks/foundation.py            # writes benchmarks/results/foundation/latest.json
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file

HERE = Path(__file__).parent
OUT = HERE / "results" / "foundation" / "latest.json"
SIZE = 64 * 2**20


def gradwire_run(hosts: int, bandwidth: str, script: str, env: dict[str, str]) -> str:
    cmd = [sys.executable, "-m", "gradwire.cli", "run", "--hosts", str(hosts), "--bandwidth",
           bandwidth, "--timeout", "300", "--", sys.executable, str(HERE / "ranks" / script)]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if p.returncode != 0:
        raise SystemExit(f"benchmark run failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args()
    rows = []
    for bw in ("1gbit", "none"):
        out = gradwire_run(2, bw, "p2p_rate.py", {"SIZE": str(SIZE)})
        for m in re.finditer(r"RATE (\d)->(\d) ([\d.]+)", out):
            rows.append({"test": "p2p 64 MiB", "hosts": 2, "bandwidth": bw,
                         "direction": f"{m.group(1)}->{m.group(2)}",
                         "gbit_per_s": float(m.group(3))})
    out = gradwire_run(4, "1gbit", "allreduce_busbw.py", {"SIZE": str(SIZE), "ITERS": "5"})
    m = re.search(r"time_s=([\d.]+) algbw_gbit=([\d.]+) busbw_gbit=([\d.]+) wrong=(\d+)", out)
    assert m, out
    rows.append({"test": "gloo all_reduce 64 MiB (median of 5)", "hosts": 4, "bandwidth": "1gbit",
                 "time_s": float(m.group(1)), "algbw_gbit_per_s": float(m.group(2)),
                 "busbw_gbit_per_s": float(m.group(3)), "wrong": int(m.group(4))})
    result = {
        **provenance.stamp(provenance.script_command()),
        "rows": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, result)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
