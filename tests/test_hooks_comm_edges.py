"""Edges of the hooks' collectives (gradwire.hooks.comm) and bucket layouts
(gradwire.hooks.layout), on one gloo rank in this process: a collective that did not complete
is an error naming it, whatever c10d reports; the comm thread does not keep a discarded hook
state alive; complex parameters, which DDP buckets as their real view."""
import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
from gradwire.errors import GradwireError
from gradwire.hooks.comm import Comm, InFlight, Worker


class Work:
    """A torch.distributed Work whose ``wait`` returns ``done`` or raises ``error``."""

    def __init__(self, done: bool = True, error: Exception | None = None) -> None:
        self.done, self.error = done, error

    def wait(self, timeout: object = None) -> bool:
        if self.error is not None:
            raise self.error
        return self.done


@pytest.mark.parametrize("work", [Work(done=False), Work(error=RuntimeError(""))],
                         ids=["returns-false", "empty-message"])
def test_a_collective_that_did_not_complete_is_one_line_naming_it(one_rank, work):
    """c10d's ``Work.wait(timeout)`` says False where the work did not complete in time (the
    transport's waits read it so): the hook went on and read a bucket still being summed. A
    RuntimeError without a message was an IndexError from the wait's own error handling."""
    comm = Comm(None, None, transport=False)
    with pytest.raises(GradwireError) as e:
        comm.wait([InFlight(work, "all_reduce of 3 elements")])  # type: ignore[arg-type]
    msg = str(e.value)
    assert msg.startswith("rank 0: torch.distributed all_reduce of 3 elements failed or timed "
                          "out after ") and "GRADWIRE_TIMEOUT" in msg and "\n" not in msg


def test_the_comm_thread_lets_go_of_its_last_task():
    """The thread held its last task until the next one came, and a task holds its hook state
    (which holds the Worker): a state whose last task was not the step's drain (int8's dense
    fallback, handed over at the end of backward) outlived its model, with its residuals,
    buckets and thread, until the process exited."""
    class State:  # a hook state: its Worker, and what a task's closure reaches
        def __init__(self) -> None:
            self.worker, self.residual = Worker(), torch.zeros(3)

    state = State()
    thread = state.worker._thread
    done = torch.futures.Future()
    state.worker.submit(lambda state=state: [state.residual + 1], [done])
    assert done.wait().tolist() == [1, 1, 1]
    del state
    thread.join(timeout=5)  # the state collected, its Worker's finalizer stops the thread
    assert not thread.is_alive()


class Complex(nn.Module):
    """A complex weight beside a real one: DDP buckets the complex one as its real view."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(16, 12, dtype=torch.complex64))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w).abs().sum() + (x.real @ self.b.unsqueeze(1)).sum()


@pytest.mark.parametrize("method", ["dense", "topk"])
@pytest.mark.parametrize("mode", ["bucket", "model"])
def test_complex_parameters_are_averaged_as_ddp_buckets_them(one_rank, method, mode):
    """A complex parameter takes two elements per entry in DDP's bucket (its real view): the
    hook counted one and refused the bucket ("bucket 1 has 384 elements, its parameters 192:
    gradwire hooks need dense gradients"). At P = 1 dense's average is this rank's gradient;
    topk's applied gradients plus its residual (kept as the real view) are the gradients
    injected, across DDP's bucket rebuild."""
    x = torch.randn(5, 16, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))
    want = Complex()
    want(x).backward()
    net = DDP(Complex(), bucket_cap_mb=1e-5)
    state = gh.make(method, density=0.1, mode=mode)
    state.register(net)
    steps = 3
    applied = [torch.zeros_like(p) for p in net.module.parameters()]
    for _ in range(steps):
        net.zero_grad()
        net(x).backward()
        for acc, p in zip(applied, net.module.parameters(), strict=True):
            acc += p.grad
    residuals = state.state_dict()["residuals"]
    for acc, p, ref in zip(applied, net.module.parameters(), want.parameters(), strict=True):
        left = residuals.get(state.positions.position(p))
        if left is not None:
            left = torch.view_as_complex(left.view(-1, 2)) if p.is_complex() else left
            acc += left.view(p.shape)
        torch.testing.assert_close(acc, steps * ref.grad)
    assert method == "dense" or residuals  # something was left out of topk's steps
