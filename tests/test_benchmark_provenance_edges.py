"""Defects of the benchmark scripts: how each records what it measured, and where. Cheap: the
scripts' measurements are replaced by stand-ins (in process), or made to run on tiny sizes."""
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import BENCHMARKS, ROOT, benchmark_argv, load_benchmark

load, argv = load_benchmark, benchmark_argv


# --- hook_equivalence: a comparison that could not fail ------------------------------------
def _equivalence(monkeypatch, tmp_path, before: dict, now: dict, *args: str):
    mod = load("hook_equivalence", monkeypatch)
    monkeypatch.setattr(mod, "fingerprint", lambda args: now)
    argv(monkeypatch, "hook_equivalence.py", *args)
    return mod.main()


def test_hook_equivalence_compares_with_the_file_as_it_was_before_the_run(monkeypatch,
                                                                          tmp_path):
    """--out F --compare F wrote F first and then compared the run with itself: always
    "bit-identical"."""
    f = tmp_path / "fp.json"
    f.write_text(json.dumps({"runs": {"dense bucket": {"sha256": "old", "losses": [2.0]}}}))
    now = {"dense bucket": {"sha256": "new", "losses": [1.0]}}
    assert _equivalence(monkeypatch, tmp_path, {}, now, "--out", str(f), "--compare",
                        str(f)) == 1
    doc = json.loads(f.read_text())
    assert doc["runs"] == now
    # the command as typed from the repository root, not sys.argv joined
    assert doc["command"] == f"python benchmarks/hook_equivalence.py --out {f} --compare {f}"


def test_hook_equivalence_fails_where_a_run_of_the_earlier_file_is_missing(monkeypatch,
                                                                           tmp_path, capsys):
    f = tmp_path / "before.json"
    same = {"sha256": "s", "losses": [1.0]}
    f.write_text(json.dumps({"runs": {"dense bucket": same, "qsgd bucket": same}}))
    assert _equivalence(monkeypatch, tmp_path, {}, {"dense bucket": same},
                        "--compare", str(f)) == 1
    assert "MISSING qsgd bucket" in capsys.readouterr().out


# --- gpu_hot_path.sh: a failed step sent back the old result -------------------------------
def _hot_path(tmp_path, size: str) -> tuple[Path, Path]:
    results, out = tmp_path / "results", tmp_path / "out"
    old = results / "topk_select" / "dry.json"
    old.parent.mkdir(parents=True)
    old.write_text('{"stale": true}\n')
    env = {**os.environ, "DEVICE": "cpu", "TAG": "dry", "SIZE": size, "RESULTS": str(results),
           "OUT": str(out), "STEPS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(["sh", str(BENCHMARKS / "gpu_hot_path.sh")], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    return old, out / "topk_select_dry.json"


def test_gpu_hot_path_does_not_send_back_a_result_its_failed_step_did_not_write(tmp_path):
    old, sent = _hot_path(tmp_path, "not-a-number")  # topk_select.py refuses it
    assert not sent.exists()
    assert json.loads(old.read_text()) == {"stale": True}  # put back as it was


def test_gpu_hot_path_sends_back_what_its_step_wrote(tmp_path):
    old, sent = _hot_path(tmp_path, "1000")
    assert "stale" not in json.loads(sent.read_text()) and sent.read_text() == old.read_text()
    assert not old.with_name("dry.json.before-step").exists()


# --- collectives: parts, their machine, contention -----------------------------------------
def _collectives_file(tmp_path) -> Path:
    out = tmp_path / "coll.json"
    out.write_text(json.dumps({"calibration": {"alpha_s": 1e-4, "beta_s_per_byte": 8e-9,
                                               "gamma_s_per_byte": 1e-10},
                               "command": "python benchmarks/collectives.py",
                               "machine": "the earlier machine"}))
    return out


def test_collectives_refuses_a_part_it_does_not_have(tmp_path):
    """A misspelt part ran nothing and restamped the file with that command."""
    out = _collectives_file(tmp_path)
    before = out.read_text()
    r = subprocess.run([sys.executable, str(BENCHMARKS / "collectives.py"), "--parts", "rign",
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--parts" in r.stderr
    assert out.read_text() == before


def test_collectives_part_records_its_machine_and_the_note_every_contended_size(monkeypatch,
                                                                                 tmp_path):
    """A part rerun alone recorded date, command and commit but not its machine, while the
    file's machine became the rerun's; on 2 cores the note called only P=8 contended, though
    the ring's and the model's P=4 has 4 ranks on 2 cores too."""
    mod = load("collectives", monkeypatch)
    monkeypatch.setattr(mod, "part_ring", lambda home: {"by_world_size": {}})
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    out = _collectives_file(tmp_path)
    argv(monkeypatch, "collectives.py", "--parts", "ring", "--out", str(out))
    mod.main()
    doc = json.loads(out.read_text())
    assert doc["ring"]["machine"] == mod.provenance.machine()
    assert "P=4" in doc["note"] and "P=8" in doc["note"]
    assert "contention" not in mod.note(16)


# --- compress_speed: one part restamped the other ------------------------------------------
SELECTION = {"numel": 10, "k": 1, "torch_topk_ms": 1.0, "threshold_ms": 0.5, "speedup": 2.0,
             "recall": 1.0}
ROWS = [{"method": "fp16", "params": {}, "encode_ms": 1.0, "decode_ms": 1.0, "wire_bytes": 20,
         "compression": 2.0}]


def _compress_speed(monkeypatch, tmp_path, parts: str) -> dict:
    mod = load("compress_speed", monkeypatch)
    monkeypatch.setattr(mod, "topk_selection", lambda *a: dict(SELECTION))
    monkeypatch.setattr(mod, "encode_decode", lambda *a: list(ROWS))
    out = tmp_path / "cs.json"
    if not out.exists():
        out.write_text(json.dumps({"command": "python benchmarks/compress_speed.py",
                                   "date": "earlier", "machine": "m", "commit": "c",
                                   "threads": 2, "topk_selection": dict(SELECTION),
                                   "rows": ROWS}))
    argv(monkeypatch, "compress_speed.py", "--parts", parts, "--out", str(out))
    mod.main()
    return json.loads(out.read_text())


def test_compress_speed_part_a_alone_leaves_table_b_its_own_stamp(monkeypatch, tmp_path):
    doc = _compress_speed(monkeypatch, tmp_path, "a")
    assert doc["command"] == "python benchmarks/compress_speed.py"  # table (b)'s, as it was
    assert doc["date"] == "earlier"
    assert doc["topk_selection"]["command"].endswith("--parts a --out " + str(tmp_path / "cs.json"))


def test_compress_speed_part_b_alone_leaves_selection_its_earlier_stamp(monkeypatch, tmp_path):
    doc = _compress_speed(monkeypatch, tmp_path, "b")
    assert "--parts b" in doc["command"]
    assert doc["topk_selection"]["command"] == "python benchmarks/compress_speed.py"
    assert doc["topk_selection"]["date"] == "earlier"


# --- notes that said "2 cores" wherever they ran -------------------------------------------
@contextlib.contextmanager
def _cluster(*args, **kwargs):
    yield SimpleNamespace(hosts=[], name="fake", bandwidth_bps=1e9, label="fake")


def _tcp_cc(mod, monkeypatch, out):
    monkeypatch.setattr(mod, "run", lambda home: [])
    argv(monkeypatch, "tcp_cc.py", "--out", str(out))


def _staging(mod, monkeypatch, out):
    monkeypatch.setattr(mod, "run", lambda p, pool, args: {
        "world_size": p, "pool": pool, "time_s": 1.0, "median_minor_faults_per_rank_call": 0})
    argv(monkeypatch, "staging.py", "--rounds", "1", "--out", str(out))


def _tbf_burst(mod, monkeypatch, out):
    monkeypatch.setattr(mod, "ephemeral_cluster", _cluster)
    monkeypatch.setattr(mod, "shape", lambda c, burst: None)
    monkeypatch.setattr(mod, "stream", lambda c, script, n: 1.0)
    monkeypatch.setattr(mod, "bench", lambda c, home: {})
    argv(monkeypatch, "tbf_burst.py", "--out", str(out))


def _tcp_sndbuf(mod, monkeypatch, out):
    monkeypatch.setattr(mod, "ephemeral_cluster", _cluster)
    monkeypatch.setattr(mod, "machine_send_buffer", lambda: 4_000_000)
    monkeypatch.setattr(mod, "host_send_buffer", lambda bps: 500_000)
    monkeypatch.setattr(mod, "bench", lambda *a: {"allreduce ring 4 MiB": 1.0})
    argv(monkeypatch, "tcp_sndbuf.py", "--rounds", "1", "--out", str(out))


@pytest.mark.parametrize("name, setup", [("tcp_cc", _tcp_cc), ("staging", _staging),
                                         ("tbf_burst", _tbf_burst), ("tcp_sndbuf", _tcp_sndbuf)])
@pytest.mark.parametrize("cores, contended", [(16, False), (2, True)])
def test_the_note_says_this_machines_cores_and_contention(monkeypatch, tmp_path, name, setup,
                                                          cores, contended):
    """The note claimed "the machine's 2 cores" (and contention) on every machine, a 16-core
    one included."""
    mod = load(name, monkeypatch)
    out = tmp_path / f"{name}.json"
    setup(mod, monkeypatch, out)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    mod.main()
    note = json.loads(out.read_text())["note"]
    assert f"{cores} cores" in note
    assert ("contention" in note and "no CPU contention" not in note) == contended


def test_the_machine_counts_the_cores_this_process_may_use(monkeypatch):
    """os.cpu_count() counts the machine's cores: a run confined to 2 of 16 (a container,
    taskset) was stamped as a 16-core result."""
    from gradwire.bench import provenance

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert ", 2 cores (of 16), Linux" in provenance.machine()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert ", 1 core (of 16), Linux" in provenance.machine()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert ", 16 cores, Linux" in provenance.machine()
