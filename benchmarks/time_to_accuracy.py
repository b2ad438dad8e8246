"""Time to accuracy: for every aggregation method, the training seconds until the test accuracy
first reaches a target, the final test accuracy and samples/s, on 4 emulated hosts at 1 Gbit/s.

Three of the project's models, each trained with every hook in turn in one process group, from
the same seed, on the same shards, with the same hyper-parameters (HPARAMS below; momentum
SGD): ``mlp`` and ``resnet20`` on scikit-learn's digits, and the character ``lstm`` on the
Python standard library's sources (next-symbol accuracy). The hooks:

- gradwire's, every method of ``gradwire.hooks.METHODS``: the sparsifiers (topk, gtopk,
  randomk, dgc) at ``--density``, topk and gtopk once more with the gTop-k paper's warm-up
  (``+warmup``: densities 0.25, 0.0725, 0.015, 0.004 for the first four epochs) and once
  more with DGC's momentum correction too (``+warmup+momentum``: the hook keeps HPARAMS'
  momentum, ``gradwire.hooks.make(..., momentum=)``, and the optimizer steps without),
  powersgd at ranks 4 and 1 (``-r4``, ``-r1``); DDP's default buckets.
- PyTorch's built-in DDP hooks: none (DDP's allreduce), fp16, bf16, and PowerSGD at ranks 4
  and 1, compressing from its second iteration (``start_powerSGD_iter=2``). DDP refuses to
  register ``bf16_compress_hook`` by its name without CUDA and NCCL 2.10, so the ranks call
  it from a function of another name (gloo reduces bfloat16 on the CPU). PyTorch's PowerSGD
  hook issues its allreduces from future callbacks, and over gloo with several buckets in
  flight it deadlocks or aborts, so its rows alone run with one DDP bucket (``"buckets":
  "one"`` in the JSON, ``"default"`` elsewhere).

``--seeds N`` trains every hook from N seeds (initial weights, shard order and the hook's
seed; the data split stays the same), and every figure is then taken from the mean of their
curves, epoch by epoch: one seed's final accuracy on digits' 360 test images moves by a point
or more from run to run, as much as the differences the accuracy targets ask about.

The training clock runs only while the ranks train (forward, backward with the hook's
communication, optimizer step; per epoch the slowest rank's time from a common barrier); after
every epoch rank 0 scores the test set with the clock stopped. A row reaches the target at the
first epoch whose test accuracy is at least TARGETS[model]. The ranks share this machine's
cores (4 ranks on 2 cores here): compute is contended, and a method that spends CPU to save
bytes pays for it in its seconds.

    python benchmarks/time_to_accuracy.py            # the full run: 3 models x 22 hooks,
                                                     # 25-40 minutes on 2 cores
    python benchmarks/time_to_accuracy.py --models mlp --epochs 2 --out /tmp/tta.json \\
        --hooks torch:allreduce,gradwire:gtopk+warmup          # a short pilot
    python benchmarks/time_to_accuracy.py --models mlp,resnet20 --lr-warmup \
        --hooks gradwire:topk+warmup,gradwire:gtopk+warmup \
        --out benchmarks/results/time_to_accuracy/lr_warmup.json   # with the paper's small LRs
    python benchmarks/time_to_accuracy.py --models mlp,resnet20 --epochs 30 --seeds 3 \
        --hooks gradwire:dense,gradwire:topk+warmup,gradwire:topk+warmup+momentum,\
gradwire:gtopk+warmup,gradwire:gtopk+warmup+momentum \
        --out benchmarks/results/time_to_accuracy/seeds_3.json   # a longer budget, 3 seeds
    python benchmarks/time_to_accuracy.py --render-only      # .png and .md again from the JSON

Needs root for the emulated cluster (--loopback runs unshaped loopback ranks). Writes
results/time_to_accuracy/latest.json (machine, command, commit, date) and the .png and .md beside
it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).parent
OUT = HERE / "results" / "time_to_accuracy" / "latest.json"
SEED = 0
SPARSIFIERS = ("topk", "gtopk", "randomk", "dgc")  # the methods that take a density
WARMUP_ROWS = ("topk", "gtopk")  # also run with the gTop-k paper's warm-up, without and with
# momentum correction
# What a sparsifier's hook name may add: the gTop-k paper's density warm-up; DGC's momentum
# correction (the hook keeps the momentum, the optimizer steps without).
EXTRAS = ("warmup", "momentum")
POWERSGD_RANKS = (4, 1)
TORCH_HOOKS = ("torch:allreduce", "torch:fp16", "torch:bf16",
               *(f"torch:powersgd-r{r}" for r in POWERSGD_RANKS))
# Per model: SGD learning rate, momentum, batch per rank, epochs, symbols per text sample.
# Dense at 4 ranks (global batch 128) in pilots: mlp (benchmarks/powersgd_accuracy.py's lr
# and batch) 0.955-0.972 from epoch 5; resnet20 0.95-0.99 from epoch 5 at lr 0.1 (0.05 was
# slower in one process); lstm 0.31 / 0.41 / 0.47 next-symbol accuracy after epochs 1 / 2 / 3
# at lr 1.0 (one process on the same global batches: 0.25 / 0.34 / 0.40 at the docs' lr 0.5;
# 2.0 gained 0.04 but risks the compressed methods). The epochs keep the full run near 25
# minutes on 2 cores (the LSTM, 0.9 M parameters over 0.47 M symbols an epoch, takes 9-23 s
# an epoch there; the others 0.5-3 s).
HPARAMS: dict[str, dict[str, float | int | None]] = {
    "mlp": {"lr": 0.1, "momentum": 0.9, "batch": 32, "epochs": 10, "seq_len": None},
    "resnet20": {"lr": 0.1, "momentum": 0.9, "batch": 32, "epochs": 10, "seq_len": None},
    "lstm": {"lr": 1.0, "momentum": 0.9, "batch": 32, "epochs": 3, "seq_len": 64},
}
# Target test accuracy per model, and how it was chosen (from dense's curve in a pilot, the
# run's settings at 4 ranks; gradwire's dense and DDP's allreduce train bit for bit alike).
TARGETS: dict[str, tuple[float, str]] = {
    "mlp": (0.95, "just below what dense reaches in its 10 epochs: 0.958 at epoch 5, then "
                  "0.955-0.972, 0.967 at the end (pilot accuracies per epoch 0.721, 0.911, "
                  "0.939, 0.916, 0.958, 0.972, 0.967, 0.967, 0.955, 0.967)"),
    "resnet20": (0.97, "just below what dense reaches in its 10 epochs: 0.978 at epoch 6, "
                       "then 0.967-0.992, 0.989 at the end (pilot per epoch 0.630, 0.769, "
                       "0.808, 0.916, 0.953, 0.978, 0.992, 0.983, 0.967, 0.989)"),
    "lstm": (0.45, "just below dense's next-symbol accuracy after its 3 epochs: 0.313, "
                   "0.406, 0.474 per epoch (epochs 2-3 from one process on the same global "
                   "batches, which gave the 4-rank pilot's epoch 1 exactly); chance ~0.03"),
}


# PyTorch's hook that does what a gradwire method does: it trains right after gradwire's
COUNTERPARTS = {"dense": "torch:allreduce", "fp16": "torch:fp16", "bf16": "torch:bf16"}


def default_hooks() -> list[str]:
    """Every hook of the full run in gradwire's METHODS order, each PyTorch hook right after
    gradwire's counterpart (interleaved, so that a drift of the machine's speed over the run
    does not fall between the two)."""
    from gradwire.hooks import METHODS

    names: list[str] = []
    for m in METHODS:
        if m == "powersgd":
            for r in POWERSGD_RANKS:
                names += [f"gradwire:powersgd-r{r}", f"torch:powersgd-r{r}"]
            continue
        names.append(f"gradwire:{m}")
        if m in COUNTERPARTS:
            names.append(COUNTERPARTS[m])
        if m in WARMUP_ROWS:
            names += [f"gradwire:{m}+warmup", f"gradwire:{m}+warmup+momentum"]
    return names + [h for h in TORCH_HOOKS if h not in names]


def parse_hook(name: str, density: float, methods: tuple[str, ...]) -> dict:
    """What the ranks need to set hook ``name`` up: side, method, the arguments of
    ``gradwire.hooks.make`` (or PyTorch's rank), warm-up, momentum correction and bucket
    layout. ``methods``: gradwire's methods. Raises ValueError naming the known hooks."""
    side, _, spec = name.partition(":")
    spec, *extras = spec.split("+")
    method, dash, rank = spec.partition("-r")
    ok_rank = rank.isdigit() and int(rank) >= 1
    ok_extras = (len(set(extras)) == len(extras) and set(extras) <= set(EXTRAS)
                 and method in SPARSIFIERS)
    spec_ok = {
        "gradwire": (method in methods and (method == "powersgd") == bool(dash)
                     and (not dash or ok_rank) and (not extras or ok_extras)),
        "torch": (not extras and (f"torch:{method}" in TORCH_HOOKS if not dash
                                  else method == "powersgd" and ok_rank)),
    }.get(side, False)
    if not spec_ok:
        known = [h for h in default_hooks() if "powersgd" not in h]
        raise ValueError(f"unknown hook {name!r}: known are {', '.join(known)}, "
                         f"gradwire:powersgd-rN and torch:powersgd-rN (N >= 1), and "
                         f"{' / '.join('+' + e for e in EXTRAS)} after gradwire's "
                         f"{', '.join(SPARSIFIERS)}")
    options: dict[str, float | int] = {}
    if method == "powersgd":
        options["rank"] = int(rank)
    elif side == "gradwire" and method in SPARSIFIERS:
        options["density"] = density
    return {"hook": name, "side": side, "method": method, "options": options,
            "warmup": "warmup" in extras, "momentum": "momentum" in extras,
            "buckets": "one" if side == "torch" and dash else "default"}


def parse_epochs(text: str | None, models: list[str]) -> dict[str, int]:
    """``--epochs``: None (HPARAMS'), one count for every model, or ``model=N,...``."""
    epochs = {m: int(HPARAMS[m]["epochs"]) for m in models}
    if not text:
        return epochs
    items = text.split(",")
    try:
        if len(items) == 1 and "=" not in text:
            epochs = dict.fromkeys(models, int(text))
        else:
            for item in items:
                model, eq, n = item.partition("=")
                if not eq or model not in epochs:
                    raise ValueError
                epochs[model] = int(n)
    except ValueError:
        raise ValueError(f"--epochs must be N or MODEL=N,... for models {', '.join(models)}, "
                         f"got {text!r}") from None
    if min(epochs.values()) < 1:
        raise ValueError(f"--epochs must be >= 1, got {text!r}")
    return epochs


# --- summary (pure) -------------------------------------------------------------------------
def summarize_row(row: dict, target: float) -> dict:
    """One row's result against ``target``: ``seconds_to_target`` (training seconds at the first
    evaluation with accuracy >= target, else None) and ``epoch_to_target``, ``reached``,
    ``best_accuracy``, ``final_accuracy``, ``train_seconds``, ``samples_per_s``."""
    if row.get("error"):
        return {"reached": False, "seconds_to_target": None, "epoch_to_target": None,
                "best_accuracy": None, "final_accuracy": None, "train_seconds": None,
                "samples_per_s": None, "error": row["error"]}
    curve = row["curve"]
    hit = next((p for p in curve if p["test_accuracy"] >= target), None)
    last = curve[-1]
    seconds = last["train_seconds"]
    seeds = ({"seeds": len(row["seeds"]), "final_accuracy_each": row["final_accuracy_each"]}
             if "seeds" in row else {})
    return {**seeds, "reached": hit is not None,
            "seconds_to_target": hit["train_seconds"] if hit else None,
            "epoch_to_target": hit["epoch"] if hit else None,
            "best_accuracy": max(p["test_accuracy"] for p in curve),
            "final_accuracy": last["test_accuracy"], "train_seconds": seconds,
            "samples_per_s": last["samples"] / seconds if seconds > 0 else None}


def best_of(summaries: dict[str, dict]) -> dict:
    """Per side, the hook that reached the target in the fewest seconds (ties: the higher
    final accuracy), and ``torch_over_gradwire``: PyTorch's best seconds over gradwire's best
    (> 1: gradwire's best gets there sooner); None where a side reached nothing."""
    out: dict[str, str | float | None] = {}
    for side in ("gradwire", "torch"):
        reached = [(s["seconds_to_target"], -s["final_accuracy"], h)
                   for h, s in summaries.items() if h.startswith(side + ":") and s["reached"]]
        best = min(reached, default=None)
        out[side] = best[2] if best else None
        out[f"{side}_seconds"] = best[0] if best else None
    g, t = out["gradwire_seconds"], out["torch_seconds"]
    out["torch_over_gradwire"] = (t / g if g and t is not None else None)
    return out


def merge_seeds(rows: list[dict]) -> list[dict]:
    """One row per (model, hook): a hook trained from several seeds (``--seeds``) becomes the
    row of their mean curve, epoch by epoch (seconds, test accuracy and loss averaged), with
    ``seeds`` and each seed's ``final_accuracy_each``; a hook that failed from any seed is
    that seed's failed row. A hook trained once is its row as it is."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["hook"]), []).append(r)
    out = []
    for runs in groups.values():
        failed = [r for r in runs if r.get("error")]
        if len(runs) == 1 or failed:
            out.append(failed[0] if failed else runs[0])
            continue
        n = min(len(r["curve"]) for r in runs)
        curve = []
        for i in range(n):
            points = [r["curve"][i] for r in runs]
            losses = [p["test_loss"] for p in points]
            curve.append({"epoch": points[0]["epoch"], "samples": points[0]["samples"],
                          "train_seconds": statistics.fmean(p["train_seconds"] for p in points),
                          "test_accuracy": statistics.fmean(p["test_accuracy"] for p in points),
                          "test_loss": (None if None in losses else statistics.fmean(losses)),
                          "train_loss": None})
        out.append({**{k: v for k, v in runs[0].items() if k not in ("seed", "curve")},
                    "seeds": [r.get("seed") for r in runs], "curve": curve,
                    "final_accuracy_each": [r["curve"][n - 1]["test_accuracy"] for r in runs]})
    return out


def summarize(rows: list[dict], targets: dict[str, float]) -> dict[str, dict]:
    """Per model: every hook's :func:`summarize_row` (of its seeds' mean curve,
    :func:`merge_seeds`) and the :func:`best_of` them."""
    models: dict[str, dict] = {}
    for row in merge_seeds(rows):
        m = models.setdefault(row["model"], {"target": targets[row["model"]], "hooks": {}})
        m["hooks"][row["hook"]] = summarize_row(row, targets[row["model"]])
    for m in models.values():
        m["best"] = best_of(m["hooks"])
    return models


def _num(x: float | None, fmt: str) -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def markdown(doc: dict) -> str:
    """The results as a markdown table, one row per (model, hook), and each model's best."""
    summary = summarize(doc["rows"], {m: t["accuracy"] for m, t in doc["targets"].items()})
    rows = {(r["model"], r["hook"]): r for r in doc["rows"]}
    seeds = len(doc.get("seeds", [0]))
    mean = (f"; every figure the mean of {seeds} seeds' curves, epoch by epoch (the final "
            "accuracy's range over seeds in brackets)" if seeds > 1 else "")
    out = [f"# Time to accuracy, {doc['network']}, {doc['hosts']} ranks",
           "", f"{doc['date']}, commit {doc['commit']}, {doc['machine']}; {doc['contention']}"
           + mean, "",
           "| model | hook | buckets | seconds to target | final accuracy | samples/s |",
           "|---|---|---|---:|---:|---:|"]
    for model, m in summary.items():
        for hook, s in m["hooks"].items():
            if s.get("error"):
                when = f"failed: {s['error']}"
            elif s["reached"]:
                when = f"{s['seconds_to_target']:.1f} (epoch {s['epoch_to_target']})"
            else:
                when = f"not reached (best {s['best_accuracy']:.3f})"
            final = _num(s["final_accuracy"], ".3f")
            if s.get("final_accuracy_each"):
                each = s["final_accuracy_each"]
                final += f" ({min(each):.3f}–{max(each):.3f})"
            out.append(f"| {model} | {hook} | {rows[model, hook]['buckets']} | {when} | "
                       f"{final} | {_num(s['samples_per_s'], '.0f')} |")
    out += ["", "| model | target | best gradwire | s | best PyTorch | s | "
            "PyTorch s / gradwire s |", "|---|---:|---|---:|---|---:|---:|"]
    for model, m in summary.items():
        b = m["best"]
        out.append(f"| {model} | {m['target']:.3f} | {b['gradwire'] or 'none reached'} | "
                   f"{_num(b['gradwire_seconds'], '.1f')} | {b['torch'] or 'none reached'} | "
                   f"{_num(b['torch_seconds'], '.1f')} | "
                   f"{_num(b['torch_over_gradwire'], '.2f')} |")
    return "\n".join(out) + "\n"


def plot(doc: dict, path: Path) -> None:
    """Test accuracy against training seconds, one panel per model, one line per hook
    (gradwire's solid, PyTorch's dashed), the target a black dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gradwire.jsonfile import save_figure

    merged = merge_seeds(doc["rows"])
    models = list(dict.fromkeys(r["model"] for r in merged))
    hooks = list(dict.fromkeys(r["hook"] for r in merged))
    colours = plt.get_cmap("tab20")
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for r in merged:
            if r["model"] != model or r.get("error"):
                continue
            c = r["curve"]
            ax.plot([p["train_seconds"] for p in c], [p["test_accuracy"] for p in c],
                    "-" if r["side"] == "gradwire" else "--", marker=".", lw=1.2,
                    color=colours(hooks.index(r["hook"]) % 20), label=r["hook"])
        target = doc["targets"][model]["accuracy"]
        ax.axhline(target, color="k", ls="--", lw=1.5, label="target")
        top = max([target] + [p["test_accuracy"] for r in merged
                              if r["model"] == model and not r.get("error") for p in r["curve"]])
        ax.set(title=f"{model} (target {target:.2f})", xlabel="training seconds",
               ylabel="test accuracy", ylim=(0, min(1.0, top + 0.05)))
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:  # every hook once, even one that only some models ran
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8)
    fig.suptitle(f"Time to accuracy, {doc['network']}, {doc['hosts']} ranks")
    fig.tight_layout(rect=(0, 0.04 + 0.025 * math.ceil(len(labels) / 6), 1, 1))
    save_figure(fig, path, dpi=120)  # and closes it


def render(doc: dict, out: Path) -> None:
    """Write the .png and the .md beside the JSON ``out`` and print the table."""
    table = markdown(doc)
    out.with_suffix(".md").write_text(table)
    plot(doc, out.with_suffix(".png"))
    print(table, end="")
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}")


def contention(hosts: int) -> str:
    """The result's word on how the ranks share this machine's cores (those this process may
    run on): contended only where they outnumber them. It said "ranks share cores, so compute
    is contended" of any run, 2 ranks on 2 cores and 4 on 16 alike."""
    from gradwire.bench.sharing import usable_cores

    cores = usable_cores()
    if hosts > cores:
        return (f"{hosts} ranks on {cores} cores: ranks share cores, so compute is contended "
                "and CPU-heavy methods pay for it")
    return f"{hosts} ranks on {cores} cores: a core per rank, no CPU contention"


def fail(message: str) -> NoReturn:
    """Refuse a bad argument in one line (argparse's own errors also print the usage)."""
    print(f"time_to_accuracy.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


# --- the run --------------------------------------------------------------------------------
def main() -> None:
    from gradwire.jsonfile import out_file

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--loopback", action="store_true", help="unshaped loopback ranks")
    ap.add_argument("--models", default=",".join(HPARAMS), help="comma-separated")
    ap.add_argument("--hooks", default=None, help="comma-separated; default: every hook")
    ap.add_argument("--epochs", default=None, help="N for every model, or MODEL=N,...")
    ap.add_argument("--density", type=float, default=0.001, help="the sparsifiers' density")
    ap.add_argument("--seeds", type=int, default=1,
                    help="train every hook from this many seeds (initial weights, shard "
                         "order, hook seed; the same data split) and report their mean")
    ap.add_argument("--timeout", type=float, default=5400, help="seconds for the whole run")
    ap.add_argument("--out", type=out_file, default=OUT)
    ap.add_argument("--lr-warmup", action="store_true",
                    help="+warmup rows also ramp the learning rate from lr/P to lr, linearly, "
                         "over the warm-up's epochs (the gTop-k paper's 'small learning "
                         "rates' while the densities warm up)")
    ap.add_argument("--render-only", action="store_true",
                    help="rebuild the .png and .md from the JSON at --out")
    args = ap.parse_args()
    if args.render_only:
        if not args.out.is_file():
            fail(f"--render-only needs an existing JSON at --out, {args.out} is not one")
        render(json.loads(args.out.read_text()), args.out)
        return
    from gradwire.hooks import METHODS

    models = [m for m in args.models.split(",") if m]
    if not models or any(m not in HPARAMS for m in models):
        fail(f"--models takes {', '.join(HPARAMS)}, got {args.models!r}")
    if not 0 < args.density <= 1:
        fail(f"--density must be in (0, 1], got {args.density}")
    if args.hosts < 1:
        fail(f"--hosts must be >= 1, got {args.hosts}")
    if args.seeds < 1:
        fail(f"--seeds must be >= 1, got {args.seeds}")
    if not args.timeout > 0:
        fail(f"--timeout must be > 0 seconds, got {args.timeout}")
    try:
        names = args.hooks.split(",") if args.hooks else default_hooks()
        if len(set(names)) != len(names):
            raise ValueError(f"--hooks names a hook twice: {args.hooks!r}")
        hooks = [parse_hook(n, args.density, METHODS) for n in names]
        epochs = parse_epochs(args.epochs, models)
    except ValueError as e:
        fail(str(e))
    settings = {m: {**HPARAMS[m], "epochs": epochs[m]} for m in models}
    plan = {"seed": SEED, "seeds": list(range(SEED, SEED + args.seeds)),
            "models": [{"model": m, **settings[m]} for m in models],
            "hooks": hooks, "lr_warmup": args.lr_warmup}
    run(args, plan, settings)


def run(args: argparse.Namespace, plan: dict, settings: dict) -> None:
    from gradwire.bench import provenance
    from gradwire.cli.options import write_json
    from gradwire.cluster import ephemeral_cluster
    from gradwire.launcher import launch

    lines: list[str] = []

    def sink(line: str) -> None:
        lines.append(line)
        if "] ROW " in line:
            r = json.loads(line.partition("ROW ")[2])
            c = r["curve"][-1] if r.get("curve") else None
            print(f"{r['model']:<9} {r['hook']:<24} " + (
                f"failed: {r['error']}" if r.get("error") else
                f"{c['train_seconds']:7.1f} s  accuracy {c['test_accuracy']:.4f}  "
                f"({r['wall_seconds']:.1f} s with evaluation and set-up)"), flush=True)
        elif "Traceback" in line or "Error" in line:
            print(line, flush=True)

    env = {"TTA_PLAN": json.dumps(plan), "OMP_NUM_THREADS": "1"}
    with ephemeral_cluster(args.hosts, args.bandwidth, args.loopback) as c:
        res = launch(c, [sys.executable, str(HERE / "ranks" / "time_to_accuracy.py")],
                     timeout=args.timeout, sink=sink, extra_env=env)
        label = c.label
    rows = [json.loads(x.partition("ROW ")[2]) for x in lines if "] ROW " in x]
    doc = {**provenance.stamp(provenance.script_command()),
           "network": label, "hosts": args.hosts,
           "contention": contention(args.hosts),
           "environment": {k: v for k, v in os.environ.items() if k.startswith("GRADWIRE_")},
           "seed": SEED, "seeds": plan["seeds"], "density": args.density,
           "torch_start_powerSGD_iter": 2,
           "lr_warmup": args.lr_warmup,
           "clock": ("training only: per epoch the slowest rank's seconds from a barrier "
                     "to its last optimizer step; evaluation (rank 0, the whole test set, "
                     "after every epoch and before the first) with the clock stopped"),
           "notes": {"torch:bf16": "PyTorch's bf16_compress_hook called from a function "
                                   "of another name: DDP refuses its name without CUDA and "
                                   "NCCL 2.10",
                     "buckets": "one: DDP with bucket_cap_mb above the model's size (PyTorch's "
                                "PowerSGD hook deadlocks or aborts on gloo with several "
                                "buckets in flight); default: DDP's own bucket sizes",
                     "ddp": "gradient_as_bucket_view=True for every row, as gradwire's "
                            "trainer builds it"},
           "settings": settings,
           "targets": {m: {"accuracy": TARGETS[m][0], "chosen": TARGETS[m][1]}
                       for m in settings},
           "hooks": [h["hook"] for h in plan["hooks"]], "rows": rows}
    doc["summary"] = summarize(rows, {m: t["accuracy"] for m, t in doc["targets"].items()})
    if res.returncode != 0:
        partial = args.out.with_suffix(".partial.json")
        write_json(partial, {**doc, "incomplete": res.message})
        sys.exit("\n".join(lines[-30:] + [res.message, f"rows so far: {partial}"]))
    write_json(args.out, doc)
    render(doc, args.out)


if __name__ == "__main__":
    main()
