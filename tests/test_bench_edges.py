"""Edges of gradwire bench, calibrate and the performance-model validation: result files
replaced whole when a write fails half way, and bad inputs refused in one line before any
work starts."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import calibration_doc
import pytest

from gradwire.errors import GradwireError

TESTS = Path(__file__).parent
LIMIT = 512  # bytes a process may write to one file in the tests below: a disk that fills


def write_with_full_disk(code: str, path: Path) -> str:
    """Run ``code`` (which writes ``path``, a result larger than ``LIMIT``) in a process
    that may write no file past ``LIMIT`` bytes, as a full disk would stop it; its stdout."""
    prelude = textwrap.dedent(f"""
        import resource, signal, sys
        sys.path.insert(0, {str(TESTS)!r})
        def full_disk():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, hard))
        path = {str(path)!r}
    """)
    p = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_a_validation_result_that_fails_half_way_leaves_the_one_that_was_there(tmp_path):
    """benchmarks/perf_validation.py writes its result after every cluster and at the end,
    over the committed latest.json by default: a write that fails half way (a full disk, a
    Ctrl-C) must leave the earlier result whole, as every other result file is replaced."""
    out = tmp_path / "latest.json"
    earlier = '{"rows": [], "earlier": true}\n'
    out.write_text(earlier)
    said = write_with_full_disk("""
        from pathlib import Path
        from gradwire.bench.validation.report import dump
        full_disk()
        try:
            dump({"rows": ["a measured row"] * 200}, Path(path))
        except OSError as e:
            print("failed", e.errno)
    """, out)
    assert said.startswith("failed")
    assert out.read_text() == earlier
    assert [p.name for p in tmp_path.iterdir()] == ["latest.json"]


def test_a_calibration_that_fails_half_way_leaves_the_one_that_was_there(tmp_path):
    """gradwire calibrate saves over the calibration gradwire bench and advise read: a save
    that fails half way must leave the earlier file whole (a half-written one makes every
    later bench fail on it)."""
    out = tmp_path / "1gbit.json"
    assert len(json.dumps(calibration_doc.doc())) > LIMIT  # the new file would not fit
    out.write_text("{}\n")
    said = write_with_full_disk("""
        import contextlib, os, types
        from pathlib import Path
        from rich.console import Console
        import calibration_doc
        import gradwire.jobs
        from gradwire.bench import calibrate as cal

        gradwire.jobs.run_ranks = lambda *a, **k: calibration_doc.doc()
        cluster = types.SimpleNamespace(link_key="1gbit", label="test", burst_bytes=5e5)
        full_disk()
        try:
            cal.calibrate(lambda: contextlib.nullcontext(cluster), Path(path), [], "test", 60,
                          Console(file=open(os.devnull, "w")))
        except Exception as e:  # the write's OSError, or the one-line error made of it
            print("failed", e)
    """, out)
    assert said.startswith("failed")
    assert out.read_text() == "{}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["1gbit.json"]


def test_a_calibration_is_saved_whole(tmp_path):
    """The save that replaces a file whole still writes the calibration, and nothing beside
    it."""
    import contextlib
    import types

    from rich.console import Console

    import gradwire.jobs
    from gradwire.bench import calibrate as cal
    from gradwire.perf import calibration

    out = tmp_path / "c.json"
    out.write_text("{}\n")
    cluster = types.SimpleNamespace(link_key="1gbit", label="test", burst_bytes=5e5)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(gradwire.jobs, "run_ranks", lambda *a, **k: calibration_doc.doc())
        got, path = cal.calibrate(lambda: contextlib.nullcontext(cluster), out, [], "test", 60,
                                  Console(file=open(tmp_path / "log.txt", "w")))
    assert path == out
    assert calibration.load(out).to_json() == got.to_json()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "log.txt"]


def test_calibrate_on_a_live_cluster_of_one_host_is_refused_before_it_starts(monkeypatch,
                                                                            capsys):
    """calibrate needs two ranks: with --cluster the ranks are the live cluster's hosts, not
    --hosts (whose default, 2, passed), so a one-host cluster started every step on the
    cluster before its rank failed."""
    import types

    from conftest import Started, run_cli

    from gradwire.bench import calibrate as cal
    from gradwire.cli import options

    one = types.SimpleNamespace(name="gw00abcd", hosts=["h0"])
    monkeypatch.setattr(options, "live_cluster", lambda name: one)

    def started(*a, **k):
        raise Started

    monkeypatch.setattr(cal, "calibrate", started)
    code, _, err = run_cli(monkeypatch, capsys, ["calibrate", "--cluster", "gw00abcd",
                                                 "--device", "cpu"], started=(Started,))
    assert code == 2 and err.count("\n") == 1, err
    assert "calibrate needs 2 or more hosts" in err and "gw00abcd has 1" in err


@pytest.mark.parametrize("workers", ["2,251", "300"])
def test_validation_refuses_more_workers_than_a_cluster_holds_before_anything_runs(workers):
    """--workers past what an emulated cluster holds (250 hosts) failed only when its cluster
    was made, after every earlier configuration's calibration and training, and then named
    --hosts, an option the script does not have."""
    from gradwire.bench import validation as pv

    with pytest.raises(GradwireError,
                       match=r"--workers: each P must be at most 250 .*, got (251|300)$"):
        pv.parse_plan("1gbit", workers, "dense")
    assert pv.parse_plan("1gbit", "2,250", "dense").workers == [2, 250]


def test_a_calibration_that_cannot_be_saved_is_one_line_and_kept_elsewhere(monkeypatch, capsys,
                                                                          tmp_path):
    """A disk that fills (or a folder that goes) during calibrate's minutes of measuring:
    one line saying so and where the calibration went instead, as every command's result
    does, not a traceback and the measurement lost."""
    import errno

    from conftest import run_cli

    import gradwire.jobs
    from gradwire.perf import calibration

    def full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gradwire.jobs, "run_ranks", lambda *a, **k: calibration_doc.doc())
    monkeypatch.setattr(calibration.Calibration, "save", full)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "cal.json"
    code, _, err = run_cli(monkeypatch, capsys, ["calibrate", "--loopback", "--device", "cpu",
                                                 "--out", str(out)])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"could not write {out} (No space left on device); result saved to " in err
    kept = Path(err.split("result saved to ")[1].strip())
    assert kept.parent == tmp_path and not out.exists()
    assert calibration.load(kept).to_json()["alpha_s"] == calibration_doc.doc()["alpha_s"]


def test_bench_prices_with_a_calibration_of_its_own_kind_of_device(monkeypatch, tmp_path):
    """A GPU's calibration ran over NCCL, whose α and γ are not gloo's on the CPU: `bench
    --device cpu` on the same links prices with nominal terms and says why, and a GPU bench
    uses it."""
    from gradwire.bench import calibrate
    from gradwire.bench.run import model_params
    from gradwire.cluster.state import Cluster, Host

    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))
    path = calibrate.calibration_path("1gbit")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(calibration_doc.doc(device="NVIDIA H200", backend="nccl",
                                                   alpha_s=7e-6)))
    cluster = Cluster("gw0bb0c4", 1e9, [Host(0, "gw0bb0c4-h0", "10.213.9.1", "eth0")])
    params, source = model_params(cluster, "cpu")
    assert params.alpha != 7e-6
    assert source.startswith("nominal") and "taken on NVIDIA H200" in source
    params, source = model_params(cluster, "cuda")
    assert params.alpha == 7e-6 and source.startswith("calibrated")
