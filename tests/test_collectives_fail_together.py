"""Edges of the executor (gradwire.collectives.executor, .local) where a call must fail on every
rank before anything is posted or any buffer changes, not half way through."""


import pytest
import torch
from conftest import run_world

import gradwire.collectives as gc
from gradwire.collectives import agree
from gradwire.collectives.agree import MismatchError
from gradwire.collectives.executor import execute
from gradwire.collectives.local import execute_local
from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.schedules.ir import Transfer, build
from gradwire.transport import as_wire


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
        as_wire(tensor)  # the transport's own check: contiguous, plain
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


# --- the call header compares the parameters as they run ---------------------------------------

def _header_checks(rank: int, world: int) -> dict:
    """On each of 2 gloo ranks: calls whose parameters differ as given but not as they run
    (rank 1 spells a default out, or gives an input that only chose it), then calls that
    really differ, each then a matched call; what this rank saw."""
    seen: dict = {}

    def call(name: str, fn, x: torch.Tensor) -> None:
        try:
            fn(x)
            seen[name] = x.tolist()
        except MismatchError as e:
            seen[name] = {"error": str(e), "buffer": x.tolist()}

    one = {"pipeline": 1} if rank else {}  # ring's default at 6 elements
    call("pipeline=1", lambda x: gc.all_reduce(x, algo="ring", **one), torch.ones(6))
    block = {"block": 3, "alpha": 1.0} if rank else {"block": 3}  # alpha only chooses a block
    call("lp alpha", lambda x: gc.broadcast(x, algo="lp", **block), torch.full((6,), 1.0 + rank))
    two = {"pipeline": 2} if rank else {}  # another schedule
    call("pipeline=2", lambda x: gc.all_reduce(x, algo="ring", **two), torch.ones(6))
    call("after", lambda x: gc.all_reduce(x), torch.ones(6))
    return seen


@pytest.fixture(scope="module")
def header_world(tmp_path_factory) -> list[dict]:
    return run_world(_header_checks, 2, tmp_path_factory.mktemp("header"))


def test_parameters_that_differ_only_as_given_are_the_same_call(header_world):
    """A ring allreduce with pipeline=1 on one rank and the default (which is 1 here) on the
    other ran one schedule, but the header compared the parameters as given: a
    MismatchError on both. So did an lp broadcast given its block on both ranks and, on one,
    an alpha, which only chooses a block not given."""
    for seen in header_world:
        assert seen["pipeline=1"] == [2.0] * 6
        assert seen["lp alpha"] == [1.0] * 6


def test_a_parameter_that_changes_the_schedule_fails_every_rank_naming_it(header_world):
    """pipeline=2 against the default 1 is another schedule: every rank raises before any
    data moves, in one line naming the parameter on each side (the header held the
    parameters cut to a checksum, ``itemsize=4,op=s#4e245fd4``), and the next call works."""
    for rank, seen in enumerate(header_world):
        got = seen["pipeline=2"]
        assert isinstance(got, dict) and got["buffer"] == [1.0] * 6
        assert got["error"].startswith(f"rank {rank}: ranks made different collective calls: "
                                       "params: op=sum,pipeline=1 on rank 0; "
                                       "op=sum,pipeline=2 on rank 1 (")
        assert "\n" not in got["error"]
        assert seen["after"] == [2.0] * 6


def test_a_field_cut_short_in_the_header_is_named_in_full_for_this_rank():
    """A value too long for its field travels as a head and a checksum; the message adds this
    rank's value in full."""
    long = "op=sum,servers=2,sharding=roundrobin"
    call = [("call", "allreduce"), ("params", long)]
    other = [("call", "allreduce"), ("params", long.replace("2", "3"))]
    headers = [agree.decode(agree.encode(c)) for c in (call, other)]
    (said,) = agree.differences(call, headers)
    assert said.startswith("params: op=sum,servers=#")
    assert said.endswith(f"on rank 1 (this rank's: {long})")
