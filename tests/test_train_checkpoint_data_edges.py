"""Training, models and data: checkpoints that do not fit a resume, splits that come out
empty, shards outside their world, and a model build that leaves the caller's random stream."""

from __future__ import annotations

import pytest
import torch

from gradwire.data import digits, shard_indices, text
from gradwire.errors import GradwireError
from gradwire.models import build_model

# ---------------------------------------------------------------- data


@pytest.mark.parametrize(("args", "message"), [
    # rank == world was dealt rank 0's samples one iteration on, a duplicate of its shard
    ((10, 2, 2, 0, 0), r"shard_indices: rank must be an integer from 0 to 1 \(world 2\), got 2"),
    # a negative rank was dealt one sample
    ((10, -1, 2, 0, 0), r"rank must be an integer from 0 to 1 \(world 2\), got -1"),
    ((10, 0, 0, 0, 0), r"shard_indices: world must be an integer >= 1, got 0"),  # ZeroDivision
    ((-1, 0, 1, 0, 0), r"shard_indices: n must be an integer >= 0, got -1"),  # RuntimeError
    ((10, 0, 1, -1, 0), r"shard_indices: epoch must be an integer >= 0, got -1"),
])
def test_shard_indices_refuses_a_rank_outside_its_world(args: tuple, message: str) -> None:
    with pytest.raises(GradwireError, match=message):
        shard_indices(*args)


@pytest.mark.parametrize("fraction", [0, 0.0, 1, 1.0, 1.5, -0.1, float("nan")])
def test_digits_and_text_refuse_a_test_fraction_outside_0_1(fraction: float) -> None:
    """1.0 left no training sample, -0.1 tested on 1618 of 1797 digits, 1.5 made a text's
    cut negative (half and half): each silently."""
    with pytest.raises(GradwireError, match=r"digits: test_fraction must be a number in "
                                            r"\(0, 1\), got "):
        digits(0, fraction)
    with pytest.raises(GradwireError, match=r"text: test_fraction must be a number in "
                                            r"\(0, 1\), got "):
        text(64, 100_000, fraction)


def test_splits_left_empty_are_refused() -> None:
    """A test split too short for one window (or a fraction too small for one digit) was an
    empty split, which evaluate scored as loss 0 and accuracy 0."""
    with pytest.raises(GradwireError, match=r"text: the test split's 50 symbols hold no window "
                                            r"of seq_len 64: expected a larger budget \(got "
                                            r"500\)"):
        text(64, 500)
    with pytest.raises(GradwireError, match=r"text: the training split's \d+ symbols hold no "
                                            r"window of seq_len 4096"):
        text(4096, 1000)
    with pytest.raises(GradwireError, match=r"digits: test_fraction 0.0001 of 1797 samples "
                                            r"leaves the test split empty"):
        digits(0, 0.0001)
    with pytest.raises(GradwireError, match=r"digits: seed must be an integer >= 0, got -1"):
        digits(-1)  # numpy's ValueError


# ---------------------------------------------------------------- models


def test_build_model_leaves_the_caller_s_random_stream_alone() -> None:
    """build_model seeded torch's global generator for good: whatever the caller drew after it
    was the same whatever the caller had seeded."""
    torch.manual_seed(1)
    expected = torch.rand(4)
    torch.manual_seed(1)
    model = build_model("mlp-small", seed=0)
    assert torch.equal(torch.rand(4), expected)
    # and the parameters are still those of the seed
    torch.manual_seed(123)
    again = build_model("mlp-small", seed=0)
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def one_epoch_bytes(tmp_path_factory) -> bytes:
    """A real checkpoint of one mlp-small epoch on one rank, trained once for every test."""
    import datetime

    import torch.distributed as dist

    from gradwire.train import worker

    where = tmp_path_factory.mktemp("one_epoch")
    ck = where / "ck.pt"
    dist.init_process_group("gloo", init_method=f"file://{where / 'store'}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        worker.train(worker.parse_args(["--model", "mlp-small", "--batch-size", "256",
                                        f"--checkpoint={ck}", "--epochs", "1"]))
    finally:
        dist.destroy_process_group()
    return ck.read_bytes()


@pytest.fixture
def one_epoch(one_epoch_bytes, tmp_path, monkeypatch):
    """(a copy of that checkpoint, the worker arguments that resume it for a second epoch)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ck = tmp_path / "ck.pt"
    ck.write_bytes(one_epoch_bytes)
    return ck, ["--model", "mlp-small", "--batch-size", "256", f"--checkpoint={ck}",
                "--epochs", "2", "--resume"]


def _doctored(ck, change) -> None:
    from gradwire.train import checkpoint

    state = torch.load(ck, weights_only=True)
    change(state)
    state.pop("format")
    checkpoint.save(ck, state)


def _momentum_of_another_shape(state: dict) -> None:
    state["optimizer"]["state"][0]["momentum_buffer"] = torch.zeros(3)


def _history_one_epoch_too_long(state: dict) -> None:
    state["history"]["train_loss"].append(1.0)


@pytest.mark.parametrize(("change", "message"), [
    # each was a traceback in every rank, at the load or at the first step
    (lambda s: s.update(optimizer={}),
     "the checkpoint's optimizer state does not fit this run's model (KeyError: "
     "'param_groups')"),
    (lambda s: s["optimizer"]["param_groups"][0].pop("momentum"),
     "the checkpoint's optimizer state has a parameter group without 'momentum'"),
    (_momentum_of_another_shape,
     "the checkpoint's optimizer momentum_buffer of parameter 0 is [3], this run's parameter "
     "has [128, 64]"),
    (lambda s: s["history"].pop("seconds"), "the checkpoint's history has no 'seconds'"),
    # was resumed: the curves came out one entry longer than the epochs
    (_history_one_epoch_too_long,
     "the checkpoint's history 'train_loss' holds 2 entries, expected one per epoch (1)"),
    (lambda s: s["history"]["test_loss"].__setitem__(0, "x"),
     "the checkpoint's history 'test_loss' holds a str, expected numbers"),
    # was resumed from epoch 0: a whole epoch trained again on top of the saved one
    (lambda s: s.update(epoch=0), "is not a whole gradwire checkpoint: its epoch is 0, "
                                  "expected >= 1"),
])
def test_resume_refuses_a_checkpoint_whose_state_does_not_fit(one_epoch, capsys, change,
                                                              message) -> None:
    from gradwire.train import worker

    ck, resume = one_epoch
    worker.parse_args(resume)  # the checkpoint as written resumes
    _doctored(ck, change)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        worker.parse_args(resume)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and message in err[-1], err
    assert not any("Traceback" in line for line in err)


def test_a_resumed_process_s_first_epoch_is_left_out_of_the_throughput_too():
    """The run's first epoch pays one-time costs (connections, allocations, DDP's bucket
    rebuild) and the throughput left it out, but a resumed process's first epoch pays them
    again and was counted: 4 epochs resumed at epoch 2 timed 1 s, 1 s, 3 s, 1 s read 1.67 s an
    epoch, not 1."""
    import argparse
    from types import SimpleNamespace

    from gradwire.train import worker

    n = 4
    history = {k: [0.0] * n for k in (*worker.SUMMED, "train_loss", "test_loss",
                                      "test_accuracy")}
    history |= {"seconds": [5.0, 1.0, 3.0, 1.0], "iterations": [10] * n,
                "density": [1.0] * n, worker.STARTED: [1.0, 0.0, 1.0, 0.0]}
    out = worker.summarize(argparse.Namespace(batch_size=4), {"world_size": 2},
                           torch.nn.Linear(2, 1), SimpleNamespace(kind="digits"), history)
    assert out["steady_epochs"] == 2
    assert out["samples_per_s"] == pytest.approx(2 * 10 * 4 * 2 / 2.0)
    # a run that never resumed leaves out its first epoch alone, as before
    history[worker.STARTED] = [1.0, 0.0, 0.0, 0.0]
    out = worker.summarize(argparse.Namespace(batch_size=4), {"world_size": 2},
                           torch.nn.Linear(2, 1), SimpleNamespace(kind="digits"), history)
    assert out["steady_epochs"] == 3


def test_a_resume_reads_its_checkpoint_once_before_the_join(one_epoch, tmp_path,
                                                            monkeypatch) -> None:
    """The worker read the checkpoint in its checks and again after joining, where a slow
    file system's read counted against the collective limit of every rank waiting at the
    start's barrier: it is read once, before the join, and the run resumes from that read."""
    import datetime

    import torch.distributed as dist

    from gradwire.train import checkpoint, worker

    ck, resume = one_epoch
    reads = []
    load = checkpoint.load
    monkeypatch.setattr(checkpoint, "load", lambda path: reads.append(path) or load(path))
    args = worker.parse_args(resume)
    assert len(reads) == 1
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        result = worker.train(args)
    finally:
        dist.destroy_process_group()
    assert len(reads) == 1 and result["epochs"] == 2, (reads, result.get("epochs"))
