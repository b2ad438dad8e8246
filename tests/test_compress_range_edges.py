"""Compressors at corners their own tests did not reach: QSGD on buckets of a small norm,
seeds given as numpy integers, and a bf16 wire decoded into an fp16 bucket."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.compress import BF16, QSGD, ErrorFeedback, PowerSGDCompressor, RandomK, TernGrad, TopK

# --- QSGD: unbiased whatever the norm's scale ----------------------------------------------


@pytest.mark.parametrize("dtype,scale", [(torch.float32, 1e-37), (torch.float32, 1e-40),
                                         (torch.float64, 1e-306)])
@pytest.mark.parametrize("s", [4, 255])
def test_qsgd_of_a_bucket_of_small_norm_is_unbiased(dtype, scale, s):
    """Levels were |x|·(s/norm): below a norm of s·2^-128 (7.5e-37 in fp32 at s = 255, far
    above fp32's smallest normal) s/norm overflowed to inf, every level came out s, and every
    nonzero element decoded to ±norm (1e-37 and 2e-37 both as 2.3e-37)."""
    x = (torch.tensor([1.0, -2.0, 0.0, 0.5, 0.25], dtype=torch.float64) * scale).to(dtype)
    q = QSGD(s=s, seed=3)
    draws = 400
    mean = sum(q.decompress(q.compress(x), 5).double() for _ in range(draws)) / draws
    norm = float(torch.linalg.vector_norm(x.double() / scale)) * scale  # 1e-306² underflows
    # one draw lies within norm/s of x: the mean of 400 within 4 sd of it
    assert torch.allclose(mean, x.double(), rtol=0, atol=4 * norm / s / draws**0.5)
    assert mean[2] == 0


@settings(max_examples=30, deadline=None, derandomize=True)
@given(exponent=st.integers(-44, 30), s=st.sampled_from([1, 3, 16, 255, 1000]))
def test_qsgd_levels_never_all_saturate_on_a_spread_bucket(exponent, s):
    """Elements of 1/8 of the bucket's largest: their level is at most ⌈s/8⌉ + 1 of s, at
    every scale of fp32 (subnormal included), never the top level."""
    x = torch.full((64,), 1.0, dtype=torch.float64)
    x[0] = 8.0
    x = (x * 10.0**exponent).float()
    if not (x[1] > 0 and torch.isfinite(x).all()):
        return
    q = QSGD(s=s)
    y = q.decompress(q.compress(x), 64)
    norm = float(torch.linalg.vector_norm(x.double()))
    assert float(y[1:].double().abs().max()) <= norm * (s // 8 + 2) / s * (1 + 1e-5)


# --- numpy integer parameters ------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda seed: QSGD(seed=seed),
    lambda seed: TernGrad(seed=seed),
    lambda seed: RandomK(density=0.1, seed=seed),
    lambda seed: TopK(density=0.001, seed=seed),
    lambda seed: PowerSGDCompressor(rank=2, seed=seed),
], ids=["qsgd", "terngrad", "randomk", "topk", "powersgd"])
def test_a_numpy_integer_seed_compresses_as_its_python_int(make):
    """The checks accept numpy integers (``is_int``), but the seed's product overflowed int64
    in the generator: OverflowError at the first compress, where the same Python int works."""
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(0))
    a, b = make(np.int64(7)).compress(x), make(7).compress(x)
    assert all(torch.equal(s, t) for s, t in zip(a.tensors(), b.tensors(), strict=True))


# --- bf16 wire, fp16 bucket ----------------------------------------------------------------


def test_bf16_wire_never_decodes_a_finite_fp16_bucket_to_inf():
    """bf16 rounds fp16's largest value, 65504, up to 65536, which the cast back made inf:
    a finite gradient applied (and, under error feedback, kept) as inf. Values on the wire
    that are inf stay inf, NaN stays NaN."""
    top = torch.finfo(torch.float16).max
    x = torch.tensor([-top, top, 1.0, 65000.0, 21840.0], dtype=torch.float16)
    c = BF16()
    p = c.compress(x)
    y = c.decompress(p, 5)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    assert torch.equal(y[:2], x[:2])
    out = torch.empty(5, dtype=torch.float16)
    assert torch.equal(c.decompress_into(p, out), y) and torch.equal(out, y)
    ef = ErrorFeedback(BF16())
    ef.compress("b", x)
    assert torch.isfinite(ef.residuals["b"]).all()
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), top],
                           dtype=torch.float16)
    got = c.decompress(c.compress(special), 4)
    assert got[0] == float("inf") and got[1] == -float("inf") and got[2].isnan()
    assert got[3] == top


def test_bf16_wire_sum_of_two_fp16_ranks_at_the_largest_value_stays_finite():
    """The summed path: each rank scales by 1/P and casts, the allreduce sums bf16, the
    average is written into the fp16 bucket (decompress_into)."""
    import dataclasses

    top = torch.finfo(torch.float16).max
    c = BF16()
    x = torch.full((3,), top, dtype=torch.float16)
    p = c.compress(x.clone().mul_(0.5))
    summed = dataclasses.replace(p, values=p.values + p.values)
    out = torch.empty(3, dtype=torch.float16)
    c.decompress_into(summed, out)
    assert torch.equal(out, x)
