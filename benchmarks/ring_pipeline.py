"""How finely the ring allreduce should cut its chunks (``pipeline``, sub-chunks per chunk) on
the emulated 1 Gbit/s cluster: the default ring, pipeline 1, 2, 4 and 8, and torch's own
all_reduce, taking turns (``gradwire bench --interleave``), at 16 and 64 MiB, P = 4 and 8.
Writes results/ring_pipeline/latest.json: every row, and per size the ratio of each ring's bus
bandwidth to the built-in one measured in the same rounds.

    python benchmarks/ring_pipeline.py            # ~4 min; needs root (network namespaces)

Run it on an otherwise idle machine: 8 ranks share 2 cores.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ab import this_code
from collectives import bench

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file
from gradwire.schedules.ring import SUBCHUNK_BYTES, pick_pipeline

HERE = Path(__file__).parent
OUT = HERE / "results" / "ring_pipeline" / "latest.json"
ALGOS = "ring,ring:pipeline=1,ring:pipeline=2,ring:pipeline=4,ring:pipeline=8"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="4,8")
    ap.add_argument("--sizes", default="16M,64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gradwire-ring-pipeline-") as home:
        runs = [bench(home, "allreduce", ALGOS, a.sizes, int(p), a.iters, interleave=True)
                for p in a.hosts.split(",")]
    table = {}
    for res in runs:
        for size in sorted({r["bytes"] for r in res["rows"]}):
            rows = [r for r in res["rows"] if r["bytes"] == size]
            base = next(r for r in rows if r["algo"] == "builtin")["busbw_Gbitps"]
            ratios = {r["algo"]: r["busbw_Gbitps"] / base for r in rows if r["algo"] != "builtin"}
            default = next(r for r in rows if r["algo"] == "ring")
            table[f"P={res['world_size']} {size >> 20} MiB"] = {
                "builtin_busbw_Gbitps": base, "ratio_to_builtin": ratios,
                "default_pipeline": pick_pipeline(res["world_size"], default["count"], None,
                                                  4)}
            print(f"P={res['world_size']} {size >> 20:>3} MiB: builtin {base:.3f} Gbit/s; "
                  + ", ".join(f"{k} {v:.3f}x" for k, v in ratios.items()))
    result = {**provenance.stamp(provenance.script_command()),
              "code": this_code(), "subchunk_bytes": SUBCHUNK_BYTES,
              "network": runs[0]["network"] if runs else None, "ratios": table, "runs": runs}
    write_json(a.out, result)


if __name__ == "__main__":
    main()
