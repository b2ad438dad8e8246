import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import gradwire_cli, needs_netns, quick_resnet20
from hypothesis import given
from hypothesis import strategies as st

from gradwire.bench import spec
from gradwire.bench.report import BUSBW_FACTOR, annotate
from gradwire.bench.spec import ITEMSIZE, elements, measured_sizes, parse_params, parse_specs
from gradwire.cluster.netns import tbf_burst
from gradwire.collectives.agree import header_spec
from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.schedules.cost import CostParams, cost
from gradwire.sizes import format_size, parse_sizes


def test_sizes_forms():
    assert parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K:64K:4") == [1024, 4096, 16384, 65536]
    assert parse_sizes("64M,4M,4M") == [4 * 2**20, 64 * 2**20]
    assert parse_sizes("13") == [13]


def test_sizes_are_rounded_to_what_the_ranks_measure_once_each():
    assert measured_sizes([1024, 1025, 1027, 1028], "float32", 3, "allreduce") == [1024, 1028]
    # allgather and reduce-scatter: whole elements, a multiple of P of them
    assert measured_sizes([1024, 1030], "float16", 3, "allgather") == [1020, 1026]
    assert measured_sizes([48, 50, 60], "float32", 3, "reducescatter") == [48, 60]


@given(st.lists(st.integers(8, 10**6), min_size=1), st.sampled_from(sorted(ITEMSIZE)),
       st.integers(1, 9), st.sampled_from(["allreduce", "broadcast", "allgather"]))
def test_measured_sizes_are_the_ranks_buffers(sizes, dtype, p, collective):
    item = ITEMSIZE[dtype]
    got = measured_sizes(sizes, dtype, p, collective)
    want = {elements(s, item, p, collective) * item for s in sizes}
    assert got == sorted(want) and len(set(got)) == len(got)
    for s in got:
        assert s % item == 0 and (collective != "allgather" or (s // item) % p == 0)


@pytest.mark.parametrize("bad", ["", "1X", "8K:1K", "1K:8K:1", "1K:8K:x", "1:2:3:4", "-1"])
def test_bad_sizes(bad):
    with pytest.raises(GradwireError, match="expected"):
        parse_sizes(bad)


@given(st.integers(0, 40))
def test_format_size_round_trips(e):
    assert parse_sizes(format_size(2**e)) == [2**e]


def test_busbw_follows_nccl_tests():
    rows = [{"collective": c, "algo": "builtin", "bytes": 10**9, "count": 2.5 * 10**8,
             "time_s": 1.0} for c in BUSBW_FACTOR]
    annotate(rows, 4, None)
    got = {r["collective"]: r["busbw_GBps"] for r in rows}
    assert got == {"allreduce": 1.5, "allgather": 0.75, "reducescatter": 0.75,
                   "broadcast": 1.0, "reduce": 1.0}
    assert all(r["algbw_GBps"] == 1.0 for r in rows)


def test_ring_prediction_uses_the_schedule():
    row = {"collective": "allreduce", "algo": "ring", "name": "ring", "params": {},
           "bytes": 4000, "count": 1000, "time_s": 1.0}
    annotate([row], 4, CostParams(1.0, 0.0, 0.0))
    assert row["predicted_s"] == 6.0  # 2(p-1) messages of α each
    row["params"] = {"pipeline": 4}  # each ring step sends 4 sub-chunks: 4 messages
    annotate([row], 4, CostParams(1.0, 0.0, 0.0))
    assert row["predicted_s"] == 24.0


def test_a_call_timed_with_its_header_exchange_is_predicted_with_it():
    """The header is gathered by recursive doubling: ⌈lg P⌉ messages, each paying α."""
    row = {"collective": "allreduce", "algo": "ring", "name": "ring", "params": {},
           "bytes": 4000, "count": 1000, "time_s": 1.0, "header": True}
    annotate([row], 4, CostParams(1.0, 0.0, 0.0))
    assert row["predicted_s"] == 6.0 + 2.0
    plain = {**row, "header": False}
    annotate([plain], 4, CostParams(1.0, 0.0, 0.0))
    assert plain["predicted_s"] == 6.0
    annotate([row], 5, CostParams(1.0, 1.0, 0.0))  # bytes matter too: exact cost of both
    c, a, n, kw = header_spec(5)
    want = (cost(registry.schedule("allreduce", "ring", 5, 1000), CostParams(1.0, 1.0), 4)
            + cost(registry.schedule(c, a, 5, n, **kw), CostParams(1.0, 1.0), 1))
    assert row["predicted_s"] == pytest.approx(want)


def test_algo_specs():
    specs = parse_specs("allreduce", "ring,ring:pipeline=4,builtin")
    assert [(s.label, s.name, s.params) for s in specs] == [
        ("ring", "ring", {}), ("ring:pipeline=4", "ring", {"pipeline": 4}),
        ("builtin", "builtin", {})]
    # a spec given twice is run once (its rows would merge under one label)
    assert [s.label for s in parse_specs("allreduce", "ring, rhd,ring,rhd ")] == ["ring", "rhd"]
    assert parse_params(["alpha=1e-4", "sharding=even"]) == {"alpha": 1e-4, "sharding": "even"}
    for bad, msg in [("ring:pipeline", "KEY=VALUE"), ("builtin:x=1", "no parameters"),
                     (",", "names no algorithm")]:
        with pytest.raises(GradwireError, match=msg):
            parse_specs("allreduce", bad)


@needs_netns
def test_calibrate_on_three_emulated_hosts_then_bench_with_it(tmp_path):
    """The host side on an emulated cluster at 1 Gbit/s: the rank side on every host, rank 2
    waiting while ranks 0 and 1 stream over a shaped link, the link's token bucket recorded,
    and the saved file read by `gradwire bench`'s model column."""
    from gradwire.hooks import METHODS
    from gradwire.perf import calibration, codecs

    env = {"GRADWIRE_HOME": str(tmp_path), "GRADWIRE_TIMEOUT": "30"}
    p = gradwire_cli("calibrate", "--hosts", "3", "--bandwidth", "1gbit", "--model",
                     str(quick_resnet20(tmp_path)), "--device", "cpu", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    path = tmp_path / "calibration" / "1gbit.json"
    cal = calibration.load(path)
    # every emulated host is its own node: α over 2(P-1) = 4 ring steps
    assert (cal.world, cal.nodes, cal.ranks_per_node) == (3, 3, 1)
    assert cal.alpha_call_s == pytest.approx(4 * cal.alpha_s) and cal.alpha_s > 0
    assert cal.beta_between == "nodes" and cal.beta_intra_s_per_byte is None
    # every rank on this machine: three ranks share its cores
    assert cal.cpu.cpu_step_s > 0 and cal.cpu.cpu_byte_s >= 0
    assert cal.cpu.cpu_ranks_per_machine == 3 and cal.cpu.cores_per_machine >= 1
    assert 0 < cal.cpu.cpu_share <= 1 and cal.cpu.cpu_slowdown >= 1
    # the probe's recursive doubling at 3 ranks: 2 steps a rank on the mean
    assert cal.cpu.cpu_sync_step_s == pytest.approx(cal.cpu.cpu_sync_s / 2)
    # the shaped link's token bucket, for the model, and its TCP payload rate: about 0.956
    # Gbit/s on tbf 1gbit
    assert cal.burst_bytes == tbf_burst(1e9) == 500_000 and cal.bandwidth == "1gbit"
    assert 0.8 < 8 / cal.beta_s_per_byte / 1e9 < 1.0
    assert cal.network.startswith("emulated 3 hosts, 1gbit links")
    assert cal.command.startswith("gradwire calibrate --hosts 3")
    table = codecs.load(str(path))
    assert set(table.methods) == set(METHODS) and "local work" in table.source
    assert table.methods["powersgd"]["encode_s"] > 0 and table.methods["dense"]["decode_s"] == 0
    out = tmp_path / "b.json"
    p = gradwire_cli("bench", "--hosts", "3", "--bandwidth", "1gbit", "--sizes", "1K,13K",
                     "--iters", "2",
                     "--algo", "ring,ring:pipeline=3",
                     "--json", str(out), env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert res["model"]["source"].startswith("calibrated")
    assert {r["algo"] for r in res["rows"]} == {"builtin", "ring", "ring:pipeline=3"}
    assert all(r["wrong"] == 0 for r in res["rows"])
    assert all(r["predicted_s"] > 0 for r in res["rows"])
    assert [r["header"] for r in res["rows"]] == [r["algo"] != "builtin" for r in res["rows"]]
    assert res["command"].startswith("gradwire bench")


@pytest.mark.parametrize("collective, algo", [("allreduce", "ring"), ("reduce", "lp"),
                                               ("reducescatter", "ring")])
def test_bench_averages_like_the_builtin(tmp_path, collective, algo):
    """--op avg: every rank's result (the root's for reduce) must be (P+1)/2, not the sum
    P(P+1)/2, for ours and the baseline alike; the model charges the division."""
    out = tmp_path / "b.json"
    p = gradwire_cli("bench", "--loopback", "--hosts", "3", "--collective", collective,
                     "--op", "avg", "--sizes", "12K", "--iters", "1", "--algo", algo,
                     "--json", str(out), env={"GRADWIRE_HOME": str(tmp_path)})
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert res["ops"] == ["avg"] and f"{collective} (avg)" in p.stdout
    assert [(r["algo"], r["redop"], r["wrong"]) for r in res["rows"]] == [
        ("builtin", "avg", 0), (algo, "avg", 0)]


def test_bench_times_integers_like_the_builtin(tmp_path):
    """--dtype int8, as nccl-tests' -d int8: the built-in row and gradwire's in one table,
    every element checked on every rank."""
    out = tmp_path / "b.json"
    p = gradwire_cli("bench", "--loopback", "--hosts", "3", "--dtype", "int8", "--op", "max",
                     "--sizes", "1K,3K", "--iters", "1", "--algo", "ring,rd",
                     "--json", str(out), env={"GRADWIRE_HOME": str(tmp_path)})
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["algo"], r["type"], r["count"], r["wrong"]) for r in rows] == [
        (a, "int8", n, 0) for n in (1024, 3072) for a in ("builtin", "ring", "rd")]


def test_bench_runs_dtype_and_op_lists_in_nccl_tests_order(tmp_path):
    """--dtype and --op take comma lists (and all), as nccl-tests' -d all -o all: each dtype's
    ops, each op's sizes (rounded to that dtype's elements), every row checked; an integer
    dtype is not averaged, and a note says so."""
    out = tmp_path / "b.json"
    p = gradwire_cli("bench", "--loopback", "--hosts", "3", "--dtype", "float64,int8",
                     "--op", "avg,max", "--sizes", "9,24", "--iters", "1", "--algo", "ring",
                     "--no-builtin", "--json", str(out), env={"GRADWIRE_HOME": str(tmp_path)})
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert (res["dtypes"], res["ops"]) == (["float64", "int8"], ["avg", "max"])
    assert [(r["type"], r["redop"], r["count"], r["wrong"]) for r in res["rows"]] == [
        ("float64", "avg", 1, 0), ("float64", "avg", 3, 0), ("float64", "max", 1, 0),
        ("float64", "max", 3, 0), ("int8", "max", 9, 0), ("int8", "max", 24, 0)]
    assert "note: --op avg times the float dtypes only, not int8" in p.stdout
    assert "allreduce (avg, max), 3 ranks" in p.stdout
    assert res["skipped"] == [["int8", "avg"]]


def test_bench_names_only_the_ops_it_ran_and_the_rows_it_will_run(monkeypatch, tmp_path):
    """--op sum,avg --dtype int8 runs sum alone: the title said "(sum, avg)"."""
    from rich.console import Console

    from gradwire.bench import run as bench_run
    from gradwire.cluster import loopback_cluster

    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))
    seen = {}
    monkeypatch.setattr(bench_run, "run_ranks", lambda *a, **k: seen.update(k) or [])
    shown = tmp_path / "out.txt"
    res = bench_run.run_bench(loopback_cluster(3), "reducescatter", parse_specs(
        "reducescatter", "ring"), [24, 30], ["int8", "float64"], 1, 0, {}, True, 60,
        Console(file=open(shown, "w"), width=200), ops=["sum", "avg"])
    assert "reducescatter (sum, avg), 3 ranks" in shown.read_text()
    # builtin and ring, each at: int8 sum's 24 and 30 elements (multiples of P), float64's
    # 3 elements for both sizes (one row) in sum and in avg
    assert seen["total"] == 2 * (2 + 1 + 1)
    assert res["skipped"] == [["int8", "avg"]]
    bench_run.run_bench(loopback_cluster(3), "allreduce", parse_specs("allreduce", "ring"),
                        [64], ["int8"], 1, 0, {}, True, 60,
                        Console(file=open(shown, "w"), width=200), ops=["sum", "avg"])
    assert "allreduce (sum), 3 ranks" in shown.read_text()


def test_wrong_rows_name_the_dtype_and_op_where_several_ran():
    from gradwire.bench.report import wrong_rows

    rows = [{"algo": "ring", "bytes": 1024, "wrong": 3, "type": t, "redop": o}
            for t, o in (("float16", "prod"), ("bfloat16", "prod"), ("float16", "sum"))]
    assert wrong_rows(rows) == (
        "3 of 3 rows gave a wrong result: ring float16 prod at 1K (3 elements), ring bfloat16 "
        "prod at 1K (3 elements), ring float16 sum at 1K (3 elements) (every rank checks its "
        "output against the known answer after the last timed call)")
    one = [{**r, "type": "float32", "redop": "sum"} for r in rows[:2]]
    assert wrong_rows(one).startswith("2 of 2 rows gave a wrong result: ring at 1K (3 "
                                      "elements), ring at 1K")


@pytest.mark.parametrize("collective, dtype, op, want", [
    ("allreduce", "all", "all", (
        [(d, o) for d in spec.DTYPES for o in spec.OPS if o != "avg" or "float" in d],
        ["int8", "uint8", "int32", "int64"])),
    ("reduce", "int32, float16,int32", "prod,sum", (
        [("int32", "prod"), ("int32", "sum"), ("float16", "prod"), ("float16", "sum")], [])),
    ("broadcast", "bfloat16", "sum", ([("bfloat16", "sum")], [])),
    ("reducescatter", "uint8,float32", "avg", ([("float32", "avg")], ["uint8"])),
])
def test_dtype_and_op_lists_pair_up(collective, dtype, op, want):
    assert spec.pairs(spec.parse_dtypes(dtype), spec.parse_ops(collective, op)) == want


@pytest.mark.parametrize("collective, dtype, op, msg", [
    ("allreduce", "int8,int64", "avg", "--op avg needs a float --dtype (float32, float16, "
     "bfloat16 or float64), got int8"),
    ("allreduce", "float32,all", "sum", "--dtype 'float32,all': all stands alone"),
    ("allreduce", "float32", " , ", "--op ' , ' names nothing"),
    ("allreduce", "float32,int16", "sum", "--dtype 'int16' is not supported: expected "
     "float32, float16, bfloat16, float64, int8, uint8, int32 or int64 (a comma list of "
     "them, or all)"),
    ("allgather", "float32", "all", "--op all applies to allreduce, reduce, reducescatter: "
     "allgather does not reduce"),
    ("broadcast", "float32", "sum,max", "--op max applies to allreduce"),
])
def test_dtype_and_op_lists_refused_in_one_line(collective, dtype, op, msg):
    with pytest.raises(GradwireError) as e:
        spec.pairs(spec.parse_dtypes(dtype), spec.parse_ops(collective, op))
    assert str(e.value).startswith(msg) and "\n" not in str(e.value)


@pytest.mark.parametrize("collective, algo", [("allreduce", "ring"), ("reduce", "binomial"),
                                               ("reducescatter", "rhd")])
def test_the_model_prices_an_integer_reduction_at_float32s_gamma_per_byte(collective, algo):
    """docs/algorithms.md: a calibration measures the float dtypes' reductions only, so an
    int8 row costs what a float32 row of the same bytes costs, γ included."""
    from gradwire.bench.report import predict

    params = CostParams(3e-5, 8e-9, gamma=2e-9)
    row = {"collective": collective, "name": algo, "params": {}, "header": True, "redop": "sum"}
    int8 = predict({**row, "bytes": 3 * 2**20, "count": 3 * 2**20}, 3, params)
    float32 = predict({**row, "bytes": 3 * 2**20, "count": 3 * 2**18}, 3, params)
    assert int8 == pytest.approx(float32, rel=1e-12)
    assert int8 > predict({**row, "bytes": 3 * 2**20, "count": 3 * 2**20}, 3,
                          CostParams(3e-5, 8e-9, gamma=0.0))


def test_the_model_column_prices_calls_back_to_back():
    """bench times calls back to back after a lead-in: on shaped links the prediction carries
    each link's credit from one call (header, then data) into the next."""
    from gradwire.bench.report import predict
    from gradwire.collectives.agree import header_spec
    from gradwire.schedules import registry
    from gradwire.schedules.cost import back_to_back, cost

    a, b = 2.7e-4, 8.4e-9
    row = {"collective": "broadcast", "algo": "lp", "name": "lp",
           "params": {"alpha": a, "beta": b}, "bytes": 2**20, "count": 2**18, "header": True}
    c, h_algo, n, h_params = header_spec(4)
    header = registry.schedule(c, h_algo, 4, n, **h_params)
    data = registry.schedule("broadcast", "lp", 4, 2**18, itemsize=4, alpha=a, beta=b)
    shaped = CostParams(a, b, burst=500_000)
    assert predict(row, 4, shaped) == back_to_back([(header, 1), (data, 4)], shaped)
    assert predict(row, 4, shaped) < cost(header, shaped, 1) + cost(data, shaped, 4)
    plain = CostParams(a, b)
    assert predict(row, 4, plain) == pytest.approx(cost(header, plain, 1) + cost(data, plain, 4))


def test_averaging_is_predicted_as_one_more_pass():
    row = {"collective": "reducescatter", "algo": "ring", "name": "ring", "params": {},
           "bytes": 3000, "count": 750, "time_s": 1.0}
    annotate([row], 3, CostParams(0.0, 0.0, 1.0))
    summed = row["predicted_s"]
    row["redop"] = "avg"
    annotate([row], 3, CostParams(0.0, 0.0, 1.0))
    assert row["predicted_s"] == summed + 1000  # its block of the input, at γ per byte


@pytest.mark.parametrize("args, msg", [
    (["--op", "band"], "--op 'band' is not supported: expected sum, avg, max, min or prod"),
    (["--op", "max", "--collective", "allgather"],
     "--op max applies to allreduce, reduce, reducescatter: allgather does not reduce"),
    (["--op", "avg", "--collective", "broadcast"],
     "--op avg applies to allreduce, reduce, reducescatter: broadcast does not reduce"),
    (["--device", "tpu"], "--device 'tpu' is not supported: expected cpu or cuda"),
    pytest.param(["--device", "cuda"], "--device cuda needs a CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA")),
])
def test_bench_refuses_a_reduction_it_cannot_run(monkeypatch, capsys, args, msg):
    from conftest import cli_error

    code, err = cli_error(monkeypatch, capsys, "bench", "--loopback", *args)
    assert code == 2 and msg in err and err.count("\n") == 1


def test_interleaved_bench_takes_turns_and_checks_each_algorithm(one_rank, monkeypatch):
    import torch

    from gradwire.bench import rank as bench_rank

    calls: list[str] = []
    real = bench_rank._call

    def recording(collective, algo, inp, out, t, params, op):
        run = real(collective, algo, inp, out, t, params, op)

        def go():
            calls.append(algo)
            run()
            if algo == "rd":  # a wrong result on every element: #wrong must say so
                out.add_(1)
        return go

    monkeypatch.setattr(bench_rank, "_call", recording)
    specs = [{"label": n, "name": n, "params": {}} for n in ("builtin", "ring", "rd")]
    rows = bench_rank.bench_interleaved("allreduce", specs, 10, torch.float32, 3, 1, batch=2)
    # a warm-up call each; three rounds of a lead-in and two timed calls each; a checked call
    timed = [a for a in ("builtin", "ring", "rd") for _ in range(3)]
    assert calls == ["builtin", "ring", "rd"] + timed * 3 + ["builtin", "ring", "rd"]
    assert [r["algo"] for r in rows] == ["builtin", "ring", "rd"]
    assert [len(r["times_s"]) for r in rows] == [3, 3, 3]
    assert [r["wrong"] for r in rows] == [0, 0, 10]


def test_bench_fails_when_a_result_is_wrong_and_keeps_the_rows(tmp_path, monkeypatch, capsys):
    from conftest import cli_error

    from gradwire.bench import run as bench_run

    def fake_ranks(cluster, module, args, what, timeout, console, total, tick, ticked):
        row = {"collective": "allreduce", "name": "ring", "params": {}, "count": 256,
               "bytes": 1024, "type": "float32", "time_s": 1e-3, "wrong": 0, "header": True}
        return [{**row, "algo": "builtin", "name": "builtin", "header": False},
                {**row, "algo": "ring", "wrong": 7}]

    monkeypatch.setattr(bench_run, "run_ranks", fake_ranks)
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))
    out = tmp_path / "b.json"
    code, err = cli_error(monkeypatch, capsys, "bench", "--loopback", "--hosts", "2",
                          "--sizes", "1K", "--algo", "ring", "--json", str(out))
    assert code == 2
    assert "1 of 2 rows gave a wrong result: ring at 1K (7 elements)" in err
    assert err.count("\n") == 1
    assert [r["wrong"] for r in json.loads(out.read_text())["rows"]] == [0, 7]


def _bench_outputs(collective: str, p: int, dtype: torch.dtype, op: str, drop: bool = False):
    """Every algorithm of ``collective`` run in this process on the inputs bench's P ranks
    make (a block of 2 elements a rank): (the algorithm, [(a checked rank's output, what the
    rank side expects of it)]). ``drop``: every received part is dropped, not combined."""
    from gradwire.bench.rank import _buffers
    from gradwire.collectives.api import COMBINES
    from gradwire.collectives.local import execute_local

    combine = COMBINES.get("product" if op == "prod" else op)
    if drop:
        combine = {"sum": lambda into, received: None}
    count = 2 * p
    for algo in (a.name for a in registry.ALGORITHMS if a.collective == collective):
        made = [_buffers(collective, count, p, r, dtype, op) for r in range(p)]
        for _, _, reset, _ in made:
            reset()
        bufs = [inp.clone() for inp, _, _, _ in made]
        if collective == "allgather":  # out of place: each rank's block of the output
            bufs = [torch.zeros(count, dtype=dtype) for _ in range(p)]
            for r, (inp, _, _, _) in enumerate(made):
                bufs[r][r * 2 : (r + 1) * 2] = inp
        execute_local(registry.schedule(collective, algo, p, count), bufs,
                      combine and [combine] * p)
        yield algo, [(bufs[r] if collective != "reducescatter" else bufs[r][r * 2 : r * 2 + 2],
                      want) for r, (_, _, _, want) in enumerate(made) if want is not None]


@pytest.mark.parametrize("collective", ["allreduce", "reduce", "reducescatter"])
@pytest.mark.parametrize("p", [22, 23, 45, 66])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
def test_bench_checks_large_worlds_in_half_precision_without_rounding(collective, p, dtype, op):
    """A correct algorithm has no wrong element at any P a cluster may have, in every dtype,
    whatever order it adds in: every algorithm of the collective run on every rank's buffers
    (in one process), against what the rank side expects (max, min and prod expected only the
    sum and the average before)."""
    for algo, outputs in _bench_outputs(collective, p, dtype, op):
        for got, want in outputs:
            assert torch.equal((got / p if op == "avg" else got).to(dtype), want), algo


@pytest.mark.parametrize("collective, op", [
    *((c, op) for c in ("allreduce", "reduce", "reducescatter")
      for op in ("sum", "max", "min", "prod")), ("allgather", "sum")])
@pytest.mark.parametrize("p", [3, 6, 15, 16, 31, 32, 66])
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_bench_checks_integers_that_wrap_at_every_world(collective, op, p, dtype):
    """Integer sums wrap modulo 2^bits, as c10d's do, whatever the order of adding: every
    algorithm run on every rank's buffers (in one process) gives what the rank side expects,
    from the world where int8's sum first wraps (6) past those where 8P does (16 in int8, 32
    in uint8) and a max or min of inputs that wrapped would be wrong; and the check's weights
    still differ by position."""
    for algo, outputs in _bench_outputs(collective, p, dtype, op):
        assert len(set(torch.cat([want for _, want in outputs]).tolist())) > 1
        for got, want in outputs:
            assert got.dtype == dtype and torch.equal(got, want), algo


@pytest.mark.parametrize("collective", ["reducescatter", "allgather"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.uint8, torch.int64])
def test_an_output_element_no_call_writes_is_wrong_in_every_dtype(collective, dtype):
    """An out-of-place output starts as what no right answer is, before every call: NaN in a
    float, the answer plus one in an integer (which has no NaN), so that a part an algorithm
    never writes is counted wrong."""
    from gradwire.bench.rank import _buffers

    for r in range(3):
        _, out, reset, want = _buffers(collective, 24, 3, r, dtype)
        reset()
        assert bool((out != want).all())


@pytest.mark.parametrize("collective", ["allreduce", "reduce", "reducescatter"])
@pytest.mark.parametrize("op, dtype, p", [
    *((op, dtype, p) for op in ("sum", "avg", "max", "min", "prod")
      for dtype, p in ((torch.float32, 4), (torch.bfloat16, 23), (torch.float16, 64))),
    # an integer has no average
    *((op, dtype, p) for op in ("sum", "max", "min", "prod")
      for dtype, p in ((torch.int8, 16), (torch.uint8, 32)))])
def test_a_reduction_that_combines_nothing_is_counted_wrong(collective, op, dtype, p):
    """A reduction that combines nothing must leave a wrong element on a checked rank. With
    rank r's input (r+1)·w the root of a reduce (rank 0, the one rank checked) held the min, w,
    before the call; and where a max's or min's inputs were all w (from P = 23 in bfloat16, 16
    in int8, 32 in uint8), every rank held the answer before the call."""
    for algo, outputs in _bench_outputs(collective, p, dtype, op, drop=True):
        right = [torch.equal((got / p).to(dtype) if op == "avg" else got, want)
                 for got, want in outputs]
        assert not all(right), algo


def test_the_bench_table_fits_120_columns_and_never_cuts_a_figure():
    """At 120 columns a 1-byte dtype's 10-digit count, a long spec and slow rows fit whole;
    at 80 a figure folds onto a second line instead of ending in "…"."""
    from rich.console import Console

    from gradwire.bench.report import table

    rows = [{"collective": "allreduce", "algo": algo, "name": "ring", "params": {},
             "count": 2**31, "bytes": 2**31, "type": "uint8", "redop": "prod",
             "time_s": 31.23456789, "wrong": 2**31} for algo in ("ring:pipeline=16",
                                                                  "builtin")]
    annotate(rows, 8, CostParams(5e-5, 8e-10, 1e-10))
    for width in (120, 80):
        console = Console(width=width, record=True, file=open(os.devnull, "w"))
        console.print(table(rows, "t"))
        text = console.export_text()
        assert "…" not in text and max(map(len, text.splitlines())) <= width
        if width == 120:  # every row on one line, whole: title, two header lines, rule, rows
            lines = text.splitlines()
            assert len(lines) == 6
            assert lines[4].split()[:6] == ["2G", "2147483648", "uint8", "prod",
                                            "ring:pipeline=16", "31234567.9"]
            assert lines[4].split()[-1] == "2147483648"


def test_bench_footer_follows_nccl_tests():
    from gradwire.bench.report import footer, wrong_rows

    rows = [{"algo": "ring", "busbw_Gbitps": 0.5, "wrong": 0, "bytes": 1024},
            {"algo": "ring", "busbw_Gbitps": 0.9, "wrong": 0, "bytes": 2048},
            {"algo": "builtin", "busbw_Gbitps": 0.8, "wrong": 0, "bytes": 1024}]
    assert footer(rows) == ["# Out of bounds values : 0 OK",
                            "# Avg bus bandwidth    : ring    0.700 Gbit/s",
                            "# Avg bus bandwidth    : builtin 0.800 Gbit/s"]
    assert wrong_rows(rows) is None
    rows[1]["wrong"] = 3
    assert footer(rows)[0] == "# Out of bounds values : 3 FAILED"


def test_interleaved_bench_counts_what_an_algorithm_leaves_unwritten(one_rank, monkeypatch):
    import torch

    from gradwire.bench import rank as bench_rank

    real = bench_rank._call

    def lazy(collective, algo, inp, out, t, params, op):  # "rd" writes nothing at all
        return (lambda: None) if algo == "rd" else real(collective, algo, inp, out, t, params,
                                                        op)

    monkeypatch.setattr(bench_rank, "_call", lazy)
    specs = [{"label": n, "name": n, "params": {}} for n in ("builtin", "rd", "ring")]
    rows = bench_rank.bench_interleaved("allgather", specs, 6, torch.float32, 2, 0)
    # the built-in call before it filled the shared output; rd's own call must still count
    assert [r["wrong"] for r in rows] == [0, 6, 0]


def test_builtin_rows_use_torchs_current_names(one_rank):
    """torch 2.13 warns (FutureWarning) on all_gather_into_tensor and reduce_scatter_tensor;
    the baseline rows call what this torch names them, and gradwire answers to both names."""
    import warnings

    import torch

    import gradwire.collectives as gc
    from gradwire.bench import rank as bench_rank

    assert gc.all_gather_single is gc.all_gather_into_tensor
    assert gc.reduce_scatter_single is gc.reduce_scatter_tensor
    spec = [{"label": "builtin", "name": "builtin", "params": {}}]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        for collective in ("allgather", "reducescatter"):
            rows = bench_rank.bench_interleaved(collective, spec, 4, torch.float32, 1, 0)
            assert rows[0]["wrong"] == 0


@pytest.mark.parametrize(("args", "msg"), [
    (["--density", "0"], "--density must be in (0, 1], got 0"),
    (["--rank", "0"], "--rank (PowerSGD's) must be from 1 to 1024, got 0"),
    (["--model", "resnet5"], "unknown profile 'resnet5'"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--out", "/nonexistent-gw/x.json"], "--out '/nonexistent-gw/x.json'"),
])
def test_calibrate_rank_side_refuses_bad_arguments_in_one_line(args, msg):
    p = subprocess.run([sys.executable, "-m", "gradwire.bench.calibrate", "--out", "x.json",
                        *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert msg in p.stderr.strip().splitlines()[-1]


def test_a_results_commit_is_marked_changed_by_code_not_by_results_or_docs(tmp_path):
    """provenance.commit: "+changes" when a tracked input differs from HEAD; other result
    files and the docs, which a session of runs rewrites, do not count."""
    from gradwire.bench.provenance import commit

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    for rel in ("src/m.py", "benchmarks/results/train_demo/latest.json", "docs/d.md", "README.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("0\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    here = tmp_path / "src"
    head = commit(here)
    assert len(head) >= 7 and "+" not in head
    for rel in ("benchmarks/results/train_demo/latest.json", "docs/d.md", "README.md"):
        (tmp_path / rel).write_text("1\n")
    assert commit(here) == head
    (tmp_path / "src/m.py").write_text("1\n")
    assert commit(here) == head + "+changes"
    # a package installed in an untracked folder of this checkout (a virtual environment in
    # a project's repository) is not that commit's code
    (tmp_path / "venv/site-packages/pkg").mkdir(parents=True)
    (tmp_path / "venv/site-packages/pkg/__init__.py").write_text("")
    assert commit(tmp_path / "venv/site-packages/pkg") == "unknown"


def test_a_benchmark_records_the_command_as_typed_from_the_repository_root():
    """provenance.script_command: whatever path ran the script, the result file's command reads
    ``python benchmarks/<script> <arguments>``, quoted for a shell."""
    from gradwire.bench.provenance import script_command

    assert script_command(["/abs/benchmarks/ddp_hooks.py", "--hooks", "a b"]) == (
        "python benchmarks/ddp_hooks.py --hooks 'a b'")
    assert script_command(["topk_select.py"]) == "python benchmarks/topk_select.py"


def test_builtin_listed_in_algo_runs_once_where_it_is_listed(monkeypatch, tmp_path):
    """`--algo ring,builtin` failed on the host ("unknown allreduce algorithm 'builtin'")
    and, with the default baseline on, would have run torch.distributed's twice."""
    from rich.console import Console

    from gradwire.bench import run as bench_run
    from gradwire.cluster import loopback_cluster

    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))  # no calibration of this machine's
    sent = []
    monkeypatch.setattr(bench_run, "run_ranks", lambda c, mod, args, *a, **k: sent.append(
        json.loads(args[args.index("--algos") + 1])) or [])
    specs = parse_specs("allreduce", "ring,builtin")
    bench_run.run_bench(loopback_cluster(2), "allreduce", specs, [1024], ["float32"], 1, 0, {},
                        True, 60, Console(file=open(tmp_path / "out.txt", "w")))
    assert [(r["label"], r["params"]) for r in sent[0]][1] == ("builtin", {})
    assert [r["label"] for r in sent[0]] == ["ring", "builtin"]
