"""Why the emulated hosts run TCP cubic (cluster.netns.CONGESTION_CONTROL), whatever the
machine's default congestion control is.

For each algorithm in ALGOS (this machine's default, bbr, and cubic) a cluster is made, its
namespaces switched to it before any rank starts, and `gradwire bench` times 64 MiB allreduces
(built-in, ring, rhd, taking turns; 10 iterations each) at P=4 and P=8. Recorded per row:
every iteration's time, the median and the worst, and the TCP retransmissions the hosts
counted.

    python benchmarks/tcp_cc.py          # ~5 min; needs root; writes results/tcp_cc/latest.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gradwire.bench import provenance
from gradwire.cluster import ephemeral_cluster
from gradwire.cluster.netns import set_congestion_control
from gradwire.jsonfile import out_file

OUT = Path(__file__).parent / "results" / "tcp_cc" / "latest.json"
ALGOS = ("bbr", "cubic")
ITERS = 10
HOSTS = (4, 8)


def contention(cores: int) -> str:
    """The cluster sizes with more ranks than this machine's cores (none: said so)."""
    return (f"up to {max(HOSTS)} ranks on the machine's {cores} cores"
            + (provenance.contention(HOSTS, cores) or ", no CPU contention"))


def retransmitted(c) -> int:
    total = 0
    for h in c.hosts:
        out = subprocess.run(["ip", "netns", "exec", h.netns, "cat", "/proc/net/snmp"],
                             capture_output=True, text=True, check=True).stdout
        head, vals = [ln.split() for ln in out.splitlines() if ln.startswith("Tcp:")][:2]
        total += int(vals[head.index("RetransSegs")])
    return total


def bench(c, home: str) -> dict:
    out = Path(home) / f"{c.name}.json"
    subprocess.run([sys.executable, "-m", "gradwire.cli", "bench", "--cluster", c.name,
                    "--collective", "allreduce", "--algo", "ring,rhd", "--sizes", "64M",
                    "--iters", str(ITERS), "--interleave", "--json", str(out)], check=True,
                   env={**os.environ, "GRADWIRE_HOME": home}, capture_output=True)
    return {r["algo"]: {"times_s": r["times_s"], "median_s": statistics.median(r["times_s"]),
                        "max_s": max(r["times_s"])}
            for r in json.loads(out.read_text())["rows"]}


def run(home: str) -> list[dict]:
    """One row per (cluster size, congestion control), each on a cluster of its own."""
    rows = []
    for hosts in HOSTS:
        for algo in ALGOS:
            with ephemeral_cluster(hosts, "1gbit") as c:
                if not all(set_congestion_control(h.netns, algo) for h in c.hosts):
                    raise SystemExit(f"could not switch the hosts to TCP {algo}")
                times = bench(c, home)
                row = {"hosts": hosts, "congestion_control": algo, "allreduce_64MiB": times,
                       "ring_over_builtin": times["builtin"]["median_s"]
                       / times["ring"]["median_s"],
                       "tcp_retransmitted_segments": retransmitted(c)}
            print(json.dumps({k: v for k, v in row.items() if k != "allreduce_64MiB"}),
                  {a: (round(t["median_s"], 3), round(t["max_s"], 3)) for a, t in times.items()},
                  flush=True)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gradwire-cc-") as home:
        rows = run(home)
    default = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    command = provenance.script_command()
    a.out.write_text(json.dumps({**provenance.stamp(command),
                                 "machine_default_congestion_control": default,
                                 "network": "emulated hosts, 1gbit links",
                                 "note": f"{ITERS} iterations per algorithm, the "
                                         "algorithms taking turns; "
                                         + contention(os.cpu_count() or 1),
                                 "rows": rows}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
