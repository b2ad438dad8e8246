"""Edges of the sparsifying compressors and of error feedback: NaN and Inf in the threshold's
sample, tensors that require grad, and residuals that a call with the header exchange off
left non-finite."""

from __future__ import annotations

import math
import warnings
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gradwire.compress.select as selection
from gradwire.compress.base import generator
from gradwire.compress.feedback import ErrorFeedback, Status, fallback, status
from gradwire.compress.select import dgc_select, exact_topk, select, threshold_topk
from gradwire.compress.sparse import DGC, RandomK, TopK
from gradwire.errors import GradwireError

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NAN, INF = float("nan"), float("inf")


def normal(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def drew_a_nan(x: torch.Tensor, g_seed: tuple[int, int], sample: float) -> bool:
    """Whether the threshold's sample (as the selectors draw it from ``generator(*g_seed)``)
    holds a NaN."""
    s = selection._sample_size(x.numel(), sample, selection.MIN_SAMPLE)
    at = torch.randint(x.numel(), (s,), generator=generator(*g_seed))
    return bool(x[at].isnan().any())


def largest_of_the_rest(x: torch.Tensor, picked: torch.Tensor) -> bool:
    """Every NaN of x is picked, and no finite element left out is larger than a finite one
    taken."""
    mask = torch.zeros(x.numel(), dtype=torch.bool)
    mask[picked] = True
    if not bool(mask[x.isnan()].all()):
        return False
    a = x.abs().double()
    taken, left = a[mask & ~x.isnan()], a[~mask]
    return not taken.numel() or not left.numel() or bool(taken.min() >= left.max())


# --- a NaN in the threshold's sample ---------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("every", [500, 1])  # 200 NaNs (fewer than k), or nothing but NaN
def test_dgc_selects_its_count_when_its_sample_draws_a_nan(dtype, every):
    """A NaN drawn must not become the sampled threshold: nothing compares ≥ NaN, so every
    pass would find no candidate and DGC would send an empty payload, its NaNs included."""
    x = normal(100_000, dtype)
    x[::every] = NAN
    k, cap = 1000, 1250
    for step in range(4):
        assert drew_a_nan(x, (0, step), 0.01)
        got = dgc_select(x, k, cap, generator(0, step), 0.01, 3)
        assert k * k / cap <= got.numel() <= cap, (step, got.numel())
        assert got.unique().numel() == got.numel()
        assert largest_of_the_rest(x, got) or every == 1
    payload = DGC(density=0.01).compress(x)
    assert k * k / cap <= int(payload.count[0]) <= cap


@pytest.mark.parametrize("dtype", DTYPES)
def test_threshold_topk_takes_a_drawn_nan_in_one_pass(dtype):
    """A NaN in the sample is no reason for the exact selector's fallback over all of x: the
    threshold below it finds enough candidates in one pass."""
    x = normal(100_000, dtype, seed=1)
    x[::300] = NAN
    x[7::1000] = -INF
    assert drew_a_nan(x, (0, 0), selection.SAMPLE)
    with mock.patch.object(selection, "exact_topk", wraps=selection.exact_topk) as fallback_:
        got = threshold_topk(x, 1000, generator(0, 0))
    assert fallback_.call_count == 0
    assert sorted(got.tolist()) == sorted(exact_topk(x, 1000).tolist())


@settings(max_examples=60, deadline=None, derandomize=True)
@given(nans=st.integers(1, 400), k=st.integers(1, 3000), seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES))
def test_a_drawn_nan_leaves_the_threshold_selectors_exact_and_dgc_counted(nans, k, seed,
                                                                          dtype):
    """Whenever the sample draws a NaN, threshold_topk gives the exact selector's set, and
    DGC a set of its count whose NaNs are all of x's."""
    n = 20_000
    x = normal(n, dtype, seed)
    g = torch.Generator().manual_seed(seed)
    x[torch.randperm(n, generator=g)[:nans]] = NAN
    if not drew_a_nan(x, (seed, 0), selection.SAMPLE):
        return
    got = threshold_topk(x, k, generator(seed, 0))
    assert sorted(got.tolist()) == sorted(exact_topk(x, k).tolist())
    cap = math.ceil(1.25 * k)
    picked = dgc_select(x, k, cap, generator(seed, 0), selection.SAMPLE, 3)
    assert 0 < picked.numel() <= cap and picked.unique().numel() == picked.numel()
    assert bool(x[picked].isnan().sum() == min(nans, picked.numel()))


# --- tensors that require grad ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [3, 500])  # a small share of n, and one that numpy selects
def test_selection_of_a_tensor_that_requires_grad(dtype, k):
    """A parameter's own values, whatever share of them k is: numpy refuses a tensor that
    requires grad, and it selects once k is an eighth of n or more."""
    w = torch.nn.Parameter(normal(1000, dtype, seed=2))
    want = sorted(exact_topk(w.detach(), k).tolist())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(exact_topk(w, k).tolist()) == want
        assert sorted(select(w, k).tolist()) == want
        assert sorted(select(w, k, "threshold").tolist()) == want
        big = torch.nn.Parameter(normal(100_000, dtype, seed=3))
        assert sorted(threshold_topk(big, 20_000, generator(0, 0)).tolist()) == \
            sorted(exact_topk(big.detach(), 20_000).tolist())


# --- residuals that a call with the header exchange off left non-finite ----------------------

SPECIAL = [0.0, -0.0, 1.0, -2.5, 40000.0, -40000.0, 65504.0, 3e38, -3e38, INF, -INF, NAN]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(pairs=st.lists(st.tuples(st.sampled_from(SPECIAL) | st.floats(-1e4, 1e4),
                                st.sampled_from(SPECIAL) | st.floats(-1e4, 1e4)),
                      min_size=1, max_size=30),
       dtype=st.sampled_from(DTYPES))
def test_header_off_never_keeps_a_non_finite_residual(pairs, dtype):
    """With the header exchange off (worst None) a residual holding NaN or Inf would keep them
    for good (x + e is non-finite wherever e is, whatever x): its non-finite elements are
    dropped, its finite ones kept (all of it dropped only where x + e overflows)."""
    x = torch.tensor([a for a, _ in pairs], dtype=torch.float64).to(dtype)
    before = torch.tensor([b for _, b in pairs], dtype=torch.float64).to(dtype)
    e = before.clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fallback(None, x, e, "test") is None
    assert bool(e.isfinite().all())
    finite = before.isfinite()
    cleaned = torch.where(finite, before, torch.zeros_like(before))
    overflow = status(x, cleaned) is Status.OVERFLOW
    assert torch.equal(e, torch.zeros_like(e) if overflow else cleaned)
    assert len(caught) == (not bool(finite.all())) + overflow


@pytest.mark.parametrize("make", [lambda: RandomK(density=0.1), lambda: DGC(density=0.1),
                                  lambda: TopK(density=0.1)], ids=["randomk", "dgc", "topk"])
def test_header_off_error_feedback_recovers_after_a_nan_step(make):
    """One gradient with a NaN and an Inf, the header exchange off: the residual takes NaN
    (unsent elements, and corrected − sent = NaN − NaN, inf − inf where sent) that every
    later call would send; the call after the last non-finite gradient clears it."""
    comp = make()
    ef = ErrorFeedback(comp)
    g = torch.Generator().manual_seed(0)
    for step in range(12):
        x = torch.randn(1000, generator=g)
        if step == 0:
            x[3], x[7] = NAN, INF
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert fallback(None, x, ef.residuals.get("b"), "test") is None
        assert len(caught) == (step == 1)  # the residual that step 0 left, cleared once
        applied = comp.decompress(ef.compress("b", x), 1000)
        if step >= 1:
            assert bool(applied.isfinite().all()) and bool(ef.residuals["b"].isfinite().all())


def test_an_unknown_selector_is_refused_not_run_as_exact():
    with pytest.raises(GradwireError, match="selector must be one of 'exact', 'threshold', "
                                            "got 'treshold'"):
        select(torch.arange(10.0), 3, "treshold")
