"""What the header exchange (gradwire.collectives.agree) costs: each call timed with it and
without, interleaved, on an emulated cluster (or loopback); writes
results/header_overhead/latest.json.

    python benchmarks/header_overhead.py                       # 4 hosts, 1gbit; needs root
    python benchmarks/header_overhead.py --loopback --out /tmp/h.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.cluster import ephemeral_cluster
from gradwire.jsonfile import out_file
from gradwire.launcher import launch

HERE = Path(__file__).parent
OUT = HERE / "results" / "header_overhead" / "latest.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--loopback", action="store_true")
    ap.add_argument("--out", type=out_file, default=OUT)
    args = ap.parse_args()
    if args.hosts < 1:
        ap.error(f"--hosts must be >= 1, got {args.hosts}")
    lines: list[str] = []
    with ephemeral_cluster(args.hosts, args.bandwidth, args.loopback) as c:
        res = launch(c, [sys.executable, str(HERE / "ranks" / "header_overhead.py")],
                     timeout=900, sink=lines.append)
        label = c.label
    if res.returncode != 0:
        sys.exit("\n".join(lines[-30:] + [res.message]))
    rows = [json.loads(x.partition("ROW ")[2]) for x in lines if "] ROW " in x]
    print(f"{'case':<40} {'checked':>12} {'unchecked':>12} overhead")
    for r in rows:
        pct = "" if r["overhead_pct"] is None else f"{r['overhead_pct']:+7.1f} %"
        print(f"{r['case']:<40} {r['checked_ms']:9.3f} ms {r['unchecked_ms']:9.3f} ms {pct}")
    result = {**provenance.stamp(provenance.script_command()), "network": label,
              "hosts": args.hosts, "rows": rows}
    write_json(args.out, result)


if __name__ == "__main__":
    main()
