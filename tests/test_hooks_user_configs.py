"""The hook under DDP set up as users set it up, beyond tests/test_hooks_ddp_options.py: the
hook registered with DDP's own ``register_comm_hook``, which the docs give as the same as
``state.register`` but which tells the state nothing of DDP's options."""
import warnings

import pytest
import torch
from test_hooks_ddp_options import Branchy, _flat
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh


@pytest.mark.parametrize("method, mode", [("topk", "bucket"), ("efsignsgd", "bucket"),
                                          ("gtopk", "model")])
def test_a_hook_registered_with_ddps_own_call_keeps_an_unused_parameters_mass(
        one_rank, method, mode):
    """``ddp.register_comm_hook(state, state.hook)``, which the docs give as the same as
    ``state.register(ddp)``, with ``zero_grad(set_to_none=False)``: DDP leaves the zeros of a
    parameter no rank used, so what the hook's average credited it was lost from the residual
    (only ``register`` told the state DDP's options; the hook alone sees no DDP)."""
    torch.manual_seed(0)
    net = Branchy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        ddp = DDP(net, bucket_cap_mb=0.0001, find_unused_parameters=True)
        state = gh.make(method, density=0.1, mode=mode)
        ddp.register_comm_hook(state, state.hook)
        params = list(net.parameters())

        def residuals() -> torch.Tensor:
            saved = state.state_dict()["residuals"]
            return _flat(params, [saved.get(state.positions.position(p)) for p in params])

        for step in range(5):
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
            before = residuals() if step else torch.zeros(sum(p.numel() for p in params))
            local = torch.autograd.grad(net(x, step < 2).square().mean(), params,
                                        allow_unused=True)
            ddp.zero_grad(set_to_none=False)
            ddp(x, step < 2).square().mean().backward()
            applied = _flat(params, [p.grad for p in params])
            gap = (residuals() + applied - before - _flat(params, local)).abs().max()
            assert gap < 1e-5, (step, float(gap))
