"""A/B of compress_speed.py: an earlier commit's compressors against this checkout's, run in
turn (earlier, this, earlier, this, ...) on the same machine, each round its own processes.

Per compressor row of table (b) and for the selector of table (a), the ratio this / earlier of
the median encode and decode times over the rounds (below 1: this checkout is faster).

    python benchmarks/compress_ab.py --baseline aa7a4ad \\
        --out benchmarks/results/compress_ab_catalogue.json
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

from ab import earlier_src, revision, this_code

from gradwire.bench import provenance

HERE = Path(__file__).parent


def run(src: Path | None, out: Path, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src}:{env.get('PYTHONPATH', '')}"
    cmd = [sys.executable, str(HERE / "compress_speed.py"), "--parts", "a,b",
           "--size", str(args.size), "--topk-size", str(args.size), "--repeats",
           str(args.repeats), "--out", str(out)]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def rows(doc: dict) -> dict[str, tuple[float, float]]:
    """(encode ms, decode ms) of every row of table (b), and the selector of (a)."""
    out = {f"{r['method']} {json.dumps(r['params'], sort_keys=True)}":
           (r["encode_ms"], r["decode_ms"]) for r in doc["rows"]}
    out["topk selection (a)"] = (doc["topk_selection"]["threshold_ms"], 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, metavar="REV")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=25_600_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"earlier": [], "this": []}
    with earlier_src(args.baseline) as old, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side, src in (("earlier", old), ("this", None)):
                runs[side].append(rows(run(src, Path(tmp) / f"{side}{r}.json", args)))
    table = {}
    for key in runs["this"][0]:
        med = {side: [statistics.median(x[key][i] for x in runs[side]) for i in (0, 1)]
               for side in runs}
        table[key] = {"earlier_ms": med["earlier"], "this_ms": med["this"],
                      "encode_ratio": round(med["this"][0] / med["earlier"][0], 3),
                      "decode_ratio": (round(med["this"][1] / med["earlier"][1], 3)
                                       if med["earlier"][1] else None)}
    doc = {**provenance.stamp(shlex.join(sys.argv)), "earlier": revision(args.baseline),
           "this": this_code(), "rounds": args.rounds, "size": args.size, "rows": table}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for key, t in table.items():
        print(f"{key:45s} encode ×{t['encode_ratio']:.3f}  decode ×{t['decode_ratio']}")


if __name__ == "__main__":
    main()
