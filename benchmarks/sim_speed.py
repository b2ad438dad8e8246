"""Simulator speed: wall time of one simulated iteration vs worker count.

ResNet-50 (built-in profile: 161 tensors, 25.56 M parameters; compute 61 + 122 ms), 25 Gbit/s,
one iteration, on this machine. Rows: the baseline parameter server (1 server, round-robin
distribution), multicast + INA, ring-reduce with messaging (one ring allreduce per tensor) and
ring with DDP's 25 MB buckets. "simulate s" is cold: the schedule caches are cleared first, so
it includes building the ring tables (numpy; the simulator never builds Transfer objects for a
ring). "Schedule objects s" is what building the same schedules as Transfer objects costs, for
comparison (2P(P−1) of them per ring allreduce: 2.1 M at P = 1024).
Targets (issue 6): ring at 1024 workers ≤ 2 s, PS at 256 workers ≤ 10 s.

    flock /tmp/gradwire-bench.lock python benchmarks/sim_speed.py    # results/sim_speed/latest.json
    python benchmarks/sim_speed.py --ps 8,16 --ring 8,16 --out /tmp/quick.json
    python benchmarks/sim_speed.py --old REV     # every row also on commit REV's library, A/B

Every row runs in a fresh process.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ab import earlier_src, revision, this_code
from rich.console import Console
from rich.table import Table

from gradwire import profiles
from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file
from gradwire.schedules import registry
from gradwire.sim import mechanisms
from gradwire.sim.cluster import SimCluster
from gradwire.sim.trace import Trace, synthetic

HERE = Path(__file__).parent
OUT = HERE / "results" / "sim_speed" / "latest.json"


def resnet50() -> Trace:
    prof = profiles.load("resnet50")
    params = list(reversed(prof.params))
    return synthetic("resnet50", [n * prof.itemsize for _, n in params], prof.forward_s,
                     prof.backward_s, names=[n for n, _ in params],
                     source="built-in profile resnet50")


def build_time(trace: Trace, p: int, bucket: int) -> float:
    """Seconds to build (not yet cached) every ring schedule the mechanism needs."""
    from gradwire.sim.collective import buckets

    registry._cached.cache_clear()
    registry._cached_table.cache_clear()
    sizes = {sum(trace.params[i].bytes for i in g) for g in buckets(trace, bucket)}
    t0 = time.perf_counter()
    for n in sizes:
        registry.schedule("allreduce", "ring", p, n, itemsize=1)
    return time.perf_counter() - t0


def one(label: str, w: int) -> dict:
    """One row, timed in this process (cold caches)."""
    trace = resnet50()
    mech = mechanisms.parse(label)
    build: float | None = 0.0
    if label.startswith("ring"):
        bucketed = "bucket" in label
        # per tensor, 22 distinct sizes: 46 M Transfer objects at 1024 workers (minutes, GBs)
        build = (build_time(trace, w, 25_000_000 if bucketed else 0)
                 if bucketed or w <= 128 else None)
    registry._cached.cache_clear()
    registry._cached_table.cache_clear()
    t0 = time.perf_counter()
    r = mech.run(trace, SimCluster(w, 25e9, iterations=1), False)
    return {"mechanism": label, "workers": w, "schedule_objects_s": build,
            "simulate_s": time.perf_counter() - t0, "iteration_s": r.iteration_s,
            "loadavg": os.getloadavg()}


def fresh(label: str, w: int, src: Path | None = None) -> dict:
    """:func:`one` in a new process, on this checkout's code or on the library at ``src``."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, __file__, "--one", f"{label}@{w}"], env=env,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{label} at {w} workers failed: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ps", default="8,16,32,64,128,256", help="worker counts for ps rows")
    ap.add_argument("--ring", default="8,32,128,512,1024",
                    help="worker counts, ring per tensor")
    ap.add_argument("--bucketed", default="8,32,128,256,512,1024",
                    help="worker counts, ring with 25 MB buckets")
    ap.add_argument("--old", metavar="REV", help="also time the library of commit REV, each "
                    "row right after this code's")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # LABEL@WORKERS: one row, as JSON
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args(argv)
    if a.one:
        label, w = a.one.rsplit("@", 1)
        print(json.dumps(one(label, int(w))))
        return
    console = Console(width=140)
    rows = []
    plan = [(m, int(w)) for m in ("ps", "multicast+ina") for w in a.ps.split(",") if w]
    plan += [("ring", int(w)) for w in a.ring.split(",") if w]
    plan += [("ring:bucket=25000000", int(w)) for w in a.bucketed.split(",") if w]
    with contextlib.ExitStack() as stack:
        old_src = stack.enter_context(earlier_src(a.old)) if a.old else None
        for label, w in plan:
            rows.append({**fresh(label, w), "code": this_code()})
            console.print(rows[-1])
            if old_src is not None:
                rows.append({**fresh(label, w, old_src), "code": revision(a.old)})
                console.print(rows[-1])
    t = Table("mechanism", "workers", "code", "simulate s (cold)", "Schedule objects s",
              "simulated iteration s", "load avg (1 min)", title="simulator speed, ResNet-50, "
              "25 Gbit/s, one iteration")
    for r in rows:
        t.add_row(r["mechanism"], str(r["workers"]), r["code"], f"{r['simulate_s']:.2f}",
                  "-" if r["schedule_objects_s"] is None else f"{r['schedule_objects_s']:.2f}",
                  f"{r['iteration_s']:.4f}",
                  f"{r['loadavg'][0]:.2f}")
    console.print(t)
    out = {**provenance.stamp(provenance.script_command()),
           "conditions": "each row in a fresh process (cold caches), one after another; load "
                         "average per row", "rows": rows}
    write_json(a.out, out)


if __name__ == "__main__":
    main()
