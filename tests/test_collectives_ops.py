"""The reductions as c10d's: ops sum, avg, max, min and product (as strings or
``dist.ReduceOp``), integer tensors, and the handle's ``get_future()``, which makes a
gradwire collective a DDP communication hook in three lines."""
import warnings

import pytest
import torch
import torch.distributed as dist
from conftest import run_world
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.collectives as gc
from gradwire.collectives.agree import MismatchError
from gradwire.errors import GradwireError

OPS = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "product": torch.prod}
ALGOS = (None, "ring", "rhd", "tree", "ps")
INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _values(rank: int, world: int, dtype: torch.dtype) -> torch.Tensor:
    """Each rank's input: every element different across ranks, small enough that the
    product of P of them fits int8 (P ≤ 3: 3·4·5 = 60) and uint8."""
    n = 7
    base = (torch.arange(n) + rank * 3) % 5 + 1  # 1..5
    if dtype.is_floating_point or dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
        base = base * (1 if rank % 2 else -1) if dtype != torch.uint8 else base
    return base.to(dtype)


def _ops_rank(rank: int, world: int) -> dict:
    got: dict[str, object] = {}
    for dtype in (torch.float32, torch.float64, torch.bfloat16, *INTS):
        everyone = torch.stack([_values(r, world, dtype) for r in range(world)])
        for name, fold in OPS.items():
            want = fold(everyone.double() if dtype.is_floating_point else everyone, dim=0)
            for algo in ALGOS:
                x = _values(rank, world, dtype)
                op = getattr(dist.ReduceOp, name.upper()) if algo == "ring" else name
                gc.all_reduce(x, op=op, algo=algo)
                got[f"allreduce {dtype} {name} {algo}"] = torch.equal(x, want.to(dtype))
            x = _values(rank, world, dtype)
            gc.reduce(x, dst=1, op=name)
            if rank == 1:
                got[f"reduce {dtype} {name}"] = torch.equal(x, want.to(dtype))
            out = torch.empty(3, dtype=dtype)
            inp = torch.cat([_values(rank, world, dtype)] * world)[: 3 * world].contiguous()
            whole = torch.cat([everyone] * world, dim=1)[:, : 3 * world]
            gc.reduce_scatter_tensor(out, inp, op=name)
            want_rs = fold(whole.double() if dtype.is_floating_point else whole, dim=0)
            got[f"reducescatter {dtype} {name}"] = torch.equal(
                out, want_rs[3 * rank : 3 * rank + 3].to(dtype))
    for name in ("max", "min"):  # a NaN anywhere is the result, whatever the order of combining
        for algo in ALGOS:
            x = torch.tensor([float("nan") if rank == i else 1.0 + rank for i in range(world)])
            gc.all_reduce(x, op=name, algo=algo)
            got[f"nan {name} {algo}"] = bool(x.isnan().all())
    try:  # ranks that reduce with different ops fail before any data moves
        gc.all_reduce(torch.ones(4), op="max" if rank == 0 else "sum", algo="ring")
    except MismatchError as e:
        got["mismatch"] = str(e)
    try:
        gc.all_reduce(torch.ones(4, dtype=torch.int32), op="avg")
    except GradwireError as e:
        got["int avg"] = str(e)
    return got


def test_every_op_and_integer_dtype_reduces_as_c10d_does(tmp_path):
    """Max, min and product were refused ("expected 'sum' or 'avg'"), and integer tensors but
    int8 ("tensor has dtype torch.int64"): a counter or a global max went through c10d."""
    for rank, got in enumerate(run_world(_ops_rank, 3, tmp_path)):
        wrong = [k for k, v in got.items() if v is False]
        assert not wrong, (rank, wrong)
        assert sum(v is True for v in got.values()) >= 8 * 4 * (len(ALGOS) + 1), rank
        assert "op" in got["mismatch"] and "\n" not in got["mismatch"]
        assert "op 'avg' needs a float tensor, got torch.int32" in got["int avg"]


def _future_hook_rank(rank: int, world: int) -> dict:
    warnings.simplefilter("ignore")

    def hook(_state, bucket):
        buf = bucket.buffer()
        handle = gc.all_reduce(buf, op="avg", algo="ring", async_op=True)
        return handle.get_future().then(lambda fut: fut.value()[0])

    grads = []
    for with_hook in (False, True):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        ddp = DDP(net, bucket_cap_mb=0.0001)
        if with_hook:
            ddp.register_comm_hook(None, hook)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
        ddp(x).square().sum().backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    handle = gc.all_reduce(torch.ones(3), algo="ring", async_op=True)
    value = handle.get_future().wait()
    return {"same": torch.allclose(grads[0], grads[1], atol=1e-6),
            "value": [v.tolist() for v in value], "done": handle.is_completed()}


def test_a_handles_future_runs_a_ddp_communication_hook(tmp_path):
    """``Handle`` had no ``get_future()``, which c10d's ``Work`` has and a DDP communication
    hook returns: an allreduce issued from a hook had to be wrapped by hand."""
    for got in run_world(_future_hook_rank, 2, tmp_path):
        assert got == {"same": True, "value": [[2.0, 2.0, 2.0]], "done": True}


def test_a_failed_calls_future_raises_its_error(one_rank, monkeypatch):
    """A call that failed: its future raises its error, not waits for good; one stopped by a
    SystemExit (which a future does not take) raises a RuntimeError that names it, and its
    handle is completed."""
    from gradwire.collectives import api

    def broken(*args, **kwargs):
        raise GradwireError("broken on purpose")

    monkeypatch.setattr(api, "execute", broken)
    handle = gc.all_reduce(torch.ones(3), algo="ring", async_op=True)
    with pytest.raises(GradwireError, match="broken on purpose"):
        handle.get_future().wait()
    with pytest.raises(GradwireError, match="broken on purpose"):
        handle.wait()

    def stopped(*args, **kwargs):
        raise SystemExit(3)

    monkeypatch.setattr(api, "execute", stopped)
    handle = gc.all_reduce(torch.ones(3), algo="ring", async_op=True)
    with pytest.raises(SystemExit):
        handle.wait()
    future = handle.get_future()
    assert handle.is_completed() and future.done()
    with pytest.raises(RuntimeError, match="the call stopped: SystemExit: 3"):
        future.wait()
