"""Edges of resuming: a checkpoint damaged on disk (torch's zip reader checks no checksum, so a
flipped bit in a tensor loaded silently as other weights, momentum or residuals), and
Lightning's validate/test with ``ckpt_path=``, which load weights and run no hook."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import cli_error

from gradwire.errors import GradwireError

QUICK = ["--loopback", "--hosts", "2", "--model", "mlp-small", "--batch-size", "64"]
SETTINGS = {"model": "mlp-small", "agg": "topk", "density": 0.01, "mode": "bucket",
            "warmup": True, "world_size": 2, "batch_size": 64, "lr": 0.05, "momentum": 0.9,
            "seed": 0, "seq_len": 64, "rank": None}
# a value no weight of the model holds: where its bytes lie in the file is where to flip one
MARK = 1234.5625


def _state() -> dict:
    """What the worker saves after epoch 1 of a 2-rank mlp-small topk run, a residual marked."""
    from gradwire.models import build_model
    from gradwire.models.task import optimizer

    model = build_model("mlp-small", 0, 10)
    opt = optimizer(model.parameters(), 0.05, 0.9)
    residual = {0: torch.full((64,), MARK)}
    agg = {"method": "topk", "epoch": 1, "step": 11, "epoch_at": [0, 0],
           "residuals": residual, "velocities": {}, "order": None, "compressor": {"step": 0}}
    history = {k: [1.0] for k in ("seconds", "train_loss", "test_loss", "test_accuracy",
                                  "iterations", "density")}
    return {"epoch": 1, "settings": dict(SETTINGS), "model": model.state_dict(),
            "optimizer": opt.state_dict(), "aggregation": [agg, agg], "history": history}


def _flip_in_marked_tensor(path) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(torch.tensor([MARK]).numpy().tobytes())
    assert at > 0
    data[at + 2] ^= 0x04  # the residual's first element, a little other
    path.write_bytes(bytes(data))


def test_a_checkpoint_with_a_flipped_bit_in_a_tensor_is_refused(tmp_path, monkeypatch, capsys,
                                                               no_cluster):
    """One bit of a residual flipped on disk: torch.load gave it back as another number and
    the run resumed on it; refused in one line, on the host, before any cluster."""
    from gradwire.train import checkpoint

    ck = tmp_path / "ck.pt"
    checkpoint.save(ck, _state())
    assert checkpoint.load(ck)["aggregation"][0]["residuals"][0][0].item() == MARK
    _flip_in_marked_tensor(ck)
    with pytest.raises(GradwireError, match="is damaged: its contents do not match the digest"):
        checkpoint.load(ck)
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--agg", "topk", "--density",
                          "0.01", "--epochs", "2", "--resume", "--checkpoint", str(ck))
    assert code == 2 and "is damaged" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_checkpoint_resaved_or_written_before_digests_still_loads(tmp_path):
    """What load() gives back saves again (tests and tools change one field and re-save it:
    the old digest goes, a new one is made), and a file without a digest (written before it
    was kept) loads as before."""
    from gradwire.train import checkpoint

    ck = tmp_path / "ck.pt"
    checkpoint.save(ck, _state())
    loaded = checkpoint.load(ck)
    loaded["history"]["train_loss"][0] = 2.0
    checkpoint.save(ck, loaded)
    assert checkpoint.load(ck)["history"]["train_loss"] == [2.0]
    old = tmp_path / "old.pt"
    torch.save({"format": checkpoint.FORMAT, **_state()}, old)
    assert checkpoint.load(old)["epoch"] == 1


LIGHTNING_VALIDATE = """
    import sys
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import gradwire.hooks as gh
    from gradwire.hooks.lightning import CHECKPOINT_KEY, strategy

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(4, 2)

        def validation_step(self, batch, _):
            self.log("v", F.cross_entropy(self.net(batch[0]), batch[1]))

    saved = gh.make("topk", density=0.5).state_dict() | {"step": 5, "epoch_at": [0, 5]}
    ck = {"state_dict": {"net." + k: v for k, v in Net().net.state_dict().items()},
          "pytorch-lightning_version": pl.__version__}
    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))),
                      batch_size=8)
    for ranks in (2, 1):  # another world size's, then this one's
        torch.save(ck | {CHECKPOINT_KEY: [saved] * ranks}, sys.argv[1])
        live = gh.make("topk", density=0.5)
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False,
                             strategy=strategy(live, process_group_backend="gloo"))
        trainer.validate(Net(), data, ckpt_path=sys.argv[1], verbose=False)
        print("VALIDATED", ranks, "hook step", live.step, flush=True)
"""


def test_lightning_validate_from_a_checkpoint_leaves_the_hook_alone(tmp_path):
    """validate(ckpt_path=) at one device of a checkpoint that two ranks trained failed with
    "resume at the world size it was saved at", and at the same world size replaced the live
    hook's residuals and step count, though validation runs no hook."""
    pytest.importorskip("lightning")
    script = tmp_path / "validate.py"
    script.write_text(textwrap.dedent(LIGHTNING_VALIDATE))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1"}
    for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "ck.ckpt")],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "VALIDATED 2 hook step 0" in out and "VALIDATED 1 hook step 0" in out, out[-3000:]


@pytest.mark.parametrize("change, msg", [
    ({"residuals": "junk"}, "rank 1's aggregation state in the checkpoint does not load"),
    ({"method": "gtopk"}, "is for method 'gtopk', this hook runs 'topk'"),
])
def test_a_malformed_aggregation_state_is_refused_before_any_rank_starts(
        tmp_path, monkeypatch, capsys, no_cluster, change, msg):
    """Each rank refused its own malformed state, once the cluster had started and every rank
    had loaded the data and built the model; now the host refuses it in one line first."""
    from gradwire.train import checkpoint

    state = _state()
    state["aggregation"][1] = {**state["aggregation"][1], **change}
    ck = tmp_path / "ck.pt"
    checkpoint.save(ck, state)
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--agg", "topk", "--density",
                          "0.01", "--epochs", "2", "--resume", "--checkpoint", str(ck))
    assert code == 2 and msg in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
