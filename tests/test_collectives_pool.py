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


def test_a_lent_buffer_is_dropped_when_the_block_raises():
    """A block that raised may have left a receive posted into the buffer: lent again, it
    would take a peer's late send in the middle of another call."""
    pool = BufferPool(keep=2**20)
    with pytest.raises(RuntimeError), pool.lend(100, torch.zeros(1)) as tmp:
        raise RuntimeError("the call failed")
    assert pool.held_bytes == 0
    assert pool.take(100, torch.zeros(1)) is not tmp
    with pool.lend(100, torch.zeros(1)) as ok:
        pass
    assert pool.held_bytes == 400 and pool.take(100, torch.zeros(1)) is ok


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


def _staged_by_failed_ring(monkeypatch, t: _PeerGone | _Refused,
                           match: str) -> tuple[BufferPool, list[torch.Tensor]]:
    """A ring allreduce of 8 elements on ``t`` fails with ``match``: the pool, and the
    staging buffers its receives were given."""
    pool = BufferPool(keep=2**20)
    monkeypatch.setattr(executor, "STAGING", pool)
    s = registry.schedule("allreduce", "ring", 2, 8)
    buf = torch.ones(8)
    with pytest.raises(PeerError, match=match):
        executor.execute(s, buf, t)
    mine = buf.untyped_storage().data_ptr()
    staged = [b for b in t.received_into if b.untyped_storage().data_ptr() != mine]
    assert staged, "the reduce-scatter's receive is staged (it sums)"
    return pool, staged


@pytest.mark.parametrize("backend", ["gloo", "nccl"])  # dataflow, and step by step
def test_staging_a_failed_receive_may_still_land_in_is_not_reused(backend, monkeypatch):
    """The staging buffer of a receive that failed or timed out went back to the pool, and
    the next call's receive was given it while the peer's late send could still land there
    (gloo keeps a receive posted after its wait failed)."""
    pool, staged = _staged_by_failed_ring(monkeypatch, _PeerGone(backend),
                                          "in allreduce/ring .*receive of 4 bytes from rank 1")
    assert pool.held_bytes == 0
    assert all(pool.take(b.numel(), b) is not b for b in staged)


def test_a_staging_buffer_comes_back_when_its_receive_is_refused_at_once(monkeypatch):
    """Refused when posted, the receive was never posted: its buffer may be lent again."""
    pool, staged = _staged_by_failed_ring(monkeypatch, _Refused(), "connection closed")
    assert pool.held_bytes == sum(b.numel() * 4 for b in staged)
    assert pool.take(4, torch.zeros(1)) is staged[0]


def test_reduce_scatter_reuses_its_work_buffer_but_not_after_a_failed_call(one_rank,
                                                                           monkeypatch):
    """reduce_scatter_tensor sums out of its input into a work buffer lent by the pool: a call
    after another reuses it (no fresh allocation per call). A call that raised may have left
    receives posted into it: it went back to the pool, and the next call summed into it."""
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
    assert used[2] is used[0] and pool.held_bytes == 0
    handle = gc.reduce_scatter_tensor(out, x, async_op=True)  # raises on the helper thread
    with pytest.raises(PeerError, match="timed out"):
        handle.wait()
    assert used[3] is not used[0] and pool.held_bytes == 0
