"""Pools of spare buffers (gradwire.collectives.pool): the executor's staging buffers and
reduce-scatter's work buffers come from one and go back to it, also when the call raises."""

import pytest
import torch

import gradwire.collectives as gc
from gradwire.collectives import api, executor
from gradwire.collectives.pool import BufferPool
from gradwire.errors import PeerError
from gradwire.schedules import registry


def test_spare_buffers_are_reused_within_a_byte_cap():
    """A buffer goes back to the pool, not to the allocator (whose returned pages fault again
    on first touch), and the pool never holds more than its cap."""
    pool = BufferPool(keep=3 * 4096)
    like = torch.zeros(1)
    a = pool.take(1024, like)
    pool.give(a)
    assert pool.take(1024, like) is a  # the same memory again
    assert pool.take(1024, like) is not a  # taken: a fresh one
    assert pool.take(1024, torch.zeros(1, dtype=torch.float64)).dtype == torch.float64
    bufs = [pool.take(1024, like) for _ in range(4)]
    for b in bufs:
        pool.give(b)  # 4 x 4 KiB offered, 12 KiB kept: the fourth starts the pool afresh
    assert pool.held_bytes <= pool.keep
    pool.give(pool.take(10_000, like))  # larger than the cap: not kept
    assert pool.held_bytes <= pool.keep


def test_a_lent_buffer_comes_back_when_the_block_raises():
    pool = BufferPool(keep=2**20)
    with pytest.raises(RuntimeError), pool.lend(100, torch.zeros(1)) as tmp:
        raise RuntimeError("the call failed")
    assert pool.held_bytes == 400
    assert pool.take(100, torch.zeros(1)) is tmp


class _Done:
    def wait(self) -> bool:
        return True


class _Failed:
    def __init__(self, rank: int, peer: int, nbytes: int) -> None:
        self.error = PeerError(rank, peer, f"receive of {nbytes} bytes from",
                               "failed: the connection closed (rank 1 exited or was killed)")

    def wait(self) -> bool:
        raise self.error


class _PeerGone:
    """Rank 0 of 2 whose sends leave and whose receives fail, as when rank 1 was killed;
    records every buffer a receive was posted into."""

    rank, world_size = 0, 2

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.received_into: list[torch.Tensor] = []

    def isend(self, tensor: torch.Tensor, dst: int) -> _Done:
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int) -> _Failed:
        self.received_into.append(tensor)
        return _Failed(self.rank, src, tensor.numel())

    def batch(self, ops: list) -> list:
        return [self.isend(o.tensor, o.peer) if o.op == "send" else self.irecv(o.tensor, o.peer)
                for o in ops]


class _Refused:
    """Rank 0 of 2 whose receives are refused when posted, as gloo refuses them once the
    peer's connection has closed; records every buffer a receive was asked for."""

    rank, world_size, backend = 0, 2, "gloo"

    def __init__(self) -> None:
        self.received_into: list[torch.Tensor] = []

    def isend(self, tensor: torch.Tensor, dst: int) -> None:
        return None

    def irecv(self, tensor: torch.Tensor, src: int) -> None:
        self.received_into.append(tensor)
        raise PeerError(self.rank, src, f"receive of {tensor.numel() * 4} bytes from",
                        "failed: the connection closed (rank 1 exited or was killed)")


def _staging_comes_back(monkeypatch, t: _PeerGone | _Refused, match: str) -> None:
    """A ring allreduce of 8 elements on ``t`` fails with ``match``, and every staging buffer
    its receives were given is back in the pool."""
    pool = BufferPool(keep=2**20)
    monkeypatch.setattr(executor, "STAGING", pool)
    s = registry.schedule("allreduce", "ring", 2, 8)
    buf = torch.ones(8)
    with pytest.raises(PeerError, match=match):
        executor.execute(s, buf, t)
    mine = buf.untyped_storage().data_ptr()
    staged = [b for b in t.received_into if b.untyped_storage().data_ptr() != mine]
    assert staged, "the reduce-scatter's receive is staged (it sums)"
    assert pool.held_bytes == sum(b.numel() * 4 for b in staged)
    assert pool.take(4, torch.zeros(1)) is staged[0]


@pytest.mark.parametrize("backend", ["gloo", "nccl"])  # dataflow, and step by step
def test_staging_buffers_go_back_when_a_receive_fails(backend, monkeypatch):
    _staging_comes_back(monkeypatch, _PeerGone(backend),
                        "in allreduce/ring .*receive of 4 bytes from rank 1")


def test_a_staging_buffer_comes_back_when_its_receive_is_refused_at_once(monkeypatch):
    _staging_comes_back(monkeypatch, _Refused(), "connection closed")


def test_reduce_scatter_work_buffer_comes_back_when_the_call_raises(one_rank, monkeypatch):
    """reduce_scatter_tensor sums out of its input into a work buffer lent by the pool: a call
    after another reuses it (no fresh allocation per call), and a call that raises gives it
    back too."""
    pool = BufferPool(keep=2**20)
    monkeypatch.setattr(api, "WORK_BUFFERS", pool)
    used: list[torch.Tensor] = []
    run = api.execute

    def spy(s, buffer, transport, **kw):
        used.append(buffer)
        return run(s, buffer, transport, **kw)

    monkeypatch.setattr(api, "execute", spy)
    x, out = torch.arange(6.0), torch.zeros(6)
    gc.reduce_scatter_tensor(out, x)
    gc.reduce_scatter_tensor(out, x)
    assert torch.equal(out, x) and torch.equal(x, torch.arange(6.0))
    assert used[0] is used[1] and pool.held_bytes == 24

    def fail(s, buffer, transport, **kw):
        used.append(buffer)
        raise PeerError(0, 1, "receive of 6 bytes from", "timed out after 1 s")

    monkeypatch.setattr(api, "execute", fail)
    with pytest.raises(PeerError, match="timed out"):
        gc.reduce_scatter_tensor(out, x)
    assert used[2] is used[0] and pool.held_bytes == 24
    handle = gc.reduce_scatter_tensor(out, x, async_op=True)  # raises on the helper thread
    with pytest.raises(PeerError, match="timed out"):
        handle.wait()
    assert used[3] is used[0] and pool.held_bytes == 24
