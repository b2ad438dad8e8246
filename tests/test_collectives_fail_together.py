"""Edges of the executor (gradwire.collectives.executor, .local) where a call must fail on every
rank before anything is posted or any buffer changes, not half way through."""

import pytest
import torch

from gradwire.collectives.executor import execute
from gradwire.collectives.local import execute_local
from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.schedules.ir import Transfer, build
from gradwire.transport import _wire


class _Done:
    def wait(self) -> bool:
        return True


class _Recording:
    """Rank ``rank`` of ``world_size`` whose operations finish at once (receives leave their
    buffer as it was); checks each tensor as the transport does and records what was posted."""

    def __init__(self, rank: int, world_size: int, backend: str) -> None:
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.posted: list[tuple[str, int]] = []

    def _post(self, op: str, tensor: torch.Tensor, peer: int) -> _Done:
        _wire(tensor)  # the transport's own check: contiguous, plain
        self.posted.append((op, peer))
        return _Done()

    def isend(self, tensor: torch.Tensor, dst: int) -> _Done:
        return self._post("send", tensor, dst)

    def irecv(self, tensor: torch.Tensor, src: int) -> _Done:
        return self._post("recv", tensor, src)

    def batch(self, ops: list) -> list:
        return [self._post(o.op, o.tensor, o.peer) for o in ops]


def _every_rank_refuses(s, buffers, match: str, backend: str, **kw) -> None:
    for rank, buf in enumerate(buffers):
        t = _Recording(rank, s.world_size, backend)
        with pytest.raises(GradwireError, match=match) as e:
            execute(s, buf, t, **kw)
        assert "\n" not in str(e.value)
        assert t.posted == [], f"rank {rank} posted {t.posted} before failing"


@pytest.mark.parametrize("backend", ["gloo", "nccl"])  # dataflow, and step by step
def test_an_unknown_combine_op_fails_every_rank_before_anything_is_posted(backend):
    """A tree allreduce merging with op "max" run without a "max" combine: found at the first
    combine, only the tree's inner ranks failed; its leaves went on to wait for a broadcast
    that never came (until the timeout), having sent their data."""
    s = registry.schedule("allreduce", "tree", 3, 4, op="max")
    bufs = [torch.full((4,), float(r)) for r in range(3)]
    _every_rank_refuses(s, bufs, "schedule tree uses combine op 'max'; known: copy, sum",
                        backend)
    assert [b.tolist() for b in bufs] == [[float(r)] * 4 for r in range(3)]


def test_execute_local_refuses_an_unknown_combine_op_before_changing_any_buffer():
    s = build("custom", "allreduce", 2, 2, [[Transfer(0, 1, 0, 1)], [Transfer(1, 0, 1, 1, "max")]])
    bufs = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    with pytest.raises(GradwireError, match="combine op 'max'; known on rank 0: copy, sum"):
        execute_local(s, bufs)
    assert [b.tolist() for b in bufs] == [[1.0, 2.0], [3.0, 4.0]]


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("out_of_place", [False, True])
def test_a_strided_buffer_fails_every_rank_before_anything_is_posted(backend, out_of_place):
    """A 1-D buffer with a stride: the root of a reduce (which only receives, into staging)
    posted its receives and waited, while its peer failed at its first send."""
    s = registry.schedule("reduce", "binomial", 2, 3, root=0)
    strided = [torch.zeros(6)[::2] for _ in range(2)]
    if out_of_place:
        _every_rank_refuses(s, [torch.zeros(3) for _ in range(2)], "source must be contiguous",
                            backend, source=strided[0])
    else:
        _every_rank_refuses(s, strided, "buffer must be contiguous", backend)
