"""The step after a failed one, on one gloo rank in this process: an error raised in the hook
itself, or outside the comm thread's tasks (a c10d RuntimeError, a KeyboardInterrupt while the
hook waits), reaches backward() as itself once DDP has finished that backward, so the next
step runs (it was PyTorch's ``INTERNAL ASSERT ... unmarked_param_indices``); a failed step
neither loses nor makes error-feedback mass (on the device path too, and where buckets were
issued from the hook or a dense fallback failed); a refused or mistaken state_dict, or a
refused registration, leaves the hook able to load or register the right one."""
import contextlib
import warnings

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
import gradwire.hooks.aggregate as hook_aggregate
from gradwire.collectives.agree import MismatchError
from gradwire.errors import GradwireError
from gradwire.hooks.comm import Comm
from gradwire.syncfree import device_paths


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        yield


def three_layers(**ddp_kw) -> DDP:
    torch.manual_seed(0)
    return DDP(nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 4), nn.Linear(4, 2)), **ddp_kw)


def backward(net: DDP, i: int = 0) -> None:
    net.zero_grad()
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(i))
    net(x).square().sum().backward()


def reference_grads(i: int) -> list[torch.Tensor]:
    want = three_layers()
    backward(want, i)
    return [p.grad for p in want.parameters()]


def fail_in(state: gh.HookState, calls: set[int], error: BaseException) -> list[int]:
    """Make the hook's ``calls``-th naming of a bucket (0 = the first from now) raise
    ``error``, as a bucket whose size does not match its parameters does; the calls so far."""
    real, seen = state.positions.layout, []

    def layout(params):
        seen.append(len(seen))
        if seen[-1] in calls:
            raise error
        return real(params)

    state.positions.layout = layout  # type: ignore[method-assign]
    return seen


def residual_mass(state: gh.HookState, net: DDP) -> list[torch.Tensor]:
    saved = state.state_dict()["residuals"]
    return [saved.get(state.positions.position(p), torch.zeros(p.numel())).view(p.shape)
            for p in net.module.parameters()]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("mode", ["bucket", "model"])
@pytest.mark.parametrize("at", [0, 1, 2])  # the first, a middle and the last bucket
@pytest.mark.parametrize("paths", ["host", "device"])
def test_an_error_raised_in_the_hook_itself_lets_the_next_step_run(one_rank, overlap, mode,
                                                                   at, paths):
    """A GradwireError raised by the hook for one bucket (not in a task) left DDP
    mid-reduction: the next backward failed with PyTorch's ``INTERNAL ASSERT FAILED ...
    unmarked_param_indices``. Now backward() raises the error itself, the next steps
    average as ever, and the failed step neither lost nor made residual mass: at P = 1 the
    gradients DDP wrote plus the residuals are the gradients injected. On the device path
    every bucket's average waits for the step's last bucket: those started before the
    failure were left unfinished (their residuals kept what they sent, and DDP wrote their
    gradients back: mass made); now they are averaged, as on the host."""
    with device_paths() if paths == "device" else contextlib.nullcontext():
        _fails_in_the_hook_at(overlap, mode, at)


def _fails_in_the_hook_at(overlap: bool, mode: str, at: int) -> None:
    net = three_layers(bucket_cap_mb=1e-5)  # three buckets once rebuilt
    state = gh.make("topk", density=0.3, overlap=overlap, mode=mode)
    state.register(net)
    applied = [torch.zeros_like(p) for p in net.parameters()]
    injected = [torch.zeros_like(p) for p in net.parameters()]

    def step(i: int, fails: bool = False) -> None:
        if fails:
            with pytest.raises(GradwireError, match=r"^bucket 1 has 9 elements, its "
                                                    r"parameters 8$"):
                backward(net, i)
        else:
            backward(net, i)
        for acc, p in zip(applied, net.parameters(), strict=True):
            acc += p.grad  # at P = 1 what DDP wrote is this rank's, averaged or not
        for acc, g in zip(injected, reference_grads(i), strict=True):
            acc += g

    for i in range(2):  # the first step, DDP's rebuild
        step(i)
    fail_in(state, {at}, GradwireError("bucket 1 has 9 elements, its parameters 8"))
    step(2, fails=True)
    for i in range(3, 6):
        step(i)
    for acc, left, want in zip(applied, residual_mass(state, net), injected, strict=True):
        torch.testing.assert_close(acc + left, want)


@pytest.mark.parametrize("overlap", [True, False])
def test_the_same_error_every_step_is_the_same_one_line_each_time(one_rank, overlap):
    """A state_dict of another model loaded before the first step (nothing to check it
    against then) fails every step in one line, naming the parameter; never PyTorch's
    internal assertion."""
    net = three_layers()
    state = gh.make("topk", density=0.3, overlap=overlap)
    state.register(net)
    wrong = {**state.state_dict(), "residuals": {0: torch.zeros(7)}}
    state.load_state_dict(wrong)
    for _ in range(3):
        with pytest.raises(GradwireError, match=r"^parameter at position 0 has \d+ elements, "
                                                r"the hook's state has 7 for it") as e:
            backward(net)
        assert "\n" not in str(e.value)


def test_after_a_mistaken_state_dict_the_right_one_loads(one_rank):
    """The element count a mistaken state_dict gave stayed once the model contradicted it, so
    the right state_dict was refused in turn ("has 30 elements, the model's has 7"): the
    next state_dict is checked against the parameter's count, and the right one loads."""
    net = three_layers()
    state = gh.make("topk", density=0.3)
    state.register(net)
    backward(net, 0)
    right = state.state_dict()
    want = three_layers()
    want_state = gh.make("topk", density=0.3)
    want_state.register(want)
    backward(want, 0)
    backward(want, 1)

    net2 = three_layers()
    state2 = gh.make("topk", density=0.3)
    state2.register(net2)
    mistaken = {**right, "residuals": {0: torch.zeros(7)}}
    state2.load_state_dict(mistaken)  # nothing to check it against yet
    with pytest.raises(GradwireError, match="the hook's state has 7 for it"):
        backward(net2, 1)
    with pytest.raises(GradwireError, match=r"^hook state_dict: residual of parameter 0 has 7 "
                                            r"elements, the model's has 30$"):
        state2.load_state_dict(mistaken)
    state2.load_state_dict(right)
    backward(net2, 1)
    for got, ref in zip(net2.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(got.grad, ref.grad)


@pytest.mark.parametrize("error", [RuntimeError("[c10d] Connection closed by peer"),
                                   KeyboardInterrupt()], ids=["c10d", "interrupt"])
def test_an_error_other_than_gradwires_while_settling_lets_the_next_step_run(
        one_rank, monkeypatch, error):
    """fp16 in steady state issues its allreduces from the hook and waits for them at the end
    of backward: only a GradwireError there was kept for backward() to raise; a RuntimeError
    of c10d, or a KeyboardInterrupt while waiting, skipped DDP's own end of backward, and
    the next step failed with PyTorch's internal assertion."""
    net = three_layers(bucket_cap_mb=1e-5)
    state = gh.make("fp16")
    state.register(net)
    for i in range(3):  # the first step, DDP's rebuild, one agreed step: issued from the hook
        backward(net, i)
    assert state.stats["issued"] > 0

    def broken(self, flying):
        raise error

    monkeypatch.setattr(Comm, "wait", broken)
    with pytest.raises(type(error)) as e:
        backward(net, 3)
    assert e.value is error
    monkeypatch.undo()
    steps = state.stats["steps"]
    for i in range(4, 7):
        backward(net, i)
        for got, ref in zip(net.parameters(), reference_grads(i), strict=True):
            assert torch.equal(got.grad, ref.half().float())
    assert state.stats["steps"] == steps + 3 and state._flights == []  # noqa: SLF001


@pytest.mark.parametrize("overlap", [True, False])
def test_a_failed_step_gives_back_an_unused_parameters_share(one_rank, monkeypatch, overlap):
    """With find_unused_parameters=True the average credited to a parameter no rank used goes
    back into its residual at the end of backward. In a step that failed (here its last
    bucket) the deferred error was raised first and that was skipped: the parameter's residual
    lost what its bucket sent."""
    module = nn.Module()
    module.a = nn.Parameter(torch.zeros(40))  # large enough to be compressed
    module.b = nn.Parameter(torch.zeros(30))
    module.c = nn.Parameter(torch.zeros(20))  # DDP's first bucket
    net = DDP(module, bucket_cap_mb=1e-5, find_unused_parameters=True)
    state = gh.make("topk", density=0.3, overlap=overlap)
    state.register(net)
    g = torch.Generator().manual_seed(0)

    def step(params: list[nn.Parameter]) -> None:
        net.zero_grad()
        grads = [torch.randn(p.shape, generator=g) for p in params]
        module.forward = lambda: sum((p * c).sum() for p, c in zip(params, grads,  # noqa: B023
                                                                   strict=True))
        net().backward()

    for _ in range(3):
        step([module.a, module.b, module.c])
    before = residual_mass(state, net)[2].clone()
    assert before.abs().sum() > 0
    calls = []
    real = hook_aggregate.start

    def last_fails(c, x, key, check=True):
        calls.append(key)
        if len(calls) == 3:
            raise MismatchError("rank 0: ranks made different collective calls (test)")
        return real(c, x, key, check)

    monkeypatch.setattr(hook_aggregate, "start", last_fails)
    with pytest.raises(MismatchError):
        step([module.a, module.b])  # c unused
    assert len(calls) == 3 and module.c.grad is None
    assert calls[0] == (state.positions.position(module.c),)  # averaged before the failure
    torch.testing.assert_close(residual_mass(state, net)[2], before)


def test_a_state_dict_that_contradicts_two_parameters_of_one_bucket_is_replaced(one_rank):
    """DDP's first bucket holds every parameter. A mistaken state_dict giving two of them the
    wrong element count failed that bucket naming the first, and only the first was then
    taken from the model: the right state_dict was refused for the second ("residual of
    parameter 1 has 5 elements, the model's has 9")."""
    net = three_layers()
    state = gh.make("topk", density=0.3)
    state.register(net)
    backward(net, 0)
    right = state.state_dict()

    net2 = three_layers()
    state2 = gh.make("topk", density=0.3)
    state2.register(net2)
    state2.load_state_dict({**right, "residuals": {0: torch.zeros(7), 1: torch.zeros(9)}})
    with pytest.raises(GradwireError, match=r"^parameter at position 0 has 30 elements, the "
                                            r"hook's state has 7 for it"):
        backward(net2, 1)
    state2.load_state_dict(right)
    backward(net2, 1)
    backward(net, 1)
    for got, ref in zip(net2.parameters(), net.parameters(), strict=True):
        assert torch.equal(got.grad, ref.grad)


@pytest.mark.parametrize("at", [1, 2])  # a middle and the last bucket
def test_a_step_that_fails_after_buckets_issued_from_the_hook_neither_loses_nor_makes_mass(
        one_rank, at):
    """int8 in steady state issues its allreduces from the hook, and its residual takes what
    a bucket sends as it is issued. A later bucket of the step that failed made the end of
    backward complete the issued ones as they were, unread and unfinished (on a device
    always; on the host where gloo's callback had not run yet): the residual kept what they
    sent and DDP wrote the gradient back as well."""
    with device_paths():
        torch.manual_seed(0)
        net = DDP(nn.Sequential(nn.Linear(60, 50), nn.Linear(50, 40), nn.Linear(40, 2)),
                  bucket_cap_mb=1e-5)  # three buckets once rebuilt
        state = gh.make("int8")
        state.register(net)
        params = list(net.parameters())
        applied = [torch.zeros_like(p) for p in params]
        injected = [torch.zeros_like(p) for p in params]

        def step(i: int, fails: bool = False) -> None:
            net.zero_grad()
            x = torch.randn(3, 60, generator=torch.Generator().manual_seed(i))
            injected_now = torch.autograd.grad(net.module(x).square().sum(), params)
            if fails:
                with pytest.raises(GradwireError, match="refused here"):
                    net(x).square().sum().backward()
            else:
                net(x).square().sum().backward()
            for acc, p in zip(applied, params, strict=True):
                acc += p.grad  # at P = 1 what DDP wrote is this rank's, averaged or not
            for acc, g in zip(injected, injected_now, strict=True):
                acc += g

        for i in range(3):  # the first step, DDP's rebuild, the step sizes agreed
            step(i)
        issued = state.stats["issued"]
        step(3)
        assert state.stats["issued"] > issued  # issued from the hook in steady state
        fail_in(state, {at}, GradwireError("refused here"))
        step(4, fails=True)
        for i in range(5, 7):
            step(i)
        for acc, left, want in zip(applied, residual_mass(state, net), injected, strict=True):
            torch.testing.assert_close(acc + left, want)


def test_a_step_whose_dense_fallback_fails_is_not_counted(one_rank, monkeypatch):
    """int8 issued from the hook: a NaN sends its bucket dense once more, from the comm thread.
    The end of backward counted the step before that fallback ran, so one that failed still
    moved the step count (and with it dense_steps and the warm-up)."""
    from gradwire.hooks.flight import Flight

    torch.manual_seed(0)
    net = DDP(nn.Sequential(nn.Linear(60, 50), nn.Linear(50, 40), nn.Linear(40, 2)),
              bucket_cap_mb=1e-5)
    state = gh.make("int8")
    state.register(net)

    def step(i: int, nan: bool = False) -> None:
        net.zero_grad()
        x = torch.randn(3, 60, generator=torch.Generator().manual_seed(i))
        if nan:
            x[0, 0] = float("nan")
        net(x).square().sum().backward()

    for i in range(4):  # from the fourth step on every bucket is issued from the hook
        step(i)
    assert state.step == 4 and state.stats["issued"] > 0

    def fails(self):
        raise GradwireError("rank 0: the dense fallback failed (test)")

    monkeypatch.setattr(Flight, "fall_back", fails)
    with pytest.raises(GradwireError, match="the dense fallback failed"):
        step(4, nan=True)
    assert state.step == state.stats["steps"] == 4
    monkeypatch.undo()
    step(5)
    assert state.step == 5


def _refused_registration_rank(rank: int, world: int) -> dict:
    import torch.distributed as dist

    warnings.simplefilter("ignore")
    groups = [dist.new_group([r]) for r in range(world)]
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    state = gh.make("dense")
    own = DDP(net, process_group=groups[rank])  # DDP over this rank alone, with a hook
    own._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)  # noqa: SLF001
    got: dict = {}
    try:
        state.register(own)
    except GradwireError as e:
        got["refused"] = str(e)
    try:  # the same state on a DDP over the world: nothing of the refused one stays
        ddp = DDP(net)
        state.register(ddp)
    except GradwireError as e:
        got["second"] = str(e)
        return got
    ddp.zero_grad()
    ddp(torch.full((1, 4), float(rank + 1))).sum().backward()
    got["grad"] = net.weight.grad.tolist()
    return got


def test_a_refused_registration_leaves_the_state_as_it_was(tmp_path):
    """register() took the group of the DDP it was given before DDP refused the hook (a hook
    registered already, here a builtin one), so the state then refused the same model over the
    world: "the state averages over ranks [0], the model's DistributedDataParallel over
    [0, 1]"."""
    from conftest import run_world

    got = run_world(_refused_registration_rank, 2, tmp_path)
    for r in got:
        assert "DDP refused the hook" in r["refused"] and "second" not in r, r
        assert r["grad"] == [[1.5] * 4] * 2  # the mean of ranks' inputs 1 and 2


@pytest.mark.parametrize("order", [torch.tensor([0, 1]), torch.arange(100).reshape(10, 10)])
def test_a_state_dict_whose_order_is_a_tensor_is_refused_in_one_line(order):
    """bool() of the order, a tensor of several elements, raised torch's RuntimeError ("Boolean
    value of Tensor with more than one value is ambiguous") instead of the one line."""
    state = gh.make("topk")
    saved = state.state_dict()
    with pytest.raises(GradwireError, match="malformed.*order is a list of parameter "
                                            "positions, got a tensor") as e:
        state.load_state_dict({**saved, "order": order})
    assert "\n" not in str(e.value) and state.state_dict()["order"] is None
