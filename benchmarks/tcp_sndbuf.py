"""Why the emulated hosts cap TCP's send buffer (cluster.netns.tcp_send_buffer).

A gloo send completes once its bytes are in the kernel, not once they have arrived. With
Linux's default send buffer (autotuned up to 4 MiB) a rank that sends to one peer and then to
another starts the second send while megabytes of the first still wait in its socket: the two
share the rank's link, and the first peer, whose data a tree forwards next, gets the rest at
half the rate. The schedule (and the model) has the first send done before the second starts.

For each send-buffer ceiling (``--ceilings``: the machine's default, what the cluster now sets,
or bytes), every host of one cluster is given it (``net.ipv4.tcp_wmem``'s maximum; each bench
run makes new sockets), then `gradwire bench` times broadcast (binomial, lp, scatter_ag) and
allreduce (ring, tree, rhd, lp, dbtree and the built-in) at two sizes, the algorithms taking
turns (a lead-in call and one timed call each, ITERS times). The settings take turns too,
``--rounds`` times, at each P of ``--hosts``.

    python benchmarks/tcp_sndbuf.py                      # ~30 min; results/tcp_sndbuf/latest.json
    python benchmarks/tcp_sndbuf.py --bandwidth 100mbit  # ~20 min; results/tcp_sndbuf/100mbit.json
    python benchmarks/tcp_sndbuf.py --ceilings default,500000,cluster --rounds 1 --out x.json

Needs root. Run it on an otherwise idle machine: 8 ranks share 2 cores.
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

from gradwire.bandwidth import parse_bandwidth
from gradwire.bench import provenance
from gradwire.cluster import ephemeral_cluster
from gradwire.cluster.netns import cap_send_buffer, host_send_buffer, machine_send_buffer
from gradwire.jsonfile import out_file

OUT = Path(__file__).parent / "results" / "tcp_sndbuf" / "latest.json"  # other rates: <rate>.json
SIZES = {"1gbit": "4M,64M", "100mbit": "1M,8M"}  # about the same seconds per call
ROUNDS = 2
ITERS = 3
# (collective, algorithms, with the built-in baseline row)
WORK = (("broadcast", "binomial,lp,scatter_ag", False),
        ("allreduce", "ring,tree,rhd,lp,dbtree", True))


def bench(c, home: str, collective: str, algos: str, builtin: bool,
          sizes: str) -> dict[str, float]:
    out = Path(home) / f"{c.name}-{len(os.listdir(home))}.json"
    subprocess.run([sys.executable, "-m", "gradwire.cli", "bench", "--cluster", c.name,
                    "--collective", collective, "--algo", algos, "--sizes", sizes,
                    "--iters", str(ITERS), "--batch", "1", "--interleave", "--json", str(out),
                    "--builtin" if builtin else "--no-builtin"], check=True,
                   env={**os.environ, "GRADWIRE_HOME": home}, capture_output=True)
    return {f"{collective} {r['algo']} {r['bytes'] >> 20} MiB": r["time_s"]
            for r in json.loads(out.read_text())["rows"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bandwidth", default="1gbit", choices=sorted(SIZES))
    ap.add_argument("--ceilings", default="default,cluster",
                    help="send-buffer ceilings in turn: default (the machine's), cluster (what "
                         "cluster up sets), or bytes")
    ap.add_argument("--hosts", default="4,8", help="cluster sizes, comma list")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--out", type=out_file)
    a = ap.parse_args()
    out_path = a.out or (OUT if a.bandwidth == "1gbit" else OUT.with_name(f"{a.bandwidth}.json"))
    default = machine_send_buffer()
    capped = host_send_buffer(parse_bandwidth(a.bandwidth))
    named = {"default": default, "cluster": capped}
    try:
        ceilings = [named[x] if x in named else int(x) for x in a.ceilings.split(",")]
        hosts_list = [int(x) for x in a.hosts.split(",")]
    except ValueError as e:
        raise SystemExit(f"--ceilings and --hosts take comma lists ({e})") from None
    if default not in ceilings:
        raise SystemExit("--ceilings must hold default: speed-ups are over it")
    by_hosts = {}
    for hosts in hosts_list:
        times: dict[str, dict[str, list[float]]] = {}
        with tempfile.TemporaryDirectory(prefix="gradwire-sndbuf-") as home, \
                ephemeral_cluster(hosts, a.bandwidth) as c:
            for rnd in range(a.rounds):
                for ceiling in ceilings:
                    if not all(cap_send_buffer(h.netns, ceiling) for h in c.hosts):
                        raise SystemExit("the hosts' send buffers could not be set")
                    got = {k: v for col, algos, builtin in WORK for k, v in
                           bench(c, home, col, algos, builtin, SIZES[a.bandwidth]).items()}
                    for k, v in got.items():
                        times.setdefault(str(ceiling), {}).setdefault(k, []).append(v)
                    print(hosts, rnd, ceiling, {k: round(v * 1e3, 1) for k, v in got.items()},
                          flush=True)
        base = times[str(default)]
        by_hosts[str(hosts)] = {
            "median_s": {s: {k: statistics.median(v) for k, v in t.items()}
                         for s, t in times.items()},
            "times_s": times,
            "speedup_over_default": {s: {k: statistics.median(base[k]) / statistics.median(v)
                                         for k, v in t.items()}
                                     for s, t in times.items() if s != str(default)}}
    command = provenance.script_command()
    cores = os.cpu_count() or 1
    out_path.write_text(json.dumps({
        **provenance.stamp(command),
        "network": f"emulated hosts, {a.bandwidth} links, TCP cubic",
        "settings": {"machine_default_ceiling_bytes": default,
                     "cluster_ceiling_bytes": capped, "ceilings_bytes": ceilings},
        "note": f"each time the median of {ITERS} timed calls, each after a lead-in call (the "
                f"algorithms in turn), per round; {a.rounds} rounds with the settings in turn; "
                f"up to {max(hosts_list)} ranks share the machine's {cores} cores"
                + (provenance.contention(tuple(hosts_list), cores) or ", no CPU contention"),
        "by_hosts": by_hosts}, indent=1) + "\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
