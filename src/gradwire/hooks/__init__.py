"""DDP communication hooks for every gradwire compressor: one factory, one state, one hook.

Example::

    import gradwire.hooks
    state = gradwire.hooks.make("topk", density=0.01)
    state.register(ddp_model)          # or ddp_model.register_comm_hook(state, state.hook)
    # (a DDP over a subgroup: register() takes its group; the hook alone sees no DDP, so
    # register_comm_hook needs make(..., group=g))
    # Lightning: Trainer(strategy=gradwire.hooks.lightning.strategy(state, ...))

What is written back is the average gradient (signsgd: the majority vote of the signs). What
each method sends, in which collectives, is :mod:`gradwire.catalogue`'s table; the hooks run
it (:func:`gradwire.catalogue.issuer` and :func:`gradwire.catalogue.start`).

docs/compression.md has the details: modes, warm-up, stats, checkpoints.
"""

from gradwire.hooks.state import METHODS, MODES, HookConfig, HookState, hook, make
from gradwire.hooks.warmup import DEFAULT_DENSITIES, Warmup

__all__ = ["DEFAULT_DENSITIES", "METHODS", "MODES", "HookConfig", "HookState", "Warmup", "hook",
           "make"]
