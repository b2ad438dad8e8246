"""Edges of checkpoints and --resume: a checkpoint of other data (the text models read this
Python's standard library), a checkpoint path that is a pipe or a link, and --epochs' bound.
Every refusal is one line on the host, before any cluster or rank starts."""

import os
import signal
import sys

import pytest
from conftest import cli_error

LSTM = ["--loopback", "--hosts", "2", "--model", "lstm", "--epochs", "2"]
QUICK = ["--loopback", "--hosts", "2", "--model", "mlp-small", "--batch-size", "64"]
SETTINGS = {"model": "lstm", "agg": "dense", "density": 0.001, "mode": "bucket", "warmup": True,
            "world_size": 2, "batch_size": 32, "lr": 0.05, "momentum": 0.9, "seed": 0,
            "seq_len": 64, "rank": None}


def _vocabulary() -> int:
    from gradwire.models import get_spec
    from gradwire.models.task import load_task

    return load_task(get_spec("lstm"), 0, 64).classes


def _lstm_checkpoint(path, classes: int, data: dict | None, world: int = 2) -> None:
    """What the worker saves after epoch 1 of an lstm run, its vocabulary ``classes`` wide;
    ``data``: the data settings it recorded (None: a checkpoint from before they were kept)."""
    from gradwire.models import build_model
    from gradwire.models.task import optimizer
    from gradwire.train import checkpoint

    model = build_model("lstm", 0, classes)
    opt = optimizer(model.parameters(), 0.05, 0.9)
    checkpoint.save(path, {"epoch": 1, "settings": SETTINGS | (data or {}),
                           "model": model.state_dict(), "optimizer": opt.state_dict(),
                           "aggregation": [{}] * world, "history": {}})


@pytest.mark.parametrize("case", ["other vocabulary", "other text", "older checkpoint"])
def test_an_lstm_checkpoint_of_another_python_is_refused_before_any_rank(
        monkeypatch, capsys, tmp_path, no_cluster, case):
    """Another Python's standard library has other bytes: another vocabulary (the model's
    embedding and decoder of another size: every rank's load_state_dict failed with a
    traceback once the cluster was up), or the same vocabulary size over other text (which
    resumed, silently, on other data). Refused on the host, naming what differs; so does each
    rank under plain torchrun."""
    from gradwire.train import worker

    ours = _vocabulary()
    ck = tmp_path / "ck.pt"
    if case == "other vocabulary":
        _lstm_checkpoint(ck, ours - 1, {"classes": ours - 1, "data": "text sha256:0123456789abcdef",
                                        "python": "3.0.1"})
        says = (f"made with classes={ours - 1}, this run has {ours} (its data were read under "
                f"Python 3.0.1, this run's under {sys.version.split()[0]}")
    elif case == "other text":
        _lstm_checkpoint(ck, ours, {"classes": ours, "data": "text sha256:0123456789abcdef",
                                    "python": sys.version.split()[0]})
        says = "made with data='text sha256:0123456789abcdef', this run has 'text sha256:"
    else:
        _lstm_checkpoint(ck, ours - 1, None)
        says = (f"the checkpoint's 'embed.weight' is [{ours - 1}, 64], this run's model has "
                f"[{ours}, 64]")
    code, err = cli_error(monkeypatch, capsys, "train", *LSTM, "--resume", "--checkpoint",
                          str(ck))
    assert code == 2 and says in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        worker.parse_args(["--model", "lstm", "--epochs", "2", "--resume",
                           f"--checkpoint={ck}"])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_a_checkpoint_short_of_a_rank_s_state_is_refused_before_any_rank(
        monkeypatch, capsys, tmp_path, no_cluster):
    """Each rank loads its own aggregation state (ck["aggregation"][rank]): a file with fewer
    than its world size was an IndexError traceback in the ranks it lacked."""
    from gradwire.train import checkpoint

    ck = tmp_path / "ck.pt"
    _lstm_checkpoint(ck, _vocabulary(), None, world=1)
    code, err = cli_error(monkeypatch, capsys, "train", *LSTM, "--resume", "--checkpoint",
                          str(ck))
    assert code == 2 and "holds 1 ranks' aggregation states, expected 2 (its world_size)" in err
    with pytest.raises(checkpoint.GradwireError, match="holds 1 ranks' aggregation states"):
        checkpoint.check_state(checkpoint.load(ck), _lstm_model())


def _lstm_model():
    from gradwire.models import build_model

    return build_model("lstm", 0, _vocabulary())


def test_resume_from_a_pipe_is_refused_not_waited_on(monkeypatch, capsys, tmp_path, no_cluster):
    """`--resume --checkpoint PIPE`: torch.load opened it and waited for a writer for ever,
    before --checkpoint's own check (which refuses a pipe) ran."""
    fifo = tmp_path / "ck.pt"
    os.mkfifo(fifo)

    def waited(signum, frame):
        raise TimeoutError("--resume waited on the pipe")

    old = signal.signal(signal.SIGALRM, waited)
    signal.alarm(10)
    try:
        code, err = cli_error(monkeypatch, capsys, *["train", *QUICK, "--resume",
                                                     "--checkpoint", str(fifo)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert code == 2 and f"--resume: '{fifo}' is not a regular file" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_checkpoint_behind_a_link_keeps_the_link(tmp_path):
    """As every other gradwire output: the file a link names is replaced whole and the link
    stays (it was replaced by a file, and the linked file went stale, one epoch behind)."""
    from gradwire.train import checkpoint

    (tmp_path / "store").mkdir()
    real, link = tmp_path / "store" / "ck.pt", tmp_path / "ck.pt"
    link.symlink_to(real)
    whole = {"settings": {}, "model": {}, "optimizer": {}, "aggregation": [], "history": {}}
    for epoch in (1, 2):
        checkpoint.save(link, {"epoch": epoch, **whole})
    assert link.is_symlink() and checkpoint.load(real)["epoch"] == 2
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ck.pt", "ck.pt", "store"]


@pytest.mark.parametrize("command", [["train", *QUICK], ["demo", "--loopback", "--hosts", "2"]])
def test_epochs_have_an_upper_bound(monkeypatch, capsys, no_cluster, command):
    """--epochs 10**12 is a typo: it started a run that never ends (and each rank, under
    plain torchrun, took it too)."""
    from gradwire.train import worker

    code, err = cli_error(monkeypatch, capsys, *command, "--epochs", str(10**12))
    assert code == 2 and f"--epochs must be at most 10000, got {10**12}" in err, err
    assert len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        worker.parse_args(["--model", "mlp-small", "--batch-size", "64", "--epochs", "10001"])
    assert e.value.code == 2 and "--epochs must be at most 10000, got 10001" in (
        capsys.readouterr().err)


@pytest.mark.parametrize("saved, run, refused", [
    ({"agg": "powersgd", "rank": None}, {"agg": "powersgd", "rank": 4}, None),
    ({"agg": "powersgd", "rank": 4}, {"agg": "powersgd", "rank": None}, None),
    ({"agg": "powersgd", "rank": 2}, {"agg": "powersgd", "rank": None}, "rank=2, this run has 4"),
    ({"agg": "dense", "density": 0.01, "warmup": False}, {"agg": "dense"}, None),
    ({"agg": "powersgd", "density": 0.01}, {"agg": "powersgd"}, None),
    ({"agg": "topk", "density": 0.01}, {"agg": "topk"}, "density=0.01, this run has 0.001"),
    ({"agg": "topk", "warmup": False}, {"agg": "topk"}, "warmup=False, this run has True"),
    ({"model": "mlp", "seq_len": 32}, {"model": "mlp"}, None),
    ({"seq_len": 32}, {}, "seq_len=32, this run has 64"),
])
def test_a_resume_compares_only_the_settings_the_run_uses(saved, run, refused):
    """A PowerSGD run with --rank left out resumes a checkpoint made with --rank 4 (its
    default), and a method that takes no density (or a model that reads no text) resumes one
    made with another density, warm-up (sequence length): each was refused, naming a setting
    the run never used. What the run does use is still compared."""
    from gradwire.train import checkpoint

    ck = {"settings": SETTINGS | saved, "epoch": 1}
    if refused is None:
        checkpoint.check_compatible(ck, SETTINGS | run, 2)
    else:
        with pytest.raises(checkpoint.GradwireError, match=refused):
            checkpoint.check_compatible(ck, SETTINGS | run, 2)


@pytest.mark.parametrize("kind", ["checkpoint", "other file", "dangling link"])
def test_a_new_run_does_not_replace_an_existing_checkpoint(monkeypatch, capsys, tmp_path,
                                                           no_cluster, kind):
    """`gradwire train --checkpoint F` without --resume replaced an existing F after its
    first epoch: a run that forgot --resume lost the one it meant to go on from. Refused in
    one line on the host, and by each rank under plain torchrun; --resume still reads it."""
    from gradwire.train import worker

    ck = tmp_path / "ck.pt"
    if kind == "checkpoint":
        _lstm_checkpoint(ck, _vocabulary(), None)
    elif kind == "other file":
        ck.write_text("results")
    else:
        ck.symlink_to(tmp_path / "gone.pt")
    says = f"--checkpoint {str(ck)!r} exists, and a new run would replace it"
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--checkpoint", str(ck))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        worker.parse_args(["--model", "mlp-small", f"--checkpoint={ck}"])
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert kind != "other file" or ck.read_text() == "results"
