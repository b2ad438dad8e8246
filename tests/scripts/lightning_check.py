"""gradwire hooks under Lightning (``gradwire.hooks.lightning.strategy``), as `gradwire run`
(one process per host) or torchrun (LAUNCHER=torchrun: P processes on one node) starts them,
the Trainer's nodes and devices from ``launch_args``: top-k at density 1.0 trains exactly as
Lightning's DDP without a hook; gTop-k at density 0.1 runs its hook every step, sends less
than the dense gradient, and leaves the replicas identical. FAIL lines per problem, then a
CHECKED line."""
import os

import lightning.pytorch as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from checklist import check, done
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gradwire.hooks as gh
from gradwire.hooks.lightning import CHECKPOINT_KEY, launch_args, load_hook_state, strategy

P = int(os.environ["WORLD_SIZE"])
STEPS = 4
class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(8 * P * STEPS, 16, generator=g),
                     torch.randint(0, 4, (8 * P * STEPS,), generator=g))


def fit(state: gh.HookState | None, steps: int = STEPS, resume: str | None = None,
        save: str | None = None) -> torch.Tensor:
    ddp = (DDPStrategy(process_group_backend="gloo") if state is None
           else strategy(state, process_group_backend="gloo"))
    trainer = pl.Trainer(accelerator="cpu", **launch_args(), max_steps=steps, strategy=ddp,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    model = Net()
    trainer.fit(model, DataLoader(data, batch_size=8, shuffle=False), ckpt_path=resume)
    if save is not None:
        trainer.save_checkpoint(save)
    return torch.cat([q.detach().reshape(-1) for q in model.parameters()])


want = fit(None)
check(dist.is_initialized() and dist.get_world_size() == P, "Lightning did not form the group")
exact = fit(gh.make("topk", density=1.0, warmup=False))
check(torch.equal(exact, want), f"topk density 1.0 differs from DDP: max "
      f"{(exact - want).abs().max().item():.3g}")
state = gh.make("gtopk", density=0.1, warmup=False)
sparse = fit(state)
check(state.stats["steps"] == STEPS, f"hook ran {state.stats['steps']} steps, not {STEPS}")
check(0 < state.stats["sent"] < STEPS * 4 * want.numel(), f"gtopk sent {state.stats['sent']}")
copies = [torch.empty_like(sparse) for _ in range(P)]
dist.all_gather(copies, sparse)
check(all(torch.equal(c, sparse) for c in copies), "gtopk replicas differ")
check(not torch.equal(sparse, want), "gtopk at density 0.1 gave the dense result")
# A checkpoint holds every rank's hook state, and a fit resumed from it restores this rank's
# (residuals, step count), where the hook used to start afresh. (Lightning's own resume is not
# bit-exact on this model, with or without a hook: the states are compared, not the weights.)
ck = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                  f"gw-lightning-{os.environ['MASTER_PORT']}.ckpt")
try:
    first, rest_state = (gh.make("gtopk", density=0.1, warmup=False) for _ in range(2))
    fit(first, STEPS, save=ck)
    saved = first.state_dict()
    got = gh.make("gtopk", density=0.1, warmup=False)
    load_hook_state(got, torch.load(ck)[CHECKPOINT_KEY], dist.get_rank(), P, ck)
    check(got.step == STEPS and saved["residuals"].keys() == got.state_dict()["residuals"].keys()
          and all(torch.equal(v, got.state_dict()["residuals"][k])
                  for k, v in saved["residuals"].items()) and saved["residuals"],
          "the checkpoint's hook state is not this rank's")
    fit(rest_state, 2 * STEPS, resume=ck)
    check(rest_state.step == 2 * STEPS, f"resumed hook ran to step {rest_state.step}, not "
          f"{2 * STEPS}")
finally:
    dist.barrier()
    if dist.get_rank() == 0 and os.path.exists(ck):
        os.remove(ck)
done()
# as the other rank scripts do: a group left to the interpreter's exit took gloo's threads
# down with it and aborted rank 0 ("terminate called without an active exception") once in
# a full test run of 2026-11-27, after every check had passed
dist.destroy_process_group()
