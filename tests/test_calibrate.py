"""gradwire calibrate's rank side under plain torchrun, and the calibration file's loader."""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import quick_resnet20

from gradwire import profiles
from gradwire.catalogue import METHODS
from gradwire.errors import GradwireError
from gradwire.launcher import free_port
from gradwire.perf import calibration, codecs
from gradwire.perf.calibration import Calibration, Coding, CpuTerms, Overlap


def _torchrun(out, nproc: int, model: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "gradwire.bench.calibrate", "--out", str(out), "--model", model, *args]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


def _check_sane(cal: Calibration, path, device: str, model: str) -> None:
    """Every field of a P = 2 run on one node, as a user would rely on it; ``model``: resnet20's
    profile, by name or file."""
    assert cal.world == 2 and cal.alpha_s > 0
    assert cal.alpha_call_s == pytest.approx(2 * cal.alpha_s)  # a ring of 2: 2 steps
    assert cal.beta_s_per_byte > 0 and cal.gamma_s_per_byte > 0
    assert cal.overlap_slowdown >= 1 and cal.overlap.backward_s > 0
    assert cal.coding_slowdown == pytest.approx(
        cal.coding.together_s / (cal.coding.backward_s + cal.coding.encode_s))
    assert set(cal.codecs.methods) == set(METHODS)
    assert cal.codecs.numel == profiles.load("resnet20").numel  # smaller than one bucket
    assert cal.codecs.methods["topk"]["params"] == {"density": 0.001}
    assert cal.codecs.methods["powersgd"]["params"] == {"rank": 4}
    assert cal.codecs.methods["powersgd"]["encode_s"] > 0
    assert "decode_fixed_s" in cal.codecs.methods["signsgd"]
    assert "local work" in cal.codecs.source
    assert cal.model == model and cal.device == device
    # the executor's α and the compute slowdown, on a stand-in of resnet20's size
    assert cal.alpha_transport_s > 0 and cal.compute_slowdown >= 1
    assert cal.compute.alone_s > 0 and cal.compute.together_s > 0
    assert "x2 hidden" in cal.compute.model
    # the half-precision reductions, timed on the backend: never faster than fp32's γ
    assert cal.reduce.nbytes > 0 and cal.reduce.float16_s > 0 and cal.reduce.bfloat16_s > 0
    assert set(cal.gamma_dtype()) == {"float16", "bfloat16"}
    assert min(cal.gamma_dtype().values()) >= cal.gamma_s_per_byte
    # whatif/advise --codecs FILE read the same table
    assert codecs.load(str(path)).methods == cal.codecs.methods


def test_rank_side_under_plain_torchrun(tmp_path):
    out, model = tmp_path / "cal.json", str(quick_resnet20(tmp_path))
    p = _torchrun(out, 2, model, "--device", "cpu")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cal = calibration.load(out)
    _check_sane(cal, out, "cpu", model)
    assert (cal.backend, cal.ranks_per_node, cal.nodes) == ("gloo", 2, 1)
    assert cal.beta_between == "ranks of one node" and cal.beta_intra_s_per_byte is None
    # CPU ranks of one machine: the shared-CPU terms, both ranks on it
    assert cal.cpu is not None and cal.cpu.cpu_ranks_per_machine == 2
    assert 0 < cal.cpu.cpu_share <= 1 and cal.cpu.cpu_slowdown >= 1
    # the CPU per call of the backend's own allreduce and per byte it moves
    assert cal.cpu.cpu_call_s > 0 and cal.cpu.cpu_byte_s >= 0
    assert cal.network is None and cal.burst_bytes == 0
    assert "gradwire.bench.calibrate --out" in cal.command and cal.gradwire
    assert f"wrote {out}" in p.stdout
    # progress: rank 0 alone says what it has measured, step by step, on stderr
    steps = [line for line in p.stderr.splitlines() if line.startswith("gradwire calibrate: ")]
    assert [s.split()[2] for s in steps] == [f"{i}/8" for i in range(1, 9)], p.stderr[-3000:]
    assert "every method's encode and decode" in steps[3]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rank_side_on_cuda(tmp_path):
    """NCCL, buffers on the GPU. Two GPUs: plain torchrun; one: two emulated hosts (each its
    own NCCL host) sharing it."""
    out = tmp_path / "cal.json"
    if torch.cuda.device_count() >= 2:
        p = _torchrun(out, 2, "resnet20", "--device", "cuda")
    else:
        p = subprocess.run([sys.executable, "-m", "gradwire.cli", "calibrate", "--loopback",
                            "--hosts", "2", "--device", "cuda", "--model", "resnet20",
                            "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cal = calibration.load(out)
    _check_sane(cal, out, torch.cuda.get_device_name(), "resnet20")
    assert cal.backend == "nccl" and cal.cpu is None


def test_the_codec_probe_times_each_method_s_local_work():
    """No hook, no process group: each method's compressor, with the catalogue's parameters,
    and the passes of error feedback around it."""
    import torch.distributed as dist

    from gradwire.bench import codec_probe

    doc = codec_probe.measure(1000, repeats=1, density=0.01, rank=2)
    assert set(doc["methods"]) == set(METHODS) and "local work" in doc["source"]
    passes = codec_probe.feedback_passes(torch.ones(1000), 1, torch.device("cpu"))
    assert set(passes) == {"status", "add"} and all(v > 0 for v in passes.values())
    assert doc["methods"]["dense"] == {"params": {}, "encode_s": 0.0, "decode_s": 0.0}
    assert doc["methods"]["gtopk"]["params"] == {"density": 0.01}
    assert doc["methods"]["powersgd"]["params"] == {"rank": 2}
    assert doc["methods"]["signsgd"]["decode_fixed_s"] >= 0  # the vote: fixed + per rank
    # the sparse aggregations: Top-k sums every rank's entries, gTop-k merges per level
    assert doc["methods"]["topk"]["decode_rank_s"] >= 0 and "merge_s" not in doc["methods"]["topk"]
    assert doc["methods"]["gtopk"]["merge_s"] > 0 and doc["methods"]["gtopk"]["decode_s"] > 0
    assert all(m["encode_s"] > 0 for n, m in doc["methods"].items() if n != "dense")
    assert not dist.is_initialized()


def test_the_codec_probe_times_each_call_from_memory(monkeypatch):
    """Every timed call whose time is kept comes after a write over twice the last-level
    cache: a hook finds its bucket and residual in memory, not in a cache warm from the call
    before. The warm-up call of each series, whose time is dropped, needs none."""
    from gradwire.bench import codec_probe

    calls = []  # per timed call: whether the cache was flushed just before it
    real = codec_probe._timed
    monkeypatch.setattr(codec_probe, "_timed", lambda fn, dev, flush=None: (
        calls.append(flush is not None), real(fn, dev, flush))[1])
    flushes, syncs = [], []
    flush = codec_probe.Flush.__call__
    monkeypatch.setattr(codec_probe.Flush, "__call__",
                        lambda self: (flushes.append(len(syncs)), flush(self)))
    sync = codec_probe.sync
    monkeypatch.setattr(codec_probe, "sync", lambda dev: (syncs.append(1), sync(dev)))
    doc = codec_probe.measure(1000, repeats=2, density=0.01, rank=2)
    # each series is a warm-up and 2 kept calls; _timed syncs twice per call, the flush just
    # before the first
    assert len(calls) % 3 == 0 and sum(calls) == 2 * len(calls) // 3
    assert len(syncs) == 2 * len(calls) and len(flushes) == sum(calls)
    assert all(i % 2 == 0 for i in flushes)
    assert "cache flush" in doc["source"]
    assert codec_probe.Flush(torch.device("cpu")).nbytes == 2 * codec_probe.cache_bytes(
        torch.device("cpu"))


def test_the_last_level_cache_is_read_from_sysfs(tmp_path):
    from gradwire.bench.codec_probe import cpu_cache_bytes

    for index, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "32M\n")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size)
    assert cpu_cache_bytes(tmp_path) == 32 * 2**20
    (tmp_path / "index4").mkdir()
    (tmp_path / "index4" / "size").write_text("unknown")  # skipped, not an error
    assert cpu_cache_bytes(tmp_path) == 32 * 2**20
    assert cpu_cache_bytes(tmp_path / "missing") is None


def _good() -> dict:
    table = codecs.CodecTable("t", 1000, {"dense": {"params": {}, "encode_s": 0.0,
                                                    "decode_s": 0.0},
                                          "topk": {"params": {"density": 0.01},
                                                   "encode_s": 1e-3, "decode_s": 1e-4}}, "s")
    return Calibration(
        alpha_s=5e-5, alpha_call_s=1e-4, beta_s_per_byte=1e-9, beta_between="nodes",
        beta_intra_s_per_byte=None, gamma_s_per_byte=1e-10, overlap_slowdown=1.2,
        overlap=Overlap("mlp", 0.05, 0.06, 26214400), coding_slowdown=1.1,
        coding=Coding("topk", 1000, 0.05, 0.01, 0.066), codecs=table,
        cpu=CpuTerms(2, 2, 1e-4, 1e-10, 0.9, 1e-3, 1e-3, 1.1), world=2, ranks_per_node=1,
        nodes=2, backend="gloo", device="cpu", model="resnet20", gradwire="0.1.0",
        commit="abc", machine="m", command="c", date="d").to_json()


def test_a_saved_calibration_reads_back_the_same(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_good()))
    cal = calibration.load(path)
    assert cal.to_json() == _good() and cal.cpu.cpu_share == 0.9
    assert cal.codecs.seconds("topk", 2000, 2) == (2e-3, 2e-4)


@pytest.mark.parametrize(("change", "msg"), [
    (None, "No such file or directory"),
    ({"format": None}, "written by an older gradwire calibrate (it has no 'format' field): "
                       "run `gradwire calibrate` again"),
    ({"format": 3}, "field 'format' must be 2, got 3"),
    ({"alpha_s": None}, "field 'alpha_s' is missing (expected a number of seconds > 0)"),
    ({"beta_s_per_byte": -1e-9}, "field 'beta_s_per_byte' must be a number of seconds > 0, "
                                 "got -1e-09"),
    ({"gamma_s_per_byte": "fast"}, "field 'gamma_s_per_byte' must be a number of seconds"),
    ({"overlap_slowdown": 0.5}, "field 'overlap_slowdown' must be a number >= 1, got 0.5"),
    ({"beta_between": "racks"}, "field 'beta_between' must be one of 'nodes', 'ranks of one"),
    ({"world": 1}, "field 'world' must be an integer >= 2, got 1"),
    ({"overlap": {"model": "m", "backward_s": 0.1}}, "field 'overlap.with_comm_s' is missing"),
    ({"cpu": {**_good()["cpu"], "cpu_share": 2}}, "field 'cpu.cpu_share' must be a number > 0 "
                                                  "and <= 1, got 2"),
    ({"codecs": {**_good()["codecs"], "methods": {"topk": {"encode_s": -1, "decode_s": 0}}}},
     "field 'codecs.methods.topk.encode_s' must be a number of seconds >= 0, got -1"),
    ({"alpha_ss": 1}, "unknown field 'alpha_ss' (did you mean 'alpha_s'?)"),
    ({"compute_slowdown": 0.5}, "field 'compute_slowdown' must be a number >= 1, got 0.5"),
    ({"alpha_transport_s": 0}, "field 'alpha_transport_s' must be a number of seconds > 0"),
    ({"compute": {"model": "m", "alone_s": 0.1}}, "field 'compute.together_s' is missing"),
    ({"reduce": {"nbytes": 4, "float32_s": 1, "float16_s": 2, "bfloat16_s": -2}},
     "field 'reduce.bfloat16_s' must be a number of seconds > 0, got -2"),
    # γ of half precision derived from the reduce times: bounded as gamma_s_per_byte is
    ({"reduce": {"nbytes": 4, "float32_s": 1e-9, "float16_s": 1e3, "bfloat16_s": 1e-9}},
     "field 'reduce.float16_s' makes the float16 γ 5e+11 ns per byte, expected at most 1000"),
])
def test_load_refuses_a_bad_file_in_one_line(tmp_path, change, msg):
    path = tmp_path / "c.json"
    if change is not None:
        doc = _good()
        for key, value in change.items():
            if value is None:
                doc.pop(key)
            else:
                doc[key] = value
        path.write_text(json.dumps(doc))
    with pytest.raises(GradwireError) as e:
        calibration.load(path)
    assert str(e.value).startswith(f"calibration file {path}")
    assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_file_without_the_executor_s_alpha_or_the_compute_slowdown_reads(tmp_path):
    """Written before those terms were measured: the backend's α and the profile's compute."""
    path = tmp_path / "c.json"
    doc = {k: v for k, v in _good().items()
           if k not in ("alpha_transport_s", "compute_slowdown", "compute")}
    path.write_text(json.dumps(doc))
    cal = calibration.load(path)
    assert cal.alpha_transport_s is None and cal.compute_slowdown == 1 and cal.compute is None
    path.write_text(json.dumps({**doc, "alpha_transport_s": 8e-4, "compute_slowdown": 1.3,
                                "compute": {"model": "m", "alone_s": 0.1, "together_s": 0.13}}))
    cal = calibration.load(path)
    assert (cal.alpha_transport_s, cal.compute_slowdown, cal.compute.together_s) == (
        8e-4, 1.3, 0.13)


def test_a_file_without_the_cpu_per_backend_call_reads_as_zero(tmp_path):
    """Written before the CPU per backend call was measured: 0, so the model charges the
    executor's CPU per step for every call, as it did; a negative one is refused."""
    path = tmp_path / "c.json"
    old = {k: v for k, v in _good()["cpu"].items() if k != "cpu_call_s"}
    path.write_text(json.dumps({**_good(), "cpu": old}))
    assert calibration.load(path).cpu.cpu_call_s == 0
    path.write_text(json.dumps({**_good(), "cpu": {**_good()["cpu"], "cpu_call_s": 9e-4}}))
    assert calibration.load(path).cpu.cpu_call_s == 9e-4
    path.write_text(json.dumps({**_good(), "cpu": {**_good()["cpu"], "cpu_call_s": -1}}))
    with pytest.raises(GradwireError, match="cpu.cpu_call_s") as e:
        calibration.load(path)
    assert "\n" not in str(e.value)


def test_half_precision_reductions_cost_their_extra_time_per_byte_a_rank_reduces(tmp_path):
    """A ring of P ranks reduces (P − 1)/P of the buffer on each; a dtype that takes longer
    than fp32 on the same bytes pays the difference there, one that takes less pays γ."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**_good(), "world": 4, "nodes": 4, "reduce": {
        "nbytes": 2**20, "float32_s": 1e-3, "float16_s": 4e-3, "bfloat16_s": 0.5e-3}}))
    cal = calibration.load(path)
    assert cal.gamma_dtype() == pytest.approx({"float16": 1e-10 + 3e-3 / (0.75 * 2**20),
                                               "bfloat16": 1e-10})
    assert calibration.Calibration(**{**cal.__dict__, "reduce": None}).gamma_dtype() == {}


def test_a_file_of_the_old_format_is_refused(tmp_path):
    """What gradwire calibrate wrote before format 2: flat fields, no "format"."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"alpha_s": 3e-4, "alpha_step_s": 1.6e-3, "beta_s_per_byte": 8e-9,
                                "gamma_s_per_byte": 1e-10, "hosts": 8, "cpu_step_s": 3.5e-4}))
    with pytest.raises(GradwireError, match=r"older gradwire calibrate .* run `gradwire "
                                            r"calibrate` again"):
        calibration.load(path)


def test_the_cli_under_a_launcher_needs_out(monkeypatch, capsys):
    from conftest import cli_error

    for k, v in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(k, v)
    code, err = cli_error(monkeypatch, capsys, "calibrate")
    assert code != 0 and "under a launcher" in err and "needs --out FILE" in err, err
    assert len(err.strip().splitlines()) == 1


def test_the_calibration_table_fits_120_columns_and_names_the_file_whole(monkeypatch):
    """A GPU's name and a long --out path: the table cut the path to "/root/.ca…" at 120
    columns; it is a line of its own now, and the table is whole."""
    from pathlib import Path

    from rich.console import Console

    import gradwire.cli.bench as cli_bench

    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    monkeypatch.setattr(cli_bench, "console", console)
    path = Path("/root/.cache/gradwire/calibration") / ("x" * 90 + ".json")
    cal = calibration.load(Path(__file__).parents[1] / "benchmarks/results/calibration/h200.json")
    cli_bench._show_calibration(cal, path)
    text = console.export_text()
    assert "…" not in text and f"saved to {path}\n" in text
    assert "NVIDIA H200" in text and "2256.3" in text
