"""A Lightning ``DDPStrategy`` that runs a gradwire hook on every device, CPU included.

Lightning's own ``DDPStrategy(ddp_comm_hook=..., ddp_comm_state=...)`` registers the hook only
when the device is CUDA (lightning 2.6, ``DDPStrategy._register_ddp_hooks``); on CPU (gloo) it
drops it without a word and trains with plain allreduce. :func:`strategy` registers the hook
itself, after Lightning has wrapped the module in DistributedDataParallel::

    import gradwire.hooks as gh
    from gradwire.hooks.lightning import strategy
    state = gh.make("gtopk", density=0.001)
    trainer = Trainer(accelerator="cpu", num_nodes=4, strategy=strategy(state,
                      process_group_backend="gloo"))

Lightning is not a gradwire dependency; this module imports it when called.
"""

from __future__ import annotations

from typing import Any

from gradwire.errors import GradwireError
from gradwire.hooks.state import HookState

OWN = ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper")


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
    try:
        from lightning.pytorch.strategies import DDPStrategy
    except ImportError as e:
        raise GradwireError("gradwire.hooks.lightning needs Lightning: pip install "
                            "lightning") from e

    class GradwireDDPStrategy(DDPStrategy):
        def configure_ddp(self) -> None:
            super().configure_ddp()
            state.register(self.model)

    return GradwireDDPStrategy(**ddp_kwargs)
