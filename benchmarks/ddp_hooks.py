"""PyTorch's built-in DDP communication hooks (allreduce, fp16, PowerSGD) beside gradwire's, on
one model and one process group, interleaved; ms per iteration (the slowest rank's, median),
the loss after the timed steps (a hook that is fast because it does nothing shows there), and
for gradwire's hooks the share of an iteration inside call-header exchanges (none in steady
state without a density warm-up, but per bucket for the methods that agree on a NaN/Inf status
first; an exchange also holds the wait for the slowest rank when it is a step's first sync
point) and,
for a hook also listed as "<hook>/nocheck" (GRADWIRE_CHECK_CALLS=0), the check's cost: the
iteration with it over the iteration without, less 1, in the same run. With --profile N, each
hook also runs one more step after its timed ones, profiled on rank 0 (torch.profiler), and the
result keeps its N ops of most device time under "profiles".

    python benchmarks/ddp_hooks.py                      # CPU: gloo, 4 emulated hosts, 1 Gbit/s
    python benchmarks/ddp_hooks.py --hosts 8 --out benchmarks/results/ddp_hooks/p8.json
    python benchmarks/ddp_hooks.py --hooks gradwire:topk-0.001,gradwire:topk-0.001/nocheck
    python benchmarks/ddp_hooks.py --hooks torch:powersgd-r4/one,gradwire:powersgd-r4/one \
        --out benchmarks/results/ddp_hooks/powersgd.json   # "/one": the whole model in one bucket
    python benchmarks/ddp_hooks.py --model mlp --iters 30 --hooks torch:allreduce,\
        gradwire:dense,gradwire:dense/thread,torch:fp16,gradwire:fp16,gradwire:fp16/thread \
        --out benchmarks/results/ddp_hooks/direct_mlp.json   # "/thread": no bucket issued
                                                             # from the hook
    python benchmarks/ddp_hooks.py --device cuda        # NCCL, P ranks sharing GPU 0, each its
                                                        # own emulated host (carry_iproute2.sh)

Needs root for the emulated cluster (--loopback runs unshaped). Writes
results/ddp_hooks/latest.json (on cuda: results/ddp_hooks/cuda.json) with the machine, command,
commit and date. Rows print as they come; a run that fails part-way still writes the hooks it
finished, with the failure under "failed", and exits non-zero.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from gradwire.bench import provenance
from gradwire.bench.sharing import usable_cores
from gradwire.cli.options import write_json
from gradwire.cluster import ephemeral_cluster
from gradwire.jsonfile import out_file
from gradwire.launcher import launch

HERE = Path(__file__).parent
OUT = HERE / "results" / "ddp_hooks" / "latest.json"  # on cuda: cuda.json beside it (--device)
HOOKS = ("torch:allreduce", "gradwire:dense", "torch:fp16", "gradwire:fp16",
         "torch:powersgd-r1", "gradwire:powersgd-r1", "gradwire:topk-0.001",
         "gradwire:gtopk-0.001")
# Which of ours stands beside which of PyTorch's, for the ratios.
PAIRS = (("gradwire:dense", "torch:allreduce"), ("gradwire:fp16", "torch:fp16"),
         ("gradwire:powersgd-r1", "torch:powersgd-r1"),
         ("gradwire:powersgd-r1/one", "torch:powersgd-r1/one"),
         ("gradwire:powersgd-r4/one", "torch:powersgd-r4/one"),
         # issued from the hook beside handed to the comm thread (dense, fp16, bf16)
         ("gradwire:dense", "gradwire:dense/thread"), ("gradwire:fp16", "gradwire:fp16/thread"),
         ("gradwire:bf16", "gradwire:bf16/thread"))


def check_hook(hook: str) -> str | None:
    """Why the ranks could not run ``hook`` (benchmarks/ranks/ddp_hooks.py's names), or None."""
    import gradwire.hooks as gh

    name, _, variant = hook.partition("/")
    if variant not in ("", "nocheck", "one", "thread"):
        return f"{hook!r}: the variant after '/' must be nocheck, one or thread"
    if name in ("torch:allreduce", "torch:fp16"):
        return None
    if name.startswith("torch:powersgd-r"):
        rank = name.removeprefix("torch:powersgd-r")
        return None if rank.isdigit() and int(rank) > 0 else f"{hook!r}: the rank must be >= 1"
    if not name.startswith("gradwire:"):
        return (f"{hook!r} is not a hook: expected torch:allreduce, torch:fp16, "
                "torch:powersgd-rN or gradwire:METHOD[-DENSITY|-rN][@ALGO]")
    method = name.removeprefix("gradwire:").partition("@")[0].partition("-")[0]
    if method not in gh.METHODS:
        return f"{hook!r}: unknown method {method!r}: expected one of {', '.join(gh.METHODS)}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--loopback", action="store_true")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", default="mlp14m",
                    choices=("mlp14m", "resnet50", "mlp", "resnet20", "mlp-tiny"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3, help="untimed iterations per run")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hooks", default=",".join(HOOKS),
                    help="comma-separated; on cpu the default leaves out torch:powersgd-r1")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after each hook's timed steps, profile one more step on rank 0 and "
                         "keep its N ops of most device time (CPU time without a GPU)")
    ap.add_argument("--out", type=out_file)
    args = ap.parse_args()
    if args.profile < 0:
        sys.exit(f"ddp_hooks.py: error: --profile must be 0 or more, got {args.profile}")
    # before any rank starts: --iters 0 divided by zero in every rank, --rounds 0 wrote a
    # result with nothing measured, --batch 0 one of NaN losses, and a negative --warmup
    # timed its first, cold iteration as a warm one
    for option, value, least in (("--hosts", args.hosts, 1), ("--batch", args.batch, 1),
                                 ("--warmup", args.warmup, 0), ("--iters", args.iters, 1),
                                 ("--rounds", args.rounds, 1)):
        if value < least:
            ap.error(f"{option} must be >= {least}, got {value}")
    if args.hooks == ",".join(HOOKS) and args.device == "cpu":
        # PyTorch's PowerSGD hook issues its allreduces from future callbacks; over gloo those
        # of different buckets can reach the ranks in different orders (gloo aborted with
        # "Received data size doesn't match expected size" on the 3-bucket mlp14m).
        args.hooks = ",".join(h for h in HOOKS if h != "torch:powersgd-r1")
    for hook in args.hooks.split(","):
        problem = check_hook(hook)
        if problem:
            sys.exit(f"ddp_hooks.py: error: --hooks: {problem}")
    if len(set(args.hooks.split(","))) != len(args.hooks.split(",")):
        # both runs' rows would be pooled under one name, as if one hook had run twice as long
        sys.exit(f"ddp_hooks.py: error: --hooks names a hook twice: {args.hooks!r}")
    out = args.out or (OUT if args.device == "cpu" else OUT.with_name(f"{args.device}.json"))
    env = {"HOOKS": args.hooks, "MODEL": args.model, "BATCH": str(args.batch),
           "WARMUP": str(args.warmup), "ITERS": str(args.iters), "ROUNDS": str(args.rounds),
           "DEVICE": args.device, "PROFILE": str(args.profile)}
    lines: list[str] = []

    def sink(line: str) -> None:  # each row as it comes, so a run cut short still shows them
        lines.append(line)
        if "] ROW " in line or "] PROF " in line:
            print(line, flush=True)

    with ephemeral_cluster(args.hosts, args.bandwidth, args.loopback) as c:
        res = launch(c, [sys.executable, str(HERE / "ranks" / "ddp_hooks.py")], timeout=3000,
                     sink=sink, extra_env=env)
        label = c.label
    rows = [json.loads(x.partition("ROW ")[2]) for x in lines if "] ROW " in x]
    failed = None if res.returncode == 0 else "\n".join(lines[-30:] + [res.message])
    if failed and not rows:
        sys.exit(failed)
    summary = {}
    # After a failure the hooks may have finished different numbers of rounds: each is then
    # summarised over the rounds every hook that ran finished, so that a ratio is still of
    # the same rounds, taken in turns (every row stays under "rows").
    done = [sum(r["hook"] == h for r in rows) for h in args.hooks.split(",")]
    rounds = min((n for n in done if n), default=0)
    for hook in args.hooks.split(","):
        mine = [r for r in rows if r["hook"] == hook and r["round"] < rounds]
        if not mine:  # the run failed before this hook's first row
            continue
        times = [t for r in mine for t in r["slowest_s"]]
        summary[hook] = {"ms_per_iter": 1e3 * statistics.median(times),
                         "loss": statistics.fmean(r["loss"] for r in mine)}
        if hook.startswith("gradwire:"):  # the call check's share (the slowest rank's)
            header = 1e3 * statistics.median(r["header_s"] for r in mine)
            summary[hook]["check_ms_per_iter"] = header
            summary[hook]["check_share"] = header / summary[hook]["ms_per_iter"]
    ratios = {f"{ours} vs {theirs}": summary[theirs]["ms_per_iter"] / summary[ours]["ms_per_iter"]
              for ours, theirs in PAIRS if ours in summary and theirs in summary}
    for hook in summary:  # the call check's cost: "<hook>/nocheck" beside "<hook>"
        if hook.endswith("/nocheck") and hook.removesuffix("/nocheck") in summary:
            on = summary[hook.removesuffix("/nocheck")]["ms_per_iter"]
            summary[hook.removesuffix("/nocheck")]["check_cost"] = (
                on / summary[hook]["ms_per_iter"] - 1)
    best = {side: min((h for h in summary if h.startswith(side)
                       and not h.endswith(("/nocheck", "/thread"))),
                      key=lambda h: summary[h]["ms_per_iter"], default=None)
            for side in ("torch:", "gradwire:")}
    if None not in best.values():
        ratios[f"best gradwire ({best['gradwire:']}) vs best torch ({best['torch:']})"] = (
            summary[best["torch:"]]["ms_per_iter"] / summary[best["gradwire:"]]["ms_per_iter"])
    print(f"{label}, {args.hosts} ranks, {args.model}, batch {args.batch}")
    print(f"{'hook':<32} {'ms/iter':>9} {'loss':>8} {'in headers':>10} {'check on/off':>12}")
    for hook, s in summary.items():
        share = f"{100 * s['check_share']:.2f}%" if "check_share" in s else ""
        cost = f"{100 * s['check_cost']:+.2f}%" if "check_cost" in s else ""
        print(f"{hook:<32} {s['ms_per_iter']:9.1f} {s['loss']:8.4f} {share:>10} {cost:>12}")
    for what, r in ratios.items():
        print(f"speed {what}: {r:.2f}x")
    result = {**provenance.stamp(provenance.script_command(), args.device),
              "network": label, "hosts": args.hosts,
              "environment": {k: v for k, v in os.environ.items() if k.startswith("GRADWIRE_")},
              "note": (f"{args.hosts} ranks on this machine's {usable_cores()} cores"
                       + provenance.contention((args.hosts,), usable_cores())),
              "model": args.model, "batch": args.batch, "warmup": args.warmup,
              "iters": args.iters, "rounds": args.rounds, "summary": summary,
              "speed_ratios": ratios, "rows": rows}
    profiles: dict[str, list[str]] = {}  # each hook's last profiled step (rank 0's)
    for x in lines:
        if "] PROF " in x:
            hook, _, text = x.partition("] PROF ")[2].partition(" ")
            if text == "BEGIN":
                profiles[hook] = []
            else:
                profiles[hook].append(text)
    if profiles:
        result["profiles"] = profiles
    if failed:  # what ran before the failure, kept, and the failure beside it
        result["failed"] = failed.splitlines()
    write_json(out, result)
    if failed:
        sys.exit(failed)


if __name__ == "__main__":
    main()
