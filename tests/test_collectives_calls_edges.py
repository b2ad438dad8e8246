"""Edges of the collectives and sparse aggregations: what ranks compare before the data moves
(a reduction's op; topk's default allgather spelled out), sums of fp16 and bf16 values that
must not overflow or round where the result fits, and one host read per header exchange."""

import contextlib

import pytest
import torch
import torch.distributed as dist
from sync_guard import SyncGuard

import gradwire.collectives as gc
from gradwire.collectives import agree, api
from gradwire.errors import GradwireError
from gradwire.sparse import allreduce as sparse_allreduce_module
from gradwire.sparse import gtopk_allreduce, sparse_allreduce, topk_allreduce
from gradwire.sparse.local import simulate


def _compared(call) -> bytes:
    """The bytes of a header that ranks compare (agree_status: the call's own fields)."""
    return bytes(agree.encode(call)[: len(call) * agree.FIELD_BYTES].tolist())


def _recorded(monkeypatch, module, name: str) -> list:
    """The headers passed to ``module.name`` (an exchange), in order, the exchange still made."""
    seen: list = []
    real = getattr(module, name)

    def record(t, call, *args, **kwargs):
        seen.append(list(call))
        return real(t, call, *args, **kwargs)

    monkeypatch.setattr(module, name, record)
    return seen


@pytest.fixture
def api_calls(monkeypatch) -> list:
    """The headers gradwire.collectives' calls exchange, in order."""
    return _recorded(monkeypatch, api, "agree")


@pytest.fixture
def sparse_calls(monkeypatch) -> list:
    """The headers gradwire.sparse's calls exchange, in order."""
    return _recorded(monkeypatch, sparse_allreduce_module, "agree_status")


# a reduction's op is part of the call ------------------------------------------------------

@pytest.mark.parametrize("call", ["all_reduce", "reduce", "reduce_scatter_tensor"])
def test_ranks_reducing_with_different_ops_make_different_calls(one_rank, api_calls, call):
    """A rank averaging and a rank summing send the same messages: each ended with its own
    result (the sum on one, the average on the other) and no error. The op must be in the
    header that every rank compares; the same op spelled as c10d's enum is the same call."""
    def run(op):
        x = torch.full((4,), 2.0)
        if call == "reduce_scatter_tensor":
            gc.reduce_scatter_tensor(torch.zeros(4), x, op=op)
        else:
            getattr(gc, call)(x, op=op)

    for op in ("sum", "avg", dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        run(op)
    summed, averaged, summed_enum, averaged_enum = map(_compared, api_calls)
    assert summed != averaged
    assert summed == summed_enum and averaged == averaged_enum


@pytest.mark.parametrize(("op", "want"), [(dist.ReduceOp.SUM, 2.0), (dist.ReduceOp.AVG, 2.0)])
def test_reduce_ops_given_as_c10d_spells_them_are_taken(one_rank, op, want):
    """dist.ReduceOp.SUM (the enum value, as c10d's callers write it) passes isinstance(op,
    dist.ReduceOp) but has no ``.op``: the call raised AttributeError."""
    x = torch.full((3,), 2.0)
    gc.all_reduce(x, op=op)
    assert x.tolist() == [want] * 3
    out = torch.zeros(3)
    gc.reduce_scatter_tensor(out, torch.full((3,), 2.0), op=op)
    assert out.tolist() == [want] * 3
    gc.all_reduce(x, op=dist.ReduceOp.MAX)
    assert x.tolist() == [2.0] * 3
    with pytest.raises(GradwireError, match="reduction op .*BAND.* is not supported"):
        gc.all_reduce(x, op=dist.ReduceOp.BAND)


# topk's default allgather, spelled out or not, is one call ----------------------------------

def test_topk_with_its_default_allgather_spelled_out_is_the_same_call(one_rank, sparse_calls):
    """sparse_allreduce(method="topk") with algo=None and with its default ("rd" at P a power
    of two, here P = 1) run one schedule, but their headers differed: ranks that spelled the
    default out on one side only failed with a MismatchError. gtopk already named its
    default as no algorithm; another allgather is still another call."""
    x = torch.tensor([1.0, -3.0, 2.0, 0.5])
    for algo in (None, "rd", "ring"):
        sparse_allreduce(x.clone(), torch.zeros(4), 2, "topk", algo=algo)
    for algo in (None, "rd"):
        topk_allreduce(torch.tensor([1.0]), torch.tensor([2]), 4, algo=algo)
    default, spelled, ring, plain, spelled_plain = map(_compared, sparse_calls)
    assert default == spelled != ring
    assert plain == spelled_plain


# duplicates and sums in the accumulation dtype ----------------------------------------------

@pytest.mark.parametrize("method", ["topk", "gtopk"])
@pytest.mark.parametrize(("dtype", "values", "want"), [
    (torch.float16, [60000.0, 60000.0, -60000.0], 60000.0),  # summed in fp16: inf
    (torch.bfloat16, [1.0, 2.0**-8, 2.0**-8], 1.0 + 2.0**-7),  # in bf16: 1.0, twice rounded
])
def test_values_given_twice_at_one_index_are_summed_as_wide_sums(one_rank, method, dtype,
                                                                 values, want):
    v, i = torch.tensor(values, dtype=dtype), torch.tensor([1, 1, 1])
    if method == "topk":
        got = topk_allreduce(v, i, 3)
    else:
        got = gtopk_allreduce(v, i, 3, torch.zeros(3, dtype=dtype))
    assert got.total().tolist() == [0.0, want, 0.0]


def test_topk_results_average_fp16_sums_that_overflow_to_the_mean():
    """Two ranks' fp16 60 000 at one index: their sum (120 000) is inf in fp16, their mean is
    not. sparse_allreduce averages from the fp32 sums; SparseResult.average() (what
    topk_allreduce and simulate return) divided the cast sum, and gave inf."""
    xs = [torch.tensor([60000.0, 0.0, 1.0], dtype=torch.float16) for _ in range(2)]
    rs = [torch.zeros(3, dtype=torch.float16) for _ in range(2)]
    results = simulate(xs, rs, 1, "topk")
    for res in results:
        assert res.average().tolist() == [60000.0, 0.0, 0.0]
        assert res.total()[0].isinf()  # the sum itself does not fit
    small = simulate([torch.tensor([3.0, 1.0]), torch.tensor([1.0, 0.0])],
                     [torch.zeros(2), torch.zeros(2)], 1, "topk")
    assert small[0].average().tolist() == [2.0, 0.0]  # fp32: as before


# the executor's staging pool -------------------------------------------------------------

# one host read per header exchange -------------------------------------------------------

class _Peer:
    """Rank 0 of 2 with the call check on: enough of a Transport for agree_status."""

    rank, world_size, check_calls = 0, 2, True
    device = torch.device("cpu")

    def control(self):
        return contextlib.nullcontext()


def _exchange(other: list, status: int):
    """agree's exchange, with rank 1 making ``other`` with status digit ``status``."""
    def run(s, buf, transport):
        row = agree.encode(other, status)
        h = row.numel()
        buf[h : 2 * h] = row

    return run


def test_a_header_exchange_reads_the_device_once(monkeypatch):
    """Whether the calls match and the worst status are read together: on a GPU (NCCL) every
    read of the exchanged headers waits for the device, and the check ran two."""
    call = [("call", "allreduce"), ("algo", "ring"), ("elements", 8), ("dtype", "float32"),
            ("root", 0), ("params", "itemsize=4")]
    monkeypatch.setattr(agree, "execute", _exchange(call, 2))
    with SyncGuard() as guard:
        with guard.watching():
            worst = agree.agree_status(_Peer(), call, 1)
    assert worst == 2
    assert len(guard.calls) == 1, guard.report()
    other = [*call[:2], ("elements", 9), *call[3:]]
    monkeypatch.setattr(agree, "execute", _exchange(other, 0))
    with pytest.raises(agree.MismatchError, match="elements: 8 on rank 0; 9 on rank 1"):
        agree.agree_status(_Peer(), call)
