"""Executor A/B: this checkout's collectives against an earlier commit's, interleaved, on the
same emulated 1 Gbit/s cluster size (8 hosts by default, 64 MiB): LP broadcast time and ring
allreduce busbw against torch.distributed's all_reduce measured in the same `gradwire bench`
call; with ``--cases rs_ring,rs_rhd`` the out-of-place reduce-scatters instead.

The earlier commit's ``src`` comes from a temporary `git worktree` and goes first on
PYTHONPATH, so the ranks (which inherit the environment) run its code; everything else (the
cluster, the launcher of this checkout's Python) is the same.

    python benchmarks/executor_ab.py                  # old = c6f8093 (before in-place receives)
    python benchmarks/executor_ab.py --old REV --rounds 3
    python benchmarks/executor_ab.py --old e4bcd88 --cases rs_ring,rs_rhd --hosts 4 --rounds 3 \
        --out benchmarks/results/executor_ab/reduce_scatter.json   # reduce-scatter without the copy

Needs root (network namespaces) and an otherwise idle machine: 8 ranks share 2 cores.
Writes benchmarks/results/executor_ab/latest.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from ab import ROOT, earlier_src, this_code

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file

HERE = Path(__file__).parent
OUT = HERE / "results" / "executor_ab" / "latest.json"
CASES = {"lp_broadcast": ("broadcast", "lp", ["--no-builtin"]),
         "ring_allreduce": ("allreduce", "ring", []),
         "rs_ring": ("reducescatter", "ring", ["--no-builtin"]),
         "rs_rhd": ("reducescatter", "rhd", ["--no-builtin"])}


def bench(src: Path, home: str, collective: str, algo: str, extra: list[str],
          hosts: int) -> dict:
    out = Path(home) / f"{collective}-{len(os.listdir(home))}.json"
    args = ["bench", "--hosts", str(hosts), "--bandwidth", "1gbit", "--collective", collective,
            "--algo", algo, "--sizes", "64M", "--iters", "5", *extra, "--json", str(out)]
    print(f"$ PYTHONPATH={src} gradwire {shlex.join(args)}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(src), "GRADWIRE_HOME": home}
    subprocess.run([sys.executable, "-m", "gradwire.cli", *args], env=env, check=True)
    rows = json.loads(out.read_text())["rows"]
    mine = next(r for r in rows if r["algo"] == algo)
    base = next((r for r in rows if r["algo"] == "builtin"), None)
    return {"time_s": mine["time_s"], "busbw_Gbitps": mine["busbw_Gbitps"],
            "builtin_busbw_Gbitps": base and base["busbw_Gbitps"],
            "ratio_to_builtin": base and mine["busbw_Gbitps"] / base["busbw_Gbitps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="c6f8093", help="the earlier commit (default: c6f8093)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cases", default="lp_broadcast,ring_allreduce",
                    help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args()
    cases = a.cases.split(",")
    if not set(cases) <= set(CASES):
        ap.error(f"--cases: expected names from {', '.join(CASES)}, got {a.cases}")
    home = tempfile.mkdtemp(prefix="gradwire-ab-")
    runs: list[dict] = []
    with earlier_src(a.old) as old_src:
        for r in range(a.rounds):
            for version, src in (("old", old_src), ("new", ROOT / "src")):
                for case in cases:
                    collective, algo, extra = CASES[case]
                    runs.append({"round": r + 1, "version": version, "case": case,
                                 **bench(src, home, collective, algo, extra, a.hosts)})
    result = {**provenance.stamp("python benchmarks/executor_ab.py " + " ".join(sys.argv[1:])),
              "old": a.old, "new": this_code(),
              "note": f"{a.hosts} emulated hosts at 1gbit on one machine: {a.hosts} ranks "
                      "share its cores; old and new alternate within each round",
              "runs": runs}
    write_json(a.out, result)
    for x in runs:
        extra = (f", {x['ratio_to_builtin']:.3f}x built-in" if x["ratio_to_builtin"] else "")
        print(f"round {x['round']} {x['version']:3} {x['case']:15} {x['time_s']:.3f} s{extra}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
