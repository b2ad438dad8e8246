"""The hook as users register it on DDP models that are not the plain case: parameters that no
rank uses in an iteration (``find_unused_parameters=True``), a DDP over a process subgroup,
one state registered twice or on two models."""
import warnings

import pytest
import torch
import torch.distributed as dist
from conftest import run_world
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
from gradwire.errors import GradwireError


class Branchy(nn.Module):
    """``c`` is used only where asked: in the other iterations no rank uses it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 8), nn.Linear(8, 3), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, use_c: bool) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        return self.b(h) + self.c(h) if use_c else self.b(h)


def _flat(params, tensors) -> torch.Tensor:
    return torch.cat([(t if t is not None else torch.zeros_like(p)).reshape(-1)
                      for p, t in zip(params, tensors, strict=True)])


@pytest.mark.parametrize("method, mode", [("topk", "bucket"), ("gtopk", "model"),
                                          ("int8", "bucket"), ("efsignsgd", "bucket")])
@pytest.mark.parametrize("set_to_none, view", [(True, False), (False, False), (False, True)])
def test_a_parameter_no_rank_used_keeps_its_mass_in_the_residual(one_rank, method, mode,
                                                                 set_to_none, view):
    """DDP leaves the gradient of a globally unused parameter as it was (None, or the zeros
    of ``zero_grad(set_to_none=False)`` where it is no view of the bucket), so what the
    hook's average credited it was lost from the residual and never applied."""
    torch.manual_seed(0)
    net = Branchy()
    ddp = DDP(net, bucket_cap_mb=0.0001, find_unused_parameters=True,
              gradient_as_bucket_view=view)
    state = gh.make(method, density=0.1, mode=mode)
    state.register(ddp)
    params = list(net.parameters())

    def residuals() -> torch.Tensor:
        saved = state.state_dict()["residuals"]
        return _flat(params, [saved.get(state.positions.position(p)) for p in params])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        for step in range(5):
            use_c = step < 2
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
            before = residuals() if step else torch.zeros(sum(p.numel() for p in params))
            local = torch.autograd.grad(net(x, use_c).square().mean(), params,
                                        allow_unused=True)
            ddp.zero_grad(set_to_none=set_to_none)
            ddp(x, use_c).square().mean().backward()
            applied = _flat(params, [p.grad for p in params])
            gap = (residuals() + applied - before - _flat(params, local)).abs().max()
            assert gap < 1e-5, (step, float(gap))


def _subgroup_rank(rank: int, world: int) -> dict:
    warnings.simplefilter("ignore")
    groups = [dist.new_group([r]) for r in range(world)]
    got = {}
    # find_unused_parameters: DDP allreduces which parameters were used right after the last
    # bucket's hook, on its group, while the comm thread still issues the step's collectives
    for name, method, kw in (("own", "dense", {"process_group": groups[rank]}),
                             ("qsgd", "qsgd", {"find_unused_parameters": True}),
                             ("powersgd", "powersgd", {"find_unused_parameters": True})):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
        ddp = DDP(net, bucket_cap_mb=0.001, **kw)
        gh.make(method).register(ddp)
        x = torch.randn(2, 16, generator=torch.Generator().manual_seed(rank))
        own = torch.autograd.grad(net(x).sum(), net[0].weight)[0]  # this rank's alone
        for _ in range(8):
            ddp.zero_grad()
            ddp(x).sum().backward()
        got[name] = torch.equal(net[0].weight.grad, own)
    try:  # a group= over other ranks than DDP's
        gh.make("dense", group=groups[rank]).register(DDP(nn.Linear(2, 2)))
    except GradwireError as e:
        got["refused"] = str(e)
    return got


def test_the_hook_averages_over_ddps_group_and_keeps_its_collectives_in_order(tmp_path):
    """A DDP over a subgroup of one rank: the hook averaged over the world instead (each rank
    got the mean of both). With find_unused_parameters=True, DDP's allreduce of the used
    parameters raced the comm thread's collectives: gloo aborted ("Received data size doesn't
    match") or hung."""
    for got in run_world(_subgroup_rank, 2, tmp_path):
        assert got["own"]  # a group of one: the average is this rank's own gradient
        assert "group DDP was given" in got["refused"]


def test_one_state_runs_one_models_hook(one_rank):
    """A second model made the state count two steps an iteration (warm-up and dense_steps
    ran twice as fast); a second registration on one model was DDP's RuntimeError."""
    state = gh.make("topk", density=0.5, warmup=[0.9, 0.8], steps_per_epoch=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first, other = DDP(nn.Linear(4, 3)), DDP(nn.Linear(5, 2))
        state.register(first)
        with pytest.raises(GradwireError, match="another model"):
            state.register(other)
        with pytest.raises(GradwireError, match="has a communication hook already"):
            state.register(first)
        state.register(DDP(first.module))  # the same model wrapped anew is the same model


def test_a_model_made_after_the_first_was_freed_is_another_model(one_rank, monkeypatch):
    """The state kept the ids of the registered model's parameters: once that model was freed,
    a new one could be given the same ids and was taken as the same model, to run on the old
    one's residuals and step count. Ids are made to collide here, as CPython's allocator does
    when it hands the freed memory to the new model's parameters."""
    import gc

    state = gh.make("topk", density=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = DDP(nn.Linear(4, 3))
        state.register(first)
        old_ids = [id(p) for p in first.parameters()]
        del first
        gc.collect()
        second = DDP(nn.Linear(4, 3))
        new = list(second.parameters())
        real_id = id
        given = dict(zip(map(real_id, new), old_ids, strict=True))
        monkeypatch.setattr("builtins.id", lambda o: given.get(real_id(o), real_id(o)))
        with pytest.raises(GradwireError, match=r"another model \(since freed\)"):
            state.register(second)


# (method, mode, static_graph, micro-batches per step: all but the last under no_sync());
# DDP itself fails no_sync() with static_graph=True (an internal assert in its reducer)
ACCUMULATE = [("dense", "bucket", False, 3), ("topk", "bucket", False, 3),
              ("gtopk", "model", False, 2), ("powersgd", "bucket", False, 2),
              ("int8", "bucket", True, 1), ("topk", "bucket", True, 1),
              ("gtopk", "bucket", True, 1), ("powersgd", "bucket", True, 1)]


def _accumulating_rank(rank: int, world: int) -> dict:
    import contextlib

    warnings.simplefilter("ignore")  # DDP's notes on static graphs
    got = {}
    for method, mode, static, micro in ACCUMULATE:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
        net[0].bias.requires_grad_(False)  # a frozen parameter: DDP leaves it out
        ddp = DDP(net, bucket_cap_mb=0.001, static_graph=static)
        state = gh.make(method, density=0.1, mode=mode)
        state.register(ddp)
        params = [p for p in net.parameters() if p.requires_grad]

        def residuals(state=state, params=params) -> torch.Tensor:
            saved = state.state_dict().get("residuals") or {}
            return _flat(params, [saved.get(state.positions.position(p)) for p in params])

        gaps, spread = [], []
        for step in range(4):
            before = residuals() if step else torch.zeros(sum(p.numel() for p in params))
            local = torch.zeros_like(before)
            ddp.zero_grad()
            for m in range(micro):
                x = torch.randn(3, 16, generator=torch.Generator().manual_seed(
                    100 * step + 10 * m + rank))
                local += _flat(params, torch.autograd.grad(net(x).square().mean(), params))
                ctx = ddp.no_sync() if m < micro - 1 else contextlib.nullcontext()
                with ctx:
                    ddp(x).square().mean().backward()
            applied = _flat(params, [p.grad for p in params])
            # no mass lost: Σ_r (residual after) + P·average = Σ_r (residual before + local)
            kept = residuals() - before - local
            dist.all_reduce(kept)
            gaps.append(float((kept + world * applied).abs().max()))
            mean = applied.clone()
            dist.all_reduce(mean)
            spread.append(float((applied - mean / world).abs().max()))
        got[f"{method}/{mode}/static={static}/micro={micro}"] = {
            "gap": max(gaps), "spread": max(spread), "steps": state.step}
    return got


def test_gradient_accumulation_and_static_graphs_lose_no_mass(tmp_path):
    """The DDP options the docs promise beside a hook: gradient accumulation with
    ``no_sync()`` (the hook runs on the step that syncs, on the micro-batches' sum, and counts
    that one step), ``static_graph=True`` (DDP rebuilds its buckets after the first
    iteration) and a frozen parameter. Every rank applies the same average, and no gradient
    mass is lost: summed over the ranks, the residuals left plus P times the average are the
    residuals before plus the gradients."""
    ranks = run_world(_accumulating_rank, 2, tmp_path)
    for name in ranks[0]:
        for got in ranks:
            assert got[name]["gap"] < 1e-4, (name, got[name])
            assert got[name]["spread"] < 1e-6, (name, got[name])
            assert got[name]["steps"] == 4, (name, got[name])


@pytest.mark.parametrize("method, mode", [("topk", "bucket"), ("gtopk", "model"),
                                          ("powersgd", "bucket")])
def test_a_compiled_ddp_model_runs_the_hook(one_rank, method, mode):
    """``torch.compile`` of a DDP model splits its graph at the buckets (dynamo's DDP
    optimizer) and DDP's reducer still runs the hook: each backward is one step, error
    feedback included (residual after + average = residual before + gradient)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    ddp = DDP(net)
    state = gh.make(method, density=0.1, mode=mode)
    state.register(ddp)
    compiled = torch.compile(ddp, backend="aot_eager")  # no C++ compiler needed
    params = list(net.parameters())
    before = torch.zeros(sum(p.numel() for p in params))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(3):
            x = torch.randn(3, 16, generator=torch.Generator().manual_seed(step))
            local = _flat(params, torch.autograd.grad(net(x).square().mean(), params))
            ddp.zero_grad()
            compiled(x).square().mean().backward()
            saved = state.state_dict()["residuals"]
            after = _flat(params, [saved.get(state.positions.position(p)) for p in params])
            applied = _flat(params, [p.grad for p in params])
            assert (after + applied - before - local).abs().max() < 1e-5, step
            before = after
    dense_bytes = 3 * 4 * before.numel()  # fp32, 3 steps
    assert state.step == 3 and 0 < state.stats["sent"] < dense_bytes


class ToBf16(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)


def _half_models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {"bf16": nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).bfloat16(),
            "fp16": nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).half(),
            # DDP puts each dtype in buckets of its own
            "mixed": nn.Sequential(nn.Linear(16, 32), nn.Tanh(), ToBf16(),
                                   nn.Linear(32, 4).bfloat16())}


@pytest.mark.parametrize("method", gh.METHODS)
def test_half_precision_and_mixed_dtype_models_train(one_rank, method):
    """A model kept in bf16 or fp16, and one with parameters of two dtypes (bucket mode),
    trains under every method: each gradient comes back finite and in its parameter's dtype."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, net in _half_models().items():
            for mode in ("bucket",) if name == "mixed" else ("bucket", "model"):
                ddp = DDP(net, bucket_cap_mb=0.0001)
                gh.make(method, density=0.1, mode=mode).register(ddp)
                for step in range(3):
                    ddp.zero_grad()
                    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(step))
                    ddp(x.to(net[0].weight.dtype)).float().square().mean().backward()
                    for p in net.parameters():
                        assert p.grad.dtype == p.dtype and torch.isfinite(p.grad).all(), \
                            (name, mode, step)


def test_model_mode_refuses_parameters_of_two_dtypes_when_registered(one_rank):
    """Model mode aggregates the whole model as one tensor: parameters of two dtypes were
    refused only at the first backward, from inside DDP's hook."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ddp = DDP(_half_models()["mixed"])
    with pytest.raises(GradwireError, match=r"one dtype, got \['torch.bfloat16', "
                                            r"'torch.float32'\]: use mode='bucket'"):
        gh.make("gtopk", mode="model").register(ddp)
    gh.make("gtopk", mode="bucket").register(ddp)


def test_model_mode_takes_a_model_whose_other_dtype_ddp_ignores(one_rank):
    """Parameters DDP is told to ignore are in no bucket: a bf16 one beside fp32 ones was
    refused as two dtypes, though DDP hands the hook one fp32 tensor."""
    net = _half_models()["mixed"]
    DDP._set_params_and_buffers_to_ignore_for_model(net, ["3.weight", "3.bias"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ddp = DDP(net)
    gh.make("gtopk", density=1.0, mode="model").register(ddp)
    ddp(torch.randn(2, 16)).float().sum().backward()
    assert net[0].weight.grad is not None and torch.isfinite(net[0].weight.grad).all()
