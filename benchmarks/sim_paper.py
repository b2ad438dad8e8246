"""The network-operator paper's evaluation, simulated: Tables 4 and 6 (speed-ups over PS at 32
workers, 25 Gbps) for Inception-v3, VGG-16, ResNet-101 and ResNet-200 beside the paper's own
numbers, the ranking of mechanisms per model, Tables 8, 9 and 10, and sweeps (bandwidth,
workers, compute speed-up, added layers) as PNG plots.

Traces: built-in profiles (exact tensor sizes) with the paper's Table 3 compute
(gradwire.sim.paper). Three iterations per run, one recorded iteration (no compute variance).

    flock /tmp/gradwire-bench.lock python benchmarks/sim_paper.py   # results/sim_paper/latest.json
                                                                    # and latest_*.png beside it
    python benchmarks/sim_paper.py --quick --out /tmp/p.json        # tables only
    python benchmarks/sim_paper.py --alpha-us 0 --latency-us 0      # the ideal network

Hosts pay the simulator's default α and latency (``gradwire simulate``'s) unless given.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

from gradwire.bench import provenance
from gradwire.cli.options import write_json
from gradwire.jsonfile import out_file
from gradwire.sim import mechanisms, report
from gradwire.sim.cluster import DEFAULT_ALPHA_S, DEFAULT_LATENCY_S, SimCluster
from gradwire.sim.paper import PAPER_SPEEDUPS, TABLE3, paper_trace

HERE = Path(__file__).parent
OUT = HERE / "results" / "sim_paper" / "latest.json"
RANKED = ("ring", "multicast+ina", "butterfly", "multicast", "ina")  # the paper's §8.7 order


def ranking(speedups: dict[str, float]) -> list[str]:
    return sorted(RANKED, key=lambda m: -speedups[m])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default=OUT)
    ap.add_argument("--quick", action="store_true", help="tables 4 and 6 only")
    ap.add_argument("--alpha-us", type=float, default=DEFAULT_ALPHA_S * 1e6,
                    help="per-message host cost, µs (default: the simulator's)")
    ap.add_argument("--latency-us", type=float, default=DEFAULT_LATENCY_S * 1e6,
                    help="one-way latency per host, µs (default: the simulator's)")
    a = ap.parse_args(argv)
    console = Console(width=150)
    traces = {m: paper_trace(m) for m in TABLE3}
    c32 = SimCluster(32, 25e9, iterations=3, alpha=a.alpha_us * 1e-6,
                     latency=a.latency_us * 1e-6)
    out: dict = {**provenance.stamp(provenance.script_command()),
                 "conditions": {"loadavg_start": os.getloadavg()},
                 "alpha_s": c32.alpha, "latency_s": c32.latency,
                 "traces": {m: t.source for m, t in traces.items()}}
    rows = []
    for name, t in traces.items():
        res = mechanisms.run(t, c32, mechanisms.parse_list(",".join(mechanisms.PAPER)))
        sp = report.speedups(res)
        rows.append({"model": name, "iteration_s": {r.mechanism: r.iteration_s for r in res},
                     "exposed_s": {r.mechanism: r.exposed_s for r in res},
                     "speedup": sp, "paper_speedup": PAPER_SPEEDUPS[name],
                     "ranking": ranking(sp), "paper_ranking": ranking(PAPER_SPEEDUPS[name]),
                     "wall_s": {r.mechanism: r.wall_s for r in res}})
        console.print(report.results_table(res, f"{name}: 32 workers, 25 Gbit/s"))
        console.print(f"  ranking sim   {' > '.join(rows[-1]['ranking'])}")
        console.print(f"  ranking paper {' > '.join(rows[-1]['paper_ranking'])}")
    out["tables_4_6"] = rows
    if not a.quick:
        for number in (8, 9, 10):
            table, trows = report.paper_table(number, list(traces.values()), c32)
            console.print(table)
            out[f"table_{number}"] = trows
        mechs = mechanisms.parse_list("ps,multicast+ina,ring,butterfly")
        sweeps = {}
        for model, axis, values in [
            ("inception-v3", "bandwidth", [1e9, 10e9, 25e9, 40e9, 100e9]),
            ("resnet200", "bandwidth", [1e9, 10e9, 25e9, 40e9, 100e9]),
            ("vgg16", "bandwidth", [1e9, 10e9, 25e9, 40e9, 100e9]),
            ("vgg16", "workers", [4, 8, 16, 32]),
            ("resnet200", "workers", [4, 8, 16, 32]),
            ("inception-v3", "speedup", [1, 1.5, 2, 2.5, 3]),
            ("resnet200", "speedup", [1, 1.5, 2, 2.5, 3]),
            ("inception-v3", "layers", [0, 25, 50, 125]),
        ]:
            srows = report.sweep(traces[model], c32, mechs, axis, values)
            png = a.out.with_name(f"{a.out.stem}_{model}_{axis}.png")
            report.plot_sweep(srows, png, f"{model}, 32 workers, 25 Gbit/s unless swept")
            sweeps[f"{model}/{axis}"] = srows
            console.print(f"wrote {png}")
        out["sweeps"] = sweeps
    out["conditions"]["loadavg_end"] = os.getloadavg()
    write_json(a.out, out)


if __name__ == "__main__":
    main()
