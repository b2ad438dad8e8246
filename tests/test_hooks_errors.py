"""The DDP hook on one gloo rank in this process: an error inside the hook, or of a bucket
issued from it, reaches backward() as itself (and a stalled peer in steady state is a timeout,
on two ranks); sparse gradients, a model without DDP and a group of the wrong kind are one
line; and the NaN/Inf policy as the hook runs it (a false alarm on large finite values, fp16
overflow)."""
import warnings

import pytest
import torch
from conftest import run_checks
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
import gradwire.hooks.aggregate as hook_aggregate
from gradwire.collectives.agree import MismatchError
from gradwire.errors import GradwireError
from gradwire.hooks.comm import Comm
from gradwire.transport import Transport


def two_layers(**ddp_kw) -> DDP:
    torch.manual_seed(0)
    return DDP(nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 2)), **ddp_kw)


def backward(net: nn.Module) -> None:
    net(torch.ones(3, 6)).sum().backward()


# --- errors raised inside the hook --------------------------------------------------------------

@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("mode", ["bucket", "model"])
def test_an_error_inside_the_hook_reaches_backward_unchanged(one_rank, monkeypatch, overlap,
                                                             mode):
    """DDP read a future completed with the error as a Tensor: "RuntimeError: Unable to cast
    <message> to Tensor". Now the error itself, and DDP finished that backward, so the next
    one runs."""
    net = two_layers(bucket_cap_mb=1e-5)  # several buckets
    gh.make("dense", overlap=overlap, mode=mode).register(net)

    def mismatch(c, x, key, check=True):
        raise MismatchError("rank 0: ranks made different collective calls: elements: 9 on "
                            "rank 0; 8 on rank 1")

    monkeypatch.setattr(hook_aggregate, "start", mismatch)
    for _ in range(2):
        with pytest.raises(MismatchError, match=r"^rank 0: ranks made different collective"):
            backward(net)
    monkeypatch.undo()
    net.zero_grad()
    backward(net)  # P = 1: the average is this rank's own gradient
    want = two_layers()
    backward(want)
    for got, ref in zip(net.parameters(), want.parameters(), strict=True):
        assert torch.equal(got.grad, ref.grad)


def test_an_error_on_the_comm_thread_keeps_its_type(one_rank):
    """A genuine one: model mode over parameters of two dtypes, registered with DDP's own
    ``register_comm_hook`` (``register`` refuses it before any backward)."""
    module = nn.Module()
    module.a = nn.Parameter(torch.zeros(3))
    module.b = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    module.forward = lambda: module.a.sum() + module.b.sum()
    net = DDP(module)
    state = gh.make("topk", mode="model")
    net.register_comm_hook(state, state.hook)
    with pytest.raises(GradwireError, match=r"^hooks: mode='model' needs every trained "
                                            r"parameter in one dtype, got \['torch.float32', "
                                            r"'torch.float64'\]: use mode='bucket'"):
        net().backward()


@pytest.mark.parametrize("where", ["collective", "decompress"])
def test_an_error_of_a_bucket_issued_from_the_hook_keeps_its_type(one_rank, monkeypatch, where):
    """In steady state fp16's allreduces are issued from the hook and their futures complete
    the buckets' (no comm thread): a collective that fails, or a decompression that raises on
    gloo's thread, still reaches backward() as itself, DDP finishes that backward, and the
    next steps agree afresh and then go the direct way again."""
    net = two_layers(bucket_cap_mb=1e-5)
    state = gh.make("fp16")
    state.register(net)
    for _ in range(3):  # the first step, DDP's rebuild, one agreed step
        backward(net)
    handed = []
    submit = state._worker.submit  # noqa: SLF001
    state._worker.submit = lambda *a: (handed.append(a), submit(*a))[1]  # noqa: SLF001
    before = state.stats["buckets"]
    backward(net)
    assert handed == [] and state.stats["steps"] == 4  # issued from the hook
    buckets = state.stats["buckets"] - before

    def broken(self, flying):
        raise GradwireError("rank 0: torch.distributed all_reduce of 8 elements failed")

    def garbled(self, payload, x):
        raise MismatchError("rank 0: garbled")

    if where == "collective":
        monkeypatch.setattr(Comm, "wait", broken)
        expected = (GradwireError, r"^rank 0: torch.distributed all_reduce of 8 elements")
    else:
        monkeypatch.setattr(type(state.compressor), "decompress_into", garbled)
        expected = (MismatchError, r"^rank 0: garbled$")
    with pytest.raises(expected[0], match=expected[1]):
        backward(net)
    monkeypatch.undo()
    for _ in range(3):
        net.zero_grad()
        backward(net)
    assert len(handed) == buckets  # the step after the failure agreed on its buckets afresh…
    assert state.stats["steps"] == 7  # …the failed one did not count, the last went direct
    want = two_layers()
    backward(want)
    for got, ref in zip(net.parameters(), want.parameters(), strict=True):
        assert torch.equal(got.grad, ref.grad.half().float())


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("mode", ["bucket", "model"])
def test_a_failed_step_does_not_count_toward_dense_steps(one_rank, monkeypatch, overlap, mode):
    """A step that failed moved the step count on all the same, and with it the warm-up and
    ``dense_steps``: with dense_steps=1 the one dense iteration was the one that failed, and
    the first that went through was sparse. A failed step is no iteration aggregated."""
    net = two_layers(bucket_cap_mb=1e-5)
    state = gh.make("topk", density=0.3, dense_steps=1, overlap=overlap, mode=mode)
    state.register(net)

    def mismatch(c, x, key, check=True):
        raise MismatchError("rank 0: ranks made different collective calls: elements: 9 on "
                            "rank 0; 8 on rank 1")

    monkeypatch.setattr(hook_aggregate, "start", mismatch)
    with pytest.raises(MismatchError):
        backward(net)
    monkeypatch.undo()
    assert (state.step, state.density, state.stats["steps"]) == (0, 1.0, 0)
    backward(net)
    assert state.stats["dense"] == state.stats["buckets"] > 0  # sent dense, as the first
    assert (state.step, state.density, state.stats["steps"]) == (1, 0.3, 1)


def test_a_failed_step_issued_from_the_hook_does_not_count(one_rank, monkeypatch):
    """The same for buckets issued from the hook (fp16 in steady state), which fail in
    _settle rather than on the comm thread."""
    net = two_layers(bucket_cap_mb=1e-5)
    state = gh.make("fp16")
    state.register(net)
    for _ in range(3):  # the first step, DDP's rebuild, one agreed step
        backward(net)

    def broken(self, flying):
        raise GradwireError("rank 0: torch.distributed all_reduce of 8 elements failed")

    monkeypatch.setattr(Comm, "wait", broken)
    with pytest.raises(GradwireError, match="all_reduce of 8 elements failed"):
        backward(net)
    assert state.step == state.stats["steps"] == 3


def test_a_stalled_rank_fails_the_others_within_the_timeout_in_steady_state():
    """tests/scripts/hook_stall_check.py: dense and fp16 issued from the hook, one rank
    stalls 5 s, the other's backward raises GradwireError after GRADWIRE_TIMEOUT (2 s)."""
    run_checks("hook_stall_check.py", 2, timeout=120)


class FakeBucket:
    """What the hook reads of a dist.GradBucket, for calling it outside a backward."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.buf = torch.cat([p.detach().reshape(-1) for p in params])

    def buffer(self) -> torch.Tensor:
        return self.buf

    def parameters(self) -> list[nn.Parameter]:
        return self.params

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def test_outside_a_backward_the_error_goes_to_the_future(one_rank, monkeypatch):
    state = gh.make("dense", overlap=False)

    def boom(c, x, key, check=True):
        raise GradwireError("broken")

    monkeypatch.setattr(hook_aggregate, "start", boom)
    fut = state.hook(state, FakeBucket([nn.Parameter(torch.ones(3))]))
    with pytest.raises(GradwireError, match="broken"):
        fut.wait()


# --- what the hook refuses, in one line -------------------------------------------------------

def sparse_model() -> nn.Module:
    return nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2))


def test_sparse_gradients_are_refused_naming_the_module(one_rank):
    with pytest.raises(GradwireError) as e:
        gh.make("topk").register(DDP(sparse_model()))
    assert str(e.value) == ("hooks: module '0' (Embedding) makes sparse gradients; gradwire's "
                            "hooks need dense gradients: build embeddings with sparse=False "
                            "(nn.Embedding, nn.EmbeddingBag)")


@pytest.mark.parametrize("method", ["topk", "dense", "powersgd"])
def test_a_sparse_bucket_fails_the_hook_in_one_line(one_rank, method):
    """Registered past register()'s check: the hook itself refuses the bucket, where it once
    failed on its shape ("x must be a 1-D float tensor") or on nbytes."""
    net = DDP(sparse_model())
    state = gh.make(method)
    net.register_comm_hook(state, state.hook)
    with pytest.raises(GradwireError, match=r"^hooks: bucket \d+ holds sparse gradients; "
                                            "gradwire's hooks need dense gradients") as e:
        net(torch.tensor([1, 2, 3])).sum().backward()
    assert "\n" not in str(e.value)


def test_register_needs_a_ddp_model():
    with pytest.raises(GradwireError) as e:
        gh.make("topk").register(nn.Linear(2, 2))
    assert str(e.value) == ("hooks: register() needs a model wrapped in torch.nn.parallel."
                            "DistributedDataParallel, got Linear: pass "
                            "DistributedDataParallel(model)")


def test_a_group_of_the_wrong_kind_is_one_line(one_rank):
    says = ("group must be None (the default group) or a torch.distributed ProcessGroup "
            "(dist.new_group(...)), got 'x'")
    with pytest.raises(GradwireError, match=r"^hooks: " + says.replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")):
        gh.make("topk", group="x")
    with pytest.raises(GradwireError, match=r"^Transport: group must be None"):
        Transport(group="x")


# --- the NaN/Inf policy in the hook -----------------------------------------------------------

def one_parameter(values: list[float], dtype: torch.dtype, method: str = "topk",
                  density: float = 0.25) -> tuple[DDP, nn.Parameter, gh.HookState]:
    p = nn.Parameter(torch.zeros(len(values), dtype=dtype))
    module = nn.Module()
    module.p = p
    net = DDP(module)
    state = gh.make(method, density=density, warmup=False, overlap=False)
    state.register(net)
    return net, p, state


def step(net: DDP, p: nn.Parameter, grad: list[float]) -> list[warnings.WarningMessage]:
    """One backward whose gradient is ``grad``; the warnings it gave."""
    c = torch.tensor(grad, dtype=p.dtype)
    p.grad = None
    net.module.forward = lambda: (p * c).sum()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net().backward()
    return caught


def residual_of(state: gh.HookState, p: nn.Parameter) -> torch.Tensor:
    return state.state_dict()["residuals"][state.positions.position(p)]


def test_finite_values_whose_sum_overflows_are_compressed_by_the_hook(one_rank):
    net, p, state = one_parameter([0] * 4, torch.float32)
    caught = step(net, p, [3e38, 3e38, 0, 0])
    big = torch.tensor(3e38).item()
    assert not caught and p.grad.tolist() == [big, 0, 0, 0]  # k = 1 of 4: compressed
    assert residual_of(state, p).tolist() == [0, big, 0, 0]


def test_fp16_overflow_in_the_hook_keeps_the_residual_and_conserves_mass(one_rank):
    net, p, state = one_parameter([0] * 4, torch.float16)
    grads = [[60000.0, 60000.0, 0, 0], [0, 10000.0, 0, 0], [0.0] * 4]
    applied = torch.zeros(4, dtype=torch.float64)
    messages = []
    for g in grads:
        messages.append([str(w.message) for w in step(net, p, g)])
        assert p.grad.isfinite().all() and residual_of(state, p).isfinite().all()
        applied += p.grad.double()
    # step 1: 60000 + 10000 overflows fp16: x alone is applied, the residual's 60000 kept
    assert messages[0] == [] and messages[2] == []
    assert len(messages[1]) == 1 and "gradient + residual overflows float16" in messages[1][0]
    total = residual_of(state, p).double() + applied
    assert torch.equal(total, torch.tensor(grads, dtype=torch.float64).sum(0))


# --- a corrupt state_dict is refused whole, in one line -------------------------------------

@pytest.mark.parametrize(("change", "message"), [
    # as a JSON copy of a checkpoint can hold (Infinity)
    ({"order": [float("inf")]}, r"order holds inf: expected each parameter position"),
    ({"residuals": {float("inf"): torch.ones(2)}}, r"residual of parameter inf: a parameter "),
    ({"compressor": {"step": float("inf")}}, r"is malformed \(OverflowError"),
    # int() took these as positions 1 and 0 (True), or kept a position the order lacks
    ({"order": [1.0, 0]}, r"order holds 1\.0"),
    ({"order": [True]}, r"order holds True"),
    ({"order": [0, 0]}, r"order names a position twice"),
    ({"order": [0], "residuals": {0: torch.ones(2), 5: torch.ones(3)}},
     r"residual of parameter 5, a position its order does not name"),
    ({"residuals": {"0": torch.ones(2)}}, r"residual of parameter '0'"),
    ({"residuals": {-1: torch.ones(2)}}, r"residual of parameter -1"),
])
def test_a_corrupt_state_dict_is_refused_in_one_line_and_changes_nothing(change, message):
    """int(inf) raised OverflowError, which load_state_dict let through as a traceback after
    it had set the step (and recorded counts): neither one line nor all or nothing. int() also
    took 1.0 or True as positions, and a residual of a position the order lacks was kept."""
    saved = gh.make("topk", density=0.1, mode="model")
    saved.positions.numels.update({0: 2})
    saved.ef.residuals[(0,)] = torch.ones(2)
    saved.step = 7
    s = gh.make("topk", density=0.1, mode="model")
    s.step = 3
    with pytest.raises(GradwireError, match=r"^hook state_dict[: ].*" + message):
        s.load_state_dict({**saved.state_dict(), **change})
    assert (s.step, s.epoch, s.positions.numels, s._resume_order) == (3, 0, {}, None)
    assert s.ef.residuals == {} and s.compressor.state_dict() == {"step": 0}
