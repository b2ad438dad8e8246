import inspect
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cli_error, strict_json
from rich.console import Console

from gradwire.cluster import loopback_cluster
from gradwire.jobs import run_ranks
from gradwire.train.job import TrainConfig

QUICK = ["--loopback", "--hosts", "2", "--model", "mlp-small", "--batch-size", "64"]



@pytest.mark.parametrize("args,msg", [
    (["--model", "alexnet"], "unknown model 'alexnet': expected one of mlp, mlp-small, resnet20"),
    (["--agg", "zip"], "unknown aggregation 'zip': expected one of dense, fp16, bf16, topk"),
    (["--agg", "dense,topk"], "--agg takes one method per training run, got 'dense,topk': to "
     "compare several in one table, gradwire demo --agg dense,topk"),
    (["--density", "0"], "--density must be in (0, 1], got 0"),
    (["--density", "1.01"], "--density must be in (0, 1], got 1.01"),
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["--mode", "layer"], "--mode 'layer' is not valid: expected one of bucket, model"),
    (["--momentum", "1"], "--momentum must be in [0, 1), got 1"),
    (["--model", "lstm", "--seq-len", "100000"], "--seq-len must be from 1 to 4096, got 100000"),
    (["--seq-len", "32"], "--seq-len 32 sets a text model's symbols per sample: mlp reads "
     "digits; leave it out"),
    (["--seed", "-1"], "--seed must be from 0 to 4294967295, got -1"),
    (["--batch-size", "5000"], "--batch-size 5000 is larger than a rank's share"),
    (["--resume"], "--resume needs --checkpoint PATH"),
    (["--resume", "--checkpoint", "/nonexistent/ck.pt"], "checkpoint '/nonexistent/ck.pt' does "
     "not exist"),
    (["--bandwidth", "fast"], "bandwidth 'fast' is not valid"),
    (["--hosts", "0"], "Invalid value for '--hosts'"),
    (["--lr", "abc"], "Invalid value for '--lr'"),
    (["--rank", "2"], "--rank is PowerSGD's rank: --agg dense has none (use --agg powersgd)"),
    (["--agg", "powersgd", "--rank", "0"], "--rank (PowerSGD's) must be from 1 to 1024, got 0"),
])
def test_bad_train_input_is_one_line_exit_2_and_builds_nothing(monkeypatch, capsys, builds, args,
                                                               msg):
    code, err = cli_error(monkeypatch, capsys, "train", *args)
    assert code == 2
    assert msg in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert builds == []


def test_resume_refuses_a_checkpoint_of_another_run(monkeypatch, capsys, tmp_path):
    from gradwire.train import checkpoint

    ck = tmp_path / "ck.pt"
    settings = {"model": "mlp-small", "agg": "dense", "density": 0.001, "mode": "bucket",
                "warmup": True, "world_size": 2, "batch_size": 64, "lr": 0.05, "momentum": 0.9,
                "seed": 0, "seq_len": 64}
    whole = {"model": {}, "optimizer": {}, "aggregation": [], "history": {}}
    checkpoint.save(ck, {"epoch": 1, "settings": settings, **whole})
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--hosts", "3", "--resume",
                     "--checkpoint", str(ck))
    assert code == 2 and "made with world_size=2, this run has 3" in err
    # the optimizer's state holds them: a resume would silently keep the saved ones
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--epochs", "3", "--lr", "0.5",
                          "--resume", "--checkpoint", str(ck))
    assert code == 2 and "made with lr=0.05, this run has 0.5" in err
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--epochs", "3", "--momentum",
                          "0", "--resume", "--checkpoint", str(ck))
    assert code == 2 and "made with momentum=0.9, this run has 0.0" in err
    checkpoint.save(ck, {"epoch": 1, "settings": settings})  # a checkpoint's format, no state
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--epochs", "3", "--resume",
                          "--checkpoint", str(ck))
    assert code == 2 and "is not a whole gradwire checkpoint: its 'model' is NoneType" in err
    checkpoint.save(ck, {"epoch": 1, "settings": settings, **whole})
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--epochs", "1", "--resume",
                     "--checkpoint", str(ck))
    assert code == 2 and "already holds 1 epochs; expected --epochs > 1, got 1" in err
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--resume", "--checkpoint",
                     str(tmp_path / "junk.pt"))
    assert code == 2 and "is not a gradwire checkpoint" in err


def test_train_on_loopback_prints_the_table_and_writes_json_and_plot(tmp_path):
    # dense runs through the same command in tests/test_demo.py.
    agg = "gtopk"
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    p = subprocess.run([sys.executable, "-m", "gradwire.cli", "train", *QUICK, "--agg", agg,
                        "--density", "0.05", "--epochs", "2", "--json", str(out),
                        "--plot", str(png)], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert p.returncode == 0, p.stdout + p.stderr
    # piped output fits 120 columns: the wide table wraps its headers in their cells
    assert max(len(line) for line in p.stdout.splitlines()) <= 120
    words = " ".join(p.stdout.split())
    for col in ("samples/s", "loopback, links not shaped"):
        assert col in words
    for col in ("wire", "payload", "compute", "compress", "comm", "acc"):  # headers, wrapped
        assert col in words
    r = json.loads(out.read_text())
    # piped, progress is a line on stderr at each quarter of the iterations, not a bar
    total = r["iterations"]
    quarters = [line for line in p.stderr.splitlines() if line.startswith("gradwire gtopk: ")]
    want = [f"{-(-total * i // 4)}/{total}" for i in (1, 2, 3, 4)]  # the first past each
    assert [q.split()[2] for q in quarters] == want
    assert "━" not in p.stdout + p.stderr
    assert r["agg"] == agg and r["epochs"] == 2 and len(r["loss"]) == len(r["epoch_wall_s"]) == 2
    assert r["wire_tx_bytes_per_iter_per_rank"] is None  # loopback: no per-host counter
    # The second epoch runs at the warm-up's 0.0725 (above --density 0.05): k entries of 8 bytes.
    assert r["density_per_epoch"] == [0.25, 0.0725] and r["steady_epochs"] == 1
    k = -(-r["parameters"] * 725 // 10_000)
    assert r["payload_bytes_per_iter_per_rank"] == 8 * k
    assert r["loss"][-1] < r["loss"][0]
    # one rank's process uses at most every core of the machine for an iteration's wall time
    iteration = r["batch_size_per_rank"] * r["world_size"] / r["samples_per_s"]
    assert 0 < r["cpu_s_per_iter"] <= 1.1 * (os.cpu_count() or 1) * iteration
    # the training thread's part of it: forward, backward and the step, not the hook's work
    assert 0 < r["cpu_main_s_per_iter"] < r["cpu_s_per_iter"]
    # and the hook's thread (coding, its collectives' own work): the three threads' parts add
    # up to no more than the process's
    assert 0 < r["cpu_hook_s_per_iter"]
    assert r["cpu_main_s_per_iter"] + r["cpu_hook_s_per_iter"] <= r["cpu_s_per_iter"] * 1.001
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_piped_progress_is_a_line_per_quarter_or_one_at_the_end(capsys) -> None:
    from gradwire.jobs import _Quarters

    q = _Quarters("bench allreduce")
    for done in range(1, 11):
        q.update(done, 10)
    q.finish()
    counted = _Quarters("emulate ring")
    counted.update(0, None)
    counted.finish()
    out, err = capsys.readouterr()
    assert out == "" and [line.rsplit(" (", 1)[0] for line in err.splitlines()] == [
        "gradwire bench allreduce: 3/10 done", "gradwire bench allreduce: 5/10 done",
        "gradwire bench allreduce: 8/10 done", "gradwire bench allreduce: 10/10 done",
        "gradwire emulate ring: done"]


def _train(cfg: TrainConfig) -> dict:
    return run_ranks(loopback_cluster(2), "gradwire.train.worker", cfg.worker_args(), cfg.agg,
                     120, Console(quiet=True))


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path: Path):
    """Through the launcher, with error feedback and a density warm-up that goes on across
    the resume (every other method and mode, in process: test_doc_promises_training)."""
    cfg = TrainConfig(model="mlp-small", agg="topk", density=0.01, mode="bucket", epochs=2,
                      batch_size=64)
    whole = _train(cfg)
    ck = tmp_path / "ck.pt"
    first = _train(replace(cfg, epochs=1, checkpoint=ck))
    rest = _train(replace(cfg, checkpoint=ck, resume=True))
    assert first["loss"] == whole["loss"][:1]
    for key in ("loss", "test_loss", "test_accuracy", "parameter_checksum", "iterations"):
        assert rest[key] == whole[key], key


def test_powersgd_rank_reaches_the_wire_and_binds_a_resume(monkeypatch, capsys, tmp_path):
    """--rank r: P and Q of r columns each, so rank 2 sends more than rank 1; the label says
    it, and a checkpoint made at one rank refuses to go on at another."""
    ck = tmp_path / "ck.pt"
    cfg = TrainConfig(model="mlp-small", agg="powersgd", epochs=1, batch_size=64, rank=1,
                      checkpoint=ck)
    one, two = _train(cfg), _train(replace(cfg, rank=2, checkpoint=None))
    assert (one["rank"], two["rank"]) == (1, 2)
    assert 0 < one["payload_bytes_per_iter_per_rank"] < two["payload_bytes_per_iter_per_rank"]
    from gradwire.report import method_label

    assert method_label(one) == "powersgd r=1"
    # the default that train's --help and docs/training.md state
    from gradwire.compress import COMPRESSORS

    assert inspect.signature(COMPRESSORS["powersgd"]).parameters["rank"].default == 4
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--agg", "powersgd", "--rank",
                          "2", "--epochs", "2", "--resume", "--checkpoint", str(ck))
    assert code == 2 and "made with rank=1, this run has 2" in err, err


@pytest.mark.parametrize(("agg", "density", "warmup", "epochs", "note"), [
    ("topk", 0.001, True, 1, "topk's warm-up lasts 4 epochs, so 1 epoch ends at density 0.25, "
                             "never 0.001: FIX"),
    ("gtopk", 0.001, True, 4, "gtopk's warm-up lasts 4 epochs, so 4 epochs end at density "
                              "0.004, never 0.001: FIX"),
    ("gtopk", 0.001, True, 5, None),
    ("topk", 0.1, True, 1, "topk's warm-up lasts 1 epoch, so 1 epoch ends at density 0.25, "
                           "never 0.1: FIX"),
    ("topk", 0.1, True, 2, None),
    ("topk", 0.5, True, 1, None),  # above every warm-up density: none
    ("topk", 0.001, False, 1, None),
    ("dense", 0.001, True, 1, None),
    ("powersgd", 0.001, True, 1, None),
])
def test_a_run_that_ends_in_its_warm_up_is_told_and_labelled(agg, density, warmup, epochs,
                                                             note):
    """Before the run, one line where every epoch falls in the warm-up; after it, the row is
    labelled with the density its figures were measured at."""
    from gradwire.hooks.warmup import Warmup
    from gradwire.report import method_label
    from gradwire.train.job import warmup_note

    cfg = TrainConfig(agg=agg, density=density, warmup=warmup, epochs=epochs)
    assert warmup_note(cfg, "FIX") == note
    if agg in ("topk", "gtopk"):
        per_epoch = [Warmup().density(e, density) if warmup else density
                     for e in range(epochs)]
        label = method_label({"agg": agg, "density": density, "density_per_epoch": per_epoch})
        assert label == (f"{agg} ρ={density:g}" if note is None
                         else f"{agg} ρ={per_epoch[-1]:g} warm-up")


@pytest.mark.parametrize("args,msg", [
    (["--lr", "-1"], "--lr must be a finite number > 0, got -1"),
    (["--momentum", "2"], "--momentum must be in [0, 1), got 2"),
    (["--seed", "-1"], "--seed must be from 0 to 4294967295, got -1"),
    (["--model", "vgg16", "--batch-size", "1"], "--batch-size 1 is too small for vgg16"),
    (["--batch-size", "5000"], "--batch-size 5000 is larger than a rank's share"),
    (["--out", "/nonexistent-gw/x.json"], "--out '/nonexistent-gw/x.json'"),
    (["--checkpoint", "/nonexistent-gw/ck.pt"], "--checkpoint '/nonexistent-gw/ck.pt'"),
    (["--resume"], "--resume needs --checkpoint PATH"),
    (["--timeout", "0"], "--timeout must be a number of seconds from 0.001"),
])
def test_the_worker_refuses_what_gradwire_train_refuses(monkeypatch, capsys, args, msg):
    """Under plain torchrun nothing checks the worker's arguments first: each rank refuses
    them in one line before it joins the process group, not with a traceback (the
    optimizer's, numpy's, batch norm's) or once the run is over (an --out it cannot write)."""
    from gradwire.train import worker

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        worker.parse_args(["--model", "mlp-small", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err.strip().splitlines()[-1], err


def test_the_worker_writes_strict_json(monkeypatch, tmp_path):
    """A diverged run's NaN losses are null in the worker's --out, as in gradwire train's
    --json: strict JSON, which other readers take."""
    from gradwire.train import worker

    monkeypatch.setattr(worker.dist, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(worker.dist, "destroy_process_group", lambda *a, **k: None)
    monkeypatch.setattr(worker, "prepare", lambda args: None)
    monkeypatch.setattr(worker, "train",
                        lambda args, prepared: {"loss": [1.0, math.nan], "x": math.inf})
    out = tmp_path / "w.json"
    assert worker.main(["--model", "mlp-small", "--out", str(out)]) == 0
    assert strict_json(out.read_text()) == {"loss": [1.0, None], "x": None}


def test_a_checkpoint_that_cannot_be_written_stops_every_rank_in_one_line(one_rank, capsys,
                                                                          tmp_path):
    """A folder removed during the run: rank 0 says so in one line and every rank exits,
    none left waiting on a barrier for it (which gave each a gloo traceback)."""
    import torch

    from gradwire.train import worker

    class Agg:
        def state_dict(self):
            return {}

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gone = tmp_path / "gone" / "ck.pt"
    with pytest.raises(SystemExit) as e:
        worker.save_checkpoint(str(gone), model, opt, Agg(), {}, 3, {})
    err = capsys.readouterr().err
    assert e.value.code == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith(f"gradwire train: error: cannot write checkpoint '{gone}' after "
                          "epoch 3: ")
    worker.save_checkpoint(str(tmp_path / "ck.pt"), model, opt, Agg(), {}, 3, {})
    assert (tmp_path / "ck.pt").stat().st_size > 0
