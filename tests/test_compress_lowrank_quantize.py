"""PowerSGD and the quantizers at the edges of their dtypes: finite gradients give finite
payloads and finite values back, in every dtype (products and sums that overflowed, a warm
start that squared the gradient's scale, a top level that rounded past the largest value)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.compress import QSGD, EFSignSGD, ErrorFeedback, PowerSGD, PowerSGDCompressor, get
from gradwire.compress.lowrank import layout


def low_rank(rows: int, cols: int, r: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, r, generator=g) @ torch.randn(cols, r, generator=g).T).reshape(-1)


# --- PowerSGD --------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1e20, 1e-22])
def test_powersgd_warm_start_does_not_square_the_gradients_scale(scale):
    """The warm start Q is the previous Mᵀ·P, of M's scale, so the next P = M·Q was of M's
    scale squared: from |x| ≈ 1e19 (far inside fp32) every second call overflowed to NaN, and
    near 1e-22 P underflowed in part (subnormal) and the approximation was 2 % off."""
    c = PowerSGDCompressor(rank=2)
    for seed in (0, 1, 2):
        x = low_rank(32, 32, 2, seed) * scale
        y = c.decompress(c.compress(x), x.numel())
        assert torch.isfinite(y).all(), seed
        assert torch.allclose(y, x, rtol=0, atol=1e-4 * float(x.abs().max())), seed


@pytest.mark.parametrize("sign", ["equal", "rank1"])
def test_powersgd_of_values_near_the_largest_fp32_is_finite(sign):
    """x of 5e37 (a 32×32 matrix: every column's norm, and so Q = Mᵀ·P, within fp32) made
    P = M·Q overflow, or QR's column norms, and every element NaN, with error feedback's
    residual NaN too."""
    g = torch.Generator().manual_seed(0)
    u, v = (torch.randint(0, 2, (32,), generator=g) * 2 - 1 for _ in range(2))
    m = torch.ones(32, 32) if sign == "equal" else torch.outer(u, v).float()
    x = (m * 5e37).reshape(-1)
    ef = ErrorFeedback(PowerSGDCompressor(rank=2))
    for _ in range(3):
        payload = ef.compress("b", x)
        applied = ef.compressor.decompress(payload, x.numel())
        assert all(torch.isfinite(t).all() for t in payload.tensors())
        assert torch.isfinite(applied).all() and torch.isfinite(ef.residuals["b"]).all()
        assert torch.allclose(applied, x, rtol=1e-5, atol=0)
    ps = PowerSGD(rank=1)  # the steps as the hook runs them, on a batch of two matrices
    batch = torch.stack([m, -m]) * 5e37
    for _ in range(2):
        p = ps.p(batch, key="k")
        q = ps.q(batch, p, key="k")
        assert torch.isfinite(p).all() and torch.isfinite(q).all()
        assert torch.allclose(ps.decompress(p, q, key="k"), batch, rtol=1e-5, atol=0)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(n=st.integers(1, 300), exponent=st.integers(-30, 37), seed=st.integers(0, 2**16),
       rank=st.integers(1, 4))
def test_powersgd_of_finite_fp32_values_is_finite_at_every_scale(n, exponent, seed, rank):
    """Three calls (the warm start included) on values of magnitude up to 10^exponent (at
    most 18 rows: every column's norm, and so Q, within fp32)."""
    c = PowerSGDCompressor(rank=rank, seed=seed)
    g = torch.Generator().manual_seed(seed)
    top = 10.0**exponent
    for _ in range(3):
        x = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1).mul_(top).float()
        payload = c.compress(x)
        assert all(torch.isfinite(t).all() for t in payload.tensors())
        assert torch.isfinite(c.decompress(payload, n)).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_powersgd_never_decodes_a_16_bit_bucket_past_its_largest_value(dtype):
    """A rank-r approximation can overshoot max|x|; in fp32 it did, and the cast back to fp16
    turned values past 65504 into inf (42 of 50 random ±65504 buckets at rank 1): the step
    applied inf where the gradient was finite. Values are bounded by the dtype's largest, as
    QSGD's are; error feedback keeps the rest."""
    top = torch.finfo(dtype).max
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = ((torch.randint(0, 2, (1000,), generator=g) * 2 - 1) * top).to(dtype)
        c = PowerSGDCompressor(rank=1)
        y = c.decompress(c.compress(x), 1000)
        assert y.dtype == dtype and torch.isfinite(y).all()
    # the hook's path: P·Qᵀ written over a 16-bit bucket
    b = layout(64, [(8, 8)], 1).batches[0]
    p = torch.full((1, 8, 1), 2e19)
    q = torch.full((1, 8, 1), 2e19)  # P·Qᵀ = 4e38: past bf16's largest, and fp16's
    out = torch.zeros(64, dtype=dtype)
    b.product_into(p, q, out)
    assert torch.equal(out, torch.full((64,), top, dtype=dtype))


# --- quantizers ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_int8_of_the_largest_finite_value_decodes_finite(dtype):
    """A block whose largest |x| is the dtype's largest value: 127·(max/127) rounded up to
    inf, so decompress gave inf (and error feedback a residual of −inf)."""
    top = torch.finfo(dtype).max
    x = torch.tensor([top, -top, 1.0], dtype=dtype)
    c = get("int8")
    payload = c.compress(x)
    for y in (c.decompress(payload, 3), c.decompress_into(payload, torch.empty(3, dtype=dtype))):
        assert torch.isfinite(y).all(), y
        assert y[0] > 0 > y[1] and torch.allclose(y[:2], x[:2], rtol=1e-6, atol=0)
    ef = ErrorFeedback(get("int8"))
    ef.compress("b", x)
    assert torch.isfinite(ef.residuals["b"]).all()


@pytest.mark.parametrize("value", [1e200, 1e308])
def test_qsgd_and_efsignsgd_of_large_finite_fp64_values_are_finite(value):
    """fp64 squares (and sums) overflow fp64 itself: from |x| ≈ 1.3e154 QSGD's norm was inf and
    every element NaN, the zeros too; EF-signSGD's sum of 1e308s was inf. Scaled by a power
    of two ≥ max|x| first, the norm is exact and the mean finite."""
    x = torch.tensor([value, -value, 0.0, value], dtype=torch.float64)
    q = QSGD(s=4, seed=1)
    total = torch.zeros(4, dtype=torch.float64)
    for _ in range(50):
        payload = q.compress(x)
        assert torch.isfinite(payload.norm).all()
        got = q.decompress(payload, 4)
        assert torch.isfinite(got).all() and got[2] == 0 and (got * x >= 0).all()
        total += got / 50
    assert torch.allclose(total, x, rtol=0, atol=4 * value / 50**0.5)
    if value < 1e300:  # the norm itself is representable: exactly what it is
        assert payload.norm.item() == pytest.approx(3**0.5 * value, rel=1e-15)
    e = EFSignSGD()
    got = e.decompress(e.compress(x), 4)
    assert torch.isfinite(got).all()
    assert got.abs()[0].item() == pytest.approx(value * 0.75, rel=1e-15)
    # in range the scaling (a power of two) changes no bit of the norm or the mean
    y = torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(QSGD(s=4).compress(y).norm, torch.linalg.vector_norm(y).reshape(1))
    assert torch.equal(EFSignSGD().compress(y).scale, (y.abs().sum() / 1000).reshape(1))



def test_powersgd_compresses_exactly_the_matrices_pytorchs_hook_does():
    """PyTorch compresses a matrix only where (rows + cols)·r·2 < rows·cols, strictly; a
    matrix at exactly twice (16×16 at r = 4, 4×4 at r = 1) went compressed here."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    for rows in range(1, 40):
        for cols in range(1, 40):
            for rank in (1, 2, 4):
                r = min(rank, rows, cols)
                theirs = _should_compress(rows, cols, r, 2)[0]
                ours = bool(layout(rows * cols, [(rows, cols)], rank).batches)
                assert ours == theirs, (rows, cols, rank)
