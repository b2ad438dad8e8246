"""Inputs of gradwire.sparse and gradwire.compress.select / .sparse: numpy counts, select's
arguments, k <= 0 for the threshold selectors, unsigned and complex indices."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.compress.base import generator
from gradwire.compress.select import dgc_select, threshold_topk
from gradwire.compress.sparse import DGC, RandomK, TopK
from gradwire.errors import GradwireError
from gradwire.schedules.cost import CostParams
from gradwire.sparse import estimate, gtopk_allreduce, select, sparse_allreduce, topk_allreduce
from gradwire.sparse.local import simulate
from gradwire.syncfree import device_paths

BIG = 20_000  # above the sampled threshold's 2·MIN_SAMPLE: its passes run


# select: bad input is one line ---------------------------------------------------------------

@pytest.mark.parametrize("selector", ["exact", "threshold"])
@pytest.mark.parametrize("device", [False, True])
@pytest.mark.parametrize("acc, k, says", [
    (torch.randn(BIG), -1, "k must be an integer >= 0"),  # threshold: math domain error
    (torch.randn(BIG), 2.5, "k must be an integer >= 0"),  # TypeError from torch.topk
    (torch.randn(BIG), None, "k must be an integer >= 0"),  # TypeError from min()
    (torch.randn(40), True, "k must be an integer >= 0"),  # a bool indexed a tensor
    (torch.randn(4, 5), 3, "acc must be a 1-D float tensor"),  # kth out of bounds / 2-D rows
    ([1.0, 2.0], 1, "acc must be a 1-D float tensor"),  # AttributeError: no numel
])
def test_select_refuses_bad_input_in_one_line(acc, k, says, selector, device):
    """select (gradwire.sparse.select, public) checked only its selector: a negative k made
    the threshold selector raise "math domain error", a float or None k a TypeError, a bool k
    a RuntimeError from indexing, a 2-D acc numpy's "kth out of bounds" on the host and, on the
    device path, a silent (rows, columns) list of positions instead of indices."""
    with device_paths() if device else torch.no_grad(), pytest.raises(GradwireError) as e:
        select(acc, k, selector)
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw", [{"sample": float("nan")}, {"sample": "0.01"},
                                {"sample": 0.0}, {"g": 3}])
def test_select_refuses_a_bad_sample_or_generator_in_one_line(kw):
    """A NaN sample raised "cannot convert float NaN to integer", a string one a TypeError, a
    generator that is none torch's randint's long TypeError."""
    with pytest.raises(GradwireError) as e:
        select(torch.randn(BIG), 5, "threshold", **kw)
    assert "select:" in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(k=st.integers(-50, 0), seed=st.integers(0, 2**16))
def test_the_threshold_selectors_take_nothing_for_k_at_most_zero(k, seed):
    """threshold_topk (exported by gradwire.compress) took the square root of a negative
    expected count ("math domain error") for k < 0, and dgc_select returned elements for
    k = −1 (the threshold of the one largest sample); exact_topk returns none for any k ≤ 0."""
    x = torch.randn(BIG, generator=torch.Generator().manual_seed(seed))
    assert threshold_topk(x, k, generator(0, seed)).numel() == 0
    assert dgc_select(x, k, 10, generator(0, seed), 0.01, 3).numel() == 0


# topk_allreduce / gtopk_allreduce: index dtypes ----------------------------------------------

@pytest.mark.parametrize("call", ["topk", "gtopk"])
@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_indices_are_aggregated(one_rank, call, dtype):
    """Indices of torch's wider unsigned dtypes passed the check ("an integer tensor") and then
    raised NotImplementedError ("min_all" not implemented for 'UInt32') from the range check.
    They are integers: taken as int64, as the narrower ones are."""
    values, indices = torch.tensor([1.0, 2.0]), torch.tensor([3, 1]).to(dtype)
    if call == "topk":
        got = topk_allreduce(values, indices, 5)
    else:
        got = gtopk_allreduce(values, indices, 5, torch.zeros(5))
    assert got.total().tolist() == [0.0, 2.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("call", ["topk", "gtopk"])
def test_complex_indices_are_one_line(one_rank, call):
    """Complex indices passed the check (not floating point, not bool), then raised
    NotImplementedError ("min_all" not implemented for 'ComplexFloat')."""
    values, indices = torch.tensor([1.0, 2.0]), torch.tensor([3, 1], dtype=torch.complex64)
    with pytest.raises(GradwireError) as e:
        if call == "topk":
            topk_allreduce(values, indices, 5)
        else:
            gtopk_allreduce(values, indices, 5, torch.zeros(5))
    assert "indices must be an integer tensor" in str(e.value) and "\n" not in str(e.value)


def test_an_unsigned_index_beyond_int64_is_refused(one_rank):
    """A uint64 index of 2⁶³ or more is no valid index; it must not wrap into range."""
    indices = torch.tensor([-(2**63) + 1]).view(torch.uint64)  # 2**63 + 1
    assert indices.long().item() < 0  # what .long() made of it: a negative int64
    with pytest.raises(GradwireError, match="indices must lie in"):
        topk_allreduce(torch.tensor([1.0]), indices, 5)


# numpy integers: accepted by the checks, then wrapped in products ------------------------------

@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_a_numpy_k_gives_the_python_ints_estimate(method):
    """k = np.uint8(200) passed spec's check (an integer), then 200 entries · 8 bytes wrapped in
    uint8: the estimate was of a 3-byte message (0.200003 ms against 0.204803 ms here)."""
    params = CostParams(1e-4, 1e-9)
    assert estimate(method, 4, 1000, np.uint8(200), params) == estimate(method, 4, 1000, 200,
                                                                         params)
    assert estimate(method, np.uint8(4), np.uint16(1000), 200, params) == estimate(
        method, 4, 1000, 200, params)


@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_a_numpy_k_is_aggregated_and_loses_no_mass(one_rank, method):
    """sparse_allreduce took k = np.uint8(200) (check_args: an integer >= 1), selected and
    zeroed the 200 entries in the residual, then raised OverflowError packing them ("Python
    integer 800 out of bounds for uint8"): the selected gradient was gone from the residual
    and never applied."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    residual = torch.zeros(1000)
    got = sparse_allreduce(x, residual, np.uint8(200), method)
    assert int((got != 0).sum()) == 200
    assert torch.equal(got + residual, x)  # one rank: applied + kept = given, exactly


@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_simulate_takes_a_numpy_k(method):
    xs = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(3)]
    results = simulate(xs, [torch.zeros(1000) for _ in xs], np.uint8(200), method)
    assert len(results[0].indices) == 200 if method == "gtopk" else len(results[0].indices) >= 200


@pytest.mark.parametrize("call", ["topk", "gtopk"])
def test_numpy_k_and_numel_of_the_explicit_calls(one_rank, call):
    """topk_allreduce / gtopk_allreduce: k = np.uint8(200) or numel = np.uint16(20 000) with
    10 000 entries wrapped the packed list's size (OverflowError)."""
    for k, numel, count in ((np.uint8(200), 1000, 200), (None, np.uint16(20_000), 10_000)):
        values, indices = torch.ones(count), torch.arange(count) * 2
        if call == "topk":
            got = topk_allreduce(values, indices, numel, k=k)
        else:
            got = gtopk_allreduce(values, indices, numel, torch.zeros(int(numel)), k=k)
        assert torch.equal(got.indices, indices)


@pytest.mark.parametrize("device", [False, True])
def test_select_takes_a_numpy_k(device):
    """select(x, np.uint8(4), "threshold") raised OverflowError (4 · 4096 samples in uint8)."""
    x = torch.randn(BIG, generator=torch.Generator().manual_seed(1))
    want = sorted(select(x, 4).tolist())
    with device_paths() if device else torch.no_grad():
        assert sorted(select(x, np.uint8(4), "threshold").tolist()) == want


@pytest.mark.parametrize("cls", [TopK, RandomK, DGC])
def test_sparsifiers_take_a_numpy_k(cls):
    """TopK(k=np.uint8(200)) said 64 wire bytes for 200 fp32 pairs (1600: the product wrapped
    in uint8) and selected with the same wrapping; DGC raised OverflowError, RandomK
    "Trying to create tensor with negative dimension -42"."""
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    given, plain = cls(k=np.uint8(200)), cls(k=200)
    assert given.wire_bytes(x.numel(), x.dtype) == plain.wire_bytes(x.numel(), x.dtype)
    assert torch.equal(given.decompress(given.compress(x), x.numel()),
                       plain.decompress(plain.compress(x), x.numel()))
    assert given.params == plain.params and type(given.params["k"]) is int
