"""A Lightning ``DDPStrategy`` that runs a gradwire hook on every device, CPU included.

Lightning's own ``DDPStrategy(ddp_comm_hook=..., ddp_comm_state=...)`` registers the hook only
when the device is CUDA (lightning 2.6, ``DDPStrategy._register_ddp_hooks``); on CPU (gloo) it
drops it without a word and trains with plain allreduce. :func:`strategy` registers the hook
itself, after Lightning has wrapped the module in DistributedDataParallel::

    import gradwire.hooks as gh
    from gradwire.hooks.lightning import launch_args, strategy
    state = gh.make("gtopk", density=0.001)
    trainer = Trainer(accelerator="cpu", **launch_args(devices=2),
                      strategy=strategy(state, process_group_backend="gloo"))

:func:`launch_args` makes one script run unchanged under torchrun, ``gradwire run`` and
Lightning's own launcher. A checkpoint the Trainer saves holds every rank's hook state
(residuals, the warm-up's position, compressor memory), and a fit resumed from it with
``ckpt_path=`` restores this rank's: error feedback and the warm-up go on where they were.
``validate``, ``test`` and ``predict`` with ``ckpt_path=`` take the weights only and leave the
hook as it is (they run no hook: a checkpoint of another world size evaluates there too).
A checkpoint saved where there is no process group (after a fit under ``start_method="fork"``,
whose ranks have ended) holds no hook state, with a warning. A fit whose warm-up counts its
epochs in another number of steps than the Trainer's epoch (``steps_per_epoch=len(loader)``
measured before Lightning shards the loader, or not divided by ``accumulate_grad_batches``) is
warned of, with the number to pass.
Lightning is not a gradwire dependency; this module imports it when called.
"""

from __future__ import annotations

import inspect
import math
import os
from typing import Any

import torch
import torch.distributed as dist

from gradwire.check import check_int
from gradwire.errors import GradwireError, did_you_mean
from gradwire.hooks.state import HookState

OWN = ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper")
# Where a checkpoint keeps every rank's hook state (residuals, warm-up position), rank order
CHECKPOINT_KEY = "gradwire_hook_states"
# DDPStrategy start methods that pickle the strategy into every process they start
PICKLED = ("spawn", "forkserver")


def launch_args(devices: int = 1) -> dict[str, int]:
    """``Trainer``'s ``num_nodes`` and ``devices`` for whatever started this process.

    Under torchrun or ``gradwire run`` (WORLD_SIZE and LOCAL_WORLD_SIZE in the environment):
    one Lightning node per LOCAL_WORLD_SIZE ranks, each rank one device; torchrun with
    ``--nproc-per-node 2`` on one machine gives ``num_nodes=1, devices=2``, ``gradwire run
    --hosts 2`` (one rank per emulated host) ``num_nodes=2, devices=1``, which is what
    Lightning checks against the environment. Otherwise Lightning starts the processes itself:
    ``devices`` of them on one node."""
    check_int("launch_args", "devices", devices, 1)  # Lightning took 0 or "2" further on
    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if world is None and local is not None and dist.is_available() and dist.is_initialized():
        # Lightning's environment deletes WORLD_SIZE when a fit ends; the group still says it
        world = str(dist.get_world_size())
    if world is None or local is None:
        return {"num_nodes": 1, "devices": devices}
    try:
        w, n = int(world), int(local)
    except ValueError:
        raise GradwireError(f"launch_args: WORLD_SIZE and LOCAL_WORLD_SIZE must be integers, "
                            f"got {world!r} and {local!r}") from None
    if n < 1 or w < n or w % n:
        raise GradwireError(f"launch_args: WORLD_SIZE {w} is not a multiple of "
                            f"LOCAL_WORLD_SIZE {n}")
    return {"num_nodes": w // n, "devices": n}


def strategy(state: HookState, **ddp_kwargs: Any) -> Any:
    """A ``lightning.pytorch.strategies.DDPStrategy`` (``ddp_kwargs`` passed on) whose
    DistributedDataParallel runs ``state``'s hook."""
    if not isinstance(state, HookState):
        raise GradwireError(f"strategy: expected a gradwire.hooks.make(...) state, got "
                            f"{type(state).__name__}")
    given = [k for k in OWN if k in ddp_kwargs]
    if given:
        raise GradwireError(f"strategy: {', '.join(given)} is set by gradwire from the state; "
                            "leave it out")
    start = ddp_kwargs.get("start_method", "popen")
    if start in PICKLED:
        # Lightning pickles the strategy, and with it the state, into each process it starts
        # this way; the strategy's class is made here and the state holds locks, so fit()
        # failed with "Can't pickle local object" after the Trainer had taken it
        raise GradwireError(f"strategy: start_method={start!r} sends the strategy to each "
                            "process by pickling it, and a hook state cannot be sent: use "
                            "'popen' (the default: Lightning runs the script once per device) "
                            "or 'fork'")
    try:
        from lightning.pytorch.strategies import DDPStrategy
        from lightning.pytorch.trainer.states import TrainerFn
        from lightning.pytorch.utilities import rank_zero_warn
    except ImportError as e:
        raise GradwireError("gradwire.hooks.lightning needs Lightning: pip install "
                            "lightning") from e
    _check_ddp_kwargs(DDPStrategy, ddp_kwargs)

    class GradwireDDPStrategy(DDPStrategy):
        def configure_ddp(self) -> None:
            super().configure_ddp()
            state.register(self.model)

        def on_train_start(self) -> None:
            super().on_train_start()
            warning = warmup_mismatch(state, self.lightning_module)
            if warning:
                rank_zero_warn(warning)

        def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any,
                            storage_options: Any = None) -> None:
            if not (dist.is_available() and dist.is_initialized()):
                # start_method="fork": after fit the ranks (and their hooks) are gone, and
                # this process's state never ran; gathering failed with "Default process
                # group has not been initialized" where Lightning's own DDP saves
                rank_zero_warn(f"{filepath}: no process group (the ranks that ran the hook "
                               "have ended): the checkpoint holds no gradwire hook state, "
                               "and a fit resumed from it starts the hook afresh")
                super().save_checkpoint(checkpoint, filepath, storage_options)
                return
            # every rank runs this (Trainer.save_checkpoint); each rank's residuals are its own
            states = gather_hook_states(state, self.world_size, self.is_global_zero)
            if self.is_global_zero:
                checkpoint = {**checkpoint, CHECKPOINT_KEY: states}
            super().save_checkpoint(checkpoint, filepath, storage_options)

        def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any
                            ) -> dict[str, Any]:
            checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
            if self._fitting():
                # validate/test/predict(ckpt_path=) load the weights and run no hook: the
                # states are refused at another world size, and would replace a live hook's
                load_hook_state(state, checkpoint.get(CHECKPOINT_KEY), self.global_rank,
                                self.world_size, str(checkpoint_path))
            return checkpoint

        def _fitting(self) -> bool:
            """Whether the Trainer that loads a checkpoint is fitting (True where it cannot
            be told: a caller of its own)."""
            try:
                fn = self.lightning_module.trainer.state.fn
            except (AttributeError, RuntimeError):  # no module, or none attached to a Trainer
                return True
            return fn is None or fn == TrainerFn.FITTING

    return GradwireDDPStrategy(**ddp_kwargs)


def _check_ddp_kwargs(ddp_strategy: type, ddp_kwargs: dict[str, Any]) -> None:
    """Refuse a keyword neither ``DDPStrategy`` nor ``DistributedDataParallel`` takes (or one
    Lightning sets itself): passed on, it would fail on every rank once fit() has started
    them, with DistributedDataParallel's "unexpected keyword argument"."""
    def names(f: Any) -> list[str]:
        return [n for n, p in inspect.signature(f).parameters.items() if n != "self"
                and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]

    own = [n for n in names(ddp_strategy.__init__) if n not in OWN]  # refused before
    ddp = [n for n in names(torch.nn.parallel.DistributedDataParallel.__init__)
           if n not in ("module", "device_ids")]
    for k in ddp_kwargs:
        if k in ("module", "device_ids"):
            raise GradwireError(f"strategy: {k} is set by Lightning; leave it out")
        if k not in own and k not in ddp:
            # difflib takes 'backend' for nothing; it is the end of process_group_backend
            part = next((n for n in own + ddp if k in n), None)
            hint = did_you_mean(k, own + ddp) or (f" (did you mean {part!r}?)" if part else "")
            raise GradwireError(f"strategy: unknown keyword {k!r}{hint}: expected one of "
                                "DDPStrategy's or DistributedDataParallel's (but module and "
                                "device_ids)")


def warmup_mismatch(state: HookState, module: Any) -> str | None:
    """What to warn of where ``state``'s warm-up counts its epochs in another number of steps
    than the Trainer takes per epoch: Lightning shards the loader over the ranks after the
    script measured it (``len(loader)``, as docs/compression.md suggests, is world-size times
    too many) and steps once per ``accumulate_grad_batches`` batches, so each warm-up density
    silently lasted several of the Trainer's epochs. None where they agree, or where the
    epoch's length is not known: under manual optimization (``module``, the LightningModule,
    steps its optimizers itself) a batch may run any number of synced backwards."""
    if not getattr(module, "automatic_optimization", True):
        return None
    trainer = module.trainer
    per = state.config.steps_per_epoch
    batches = getattr(trainer, "num_training_batches", None)
    accumulate = getattr(trainer, "accumulate_grad_batches", 1)
    if (not state.config.warmup.densities or per is None or not isinstance(batches, int)
            or batches < 1 or not isinstance(accumulate, int) or accumulate < 1):
        return None
    steps = math.ceil(batches / accumulate)  # Lightning steps on an epoch's last batches too
    if steps == per:
        return None
    return (f"gradwire: make(steps_per_epoch={per}) lasts each warm-up density {per} optimizer "
            f"steps, but this Trainer takes {steps} per epoch ({batches} batches on each rank, "
            f"accumulate_grad_batches={accumulate}): pass steps_per_epoch={steps} for one "
            "epoch each")


def gather_hook_states(state: HookState, world: int, is_zero: bool) -> list[Any] | None:
    """Every rank's ``state.state_dict()`` on rank 0 (None elsewhere), each tensor copied to
    the host first: gathered as they are, a GPU's residuals would be rebuilt on rank 0 on the
    GPU each came from, every rank's state on one process, where a checkpoint holds them on
    the host anyway (Lightning loads it there)."""
    states: list[Any] | None = [None] * world if is_zero else None
    dist.gather_object(_on_host(state.state_dict()), states, dst=0)
    return states


def _on_host(obj: Any) -> Any:
    """``obj`` with every tensor in its dicts, lists and tuples copied to the host."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _on_host(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_on_host(v) for v in obj)
    return obj


def load_hook_state(state: HookState, states: Any, rank: int, world: int, where: str) -> None:
    """This rank's entry of a checkpoint's hook states into ``state``. A checkpoint without
    them (Lightning's own DDP wrote it) starts the hook afresh: no residual, warm-up from its
    start."""
    if states is None:
        return
    if not isinstance(states, list) or len(states) != world:
        got = f"{len(states)} ranks'" if isinstance(states, list) else repr(type(states))
        raise GradwireError(f"{where}: the checkpoint holds {got} hook states, this run has "
                            f"{world} ranks: resume at the world size it was saved at")
    state.load_state_dict(states[rank])
