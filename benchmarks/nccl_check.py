"""NCCL on a GPU, recorded: gradwire's collectives, sparse allreduces and DDP hooks with CUDA
tensors over NCCL, several ranks sharing one GPU. Needs a CUDA device (CI has none).

(a) The test suite's check scripts (tests/scripts: collectives_check.py, every algorithm
    against torch.distributed's own collective and the schedule's bytes; sparse_check.py, the
    sparse allreduces against the long-hand reference; hooks_check.py, every DDP hook method) on
    P ranks over NCCL (GRADWIRE_TEST_BACKEND=nccl): cases checked, failures, seconds.
(b) Why the launcher gives every emulated host its own NCCL host id: two ranks on one GPU
    under one id, against the same two ranks with their own ids (the launcher's default).
(c) ``gradwire bench --device cuda``: allreduce algorithms beside NCCL's own all_reduce, on the
    emulated 1 Gbit/s cluster where namespaces work here, else on loopback (not shaped).
(d) Why the executor goes step by step over NCCL: its dataflow path (receives posted ahead of
    sends, as over gloo) on 2 ranks, ring and recursive doubling allreduce, bounded at 60 s.

    python benchmarks/nccl_check.py              # writes benchmarks/results/nccl_check/latest.json
    python benchmarks/nccl_check.py --parts b --out /tmp/n.json
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.cluster import loopback_cluster, netns_available
from gradwire.jsonfile import out_file
from gradwire.launcher import launch

HERE = Path(__file__).parent
OUT = HERE / "results" / "nccl_check" / "latest.json"
SCRIPTS = HERE.parent / "tests" / "scripts"
CHECKS = ["collectives_check.py", "sparse_check.py", "hooks_check.py"]
PROBE = """
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl")
x = torch.full((4,), dist.get_rank() + 1.0, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
print("SUM", x.tolist(), flush=True)
dist.destroy_process_group()
"""


def checks(ranks: list[int], scripts: list[str], timeout: float, rows: list[dict], save,
           stamp: dict) -> None:
    """Run each script on each number of ranks; a row replaces the one of the same script and
    ranks in ``rows`` (so a run of some of them keeps the others)."""
    for p in ranks:
        for name in scripts:
            lines: list[str] = []
            t0 = time.perf_counter()
            res = launch(loopback_cluster(p), [sys.executable, str(SCRIPTS / name)],
                         timeout=timeout, sink=lines.append,
                         extra_env={"GRADWIRE_TEST_BACKEND": "nccl"})
            done = [x.split("CHECKED")[1].split() for x in lines if "CHECKED" in x]
            fields = [dict(kv.split("=") for kv in d[2:]) for d in done]
            row = {"script": name, "ranks": p, "date": stamp["date"],
                   "commit": stamp["commit"], "returncode": res.returncode,
                   "seconds": round(time.perf_counter() - t0, 1),
                   "ranks_done": len(done),
                   "cases_per_rank": [int(f["cases"]) for f in fields],
                   "failures": sum(int(f["failures"]) for f in fields),
                   "fail_lines": [x for x in lines if "FAIL" in x][:20],
                   "tail": lines[-8:] if res.returncode else []}
            rows[:] = [r for r in rows if (r["script"], r["ranks"]) != (name, p)] + [row]
            rows.sort(key=lambda r: (r["ranks"], CHECKS.index(r["script"])))
            save()
            print(json.dumps({k: v for k, v in row.items() if k != "tail"}), flush=True)


def host_ids(timeout: float) -> list[dict]:
    rows = []
    for label, env in (("one NCCL host id for both ranks", {"NCCL_HOSTID": "one-machine"}),
                       ("each rank its own (the launcher's default)", {})):
        lines: list[str] = []
        res = launch(loopback_cluster(2), [sys.executable, "-c", PROBE], timeout=timeout,
                     sink=lines.append, extra_env=env)
        said = [x for x in lines if "SUM" in x or "Duplicate" in x or "Error" in x]
        rows.append({"case": label, "returncode": res.returncode, "said": said[:6]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench(timeout: float) -> dict:
    ok, why = netns_available()
    where = ["--bandwidth", "1gbit"] if ok else ["--loopback"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "gradwire", "bench", "--device", "cuda", "--hosts", "4",
               *where, "--sizes", "64K:64M:4", "--algo", "ring,rhd,tree,lp", "--iters", "5",
               "--json", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        print(res.stdout[-6000:], res.stderr[-3000:], flush=True)
        result = json.loads(out.read_text()) if out.exists() else {}
    return {"bench_command": shlex.join(["gradwire", *cmd[3:-2]]), "returncode": res.returncode,
            "namespaces": ok or why, "stderr_tail": res.stderr[-1500:] if res.returncode else "",
            "result": result}


def dataflow(timeout: float) -> dict:
    env = {"GRADWIRE_TEST_BACKEND": "nccl", "GRADWIRE_TEST_DATAFLOW": "1",
           "ALGOS": "allreduce/ring,allreduce/rd", "SIZES": "1000,100000"}
    lines: list[str] = []
    t0 = time.perf_counter()
    res = launch(loopback_cluster(2), [sys.executable, str(SCRIPTS / "collectives_check.py")],
                 timeout=timeout, sink=lines.append, extra_env=env)
    row = {"env": env, "timeout_s": timeout, "returncode": res.returncode,
           "seconds": round(time.perf_counter() - t0, 1),
           "checked": [x for x in lines if "CHECKED" in x], "tail": lines[-4:]}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2,3,4", help="rank counts for (a)")
    ap.add_argument("--scripts", default=",".join(CHECKS), help="check scripts for (a)")
    ap.add_argument("--parts", default="a,b,c,d", help="comma list of a, b, c, d")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per run")
    ap.add_argument("--out", type=out_file, default=OUT)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("nccl_check.py needs a CUDA device: none here")
    parts = set(args.parts.split(","))
    # Parts not run keep what --out holds; each part records when, where and how it ran.
    result = json.loads(args.out.read_text()) if args.out.exists() and parts != {
        "a", "b", "c", "d"} else {}
    stamp = provenance.stamp(provenance.script_command(),
                             "cuda")

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, result)

    if "b" in parts:
        result["host_ids"] = {**stamp, "rows": host_ids(args.timeout)}
        save()
    if "a" in parts:
        rows = result.get("checks", {}).get("rows", [])
        result["checks"] = {**stamp, "rows": rows}
        checks([int(p) for p in args.ranks.split(",")], args.scripts.split(","), args.timeout,
               rows, save, stamp)
    if "c" in parts:
        result["bench"] = {**stamp, **bench(args.timeout * 2)}
        save()
    if "d" in parts:
        result["dataflow"] = {**stamp, **dataflow(60)}
        save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
