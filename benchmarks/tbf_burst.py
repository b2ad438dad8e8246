"""Why the emulated links keep a 500 kB token bucket at 1 Gbit/s (cluster.netns.tbf_burst).

For each bucket size, every link of a 4-host cluster is re-shaped with it, then:
1. one TCP stream host 0 → host 1 (plain sockets): 1 MiB after 50 ms idle, and 64 MiB; Gbit/s;
2. `gradwire bench` on the same cluster: LP allreduce and ring allreduce at 1 MiB and 64 MiB.
A bucket bigger than a timer tick's worth lets a transfer after an idle spell start faster
than the rate; a smaller one costs throughput when flows share links.

    python benchmarks/tbf_burst.py     # ~4 min; needs root; writes results/tbf_burst/latest.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gradwire.bench import provenance
from gradwire.cluster import ephemeral_cluster
from gradwire.jsonfile import out_file

OUT = Path(__file__).parent / "results" / "tbf_burst" / "latest.json"
BURSTS = (500_000, 131_072, 65_536)
STREAM = r"""
import socket, sys, time
mode, host, n, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "srv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 5599)); s.listen(1); c, _ = s.accept(); mv = memoryview(bytearray(1 << 20))
    for _ in range(reps):
        got = 0
        while got < n:
            got += c.recv_into(mv)
        c.sendall(b"x")
else:
    c = socket.socket()
    for _ in range(100):
        try:
            c.connect((host, 5599)); break
        except OSError:
            time.sleep(0.05)
    data, rates = b"\0" * n, []
    for _ in range(reps):
        time.sleep(0.05)
        t = time.perf_counter(); c.sendall(data); c.recv(1)
        rates.append(n * 8 / (time.perf_counter() - t) / 1e9)
    print(sorted(rates)[len(rates) // 2])
"""


def shape(c, burst: int) -> None:
    rate = f"{int(c.bandwidth_bps)}bit"
    for h in c.hosts:
        for prefix, dev in ((["ip", "netns", "exec", h.netns], h.ifname),
                            ([], f"{c.name}-v{h.rank}")):
            subprocess.run([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                            rate, "burst", str(burst), "latency", "100ms"], check=True)


def stream(c, script: str, n: int) -> float:
    a, b = c.hosts[0], c.hosts[1]
    srv = subprocess.Popen(["ip", "netns", "exec", b.netns, sys.executable, script, "srv",
                            b.addr, str(n), "5"])
    try:
        out = subprocess.run(["ip", "netns", "exec", a.netns, sys.executable, script, "cli",
                              b.addr, str(n), "5"], check=True, capture_output=True, text=True)
    except BaseException:
        srv.kill()  # its client is gone: it would wait for bytes that never come
        raise
    finally:
        srv.wait(timeout=60)
    return float(out.stdout)


def bench(c, home: str) -> dict[str, float]:
    out = Path(home) / f"b{time.monotonic_ns()}.json"
    subprocess.run([sys.executable, "-m", "gradwire.cli", "bench", "--cluster", c.name,
                    "--collective", "allreduce", "--algo", "lp,ring", "--sizes", "1M,64M",
                    "--iters", "3", "--json", str(out)], check=True,
                   env={**os.environ, "GRADWIRE_HOME": home}, capture_output=True)
    return {f"{r['algo']} {r['bytes'] >> 20} MiB": r["time_s"]
            for r in json.loads(out.read_text())["rows"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gradwire-tbf-") as home, \
            ephemeral_cluster(4, "1gbit") as c:
        script = Path(home) / "stream.py"
        script.write_text(STREAM)
        for burst in BURSTS:
            shape(c, burst)
            row = {"burst_bytes": burst,
                   "stream_1MiB_after_idle_Gbitps": stream(c, str(script), 2**20),
                   "stream_64MiB_Gbitps": stream(c, str(script), 64 * 2**20),
                   "allreduce_s": bench(c, home)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    command = provenance.script_command()
    cores = os.cpu_count() or 1
    a.out.write_text(json.dumps({**provenance.stamp(command),
                                 "network": "emulated 4 hosts, 1gbit links (tbf re-shaped per "
                                            "row)",
                                 "note": f"4 ranks share the machine's {cores} cores"
                                         + provenance.contention((4,), cores)
                                         + "; median of 5 streams, median of 3 bench "
                                           "iterations",
                                 "rows": rows}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
