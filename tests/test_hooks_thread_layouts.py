"""The hooks' comm thread, deferred errors and bucket layouts (gradwire.hooks.comm, .layout), on
one gloo rank in this process: a KeyboardInterrupt in an aggregation that completes several
buckets' futures reaches backward() instead of leaving DDP waiting for ever; the comm thread
outlives any task; a known layout that a newer one took parameters from is assembled afresh,
so error feedback neither makes nor loses mass across a new DDP of the same model.

A step that would hang runs in a daemon thread, so that a regression fails here rather than
stopping the suite."""
import contextlib
import threading
import time
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
import gradwire.hooks.aggregate as hook_aggregate
from gradwire.errors import GradwireError
from gradwire.hooks import layout
from gradwire.hooks.comm import Worker
from gradwire.syncfree import device_paths

HANG = 60  # seconds a step may take before it counts as hung (a step here takes well under 1)


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        yield


def three_layers() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 4), nn.Linear(4, 2))


class Ledger:
    """At P = 1 what DDP wrote into the gradients, averaged or not, plus the residuals left
    must be the gradients injected: neither mass made nor lost."""

    def __init__(self, module: nn.Module) -> None:
        self.params = list(module.parameters())
        self.ref = three_layers()
        self.applied = [torch.zeros_like(p) for p in self.params]
        self.injected = [torch.zeros_like(p) for p in self.params]

    def step(self, net: DDP, i: int) -> BaseException | None:
        """One backward of ``net`` on batch ``i`` (in a thread, bounded by HANG); the error it
        raised, if any."""
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(i))
        self.ref.zero_grad()
        self.ref(x).square().sum().backward()
        net.zero_grad()
        raised: list[BaseException] = []

        def run() -> None:
            try:
                net(x).square().sum().backward()
            except BaseException as e:  # a KeyboardInterrupt too: the test's to look at
                raised.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(HANG)
        assert not thread.is_alive(), f"step {i} hung: DDP waits for a future never completed"
        for acc, p in zip(self.applied, self.params, strict=True):
            acc += p.grad
        for acc, r in zip(self.injected, self.ref.parameters(), strict=True):
            acc += r.grad
        return raised[0] if raised else None

    def check(self, state: gh.HookState) -> None:
        saved = state.state_dict()["residuals"]
        for acc, p, want in zip(self.applied, self.params, self.injected, strict=True):
            left = saved.get(state.positions.position(p), torch.zeros(p.numel()))
            torch.testing.assert_close(acc + left.view(p.shape), want)


def interrupt_at(monkeypatch, call: int) -> BaseException:
    """The hook's ``call``-th aggregation (1 = the first from now) raises a KeyboardInterrupt,
    as Ctrl-C while it waits for a collective does; that interrupt."""
    real, calls, interrupt = hook_aggregate.start, [], KeyboardInterrupt()

    def start(c, x, key, check=True):
        calls.append(key)
        if len(calls) == call:
            raise interrupt
        return real(c, x, key, check)

    monkeypatch.setattr(hook_aggregate, "start", start)
    return interrupt


# --- an interrupt in an aggregation that completes several buckets ------------------------

@pytest.mark.parametrize(("mode", "paths", "call"),
                         [("model", "host", 1), ("bucket", "device", 3), ("bucket", "device", 2),
                          ("bucket", "host", 3)],
                         ids=["model", "device-last", "device-middle", "host-last"])
@pytest.mark.parametrize("overlap", [False, True])
def test_an_interrupt_in_an_aggregation_reaches_backward_and_the_next_step_runs(
        one_rank, monkeypatch, mode, paths, call, overlap):
    """Model mode, and bucket mode on a device at the step's last bucket, complete every
    bucket's future from one aggregation. Without overlap it runs in the hook: a
    KeyboardInterrupt there went past the task's guard to the hook, which completed only its
    own bucket's future, and DDP waited for the others for ever (Ctrl-C then did nothing).
    With overlap (an interrupt is the main thread's, so any BaseException on the comm thread)
    the thread ended, and DDP waited for ever too. Now backward() raises the interrupt itself,
    the next steps run, and the interrupted step neither made nor lost residual mass."""
    with device_paths() if paths == "device" else contextlib.nullcontext():
        module = three_layers()
        net = DDP(module, bucket_cap_mb=1e-5)  # three buckets once rebuilt
        state = gh.make("topk", density=0.3, mode=mode, overlap=overlap)
        state.register(net)
        ledger = Ledger(module)
        for i in range(2):  # the first step, DDP's rebuild
            assert ledger.step(net, i) is None
        steps = state.stats["steps"]
        interrupt = interrupt_at(monkeypatch, call)
        assert ledger.step(net, 2) is interrupt
        monkeypatch.undo()
        for i in range(3, 5):
            assert ledger.step(net, i) is None
        assert state.stats["steps"] == steps + 2  # the interrupted step is not counted
        ledger.check(state)


# --- the comm thread outlives its tasks ---------------------------------------------------

def settled(fut: torch.futures.Future) -> torch.futures.Future:
    """``fut`` once completed, within HANG seconds (a future of a thread that ended is never
    completed, and its ``wait()`` would not return)."""
    deadline = time.monotonic() + HANG
    while not fut.done():
        assert time.monotonic() < deadline, "never completed: the comm thread ended"
        time.sleep(0.01)
    return fut


def test_a_task_raising_a_base_exception_fails_its_futures_and_the_thread_goes_on():
    """A BaseException out of a task ended the thread with its futures unset: DDP waited for
    them, and drain() and every later task, for ever."""
    worker = Worker()
    failed, later = torch.futures.Future(), torch.futures.Future()

    def stops() -> list[torch.Tensor]:
        raise SystemExit(3)

    worker.submit(stops, [failed])
    worker.submit(lambda: [torch.ones(2)], [later])
    assert settled(later).wait().tolist() == [1, 1]
    with pytest.raises(GradwireError, match=r"^hooks: a task on the comm thread raised "
                                            r"SystemExit: 3$"):
        settled(failed).wait()
    assert worker._thread.is_alive()  # noqa: SLF001
    worker.drain()


def test_a_future_completed_twice_fails_the_rest_and_the_thread_goes_on():
    """A future already completed made ``set_result`` raise on the thread, which ended there:
    the task's other futures, and every later task, were never completed."""
    worker = Worker()
    done, rest = torch.futures.Future(), torch.futures.Future()
    done.set_result(torch.zeros(1))
    worker.submit(lambda: [torch.ones(1), torch.ones(1)], [done, rest])
    with pytest.raises(RuntimeError, match="completed"):
        settled(rest).wait()
    assert done.wait().tolist() == [0]  # as it was
    assert worker._thread.is_alive()  # noqa: SLF001
    worker.drain()


def one_bucket(module: nn.Module):
    """A stand-in for a GradBucket of every parameter of ``module``, its one bucket."""
    params = list(module.parameters())

    class Bucket:
        def buffer(self) -> torch.Tensor:
            return torch.cat([torch.ones(p.numel()) for p in params])

        def index(self) -> int:
            return 0

        def is_last(self) -> bool:
            return True

        def parameters(self) -> list[torch.Tensor]:
            return params

    return Bucket()


def test_outside_a_backward_a_base_exception_reaches_the_caller(one_rank, monkeypatch):
    """The guard keeps a BaseException only while armed (inside a backward): a hook called
    directly, without overlap, raises it to its caller as before."""
    module = three_layers()
    net = DDP(module)
    state = gh.make("dense", overlap=False)
    state.register(net)
    interrupt = interrupt_at(monkeypatch, 1)
    bucket = one_bucket(module)
    with pytest.raises(KeyboardInterrupt) as e:
        state.hook(state, bucket)
    assert e.value is interrupt


# --- a known layout whose parameters a newer one took -------------------------------------

def test_a_known_layout_a_newer_one_took_parameters_from_is_assembled_afresh():
    """(0, 1, 2) gave p0 and p2 to (2, 0), which then took on new residuals; used again, it
    was taken as it was: its stale p0 and p2 were sent a second time (mass made) and what it
    then kept of them was lost, as where() reads (2, 0)'s."""
    numels = {0: 2, 1: 3, 2: 1}
    res = {(0, 1, 2): torch.arange(6, dtype=torch.float64)}  # p0: 0 1, p1: 2 3 4, p2: 5
    like = torch.zeros(1, dtype=torch.float64)
    layout.carry(res, (2, 0), numels, like)
    res[(2, 0)] += 10  # what the step of (2, 0) left: p2 15, p0 10 11
    layout.carry(res, (0, 1, 2), numels, like)
    assert list(res) == [(0, 1, 2)]  # (2, 0) holds nothing live any more
    assert res[(0, 1, 2)].tolist() == [10, 11, 2, 3, 4, 15]
    assert {k: v.tolist() for k, v in layout.split(res, numels).items()} == {
        0: [10, 11], 1: [2, 3, 4], 2: [15]}


def test_a_known_layout_nobody_took_from_is_used_as_it_is():
    """The steady state: a step's layouts are disjoint, each keeps its own tensor (no copy)."""
    numels = {0: 2, 1: 3, 2: 1}
    res = {(1,): torch.ones(3), (2, 0): torch.zeros(3)}
    kept = dict(res)
    for key in [(1,), (2, 0), (1,)]:
        layout.carry(res, key, numels, torch.zeros(1))
    assert list(res) == [(1,), (2, 0)]
    assert all(res[k] is kept[k] for k in res)


def test_carry_says_whether_the_layouts_are_disjoint():
    """False while a superseded layout lingers, True once it is assembled afresh; a caller told
    True skips the check and the layouts are used as they are."""
    numels = {0: 2, 1: 3, 2: 1}
    res = {(0, 1, 2): torch.arange(6, dtype=torch.float64)}
    like = torch.zeros(1, dtype=torch.float64)
    assert layout.carry(res, (2, 0), numels, like) is False  # (0, 1, 2) still holds p1
    assert layout.carry(res, (2, 0), numels, like) is False  # known, the newest: as it is
    assert layout.carry(res, (0, 1, 2), numels, like) is True
    assert layout.carry(res, (0, 1, 2), numels, like, disjoint=True) is True


layouts = st.lists(st.permutations(range(5)).flatmap(
    lambda order: st.integers(1, 5).map(lambda n: tuple(order[:n]))), min_size=1, max_size=8)


@given(layouts)
def test_carry_told_what_it_returned_keeps_what_checking_every_time_keeps(sequence):
    """The caller's flag is only a shortcut: for any sequence of buckets, the residuals carried
    with it are those carried with the check done every call, value for value."""
    numels = {p: p + 1 for p in range(5)}
    like = torch.zeros(1, dtype=torch.float64)
    told: dict[layout.Layout, torch.Tensor] = {}
    checked: dict[layout.Layout, torch.Tensor] = {}
    disjoint = False
    for i, key in enumerate(sequence):
        disjoint = layout.carry(told, key, numels, like, disjoint=disjoint)
        layout.carry(checked, key, numels, like)
        for res in (told, checked):  # the step's compression leaves new values
            size = sum(numels[p] for p in key)
            if key not in res:
                res[key] = torch.zeros(size, dtype=torch.float64)
            res[key] += torch.arange(size, dtype=torch.float64) + i
        assert list(told) == list(checked)
        assert all(torch.equal(told[k], checked[k]) for k in told)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_new_ddp_after_a_step_failed_part_way_neither_makes_nor_loses_mass(one_rank, overlap):
    """Step 0's one bucket is every parameter; DDP's rebuilt buckets then take them a few at a
    time. A step that fails after the first of those leaves step 0's layout holding the rest;
    a new DDP of the same model starts from step 0's buckets again, and that layout was used
    as it was: the parameters the rebuilt bucket took were sent twice (measured: 0.36 of
    gradient made on this model)."""
    module = three_layers()
    net = DDP(module, bucket_cap_mb=1e-5)
    state = gh.make("topk", density=0.3, overlap=overlap)
    state.register(net)
    ledger = Ledger(module)
    assert ledger.step(net, 0) is None
    real, calls = state.positions.layout, []

    def second_fails(params):
        calls.append(params)
        if len(calls) == 2:
            raise GradwireError("refused here")
        return real(params)

    state.positions.layout = second_fails  # type: ignore[method-assign]
    assert isinstance(ledger.step(net, 1), GradwireError)
    del state.positions.layout
    again = DDP(module, bucket_cap_mb=1e-5)
    state.register(again)
    for i in range(2, 5):
        assert ledger.step(again, i) is None
    layouts = list(state.ef.residuals)
    assert len({p for key in layouts for p in key}) == sum(map(len, layouts))  # disjoint
    ledger.check(state)
