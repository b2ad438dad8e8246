"""gradwire.sparse's calls at their edges (a residual that requires grad, the default k, the
values' dtype, the world size, simulate's inputs), and a property test of both paths against
the long-hand reference (tests/sparse_reference.py)."""
import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sparse_reference import reference

from gradwire.collectives.local import execute_local
from gradwire.errors import GradwireError
from gradwire.schedules.cost import CostParams
from gradwire.sparse import Entries, estimate, gtopk_allreduce, topk_allreduce
from gradwire.sparse import allreduce as sparse_module
from gradwire.sparse.local import simulate
from gradwire.syncfree import device_paths


class _World:
    """Rank 0 of a world of two, the other rank played in this process: what resolve()
    returns."""

    rank, world_size, group = 0, 2, None


def _two_ranks(monkeypatch, other):
    """Make the public calls run rank 0 of two in this process: ``other(schedule)`` gives rank
    1's plan; the header check is skipped (both ranks make the same call)."""
    monkeypatch.setattr(sparse_module, "resolve", lambda *a: _World())
    monkeypatch.setattr(sparse_module, "_agree", lambda *a, **kw: None)

    def execute(schedule, buffer, transport, combine):
        peer = other()
        execute_local(schedule, [buffer, peer.buffer], [combine, peer.combine])

    monkeypatch.setattr(sparse_module, "execute", execute)


def test_gtopk_allreduce_writes_a_residual_that_requires_grad_as_data(monkeypatch):
    """gtopk_allreduce added a merge's drops to the residual in place after the exchange, on
    the residual as given: one that requires grad raised autograd's "a leaf Variable that
    requires grad is being used in an in-place operation" traceback, and the drops were lost.
    sparse_allreduce reads and writes its residual as data; so does gtopk_allreduce now."""
    other_residual = torch.zeros(4)
    _two_ranks(monkeypatch, lambda: sparse_module.gtopk_plan(
        Entries(torch.tensor([3.0]), torch.tensor([2])), 1, 4, other_residual, 1, 2))
    residual = torch.zeros(4, requires_grad=True)
    got = gtopk_allreduce(torch.tensor([1.0]), torch.tensor([0]), 4, residual)
    assert got.indices.tolist() == [2] and got.entries.values.tolist() == [3.0]
    assert residual.tolist() == [1.0, 0.0, 0.0, 0.0]  # rank 0's own dropped entry, kept
    assert residual.grad_fn is None and other_residual.abs().sum() == 0


@pytest.mark.parametrize("call", ["topk", "gtopk"])
def test_the_default_k_is_the_number_of_values_given(one_rank, call):
    """k defaults to len(values), "the same on every rank"; it was counted after values at a
    repeated index were summed, so two ranks that each gave 2 values, one of them twice at one
    index, made calls of k = 1 and k = 2 (a mismatch on every rank) with the default."""
    values, indices = torch.tensor([1.0, 2.0]), torch.tensor([3, 3])
    if call == "topk":
        got = topk_allreduce(values, indices, 5)
    else:
        got = gtopk_allreduce(values, indices, 5, torch.zeros(5))
    assert got.schedule.count == 2 * 8 + 1  # two entries of 8 bytes and the status byte
    assert got.total().tolist() == [0.0, 0.0, 0.0, 3.0, 0.0]


@pytest.mark.parametrize("call", ["topk", "gtopk"])
def test_values_of_a_dtype_the_merges_cannot_add_are_one_line(one_rank, call):
    """float8 values passed the check ("a 1-D float tensor"), then a ⊤ merge raised torch's
    NotImplementedError ("index_add_" not implemented for 'Float8_e4m3fn') mid-exchange."""
    values = torch.ones(2).to(torch.float8_e4m3fn)
    with pytest.raises(GradwireError) as e:
        if call == "topk":
            topk_allreduce(values, torch.tensor([0, 1]), 5)
        else:
            gtopk_allreduce(values, torch.tensor([0, 1]), 5, torch.zeros(5).to(values.dtype))
    assert "values must be a 1-D float tensor (fp16, bf16, fp32, fp64)" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("world_size", [2.5, "4", None])
def test_a_world_size_that_is_no_integer_is_one_line(world_size):
    """topk's schedule chose its default allgather from the world size first: 2.5 raised
    "unsupported operand type(s) for &", "4" and None a TypeError too (gtopk's said what was
    wrong)."""
    for method in ("topk", "gtopk"):
        with pytest.raises(GradwireError) as e:
            estimate(method, world_size, 100, 3, CostParams(1e-4, 1e-9))
        assert "world_size must be an integer >= 1" in str(e.value)


def test_simulate_refuses_a_residual_shared_by_two_ranks():
    """``[torch.zeros(n)] * p`` gave every rank one residual: each rank's error feedback went
    into the others', and the results were wrong with no error."""
    x = torch.tensor([1.0, -4.0, 2.0])
    shared = torch.zeros(3)
    with pytest.raises(GradwireError, match="rank 1's residual shares memory"):
        simulate([x, x], [shared, shared], 1)
    assert shared.abs().sum() == 0  # refused before anything was written
    with pytest.raises(GradwireError, match="rank 0's residual shares memory"):
        simulate([x, shared], [shared, torch.zeros(3)], 1, "topk")  # another rank's x
    rows = torch.zeros(2, 3)  # a tensor of rows: one residual each, side by side
    results = simulate(torch.stack([x, x]), rows, 1)
    assert results[0].total().tolist() == [0.0, -8.0, 0.0] and rows.sum() == 6


def test_simulate_says_what_is_wrong_with_a_rank_that_is_no_tensor():
    """A list in place of rank 0's x raised AttributeError ('list' object has no attribute
    'numel') before any check."""
    with pytest.raises(GradwireError, match="x must be a 1-D float tensor"):
        simulate([[1.0, 2.0]], [torch.zeros(2)], 1)


@st.composite
def _cases(draw):
    p = draw(st.integers(1, 9))
    n = draw(st.integers(0, 12))
    k = draw(st.sampled_from([1, 2, 3, max(1, n // 2), max(1, n), n + 2]))
    xs = [draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)) for _ in range(p)]
    rs = [draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)) for _ in range(p)]
    return xs, rs, k


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=_cases(), method=st.sampled_from(["topk", "gtopk/tree", "gtopk/rd"]),
       device=st.booleans())
def test_both_paths_are_the_reference(case, method, device):
    """simulate on the host and on the device path (padded lists): the reference's totals and
    residuals exactly, on every rank (small integers: ties and zeros everywhere)."""
    xs, rs, k = case
    method, _, algo = method.partition("/")
    tx = [torch.tensor(x, dtype=torch.float64) for x in xs]
    tr = [torch.tensor(r, dtype=torch.float64) for r in rs]
    with device_paths() if device else contextlib.nullcontext():
        results = simulate([x.clone() for x in tx], tr, k, method, algo=algo or None)
    want, want_res = reference([np.array(x, dtype=np.float64) for x in xs],
                               [np.array(r, dtype=np.float64) for r in rs], k, method,
                               algo or "rd")
    for res in results:
        assert np.array_equal(res.total().numpy(), want)
    for got, w in zip(tr, want_res, strict=True):
        assert np.array_equal(got.numpy(), w)
