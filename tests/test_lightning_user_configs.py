"""gradwire.hooks.lightning.strategy as a Lightning user configures it: keywords passed on to
DDPStrategy, a checkpoint saved after a fit under ``start_method="fork"``, and a warm-up whose
``steps_per_epoch`` is not the Trainer's epoch. Each Trainer runs in a script of its own (the
process group it forms stays out of the test process), on CPU over gloo."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import gradwire.hooks as gh
from gradwire.errors import GradwireError

pytest.importorskip("lightning")

from gradwire.hooks.lightning import CHECKPOINT_KEY, strategy  # noqa: E402

COMMON = """
    import sys
    import warnings

    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import gradwire.hooks as gh
    from gradwire.hooks.lightning import strategy

    warnings.simplefilter("default")

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

        def training_step(self, batch, _):
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(128, 8, generator=g), torch.randint(0, 2, (128,), generator=g))
    loader = DataLoader(data, batch_size=8)  # 16 batches; 8 on each of 2 ranks

    def trainer(state, **kw):
        start = kw.pop("start_method", "popen")
        return pl.Trainer(accelerator="cpu", devices=2, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          strategy=strategy(state, process_group_backend="gloo",
                                            start_method=start), **kw)
"""


def run_script(tmp_path, body: str, *args: str) -> str:
    """The output of COMMON + ``body`` run as a script Lightning starts 2 CPU ranks from."""
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(COMMON) + textwrap.dedent(body))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
              "MASTER_PORT", "NODE_RANK", "PL_DISABLE_FORK"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    return out


# ---- keywords passed on to DDPStrategy

@pytest.mark.parametrize("kwargs,says", [
    ({"backend": "gloo"}, "strategy: unknown keyword 'backend' (did you mean "
                          "'process_group_backend'?)"),
    ({"find_unused_parameter": True}, "(did you mean 'find_unused_parameters'?)"),
    ({"device_ids": [0]}, "strategy: device_ids is set by Lightning; leave it out"),
])
def test_strategy_refuses_a_keyword_ddp_would_refuse_on_every_rank(kwargs, says):
    """Passed on, it failed with DistributedDataParallel's "unexpected keyword argument" (or
    "multiple values for device_ids") on every rank, once fit() had started them."""
    with pytest.raises(GradwireError) as e:
        strategy(gh.make("topk"), **kwargs)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_strategy_takes_the_keywords_of_ddpstrategy_and_ddp():
    s = strategy(gh.make("topk"), process_group_backend="gloo", find_unused_parameters=True,
                 static_graph=False, bucket_cap_mb=1, gradient_as_bucket_view=True,
                 start_method="fork")
    assert s._ddp_kwargs == {"find_unused_parameters": True, "static_graph": False,
                             "bucket_cap_mb": 1, "gradient_as_bucket_view": True}


# ---- checkpoints without a process group

def test_a_checkpoint_saved_without_a_process_group_holds_no_hook_state(tmp_path):
    """Gathering the ranks' states needs their group: without one it failed with "Default
    process group has not been initialized"; the checkpoint is saved as Lightning's own DDP
    saves it, without hook states."""
    assert not torch.distributed.is_initialized()
    ck = tmp_path / "ck.ckpt"
    with pytest.warns(UserWarning, match="holds no gradwire hook state"):
        strategy(gh.make("topk")).save_checkpoint({"state_dict": {}, "epoch": 1}, ck)
    saved = torch.load(ck, weights_only=True)
    assert saved["epoch"] == 1 and CHECKPOINT_KEY not in saved


def test_trainer_save_checkpoint_after_a_fit_under_fork(tmp_path):
    """``start_method="fork"`` is documented to work; the fit runs in forked ranks that end
    with it, and ``trainer.save_checkpoint`` in the script afterwards (which Lightning's own
    DDP saves) failed in gather_object with "Default process group has not been
    initialized"."""
    out = run_script(tmp_path, """
        tr = trainer(gh.make("topk", density=0.5), start_method="fork", max_epochs=1)
        tr.fit(Net(), loader)
        tr.save_checkpoint(sys.argv[1])
        print("SAVED", sorted(torch.load(sys.argv[1], weights_only=True)["state_dict"]))
    """, str(tmp_path / "after.ckpt"))
    assert "SAVED ['net.0.bias'" in out and "holds no gradwire hook state" in out, out[-3000:]


# ---- warm-up epochs against the Trainer's

def test_a_warmup_counted_in_the_unsharded_loader_is_warned_of(tmp_path):
    """docs/compression.md: a warm-up needs ``steps_per_epoch=`` (e.g. ``len(loader)``). Under
    Lightning, which shards the loader over the ranks after the script measured it, that is
    twice the Trainer's epoch at 2 ranks (and half as many again with
    ``accumulate_grad_batches=2``): each warm-up density silently lasted two (four) epochs."""
    out = run_script(tmp_path, """
        for per, accumulate in ((len(loader), 1), (len(loader), 2), (4, 2)):
            state = gh.make("gtopk", density=0.01, warmup=True, steps_per_epoch=per)
            tr = trainer(state, max_epochs=1, accumulate_grad_batches=accumulate)
            tr.fit(Net(), loader)
            if tr.global_rank == 0:
                print("FITTED", per, accumulate, "hook steps", state.step, flush=True)
    """)
    assert "FITTED 16 1 hook steps 8" in out and "FITTED 4 2 hook steps 4" in out, out[-3000:]
    assert out.count("pass steps_per_epoch=") == 2, out[-3000:]
    assert ("make(steps_per_epoch=16) lasts each warm-up density 16 optimizer steps, but this "
            "Trainer takes 8 per epoch (8 batches on each rank, accumulate_grad_batches=1): "
            "pass steps_per_epoch=8 for one epoch each") in out, out[-3000:]
    assert "takes 4 per epoch (8 batches on each rank, accumulate_grad_batches=2)" in out


def test_the_warmup_length_is_not_judged_under_manual_optimization():
    """A LightningModule that steps its optimizers itself may run any number of synced
    backwards a batch (a GAN's two): the Trainer's batches say nothing of the hook's steps,
    and the warning named a wrong steps_per_epoch."""
    from types import SimpleNamespace

    from gradwire.hooks.lightning import warmup_mismatch

    state = gh.make("gtopk", density=0.01, warmup=True, steps_per_epoch=16)
    trainer = SimpleNamespace(num_training_batches=8, accumulate_grad_batches=1)
    auto = SimpleNamespace(automatic_optimization=True, trainer=trainer)
    manual = SimpleNamespace(automatic_optimization=False, trainer=trainer)
    assert "pass steps_per_epoch=8 for one epoch each" in (warmup_mismatch(state, auto) or "")
    assert warmup_mismatch(state, manual) is None
