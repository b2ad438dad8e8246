"""The ranks' allocator setting (``launcher.MALLOC_TUNABLES``) against glibc's defaults.

The launcher gives every rank ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (malloc asks for
transparent huge pages, so a fresh gradient-sized buffer faults in 2 MiB pages instead of
4 KiB ones) unless the caller set it; ``GLIBC_TUNABLES=`` (empty) keeps glibc's defaults. Two
parts, each alternating the two settings (defaults first, then ours, per round):

1. one thread, 25.6 M fp32 (a ResNet-50 gradient): ``x.abs()`` into a fresh tensor and into
   an existing one, and ``torch.rand`` — 7 calls each (the first pays for the huge pages),
   median, in a fresh process per setting;
2. ``gradwire train`` on the demo's settings (4 emulated hosts, 1 Gbit/s, the MLP, whole-model
   mode, density 0.001), ``--epochs`` each, for every ``--agg``: samples/s and the
   per-iteration breakdown. Training is deterministic: both settings must end with the same
   accuracy.

    python benchmarks/malloc_ab.py        # ~10 min; needs root (namespaces)

Writes benchmarks/results/malloc_ab/latest.json.
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

from gradwire import catalogue
from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file
from gradwire.launcher import MALLOC_TUNABLES

HERE = Path(__file__).parent
OUT = HERE / "results" / "malloc_ab" / "latest.json"
SETTINGS = {"glibc defaults": "", "gradwire's": MALLOC_TUNABLES}

MICRO = """
import json, statistics, time, torch
torch.set_num_threads(1)
n = 25_600_000
x, out = torch.randn(n), torch.empty(n)
def ms(f):
    times = []
    for _ in range(7):
        t0 = time.perf_counter(); f(); times.append((time.perf_counter() - t0) * 1e3)
    return {"median": statistics.median(times), "each": times}
print(json.dumps({"abs_fresh_ms": ms(lambda: x.abs()),
                  "abs_into_existing_ms": ms(lambda: torch.abs(x, out=out)),
                  "rand_ms": ms(lambda: torch.rand(n))}))
"""


def env_with(tunables: str) -> dict[str, str]:
    return {**os.environ, "GLIBC_TUNABLES": tunables}


def micro(tunables: str) -> dict:
    p = subprocess.run([sys.executable, "-c", MICRO], env=env_with(tunables),
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def train(tunables: str, agg: str, epochs: int, home: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        sparse = ["--density", "0.001"] if catalogue.get(agg).takes_density else []
        cmd = [sys.executable, "-m", "gradwire.cli", "train", "--model", "mlp", "--agg", agg,
               *sparse, "--mode", "model", "--epochs", str(epochs),
               "--batch-size", "8", "--hosts", "4", "--bandwidth", "1gbit", "--json", f.name]
        p = subprocess.run(cmd, env={**env_with(tunables), "GRADWIRE_HOME": home},
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{shlex.join(cmd)} failed: {p.stderr[-500:]}")
        r = json.loads(Path(f.name).read_text())
    return {"samples_per_s": r["samples_per_s"], "seconds_per_iter": r["seconds_per_iter"],
            "cpu_s_per_iter": r["cpu_s_per_iter"], "test_accuracy": r["test_accuracy"][-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agg", default="gtopk,dense,qsgd")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--out", type=out_file, default=OUT)
    a = ap.parse_args()
    doc = {**provenance.stamp(provenance.script_command()),
           "load_average_before": os.getloadavg(),
           "settings": SETTINGS, "order": "per round: glibc defaults, then gradwire's",
           "micro": {k: [] for k in SETTINGS}, "train": {}}
    for _ in range(a.rounds):
        for name, tun in SETTINGS.items():
            doc["micro"][name].append(micro(tun))
    home = tempfile.mkdtemp(prefix="gradwire-malloc-")
    for agg in a.agg.split(","):
        runs: dict[str, list[dict]] = {k: [] for k in SETTINGS}
        for i in range(a.rounds):
            for name, tun in SETTINGS.items():
                runs[name].append(train(tun, agg, a.epochs, home))
                print(f"{agg} round {i + 1} {name}: {runs[name][-1]['samples_per_s']:.0f} "
                      "samples/s", flush=True)
        med = {k: statistics.median(r["samples_per_s"] for r in v) for k, v in runs.items()}
        doc["train"][agg] = {
            "runs": runs, "median_samples_per_s": med,
            "ratio_of_medians": med["gradwire's"] / med["glibc defaults"],
            "per_round_ratio": [b["samples_per_s"] / a_["samples_per_s"] for a_, b in
                                zip(runs["glibc defaults"], runs["gradwire's"], strict=True)],
            "same_accuracy": len({r["test_accuracy"] for v in runs.values() for r in v}) == 1}
    doc["load_average_after"] = os.getloadavg()
    write_json(a.out, doc)
    for name, ms in doc["micro"].items():
        print(name, {k: round(statistics.median(m[k]["median"] for m in ms), 1) for k in ms[0]})
    for agg, d in doc["train"].items():
        print(f"{agg}: {d['ratio_of_medians']:.3f}x samples/s "
              f"(per round {', '.join(f'{x:.2f}' for x in d['per_round_ratio'])}), "
              f"same accuracy: {d['same_accuracy']}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
