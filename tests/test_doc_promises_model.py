"""Promises docs/performance-model.md and docs/simulator.md make to a user that no other test
held: the reference settings' terms, dense's ring and the §5 answers as the documented
formulas (β = 8 / --bandwidth, a calibration's β not used), the collectives each method makes,
the built-in profiles' table, codec times priced unchanged, the records whatif's and advise's
--json write, what the CLI leaves at 0 (stragglers, token buckets), a calibration's cores per
node; and of the simulator: its outputs (steady iteration, speed-up, exposed time, title, the
result file), the default host costs' 13 µs a ring step, a parameter server's stream paying
max(α, transfer) a message, --calibration's α with no latency, the trace reader's documented
error, its bounds, and `trace --compute-speedup`.

Where a formula is documented, it is computed here from the doc and compared with what the
command printed or wrote, not with the code that computes it."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import calibration_doc
import pytest
import torch
from conftest import ROOT, cli_error, one_line_cli_error, run_cli

from gradwire import catalogue, profiles
from gradwire.errors import GradwireError
from gradwire.perf import codecs, comm, scenario
from gradwire.perf.model import Aggregation, operations
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.mechanisms import parse
from gradwire.sim.ps import PSOptions, simulate_ps

R50 = profiles.load("resnet50")
N50 = R50.numel  # 25,557,032: a multiple of 8, so a ring's blocks are equal at P = 4 and 8


@pytest.fixture
def wide(monkeypatch):
    """The console prints a line as one line (the inputs note, the tables' rows)."""
    from gradwire.cli import options

    monkeypatch.setattr(options.console, "width", 1000)


def _json(monkeypatch, capsys, tmp_path, args: list[str], name: str = "out.json"
          ) -> tuple[dict, str]:
    """(what ``gradwire ARGS --json FILE`` wrote, what it printed)."""
    path = tmp_path / name
    code, out, err = run_cli(monkeypatch, capsys, [*args, "--json", str(path)])
    assert code == 0, err
    return json.loads(path.read_text()), out


def _ring(p: int, n: int, alpha: float, beta, gamma: float, item: int = 4):
    """A ring allreduce of n elements, as the cost model counts it: 2(P − 1) steps of α, each
    rank sending 2(P − 1)/P of the bytes and reducing (P − 1)/P of them."""
    nbytes = n * item
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta + (p - 1) / p * nbytes * gamma


# ---- docs/performance-model.md: the reference settings

# name: (α s, γ s/B as the doc's table gives it, its significant digits' tolerance)
REFERENCE_TABLE = {"v100": (50e-6, 0.0033e-9, 0.02), "h100": (50e-6, 0.00115e-9, 0.005)}


@pytest.mark.parametrize("name", sorted(REFERENCE_TABLE))
def test_a_reference_setting_has_the_terms_of_the_doc_s_table(
        monkeypatch, capsys, tmp_path, wide, name):
    """performance-model.md: "| `v100` | V100, Ethernet, NCCL ring: ... | 50 µs | 0.0033 ns/B
    | the paper's Table 2 | after backward |", "| `h100` | ... | 50 µs | 0.00115 ns/B | measured
    on an H100 | after backward |"; without a calibration, point 9's executor α is "α",
    point 10's compute slowdown "1" and point 11's half-precision γ "γ"."""
    alpha, gamma, tol = REFERENCE_TABLE[name]
    rec, out = _json(monkeypatch, capsys, tmp_path, [
        "advise", "--model", "resnet50", "--workers", "8", "--agg", "dense,fp16,topk",
        "--reference", name])
    assert rec["reference"] == name and rec["calibration"] is None
    assert rec["alpha_s"] == pytest.approx(alpha, rel=1e-12)
    assert rec["gamma_s_per_byte"] == pytest.approx(gamma, rel=tol)
    assert rec["codec_table"] == name
    assert rec["coding_slowdown"] == 1.0  # coding after backward: it shares the device
    assert "coding after backward" in out
    assert rec["alpha_transport_s"] is None  # point 9: without a calibration, α
    assert rec["compute_slowdown"] == 1.0  # point 10
    assert rec["gamma_dtype_s_per_byte"] == {}  # point 11: every dtype at γ


# ---- docs/performance-model.md: point 3 and point 4, dense in one bucket


def test_dense_in_one_bucket_is_compute_and_the_documented_ring_at_beta_8_over_the_rate(
        monkeypatch, capsys, tmp_path):
    """performance-model.md, point 3: "α, β = 8 / `--bandwidth` ..., γ"; "dense | ring
    allreduce of 4n bytes"; point 4, "the iteration and the scaling efficiency (the gTop-k
    paper's Eq. 4)"; and the §5 budget, "the predicted dense time minus the compute time".
    With `--mode model` the one bucket is ready when backward ends (point 1 in model.py, which
    the guide refers to: "Bucket b is ready when backward has produced its last tensor"), so
    the iteration is t_f + t_b + ring + t_step ("single-bucket dense = compute + ring cost", as
    "Held by tests" says)."""
    alpha_us, gamma_ns = 120.0, 0.25
    rec, _ = _json(monkeypatch, capsys, tmp_path, [
        "whatif", "--model", "resnet50", "--workers", "4,8", "--bandwidth", "1gbit,10gbit",
        "--agg", "dense", "--mode", "model", "--alpha-us", str(alpha_us), "--gamma-ns",
        str(gamma_ns)])
    f, b, s = R50.forward_s, R50.backward_s, R50.step_s
    rates = {"1gbit": 1e9, "10gbit": 1e10}
    assert len(rec["rows"]) == 4
    for row in rec["rows"]:
        p, bps = row["workers"], rates[row["bandwidth"]]
        ring = _ring(p, N50, alpha_us * 1e-6, 8 / bps, gamma_ns * 1e-9)
        it = f + b + ring + s
        assert row["communicate_s"] == pytest.approx(ring, rel=1e-9), row
        assert row["iteration_s"] == pytest.approx(it, rel=1e-9), row
        assert row["efficiency"] == pytest.approx((f + b) / it, rel=1e-9), row
        assert row["exposed_s"] == pytest.approx(it - f - b - s, rel=1e-9, abs=1e-12), row
        assert row["coding_s"] == 0 and row["wire_bytes"] == 4 * N50
        answer = next(a for a in rec["answers"]
                      if (a["workers"], a["bandwidth"]) == (p, row["bandwidth"]))
        assert answer["coding_budget_s"] == pytest.approx(it - (f + b + s), rel=1e-9, abs=1e-12)


def test_a_calibration_s_measured_beta_is_not_the_link_rate_asked(monkeypatch, capsys, tmp_path):
    """performance-model.md, point 3: β = 8 / `--bandwidth` "(the link rate asked about; only
    the validation benchmark uses the calibration's measured β)"; α and γ are the
    calibration's."""
    cal = calibration_doc.doc(cpu=None, beta_s_per_byte=8.4e-9, alpha_s=3e-4,
                              gamma_s_per_byte=2e-10)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    for rate, bps in (("10gbit", 1e10), ("100mbit", 1e8)):
        rec, _ = _json(monkeypatch, capsys, tmp_path, [
            "advise", "--model", "resnet50", "--workers", "4", "--bandwidth", rate, "--agg",
            "dense", "--mode", "model", "--calibration", str(path)])
        [row] = rec["ranked"]
        want = _ring(4, N50, 3e-4, 8 / bps, 2e-10)
        assert row["communicate_s"] == pytest.approx(want, rel=1e-9), rate


# ---- docs/performance-model.md: §5, required compression


@pytest.mark.parametrize("kappa,speedup", [(1.0, 1.0), (1.5, 2.0)])
def test_required_compression_is_the_documented_ratio(monkeypatch, capsys, tmp_path, kappa,
                                                      speedup):
    """performance-model.md: "the ring's time is A + B·bytes (A, the α part, and B read from
    its schedule summary), so c = B·bytes/(t_b − A), t_b the backward the model's prediction
    lets communication hide behind: the profile's times the calibration's compute slowdown,
    over the compute speedup, times κ"."""
    rec, _ = _json(monkeypatch, capsys, tmp_path, [
        "whatif", "--model", "resnet50", "--workers", "4,8,32", "--bandwidth", "1gbit,10gbit",
        "--agg", "dense", "--overlap-slowdown", str(kappa), "--compute-speedup", str(speedup)])
    alpha, gamma = 50e-6, 12 / 4 / 900e9  # the v100 setting's (the test above holds them)
    t_b = R50.backward_s * kappa / speedup
    rates = {"1gbit": 1e9, "10gbit": 1e10}
    assert len(rec["answers"]) == 6
    for a in rec["answers"]:
        p, bps = a["workers"], rates[a["bandwidth"]]
        big_a = 2 * (p - 1) * alpha
        b_bytes = _ring(p, N50, 0.0, 8 / bps, gamma)
        want = max(1.0, b_bytes / (t_b - big_a))
        assert a["required_compression"] == pytest.approx(want, rel=1e-9), a


# ---- docs/performance-model.md: point 3's table of collectives


def _wire(method: str, n: int, density: float) -> int:
    return catalogue.get(method).make_compressor(density).wire_bytes(n, torch.float32)


@pytest.mark.parametrize("p", [4, 6])
def test_each_method_makes_the_collectives_of_the_doc_s_table(p):
    """performance-model.md, point 3: "dense | ring allreduce of 4n bytes"; "fp16, bf16,
    randomk | ring allreduce of `wire_bytes(n)`"; "topk | ... an allgather of P·k packed
    entries (recursive doubling; Bruck where P is not a power of two)"; "gtopk | ... butterfly
    allreduce of k entries with the ⊤ merge"; "int8 | one ring allreduce of n + 8⌈n/1024⌉ + 2
    int8"; "signsgd, efsignsgd, qsgd, terngrad, dgc | ring allgather of P·`wire_bytes(n)`"."""
    n, density = 100_000, 0.01
    k = 1000  # select_count(n, density)

    def calls(method: str) -> list[tuple[str, str, int]]:
        ops = operations(Aggregation(method, density=density), n, p)[0]
        return [(c, a, count * item) for c, a, count, item, _ in ops]

    assert calls("dense") == [("allreduce", "ring", 4 * n)]
    for method in ("fp16", "bf16", "randomk"):
        assert calls(method) == [("allreduce", "ring", _wire(method, n, density))], method
    assert calls("int8") == [("allreduce", "ring", n + 8 * math.ceil(n / 1024) + 2)]
    for method in ("signsgd", "efsignsgd", "qsgd", "terngrad", "dgc"):
        assert calls(method) == [("allgather", "ring", p * _wire(method, n, density))], method
    [(c, algo, nbytes)] = calls("topk")
    assert (c, algo) == ("allgather", "rd" if p & (p - 1) == 0 else "bruck")
    # k packed entries (value and index) per rank, and the NaN/Inf status that travels with them
    assert nbytes % p == 0 and nbytes // p - 8 * k in (0, 1)
    [(c, algo, nbytes)] = calls("gtopk")
    ops = operations(Aggregation("gtopk", density=density), n, p)[0]
    assert (c, algo, ops[0][4].get("op")) == ("allreduce", "rd", "gtopk")
    assert nbytes - 8 * k in (0, 1)


def test_powersgd_sends_every_weight_s_p_then_every_q():
    """performance-model.md, point 3: "powersgd | two ring allreduces, fp32: the 1-D tensors,
    every weight's P (rows·r) and the NaN/Inf status (one element), then every Q (cols·r);
    each weight of the profile's shapes its own matrix, dense when none gains"."""
    r = 4
    shapes = ((64, 100), (100,), (32, 8, 4), (300,))
    n = sum(math.prod(s) for s in shapes)
    ops = operations(Aggregation("powersgd", rank=r), n, 4, shapes=shapes)[0]
    first = 100 + 300 + 64 * r + 32 * r + 1
    second = 100 * r + (8 * 4) * r
    assert [(c, a, count, item) for c, a, count, item, _ in ops] == [
        ("allreduce", "ring", first, 4), ("allreduce", "ring", second, 4)]
    # no weight gains (a rank-4 pair of a 4×4 matrix is twice its size): the bucket goes dense
    small = ((4, 4), (4, 4), (16,))
    ops = operations(Aggregation("powersgd", rank=r), 48, 4, shapes=small)[0]
    assert [(c, a, count, item) for c, a, count, item, _ in ops] == [
        ("allreduce", "ring", 48, 4)]


# ---- docs/performance-model.md: Costing large P fast


def test_summaries_are_reused_from_lcm_of_p_and_its_power_of_two_times_the_blocks():
    """performance-model.md: "Messages of lcm(P, 2^⌈lg P⌉) elements (times the pipeline's
    block count, for a pipelined schedule) or more reuse the summary at that count"."""
    for p in range(1, 130):
        power = 2 ** math.ceil(math.log2(p))
        assert comm.ref_count(p) == math.lcm(p, power), p
        assert comm.ref_count(p, 3) == 3 * math.lcm(p, power), p


# ---- docs/performance-model.md: the built-in profiles' table


def _profile_table() -> dict[str, tuple[int, int, tuple[float, float] | None]]:
    """The doc's table of built-in profiles: name → (parameters, tensors, (forward, backward)
    in seconds, or None for "—")."""
    text = (ROOT / "docs" / "performance-model.md").read_text()
    rows = {}
    for m in re.finditer(r"^\| (\S+) \| ([\d,]+)[^|]*\| (\d+) \| ([^|]+) \|", text, re.M):
        name, params, tensors, times = m.groups()
        t = re.match(r"\s*([\d.]+) / ([\d.]+) ms", times)
        rows[name] = (int(params.replace(",", "")), int(tensors),
                      (float(t.group(1)) / 1e3, float(t.group(2)) / 1e3) if t else None)
    return rows


def test_the_built_in_profiles_are_the_doc_s_table():
    """performance-model.md, "Built-in profiles": every row's parameters, tensors and forward
    / backward ms ("—": none in the papers), e.g. "| resnet50 | 25,557,032 | 161 | 61 / 122 ms
    (batch 64, V100) | backward: compression-utility Table 2 caption; forward **assumed** half
    of it |"."""
    table = _profile_table()
    assert sorted(table) == profiles.builtin_names()
    for name, (numel, tensors, times) in table.items():
        p = profiles.load(name)
        assert (p.numel, len(p.params)) == (numel, tensors), name
        if times is None:
            assert (p.forward_s, p.backward_s) == (None, None), name
        else:
            assert (p.forward_s, p.backward_s) == pytest.approx(times, rel=1e-9), name
    r50 = profiles.load("resnet50")
    assert r50.batch_size == 64 and "assumed" in r50.sources["forward_s"]
    assert profiles.load("inception-v3").batch_size == 32


# ---- docs/performance-model.md: encode/decode tables


@pytest.mark.parametrize("command", ["advise", "whatif"])
def test_sparsifiers_timed_at_another_density_are_priced_unchanged_and_said(
        monkeypatch, capsys, tmp_path, wide, command):
    """performance-model.md: "The model prices a method at the `--density` ... asked with those
    times unchanged (it does not scale them), and where the two differ, whatif and advise add
    a line to their inputs note, e.g. `topk's encode/decode times were measured at density
    0.01; priced here at 0.001 unchanged` (the `v100` table's sparsifiers were timed at
    density 0.01, the `h100` table's random-k too)"."""
    args = [command, "--model", "resnet50", "--workers", "8", "--bandwidth", "10gbit"]
    coding = {}
    for density in ("0.001", "0.01"):
        rec, out = _json(monkeypatch, capsys, tmp_path, [*args, "--agg", "topk,gtopk",
                                                         "--density", density])
        rows = rec["ranked"] if command == "advise" else rec["rows"]
        coding[density] = {r["method"]: r["coding_s"] for r in rows}
        if density == "0.001":
            for m in ("topk", "gtopk"):
                line = (f"{m}'s encode/decode times were measured at density 0.01; priced "
                        f"here at 0.001 unchanged")
                assert out.splitlines().count(line) == 1, out
        else:
            assert "measured at" not in out
    assert coding["0.001"] == coding["0.01"]
    assert coding["0.01"]["topk"] > 0
    rec, out = _json(monkeypatch, capsys, tmp_path, [*args, "--agg", "randomk,topk,dgc",
                                                     "--codecs", "h100"])
    assert [a["method"] for a in rec["codec_params_apart"]] == ["randomk"]
    assert ("randomk's encode/decode times were measured at density 0.01; priced here at "
            "0.001 unchanged") in out


@pytest.mark.parametrize("table", ["v100", "h100"])
def test_the_built_in_tables_pay_one_sparse_decode_whatever_p(monkeypatch, capsys, tmp_path,
                                                              table):
    """performance-model.md: "`decode_rank_s`, paid P times ... and `merge_s`, paid ⌈lg P⌉
    times ... The built-in tables have neither, so there Top-k and gTop-k pay one decode
    whatever P is"."""
    t = codecs.load(table)
    for m in ("topk", "gtopk"):
        assert not {"decode_rank_s", "merge_s"} & set(t.methods[m]), m
    rec, _ = _json(monkeypatch, capsys, tmp_path, [
        "whatif", "--model", "resnet50", "--workers", "2,8,64,1024", "--bandwidth", "10gbit",
        "--agg", "topk,gtopk", "--codecs", table])
    for m in ("topk", "gtopk"):
        seen = {r["coding_s"] for r in rec["rows"] if r["method"] == m}
        assert len(seen) == 1, (m, seen)


def test_whatif_leaves_out_a_method_its_codec_table_lacks_and_says_so(
        monkeypatch, capsys, tmp_path, wide):
    """performance-model.md: `--codecs v100`: "methods it lacks are left out, and said so, by
    whatif and advise"; "A (scheme, workers) point the model refuses (..., a method the codec
    table lacks) is left out of the tables and the plot, and said in one line per scheme and
    reason"."""
    rec, out = _json(monkeypatch, capsys, tmp_path, [
        "whatif", "--model", "resnet50", "--workers", "4,8", "--bandwidth", "1gbit",
        "--agg", "dense,qsgd", "--codecs", "v100"])
    assert {r["method"] for r in rec["rows"]} == {"dense"}
    [entry] = rec["not_predicted"]
    assert entry["agg"] == "qsgd" and entry["workers"] == [4, 8]
    assert "codec table 'v100'" in entry["reason"]
    said = [line for line in out.splitlines() if line.startswith("not predicted:")]
    assert len(said) == 1 and said[0].startswith("not predicted: qsgd at every worker count "
                                                 "asked (4 to 8): ")


# ---- docs/performance-model.md: what --json records

# "the inputs: ..." of advise's --json, as the doc lists them
ADVISE_INPUTS = {"model", "parameters", "workers", "bandwidth", "compute_speedup", "aggs",
                 "density", "rank", "mode", "bucket_mb", "calibration", "reference", "alpha_s",
                 "alpha_transport_s", "gamma_s_per_byte", "gamma_dtype_s_per_byte",
                 "overlap_slowdown", "coding_slowdown", "compute_slowdown", "codec_table",
                 "codecs", "ranks_per_node", "intra_bps", "shared_cpu", "compute_source",
                 "load_average", "note", "codec_params_apart"}
STAMP = {"command", "date", "commit", "machine"}
ROW = {"agg", "method", "workers", "bandwidth", "compute_speedup", "iteration_s", "efficiency",
       "communicate_s", "exposed_s", "coding_s", "wire_bytes"}


def test_advise_and_whatif_json_are_the_documented_records(monkeypatch, capsys, tmp_path):
    """performance-model.md: "advise's `--json` is one record: the `command`, `date`, `commit`
    and `machine` that made it; the inputs: `model`, ... `note` (the inputs note as printed)
    and `codec_params_apart`; then `ranked`, ... and `not_ranked`"; whatif's has "every
    prediction under `rows` (...), the §5 answers under `answers`, the worker counts swept
    under `workers`, the refused points under `not_predicted`, ..., the `command`, `date`,
    `commit` and `machine`, and the inputs as advise's `--json` records them (...; the rates
    and speedups are in each row)"."""
    common = ["--model", "resnet50", "--bandwidth", "1gbit", "--agg", "dense,topk"]
    advice, _ = _json(monkeypatch, capsys, tmp_path, ["advise", "--workers", "8", *common],
                      "a.json")
    assert set(advice) == STAMP | ADVISE_INPUTS | {"ranked", "not_ranked"}
    assert all(set(r) == ROW | {"overhead_s"} for r in advice["ranked"])
    sweep, _ = _json(monkeypatch, capsys, tmp_path, ["whatif", "--workers", "8,4,8", *common],
                     "w.json")
    per_row = {"workers", "bandwidth", "compute_speedup"}
    assert set(sweep) == (STAMP | ADVISE_INPUTS - per_row
                          | {"rows", "answers", "workers", "not_predicted"})
    assert sweep["workers"] == [4, 8]
    assert all(set(r) == ROW for r in sweep["rows"])
    assert all(set(a) == {"workers", "bandwidth", "compute_speedup", "required_compression",
                          "coding_budget_s"} for a in sweep["answers"])
    # each prints its own inputs note (whatif's names the codec table's source too)
    shared = ADVISE_INPUTS - per_row - {"load_average", "note"}
    assert {k: sweep[k] for k in shared} == {k: advice[k] for k in shared}


# ---- docs/performance-model.md: what the CLI leaves at 0, and a calibration's cores


def test_stragglers_and_token_buckets_are_zero_in_the_cli_whatever_the_calibration(tmp_path):
    """performance-model.md, points 6 and 7: "`ClusterModel.straggle`, Python API only (0 in
    the CLI)", "`ClusterModel.burst`, Python API only (0 in the CLI: real links have none)";
    a calibration of an emulated cluster records its links' token bucket (`burst_bytes`)."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(calibration_doc.doc(burst_bytes=5e5)))
    for cal in (None, path):
        s = scenario.Scenario(model="resnet50", agg="dense,topk", calibration=cal)
        advice = scenario.advise(s, 8, "1gbit", 1.0)
        assert (advice.cluster.straggle, advice.cluster.burst) == (0.0, 0.0), cal
        for r in advice.ranked:
            assert r.prediction.iteration >= (r.prediction.forward + r.prediction.backward
                                              + r.prediction.step)


@pytest.mark.parametrize("ranks_per_machine,who,load", [
    (4, "every worker on one machine", 16 / 2), (2, "each node's ranks", 2 / 2)])
def test_a_calibration_s_cores_are_the_machine_s_or_each_node_s(
        monkeypatch, capsys, tmp_path, wide, ranks_per_machine, who, load):
    """performance-model.md: "its terms then apply to every worker on one machine when every
    calibrated rank was on one (an emulated cluster), otherwise to each node's
    `--ranks-per-node` ranks". Calibrated on 4 ranks, 2 per node, 2 cores a machine; asked
    about 16 workers, 2 per node."""
    doc = calibration_doc.doc(world=4, ranks_per_node=2, cpu=calibration_doc.cpu(
        cpu_ranks_per_machine=ranks_per_machine, cores_per_machine=2))
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    rec, out = _json(monkeypatch, capsys, tmp_path, [
        "advise", "--model", "resnet50", "--workers", "16", "--agg", "dense",
        "--ranks-per-node", "2", "--calibration", str(path)])
    assert f"{who} sharing 2 cores" in out
    assert rec["shared_cpu"]["one_machine"] is (ranks_per_machine == 4)
    s = scenario.Scenario(model="resnet50", agg="dense", ranks_per_node=2, calibration=path)
    assert scenario.advise(s, 16, "1gbit", 1.0).cluster.cpu_load == load


# ---- docs/simulator.md: outputs


def _sim_trace(tmp_path: Path) -> Path:
    return tr.save(tr.synthetic("sim", [40_000, 400_000, 4_000, 800_000], 0.004, 0.008, 0.001),
                   tmp_path / "sim.trace.jsonl")


def test_simulate_prints_and_keeps_the_steady_iteration_speed_up_and_exposed_time(
        monkeypatch, capsys, tmp_path, wide):
    """simulator.md: "Per mechanism: the steady iteration time (mean interval between
    iteration ends after the first; `--iterations`, default 3), speed-up over `ps` (over the
    first mechanism where `ps` did not run), compute per iteration, exposed communication
    (iteration − compute)"; "Titles name the host costs simulated (`α 10 µs, latency 1.5
    µs/host`, and γ where it is not 0)"; `--json` keeps "the command, date, commit and
    machine; under `traces` each trace simulated (`model`, `source`, `tensors`, `bytes`,
    `forward_s`, `backward_s`)"."""
    path = _sim_trace(tmp_path)
    t = tr.load(path)
    for mechanisms, base in (("ring,ps,butterfly", "ps"), ("butterfly,ring", "butterfly")):
        rec, out = _json(monkeypatch, capsys, tmp_path, [
            "simulate", "--trace", str(path), "--workers", "4", "--bandwidth", "10gbit",
            "--mechanism", mechanisms])
        assert STAMP <= set(rec)
        assert rec["traces"] == [{"model": "sim", "source": t.source, "tensors": 4,
                                  "bytes": 1_244_000, "forward_s": t.iterations[0].forward_s,
                                  "backward_s": t.iterations[0].backward_s}]
        assert "α 10 µs, latency 1.5 µs/host" in out and "γ" not in out
        assert f"vs {base}" in out
        by = {r["mechanism"]: r for r in rec["results"]}
        assert list(by) == mechanisms.split(",")
        for name, r in by.items():
            ends = r["ends"]
            assert len(ends) == 3
            assert r["iteration_s"] == pytest.approx((ends[2] - ends[0]) / 2, rel=1e-12)
            assert r["exposed_s"] == pytest.approx(max(r["iteration_s"] - r["compute_s"], 0),
                                                   abs=1e-15)
            speed_up = by[base]["iteration_s"] / r["iteration_s"]
            row = next(line for line in out.splitlines() if line.split()[:1] == [name])
            assert row.split()[2] == f"{speed_up:.2f}x", row


@pytest.mark.parametrize("workers,span", [(999, 1000), (1000, 10_000)])
def test_timeline_processes_go_to_ten_thousand_a_mechanism_once_a_host_id_reaches_1000(
        tmp_path, workers, span):
    """simulator.md: "Host h of the k-th mechanism (from 0) is process k × 1000 + h, or k × 10
    000 + h and so on once a host id reaches 1000 (more than 1000 hosts, servers included)".
    With one server, 999 workers are 1000 hosts (ids 0-999), 1000 workers 1001."""
    from conftest import strict_json

    from gradwire.sim.cluster import SimResult
    from gradwire.sim.report import write_timeline

    def result(name: str, hosts: int) -> SimResult:
        return SimResult(name, 1.0, [1.0], 0.5, {}, {}, [
            {"name": "x", "ph": "X", "pid": h, "tid": 1, "ts": 0.0, "dur": 1.0}
            for h in range(hosts)])

    doc = strict_json(write_timeline([result("ps", workers + 1), result("ring", workers)],
                                     workers, tmp_path / "t.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names[workers] == "ps: server 0"
    assert names[span] == "ring: worker 0" and names[span + 7] == "ring: worker 7"
    assert max(names) == span + workers - 1


# ---- docs/simulator.md: the default host costs


@pytest.mark.parametrize("p,said_ms", [(32, 0.8), (1024, 27)])
def test_the_default_host_costs_make_a_ring_pay_13_us_a_step(p, said_ms):
    """simulator.md: "So a small message takes 13 µs one way ..., and a ring allreduce of P
    ranks pays 2(P − 1) × 13 µs per collective before its bytes: 0.8 ms at 32 workers, 27 ms at
    1024"."""
    t = tr.synthetic("small", [4 * 4 * p], 0.0, 0.0)  # 4 elements a rank
    ring = parse("ring")
    default = ring.run(t, SimCluster(p, 100e9, iterations=1), False).iteration_s
    ideal = ring.run(t, SimCluster(p, 100e9, alpha=0.0, latency=0.0, iterations=1),
                     False).iteration_s
    assert default - ideal == pytest.approx(2 * (p - 1) * 13e-6, rel=1e-6)
    assert round((default - ideal) * 1e3, 1 if said_ms < 1 else 0) == said_ms


@pytest.mark.parametrize("alpha_us", [0.0, 5.0, 10.0, 20.0, 40.0])
def test_a_parameter_server_s_stream_pays_max_of_alpha_and_transfer_a_message(alpha_us):
    """simulator.md: "A parameter-server host readies its messages one after another, each for
    `alpha`, while earlier ones are still on the wire, so a stream of messages costs max(α,
    transfer) each, not the sum." One server sends one parameter to W workers (T = 10 µs a
    message), each worker pushes its gradient back at once (no compute, no latency): the
    last arrives after α + (W − 1)·max(α, T) + T, and its push takes α + T more."""
    w, nbytes, bps = 8, 12_500, 10e9
    alpha, transfer = alpha_us * 1e-6, nbytes * 8 / bps
    t = tr.synthetic("one", [nbytes], 0.0, 0.0)
    c = SimCluster(w, bps, latency=0.0, alpha=alpha, iterations=1)
    got = simulate_ps(t, c, PSOptions()).iteration_s
    want = alpha + (w - 1) * max(alpha, transfer) + transfer + alpha + transfer
    assert got == pytest.approx(want, rel=1e-9)
    if alpha > 0:
        assert got < w * (alpha + transfer) + alpha + transfer  # not the sum


def test_simulate_with_a_calibration_takes_its_alpha_with_the_latency_in_it(
        monkeypatch, capsys, tmp_path):
    """simulator.md: "`--calibration cal.json` takes α (per step, latency included) and γ from
    what `gradwire calibrate` measured on your cluster instead" (of `--alpha-us` and
    `--latency-us`): the result records the calibration's α and γ and no latency."""
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(calibration_doc.doc(alpha_s=2.5e-4, gamma_s_per_byte=1e-10)))
    rec, out = _json(monkeypatch, capsys, tmp_path, [
        "simulate", "--trace", str(_sim_trace(tmp_path)), "--workers", "4", "--mechanism",
        "ring", "--calibration", str(cal)])
    c = rec["cluster"]
    assert (c["alpha_s"], c["latency_s"], c["gamma_s_per_byte"]) == (2.5e-4, 0.0, 1e-10)
    assert "latency 0 µs/host, γ 0.1 ns/B" in " ".join(out.split())


# ---- docs/simulator.md: the trace format and its limits

GOOD = tr.dumps(tr.synthetic("m", [8, 16], 0.004, 0.006)).splitlines()


def _iteration(**fields: object) -> str:
    line = json.loads(GOOD[3])
    line.update(fields)
    return json.dumps(line)


def test_the_doc_s_example_of_a_defect_is_the_reader_s_line():
    """simulator.md: "Any defect is a one-line error naming the line and field, e.g.
    `x.jsonl:4: field 'forward[1]': forward times must not decrease (params are listed in
    forward order): 0.002 < 0.003`"."""
    text = "\n".join([*GOOD[:3], _iteration(forward=[0.003, 0.002])])
    with pytest.raises(GradwireError) as e:
        tr.loads(text, "x.jsonl")
    assert str(e.value) == ("x.jsonl:4: field 'forward[1]': forward times must not decrease "
                            "(params are listed in forward order): 0.002 < 0.003")


@pytest.mark.parametrize("lines,where", [
    # "`forward_s` | the whole forward pass, seconds (≥ every `forward` time)"
    ([*GOOD[:3], _iteration(forward_s=0.001, forward=[0.0, 0.002])], "x.jsonl:4: field "
     "'forward_s'"),
    # "`bytes` | ... gradient size in bytes (≥ 1)"
    ([GOOD[0], GOOD[1].replace('"bytes": 8', '"bytes": 0'), *GOOD[2:]], "x.jsonl:2: field "
     "'bytes'"),
    # "times finite and up to 10^6 s each"
    ([*GOOD[:3], _iteration(backward=[0.006, 1e6 + 1])], "x.jsonl:4: field 'backward[1]'"),
    # "`format`, `version` | `"gradwire-trace"`, `1`"
    ([GOOD[0].replace("gradwire-trace", "gradwire-trace2"), *GOOD[1:]], "x.jsonl:1: field "
     "'format'"),
])
def test_a_trace_past_the_documented_fields_is_one_line_naming_line_and_field(lines, where):
    with pytest.raises(GradwireError) as e:
        tr.loads("\n".join(lines), "x.jsonl")
    assert str(e.value).startswith(where) and "\n" not in str(e.value), str(e.value)


def test_a_trace_time_of_a_million_seconds_is_read():
    """simulator.md: "times finite and up to 10^6 s each": 10^6 itself is a time."""
    t = tr.loads("\n".join([*GOOD[:3], _iteration(forward_s=1e6, backward=[1e6, 1e6])]))
    assert t.iterations[0].forward_s == 1e6


@pytest.mark.parametrize("args,says", [
    (["--iterations", "1001"], "iterations must be at most 1000, got 1001"),
    (["--workers", "4097"], "workers must be at most 4096"),
])
def test_simulate_runs_at_most_1000_iterations_on_at_most_4096_workers(
        monkeypatch, capsys, tmp_path, args, says):
    """simulator.md: "a simulation runs at most 1000 (the steady state shows after two)";
    "Workers (at most 4096: ...)"."""
    path = _sim_trace(tmp_path)
    one_line_cli_error(*cli_error(monkeypatch, capsys, "simulate", "--trace", str(path),
                                  "--mechanism", "ring", *args), says)


def test_simulate_takes_1000_iterations_and_4096_workers():
    """The bounds themselves are taken (the cluster is made, nothing is run)."""
    assert SimCluster(2, 1e9, iterations=1000).iterations == 1000
    assert SimCluster(4096, 1e9).workers == 4096


def test_trace_compute_speedup_divides_every_time(monkeypatch, capsys, tmp_path):
    """simulator.md: "`--compute-speedup F` divides every time by F (the paper's "faster
    GPUs", §8.6)"; "An edit keeps the trace's own iterations"."""
    t = tr.synthetic("m", [400, 800, 1200], 0.006, 0.012, 0.002)
    its = [tr.Iteration(w, 0, 0.006 * (w + 1), (0.0, 0.002 * (w + 1), 0.004 * (w + 1)),
                        (0.012 * (w + 1), 0.008 * (w + 1), 0.002 * (w + 1))) for w in range(2)]
    src = tr.save(tr.Trace(t.model, t.params, tuple(its), t.source), tmp_path / "in.jsonl")
    out = tmp_path / "fast.jsonl"
    code, _, err = run_cli(monkeypatch, capsys, ["trace", "--from", str(src),
                                                 "--compute-speedup", "4", "-o", str(out)])
    assert code == 0, err
    fast = tr.load(out)
    assert fast.params == t.params and len(fast.iterations) == 2
    for a, b in zip(its, fast.iterations, strict=True):
        assert (b.worker, b.iteration) == (a.worker, a.iteration)
        assert b.forward_s == pytest.approx(a.forward_s / 4, rel=1e-12)
        assert b.forward == pytest.approx([x / 4 for x in a.forward], rel=1e-12)
        assert b.backward == pytest.approx([x / 4 for x in a.backward], rel=1e-12)
