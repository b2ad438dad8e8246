"""Codecs whose inputs are finite but whose sums or differences pass the dtype's largest value:
Top-k's and gTop-k's sums over ranks (an average that fits comes out finite, nothing sent is
lost), and PowerSGD's residual corrected − applied (finite, all of it that fits kept)."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from gradwire.collectives.local import execute_local
from gradwire.compress import ErrorFeedback, PowerSGDCompressor
from gradwire.sparse.allreduce import feed, plan
from gradwire.sparse.local import simulate
from gradwire.syncfree import device_paths

WIDE = [torch.float32, torch.bfloat16, torch.float64]  # sums of P of them pass acc_dtype's top
METHODS = [("topk", None), ("gtopk", None), ("gtopk", "tree")]


def averages(xs, k, method, algo, device):
    """(every rank's average, every rank's residual after) of one sparse aggregation with
    zero residuals, on the host path (simulate) or the device path (plans, no host read)."""
    xs = [x.clone() for x in xs]
    rs = [torch.zeros_like(x) for x in xs]
    if not device:
        return [r.average() for r in simulate(xs, rs, k, method, algo=algo)], rs
    n, p = xs[0].numel(), len(xs)
    with device_paths():
        plans = [plan(method, feed(x, r, k, "exact"), min(k, n), n, r, i, p, algo)
                 for i, (x, r) in enumerate(zip(xs, rs, strict=True))]
        execute_local(plans[0].schedule, [q.buffer for q in plans], [q.combine for q in plans])
        return [q.average(torch.empty_like(xs[0])) for q in plans], rs


# --- Top-k and gTop-k -----------------------------------------------------------------------

@pytest.mark.parametrize("device", [False, True])
# gTop-k in bf16 is test_numeric_and_sim_edges.py's (its values travel divided already)
@pytest.mark.parametrize(("dtype", "method", "algo"),
                         [(d, m, a) for d in WIDE for m, a in METHODS
                          if d != torch.bfloat16 or m == "topk"])
@pytest.mark.parametrize("p", [2, 3, 4])
def test_ranks_at_the_largest_value_average_to_it(p, dtype, method, algo, device):
    """Every rank sends ± the dtype's largest value: their sum is ±inf in fp32 (fp64 for
    fp64), the sum Top-k adds up and gTop-k's merges carry, and the average came out ±inf."""
    top = torch.finfo(dtype).max
    xs = [torch.tensor([top, -top, 3.0], dtype=dtype) for _ in range(p)]
    avgs, rs = averages(xs, 3, method, algo, device)
    for avg in avgs:
        assert avg.tolist() == [top, -top, 3.0]
    assert all(not r.any() for r in rs)  # everything was sent and applied


@pytest.mark.parametrize("device", [False, True])
@pytest.mark.parametrize("p", [2, 4])
def test_gtopk_of_fp32_near_its_largest_keeps_what_scaling_rounds_away(p, device):
    """fp32's values travel divided by 2^⌈lg P⌉ so that no merge overflows: the large ones
    exactly, the subnormal ones rounded, and what that rounds away goes back to the sender's
    residual. Σ residual + P·average = Σ x exactly (P a power of two: the average is exact)."""
    sub = 2.0**-149
    xs = [torch.tensor([2.0**125 * (r + 1), sub * (2 * r + 1), -3 * sub, 5.0])
          for r in range(p)]
    avgs, rs = averages(xs, 4, "gtopk", None, device)
    assert avgs[0].isfinite().all() and all(torch.equal(a, avgs[0]) for a in avgs)
    kept = [sum(Fraction(float(r[i])) for r in rs) + p * Fraction(float(avgs[0][i]))
            for i in range(4)]
    assert kept == [sum(Fraction(float(x[i])) for x in xs) for i in range(4)]
    assert any(r[1] != 0 for r in rs)  # the subnormals' low bits went back


def _units(dtype: torch.dtype) -> float:
    """2^(emax − 3): |m|·that for |m| ≤ 15 is finite and exact in ``dtype``, P ≤ 6 of them
    sum exactly in 8 bits, and two of 15 pass the largest value."""
    return 2.0 ** (math.frexp(torch.finfo(dtype).max)[1] - 4)


@st.composite
def near_top(draw):
    p = draw(st.integers(1, 6))
    n = draw(st.integers(1, 6))
    ms = [draw(st.lists(st.integers(-15, 15), min_size=n, max_size=n)) for _ in range(p)]
    return p, n, draw(st.integers(1, n + 1)), ms


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=near_top(), dtype=st.sampled_from(WIDE), how=st.sampled_from(METHODS),
       device=st.booleans())
@example(case=(2, 1, 1, [[15], [15]]), dtype=torch.float32, how=("topk", None), device=False)
@example(case=(3, 2, 1, [[15, 1], [15, 0], [-2, 15]]), dtype=torch.float64,
         how=("gtopk", None), device=True)
def test_sparse_averages_near_the_largest_value_are_finite_and_keep_the_mass(case, dtype,
                                                                            how, device):
    """Multiples of 2^(emax − 3) up to ±15 of them on every rank, whose sums pass the largest
    value: every rank's average is finite and the same, residuals are finite, and
    Σ residual + P·average = Σ x, exactly where P is a power of two (the average is then
    exact), within the mean's rounding otherwise. The tree, and the butterfly's fold at
    other P, hand a merge's dropped partial sum of several ranks to one residual, which need
    not hold it: those are run with k ≥ n (nothing dropped)."""
    p, n, k, ms = case
    method, algo = how
    power = p & (p - 1) == 0
    assume(k >= n or method == "topk" or (algo is None and power))
    unit = _units(dtype)
    xs = [torch.tensor([m * unit for m in row], dtype=dtype) for row in ms]
    avgs, rs = averages(xs, k, method, algo, device)
    for avg in avgs:
        assert avg.isfinite().all() and torch.equal(avg, avgs[0])
    assert all(r.isfinite().all() for r in rs)
    # in units, where every value here is a small integer or a fraction of P: exact
    kept = [sum(Fraction(float(r[i])) for r in rs) / Fraction(unit)
            + p * Fraction(float(avgs[0][i])) / Fraction(unit) for i in range(n)]
    want = [Fraction(sum(row[i] for row in ms)) for i in range(n)]
    if power:
        assert kept == want
    else:  # each of P roundings of the mean within a few of the dtype's steps of 15 units
        eps = Fraction(torch.finfo(dtype).eps)
        assert all(abs(a - b) <= p * p * 16 * eps for a, b in zip(kept, want, strict=True))


# --- PowerSGD's residual ----------------------------------------------------------------------

def _far(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """64 values uniform in ±0.95 of ``dtype``'s largest: a rank-1 approximation of their
    8×8 matrix has elements of the other sign near it, so corrected − applied passes it."""
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(64, generator=g, dtype=torch.float64) * 2 - 1)
            * 0.95 * torch.finfo(dtype).max).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_powersgd_residual_near_the_largest_value_is_finite_and_keeps_what_fits(dtype):
    """One error-feedback step: where corrected − applied fits the dtype, the residual is it
    (one rounding); where it does not, ± the largest value, the most the residual can hold.
    It was ±inf there, and the next step's corrected (a zero gradient + it) inf, then NaN."""
    top = torch.finfo(dtype).max
    x = _far(dtype, 2)
    ef = ErrorFeedback(PowerSGDCompressor(rank=1))
    c = ef.compressor
    applied = c.decompress(ef.compress("b", x), 64)
    diff = x.double() - applied.double()
    over = diff.abs() > top
    assert over.any()  # the case in question
    e = ef.residuals["b"]
    assert e.isfinite().all()
    assert torch.equal(e[over].double(), diff[over].sign() * top)
    assert torch.equal(e[~over], diff[~over].to(dtype))
    zero = torch.zeros_like(x)
    again = c.decompress(ef.compress("b", zero), 64)
    assert again.isfinite().all() and ef.residuals["b"].isfinite().all()


@settings(max_examples=80, deadline=None, derandomize=True)
@given(dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
       pairs=st.lists(st.tuples(st.floats(-1, 1), st.floats(-1, 1)), min_size=1,
                      max_size=12))
@example(dtype=torch.float16, pairs=[(1.0, -1.0), (-0.9, 0.2)])
def test_powersgd_steps_update_saturates_only_what_does_not_fit(dtype, pairs):
    """ErrorFeedback.update, PowerSGD's half of error feedback for its two-allreduce steps:
    residual = corrected − applied, one rounding, where that fits; ± the largest value where
    finite corrected and applied lie further apart."""
    top = torch.finfo(dtype).max
    corrected = torch.tensor([a * top for a, _ in pairs], dtype=torch.float64).to(dtype)
    applied = torch.tensor([b * top for _, b in pairs], dtype=torch.float64).to(dtype)
    ef = ErrorFeedback(PowerSGDCompressor(rank=1))
    ef.update("b", corrected.clone(), applied)
    diff = corrected.double() - applied.double()
    want = torch.where(diff.abs() > top, diff.sign() * top, diff.to(dtype).double())
    assert torch.equal(ef.residuals["b"].double(), want)


@pytest.mark.parametrize("paths", ["host", "device"])
def test_the_powersgd_hook_near_the_largest_value_applies_and_keeps_finite(one_rank, paths):
    """The hook's own residual (acc − average, catalogue.paths): with gradients of a 64×64
    weight uniform in ±0.95·fp32's largest, the rank-1 approximation lies across zero from
    some of them, and the residual held ±inf: the next step applied inf to the model."""
    import contextlib
    import warnings

    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradwire.hooks as gh

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(64, 64))

        def forward(self, g: torch.Tensor) -> torch.Tensor:
            return (self.w * g).sum()  # the weight's gradient is g

    top = torch.finfo(torch.float32).max
    on_device = device_paths() if paths == "device" else contextlib.nullcontext()
    with warnings.catch_warnings(), on_device:
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        net = DDP(Scaled())
        state = gh.make("powersgd", rank=1)
        state.register(net)
        for step in range(3):
            g = (torch.rand(64, 64, generator=torch.Generator().manual_seed(step)) * 2 - 1)
            net.zero_grad()
            net(g * 0.95 * top).backward()
            assert net.module.w.grad.isfinite().all(), step
            assert all(r.isfinite().all() for r in state.ef.residuals.values()), step
