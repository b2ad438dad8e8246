"""``gradwire bench``: run the rank program on a cluster, then report nccl-tests columns."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence

from rich.console import Console

from gradwire.bandwidth import format_bandwidth
from gradwire.bench import calibrate, provenance
from gradwire.bench.report import annotate, footer, table
from gradwire.bench.sharing import usable_cores
from gradwire.bench.spec import BACKENDS, BUILTIN, REDUCING, AlgoSpec, measured_sizes, pairs
from gradwire.cluster import Cluster
from gradwire.cluster.netns import machine_send_buffer
from gradwire.config import DEFAULT_ALPHA_S
from gradwire.errors import GradwireError
from gradwire.interrupts import Interrupted
from gradwire.jobs import run_ranks
from gradwire.schedules import registry
from gradwire.schedules.cost import CostParams

# the rate the nominal model assumes for links not shaped (loopback, --bandwidth none)
UNSHAPED_BPS = 10e9


def model_params(cluster: Cluster, device: str = "cpu") -> tuple[CostParams, str]:
    """Calibrated α, β, γ for this cluster's links and ``device``'s kind (a GPU's calibration
    ran over NCCL, whose α and γ are not gloo's on the CPU), or nominal ones (and which it
    was)."""
    key = cluster.link_key
    found = calibrate.load(key)
    path = calibrate.calibration_path(key)
    why = "run gradwire calibrate"
    if found and (found[1]["device"] == "cpu") == (device == "cpu"):
        return found[0], f"calibrated {found[1]['date']} ({path})"
    if found:
        why = f"the calibration at {path} was taken on {found[1]['device']}"
    bps = cluster.bandwidth_bps or UNSHAPED_BPS
    rate = ("link rate" if cluster.bandwidth_bps else
            f"{format_bandwidth(bps)} assumed (links not shaped)")
    return (CostParams.for_link(bps, DEFAULT_ALPHA_S),
            f"nominal: α={DEFAULT_ALPHA_S * 1e6:g} us, {rate}, γ=0 ({why})")


# what the table and the model read of a row
ROW_KEYS = {"collective", "algo", "name", "params", "count", "bytes", "type", "time_s", "wrong"}


def _rows(lines: list[str]) -> list[dict]:
    """The rows rank 0 reported (``GW_BENCH`` lines' JSON) up to the first that does not
    read as one."""
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            break
        if not (isinstance(row, dict) and ROW_KEYS <= row.keys()):
            break
        rows.append(row)
    return rows


def run_bench(cluster: Cluster, collective: str, specs: list[AlgoSpec], sizes: list[int],
              dtypes: list[str], iters: int, warmup: int, params: dict, builtin: bool,
              timeout: float, console: Console, interleave: bool = False,
              ops: Sequence[str] = ("sum",), device: str = "cpu", batch: int = 1) -> dict:
    """Time ``specs`` (plus the built-in baseline) at every size (bytes, each rounded to whole
    elements of each dtype, :func:`measured_sizes`) of every (dtype, op) of ``dtypes`` ×
    ``ops`` (:func:`pairs`); rows with the prediction."""
    cost_params, source = model_params(cluster, device)
    # LP and the double tree choose their block from α and β: give them the calibrated ones,
    # and the double tree the hosts' TCP send-buffer ceiling, which caps its block.
    # --param values go to every algorithm that takes them (check_shared refused the others).
    sndbuf = cluster.send_buffer_bytes or machine_send_buffer()
    algo_params = {"alpha": cost_params.alpha, "beta": cost_params.beta, "sndbuf": sndbuf,
                   **params}

    def taken(s: AlgoSpec) -> dict:
        if s.name == BUILTIN:  # torch.distributed's own: no parameters
            return {}
        known = registry.parameters(registry.get(collective, s.name))
        return {**{k: v for k, v in algo_params.items() if k in known}, **s.params}

    listed = any(s.name == BUILTIN for s in specs)  # --algo ...,builtin: where it was put
    runs = ([AlgoSpec(BUILTIN, BUILTIN)] if builtin and not listed else []) + [
        AlgoSpec(s.label, s.name, taken(s)) for s in specs]
    args = ["--collective", collective, "--algos", json.dumps([r.to_json() for r in runs]),
            "--sizes", ",".join(map(str, sizes)), "--dtype", ",".join(dtypes),
            "--iters", str(iters), "--warmup", str(warmup), "--batch", str(batch),
            "--op", ",".join(ops), "--device", device, *(["--interleave"] if interleave else [])]
    p = len(cluster.hosts)
    reducing = collective in REDUCING
    kept, unaveraged = pairs(dtypes, list(ops))
    named_ops = f" ({', '.join(dict.fromkeys(o for _, o in kept))})" if reducing else ""
    title = (f"{collective}{named_ops}, {p} ranks"
             f"{' (NCCL, CUDA buffers)' if device == 'cuda' else ''}, {cluster.label}; "
             f"model: {source}")
    measured: list[str] = []
    total = len(runs) * sum(len(measured_sizes(sizes, d, p, collective)) for d, _ in kept)
    try:
        rows = run_ranks(cluster, "gradwire.bench.rank", args, f"bench {collective}", timeout,
                         console, total=total, tick="GW_BENCH ", ticked=measured)
    except (GradwireError, Interrupted) as e:
        # as nccl-tests prints each row when it is measured: the rows before the failure or
        # the Ctrl-C (the ranks are stopped by now; the cluster goes after this)
        done = _rows(measured)
        if done:
            why = "interrupt" if isinstance(e, Interrupted) else "failure"
            annotate(done, p, cost_params)
            # a second Ctrl-C cuts the table short, not the first one's line ("stopped N
            # ranks") or the failure's, which the command still ends with
            with contextlib.suppress(KeyboardInterrupt, Interrupted):
                console.print(table(done, f"{title} (the {len(done)} of {total} rows "
                                          f"measured before the {why})"))
        raise
    annotate(rows, p, cost_params)
    console.print(table(rows, title))
    for line in footer(rows):
        console.print(line, highlight=False)
    cores = usable_cores()
    if p > cores:  # every rank of an emulated or loopback cluster runs on this machine
        console.print(f"note: {p} ranks share {cores} cores; CPU contention affects these "
                      "times")
    return {
        "collective": collective, "dtypes": dtypes, "ops": list(ops) if reducing else None,
        # the (dtype, op) pairs of dtypes × ops not run: an integer is not averaged
        "skipped": [[d, "avg"] for d in unaveraged],
        "world_size": p, "network": cluster.label,
        "device": device, "backend": BACKENDS[device],
        **provenance.stamp(device=device),
        "model": {"alpha_s": cost_params.alpha, "beta_s_per_byte": cost_params.beta,
                  "gamma_s_per_byte": cost_params.gamma, "burst_bytes": cost_params.burst,
                  "source": source},
        "algo_params": algo_params, "iters": iters, "batch": batch, "warmup": warmup,
        "interleaved": interleave, "rows": rows,
    }
