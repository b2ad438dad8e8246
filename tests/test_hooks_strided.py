"""Parameters that DDP's buckets hold in their memory order (a channels_last conv weight, a
transposed matrix): error feedback finds what DDP left unwritten element by element, and
PowerSGD compresses the matrix the bucket holds."""
import warnings

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        yield


# --- error feedback conserves mass for parameters not laid out C-contiguously ---------------

class _Strided(nn.Module):
    """A first layer whose parameter is dense but not contiguous (a channels_last conv weight,
    or a transposed matrix), and two heads, one unused on some steps."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "channels_last":
            self.a = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        else:
            self.w = nn.Parameter(torch.randn(4, 6).t())  # 6 x 4, strides (1, 6)
        self.b, self.c = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, i: int) -> torch.Tensor:
        if self.kind == "channels_last":
            h = self.a(x.view(2, 3, 4, 4).to(memory_format=torch.channels_last)).mean((2, 3))
        else:
            h = x[:, :6] @ self.w
        return self.b(h) if i % 3 else self.c(h)


@pytest.mark.parametrize("kind", ["channels_last", "transposed"])
@pytest.mark.parametrize("method", ["topk", "int8"])
def test_reclaim_compares_each_gradient_element_with_its_own_bucket_element(one_rank, kind,
                                                                             method):
    """With find_unused_parameters=True the hook compares each gradient with its bucket's
    average to find what DDP left unwritten. DDP lays a dense parameter out in its bucket in
    its memory order; the gradient was compared in its logical order, so for a channels_last
    or transposed weight most elements "differed" and their average went back into the
    residual though DDP had written it: gradient mass made at every step."""
    torch.manual_seed(0)
    net, ref = _Strided(kind), _Strided(kind)
    ref.load_state_dict(net.state_dict())
    if kind == "transposed":
        assert not net.w.is_contiguous()
        with torch.no_grad():
            ref.w.copy_(net.w)
    ddp = DDP(net, find_unused_parameters=True)
    state = gh.make(method, **({"density": 0.3} if method == "topk" else {}))
    state.register(ddp)
    sent = [torch.zeros_like(p, dtype=torch.float64) for p in net.parameters()]
    raw = [torch.zeros_like(p, dtype=torch.float64) for p in net.parameters()]
    for i in range(4):
        x = torch.randn(2, 48, generator=torch.Generator().manual_seed(i))
        ddp.zero_grad()
        ref.zero_grad()
        ddp(x, i).square().sum().backward()
        ref(x, i).square().sum().backward()
        for total, p in zip(sent, net.parameters(), strict=True):
            if p.grad is not None:
                total += p.grad
        for total, p in zip(raw, ref.parameters(), strict=True):
            if p.grad is not None:
                total += p.grad
    residuals = state.state_dict()["residuals"]
    for s, r, p in zip(sent, raw, net.parameters(), strict=True):
        kept = residuals.get(state.positions.position(p), torch.zeros(p.numel()))
        # a residual is kept in bucket order: the parameter's memory order
        kept = kept.double().as_strided(p.shape, p.stride())
        assert torch.allclose(s + kept, r, atol=1e-5), (p.shape, (s + kept - r).abs().max())


# --- PowerSGD sees a parameter's matrix as DDP's bucket holds it ----------------------------

def test_powersgd_compresses_a_transposed_weight_as_the_matrix_its_bucket_holds(one_rank):
    """DDP lays a dense parameter out in its bucket in memory order, so a transposed 16 x 8
    weight lies there as an 8 x 16 matrix. The hook told PowerSGD its logical shape, and the
    8 x 16 elements read as 16 x 8 rows made a rank-1 gradient rank 2: rank 1 left most of it
    in the residual at every step (1.7 of 2, here), where the contiguous weight's is exact."""
    from gradwire.hooks.layout import Positions

    class Net(nn.Module):
        def __init__(self, transposed: bool) -> None:
            super().__init__()
            w = torch.randn(8, 16)
            self.w = nn.Parameter(w.t() if transposed else w.t().contiguous())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x @ self.w).sum()  # the gradient: an outer product, rank 1

    for transposed in (False, True):
        torch.manual_seed(0)
        ddp = DDP(Net(transposed))
        state = gh.make("powersgd", rank=1)
        state.register(ddp)
        for i in range(2):
            ddp.zero_grad()
            ddp(torch.randn(1, 16, generator=torch.Generator().manual_seed(i))).backward()
            residual = state.state_dict()["residuals"][0]
            assert residual.abs().max() < 1e-4, (transposed, i, residual.abs().max())
    pos = Positions()
    channels_last = torch.empty(4, 3, 2, 2).to(memory_format=torch.channels_last)
    pos.layout([nn.Parameter(torch.empty(8, 16).t()), nn.Parameter(channels_last),
                nn.Parameter(torch.empty(4, 6)[:, ::2]), nn.Parameter(torch.empty(5))])
    assert pos.shapes == {0: (8, 16), 1: (4, 2, 2, 3), 2: (4, 3), 3: (5,)}
