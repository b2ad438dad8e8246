"""Promises of docs/compression.md and docs/reliability.md about the DDP hooks that no other
test held to: NaN and Inf through the casts and through every compressing method, momentum
correction's per-element restart, ``dense_steps`` for every method, model mode whatever DDP's
bucketing, a payload no smaller than its bucket going dense with its residual, ``stats`` until
``reset_stats()``, and, on two ranks, ``register_comm_hook`` with ``make(group=)``, signSGD's
vote and gTop-k's ``algo="tree"``.

Most run on one gloo rank, where the dense average of a bucket is exactly this rank's own
gradient plus its residual, so what the hook applied can be compared bit for bit."""
import warnings

import pytest
import torch
import torch.distributed as dist
from conftest import run_world
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
from gradwire.catalogue import METHODS as CATALOGUE

# the methods that compress (all but dense and the casts), and those that keep a residual
COMPRESSING = tuple(m for m in gh.METHODS if m not in ("dense", "fp16", "bf16"))
EF = tuple(m for m in gh.METHODS if CATALOGUE[m].error_feedback)


class Given(nn.Module):
    """Parameters whose gradients are the tensors handed to forward: loss = Σ p·c."""

    def __init__(self, *shapes: tuple[int, ...]) -> None:
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in shapes])

    def forward(self, grads: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * c).sum() for p, c in zip(self.ps, grads, strict=True))


def _ddp(net: nn.Module, cap: float = 1e-5) -> DDP:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        return DDP(net, bucket_cap_mb=cap)


def _backward(ddp: DDP, grads: list[torch.Tensor]) -> list[warnings.WarningMessage]:
    """One iteration whose gradients are ``grads``; the warnings it raised."""
    ddp.zero_grad()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ddp(grads).backward()
    return [w for w in caught if issubclass(w.category, RuntimeWarning)]


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _saved(state: gh.HookState, what: str, p: nn.Parameter) -> torch.Tensor:
    """``p``'s residual or velocity (zeros where it has none, or before the first step),
    flat."""
    if not state.step:
        return torch.zeros(p.numel())
    got = state.state_dict()[what].get(state.positions.position(p))
    return torch.zeros(p.numel()) if got is None else got.reshape(-1).clone()


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal bit for bit, NaN where NaN, each Inf with its sign."""
    return bool(((got == want) | (got.isnan() & want.isnan())).all())


@pytest.mark.parametrize("method", ["dense", "fp16", "bf16"])
def test_the_casts_pass_nan_and_inf_where_a_dense_allreduce_puts_them(one_rank, method):
    """reliability.md: "Dense, fp16 and bf16 keep no residual: NaN and Inf go through as they
    are, where a dense allreduce puts them (the fp16 cast keeps both)", on the comm thread
    (the first steps) and issued from the hook (steady state)."""
    net = Given((6, 5), (5,), (3,))
    ddp = _ddp(net)
    state = gh.make(method)
    state.register(ddp)
    for step in range(5):
        # eighths: exact in fp16 and bf16, so the average at P = 1 is the gradient itself
        grads = [torch.randint(-64, 64, p.shape, generator=torch.Generator().manual_seed(step))
                 / 8 for p in net.ps]
        grads[0][0, 0], grads[0][1, 2], grads[1][3] = float("nan"), float("inf"), -float("inf")
        _backward(ddp, grads)
        for p, c in zip(net.ps, grads, strict=True):
            assert _same(p.grad, c), (method, step, p.grad, c)
    assert state.stats["issued"] > 0  # steady state went the hook's own way


@pytest.mark.parametrize("mode", ["bucket", "model"])
@pytest.mark.parametrize("method", COMPRESSING)
def test_a_non_finite_bucket_goes_dense_and_clears_the_residual(one_rank, method, mode):
    """reliability.md, NaN and Inf: "non-finite anywhere: ... every compressing hook (all but
    dense, fp16 and bf16, with error feedback or without) aggregate that bucket dense on every
    rank, x + e", the residual "added in and cleared", and "A RuntimeWarning says which path
    was taken". The steps after it compress again, finite."""
    net = Given((32, 32))
    p = net.ps[0]
    ddp = _ddp(net)
    state = gh.make(method, density=0.1, mode=mode)
    state.register(ddp)
    for step in range(6):
        g = _randn(32, 32, seed=step)
        if step == 3:  # int8 is issued from the hook by now
            g[0, 1], g[4, 4], g[7, 0] = float("nan"), float("inf"), -float("inf")
        before = _saved(state, "residuals", p) if method in EF else torch.zeros(p.numel())
        warned = _backward(ddp, [g])
        applied = p.grad.reshape(-1)
        if step == 3:
            assert _same(applied, g.reshape(-1) + before), (method, mode)
            assert warned and any("NaN or Inf" in str(w.message) for w in warned), \
                [str(w.message) for w in warned]
            if method in EF:
                assert not _saved(state, "residuals", p).any()
        else:
            assert applied.isfinite().all() and not warned, (method, mode, step)
            # compressed: not the gradient plus residual as a dense step gives it
            assert not torch.equal(applied, g.reshape(-1) + before), (method, mode, step)
        if method in EF:
            assert _saved(state, "residuals", p).isfinite().all()


@pytest.mark.parametrize("method", ["topk", "dgc", "int8", "powersgd"])
def test_momentum_correction_restarts_only_the_non_finite_elements_velocity(one_rank, method):
    """compression.md, momentum correction: "a NaN or Inf goes out as it is (GradScaler skips
    the step) and restarts that element's velocity" — that element's alone: every other
    element's velocity goes on as u = m·u + g. Top-k's status travels with its data, DGC's in
    the header (the velocity moves once the call is agreed), int8 in steady state is issued
    from the hook."""
    net = Given((32, 32))
    p = net.ps[0]
    ddp = _ddp(net)
    state = gh.make(method, density=0.1, momentum=0.9)
    state.register(ddp)
    bad = [1, 500]
    for step in range(5):
        g = _randn(32, 32, seed=step).reshape(-1)
        if step == 3:
            g[bad[0]], g[bad[1]] = float("nan"), float("inf")
        u = _saved(state, "velocities", p)
        _backward(ddp, [g.reshape(32, 32)])
        want = 0.9 * u + g
        if step == 3:
            assert p.grad.reshape(-1)[bad[0]].isnan()  # sent as it is
            want[bad] = 0.0
        got = _saved(state, "velocities", p)
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), (method, step)
        assert got.isfinite().all()


@pytest.mark.parametrize("mode", ["bucket", "model"])
@pytest.mark.parametrize("method", gh.METHODS)
def test_dense_steps_send_the_first_iterations_dense_for_every_method(one_rank, method, mode):
    """compression.md, warm-up: "`dense_steps=N` sends the first N iterations dense, for every
    method" (at P = 1 the dense average is the gradient, bit for bit; fp16 would round it,
    signSGD would vote), and "`state.density` says what the next iteration uses"."""
    net = Given((32, 32))
    p = net.ps[0]
    ddp = _ddp(net)
    state = gh.make(method, density=0.1, mode=mode, dense_steps=2)
    state.register(ddp)
    sparsifies = method in ("topk", "gtopk", "randomk", "dgc")
    for step in range(3):
        assert state.density == (0.1 if step == 2 and sparsifies else 1.0), (method, step)
        g = _randn(32, 32, seed=step)
        _backward(ddp, [g])
        if step < 2:
            assert torch.equal(p.grad, g), (method, mode, step)
            assert not _saved(state, "residuals", p).any()
        elif method != "dense":
            assert not torch.equal(p.grad, g), (method, mode, step)
    assert state.stats["dense"] == 2 and state.step == 3, state.stats


@pytest.mark.parametrize("method", ["topk", "gtopk", "randomk", "dgc", "efsignsgd", "qsgd",
                                    "int8", "powersgd"])
def test_model_mode_does_not_depend_on_how_ddp_bucketed_the_model(one_rank, method):
    """compression.md, model mode: "With several buckets the model is first gathered in
    parameter-position order (so the result does not depend on how DDP bucketed it)": the
    same model under two bucket sizes applies the same gradients, bit for bit."""
    shapes = ((24, 16), (24,), (16, 24), (16,), (8, 16), (8,))
    applied, buckets = [], []
    for cap in (1e-5, 0.002):  # a bucket per parameter, or two or three of them together
        torch.manual_seed(0)
        net = Given(*shapes)
        ddp = _ddp(net, cap)
        state = gh.make(method, density=0.1, mode="model")
        state.register(ddp)
        seen, per_step = [], []
        handed = state.on_bucket  # count the buckets DDP hands over

        def counted(bucket, handed=handed, per_step=per_step):
            per_step[-1] += 1
            return handed(bucket)

        state.on_bucket = counted
        for step in range(4):
            before = state.stats["buckets"]
            per_step.append(0)
            _backward(ddp, [_randn(*s, seed=10 * step + i) for i, s in enumerate(shapes)])
            seen.append(torch.cat([q.grad.reshape(-1) for q in net.ps]))
            assert state.stats["buckets"] - before == 1  # the model, once
        applied.append(seen)
        buckets.append(per_step)
    assert buckets[0][1:] != buckets[1][1:], buckets  # the bucketings differ
    for step, (a, b) in enumerate(zip(*applied, strict=True)):
        assert torch.equal(a, b), (method, step)


@pytest.mark.parametrize(("method", "density", "dense"), [
    ("topk", 0.5, True), ("gtopk", 0.5, True), ("dgc", 0.4, True),
    ("topk", 0.49, False), ("gtopk", 0.49, False), ("dgc", 0.39, False)])
def test_a_payload_no_smaller_than_its_bucket_goes_dense_with_its_residual(one_rank, method,
                                                                           density, dense):
    """compression.md: "A bucket whose compressed payload would be no smaller than the bucket
    itself goes through the dense allreduce, its residual with it: Top-k or gTop-k keeping
    half an fp32 bucket or more ..., DGC from 0.4 of an fp32 bucket": x + e applied, the
    residual cleared, the bucket's 4n bytes sent."""
    net = Given((32, 32))
    p = net.ps[0]
    ddp = _ddp(net)
    state = gh.make(method, density=density)
    residual = _randn(1024, seed=99)
    saved = state.state_dict()
    state.load_state_dict({**saved, "residuals": {0: residual}})
    state.register(ddp)
    g = _randn(32, 32, seed=1)
    _backward(ddp, [g])
    sum_ = g.reshape(-1) + residual
    if dense:
        assert torch.equal(p.grad.reshape(-1), sum_)
        assert not _saved(state, "residuals", p).any()
        assert state.stats["sent"] == 4 * 1024
    else:
        assert 0 < state.stats["sent"] < 4 * 1024
        assert torch.allclose(p.grad.reshape(-1) + _saved(state, "residuals", p), sum_,
                              rtol=0, atol=1e-6)


def test_stats_are_cumulative_until_reset_stats(one_rank):
    """compression.md, Stats: "`state.stats`, cumulative until `state.reset_stats()`"; the
    hook's step count and residuals are not stats and go on."""
    net = Given((32, 32))
    ddp = _ddp(net)
    state = gh.make("topk", density=0.1, dense_steps=1)
    state.register(ddp)
    for step in range(3):
        _backward(ddp, [_randn(32, 32, seed=step)])
    s = dict(state.stats)
    assert s["steps"] == 3 and s["buckets"] == 3 and s["dense"] == 1
    assert s["sent"] > 0 and s["compress"] > 0
    kept = _saved(state, "residuals", net.ps[0])
    state.reset_stats()
    assert set(state.stats) == set(s) and not any(state.stats.values())
    assert state.step == 3 and torch.equal(_saved(state, "residuals", net.ps[0]), kept)
    _backward(ddp, [_randn(32, 32, seed=3)])
    assert state.stats["steps"] == 1 and state.stats["buckets"] == 1
    assert state.stats["dense"] == 0 and 0 < state.stats["sent"] < s["sent"]


@pytest.mark.parametrize("method", ["dense", "gtopk", "int8", "powersgd"])
def test_gradwire_train_keeps_the_model_in_one_bucket_in_model_mode(one_rank, method):
    """training.md: "`--mode model` ... DDP then keeps the whole gradient in one bucket" (from
    the first iteration on, through DDP's rebuild), and "DDP keeps the gradients as views of
    its buckets (`gradient_as_bucket_view`)" in either mode (gradwire.train.aggregate, as the
    training worker builds DDP). The one bucket is aggregated where it lies, so dense and int8
    are issued from the hook itself there, as in bucket mode."""
    from gradwire.models import build_model
    from gradwire.train.aggregate import HookedDDP

    for mode in ("model", "bucket"):
        model = build_model("mlp", seed=0)
        agg = HookedDDP(method, 0.01, mode, False, 0, 10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ddp = agg.start(model)
        assert ddp.gradient_as_bucket_view, mode
        state, per_step = agg.hook, []
        handed = state.on_bucket

        def counted(bucket, handed=handed, per_step=per_step):
            per_step[-1] += 1
            return handed(bucket)

        state.on_bucket = counted
        for step in range(4):
            per_step.append(0)
            x = _randn(8, 64, seed=step)
            ddp.zero_grad()
            ddp(x).square().mean().backward()
            assert all(p.grad.isfinite().all() for p in model.parameters())
        if mode == "model":
            assert per_step == [1, 1, 1, 1], (method, per_step)
            if method in ("dense", "int8"):
                assert state.stats["issued"] >= 1, state.stats


def _two_ranks(rank: int, world: int) -> dict:
    warnings.simplefilter("ignore")
    got: dict[str, object] = {}
    # register_comm_hook itself over a DDP of a subgroup (of one rank): make(group=g)
    groups = [dist.new_group([r]) for r in range(world)]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    ddp = DDP(net, process_group=groups[rank], bucket_cap_mb=0.001)
    state = gh.make("topk", density=1.0, group=groups[rank])
    ddp.register_comm_hook(state, state.hook)
    x = _randn(2, 16, seed=rank)
    own = torch.autograd.grad(net(x).sum(), list(net.parameters()))
    for _ in range(3):
        ddp.zero_grad()
        ddp(x).sum().backward()
    got["own"] = all(torch.equal(p.grad, o) for p, o in zip(net.parameters(), own,
                                                            strict=True))
    # signSGD: the majority vote of the ranks' signs, 0 on a tie (half the elements here)
    vote = Given((64,))
    ddp = DDP(vote)
    gh.make("signsgd").register(ddp)
    g = torch.arange(1.0, 65.0) * torch.tensor([1.0, -1.0]).repeat(32)
    if rank == 1:
        g[:32] = -g[:32]  # the first half: opposite signs on the two ranks
    ddp([g]).backward()
    want = torch.sign(g)
    want[:32] = 0.0
    got["vote"] = torch.equal(vote.ps[0].grad, want)
    # gTop-k at P = 2 (a power of two): the paper's tree gives the butterfly's average
    grads = {}
    for algo in ("rd", "tree"):
        torch.manual_seed(0)
        net = Given((32, 32))
        ddp = DDP(net)
        gh.make("gtopk", density=0.05, algo=algo).register(ddp)
        ddp([_randn(32, 32, seed=rank)]).backward()
        grads[algo] = net.ps[0].grad.clone()
    got["tree"] = torch.equal(grads["rd"], grads["tree"])
    got["sparse"] = 0 < int((grads["tree"] != 0).sum()) <= 52
    return got


def test_on_two_ranks_group_vote_and_gtopk_tree(tmp_path):
    """compression.md: "for a DDP over a subgroup give `make(..., group=g)`" to a hook
    registered with `register_comm_hook` (the average is then the subgroup's, here this
    rank's own gradient); signSGD's result "is the majority vote of the signs (±1, 0 on a
    tie)"; gTop-k's hooks "take the same `algo=`", and "for P a power of two the merges and
    the result equal the tree's"."""
    for got in run_world(_two_ranks, 2, tmp_path):
        assert got == {"own": True, "vote": True, "tree": True, "sparse": True}, got
