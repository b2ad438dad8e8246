"""DDP communication hooks for every gradwire compressor: one factory, one state, one hook.

Example::

    import gradwire.hooks
    state = gradwire.hooks.make("topk", density=0.01)
    state.register(ddp_model)          # or ddp_model.register_comm_hook(state, state.hook)
    # Lightning: Trainer(strategy=gradwire.hooks.lightning.strategy(state, ...))

What is written back is the average gradient (signsgd: the majority vote of the signs). For n
elements of a bucket (fp32), P ranks, k = ⌈density·n⌉:

| method    | on the wire from each rank            | combined by        | error feedback |
|-----------|---------------------------------------|--------------------|----------------|
| dense     | 4n (allreduce ring: 2(P−1)/P · 4n)    | allreduce          | no             |
| fp16/bf16 | 2n                                    | allreduce          | no             |
| topk      | 8k                                    | TopKAllReduce      | yes            |
| gtopk     | 8k per round, log₂P rounds            | gTopKAllReduce     | yes            |
| randomk   | 4k (indices from the shared seed)     | allreduce          | yes            |
| dgc       | 8⌈1.25k⌉ + 4                          | allgather          | yes            |
| signsgd   | ⌈n/8⌉                                 | allgather, vote    | no             |
| efsignsgd | ⌈n/8⌉ + 4                             | allgather          | yes            |
| qsgd      | 4 + ⌈n/8⌉ + ⌈n·w/8⌉                   | allgather          | no (unbiased)  |
| terngrad  | ⌈n/4⌉ + 4                             | allgather          | no (unbiased)  |
| powersgd  | 4(rows + cols)·r, two allreduces      | allreduce of P, Q  | yes            |

docs/compression.md has the details: modes, warm-up, stats, checkpoints.
"""

from gradwire.hooks.state import METHODS, MODES, HookConfig, HookState, hook, make
from gradwire.hooks.warmup import DEFAULT_DENSITIES, Warmup

__all__ = ["DEFAULT_DENSITIES", "METHODS", "MODES", "HookConfig", "HookState", "Warmup", "hook",
           "make"]
