"""A/B of compress_speed.py: an earlier commit's compressors against this checkout's, run in
turn (earlier, this, earlier, this, ...) on the same machine, each round its own processes.

Per compressor row of table (b) and for the selector of table (a), the ratio this / earlier of
the median encode and decode times over the rounds (below 1: this checkout is faster).

    python benchmarks/compress_ab.py --baseline aa7a4ad \\
        --out benchmarks/results/compress_ab/latest.json
    python benchmarks/compress_ab.py --earlier-src /path/to/old/src --device cuda ...
        # where there is no git (a lent GPU machine): the earlier src copied beside
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from ab import earlier_src, revision, this_code

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file

HERE = Path(__file__).parent


def run(src: Path, out: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{src}:{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, str(HERE / "compress_speed.py"), "--parts", "a,b", "--device",
           args.device,
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
    ap.add_argument("--baseline", metavar="REV", help="the earlier commit (a git worktree)")
    ap.add_argument("--earlier-src", type=Path, help="or the earlier commit's src folder")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=25_600_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=out_file, required=True)
    args = ap.parse_args()
    if (args.baseline is None) == (args.earlier_src is None):
        ap.error("give --baseline REV or --earlier-src PATH")
    runs: dict[str, list[dict]] = {"earlier": [], "this": []}
    with ExitStack() as stack:
        old = (stack.enter_context(earlier_src(args.baseline)) if args.baseline
               else args.earlier_src.resolve())
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        for r in range(args.rounds):
            for side, src in (("earlier", old), ("this", HERE.parent / "src")):
                runs[side].append(rows(run(src, Path(tmp) / f"{side}{r}.json", args)))
    table = {}
    for key in runs["this"][0]:
        med = {side: [statistics.median(x[key][i] for x in runs[side]) for i in (0, 1)]
               for side in runs}
        table[key] = {"earlier_ms": med["earlier"], "this_ms": med["this"],
                      "encode_ratio": round(med["this"][0] / med["earlier"][0], 3),
                      "decode_ratio": (round(med["this"][1] / med["earlier"][1], 3)
                                       if med["earlier"][1] else None)}
    earlier = revision(args.baseline) if args.baseline else str(args.earlier_src)
    try:
        this = this_code()
    except (subprocess.CalledProcessError, OSError):  # a copy without git (a GPU machine)
        this = "this checkout (no git here)"
    doc = {**provenance.stamp(provenance.script_command(), args.device), "earlier": earlier,
           "this": this, "rounds": args.rounds, "size": args.size, "rows": table}
    write_json(args.out, doc)
    for key, t in table.items():
        print(f"{key:45s} encode ×{t['encode_ratio']:.3f}  decode ×{t['decode_ratio']}")


if __name__ == "__main__":
    main()
