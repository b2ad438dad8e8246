"""Edge cases of gradwire.compress: bad input as one-line errors, stale residuals, extreme
magnitudes in every dtype, and counts that floating point must not round up."""
import pytest
import torch

from gradwire.compress import (
    COMPRESSORS,
    DGC,
    QSGD,
    ErrorFeedback,
    SignSGD,
    TopK,
    feedback,
    get,
    majority_vote,
)
from gradwire.errors import GradwireError


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_compress_of_a_non_tensor_is_a_one_line_error(name):
    """A list or a number is a user error, not an AttributeError from deep inside."""
    for bad in ([1.0, 2.0], 3.0, None):
        with pytest.raises(GradwireError, match=f"{name}: expected a 1-D float tensor") as e:
            get(name).compress(bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_combine_of_no_payloads_is_a_one_line_error(name):
    with pytest.raises(GradwireError, match="at least one (sign )?payload") as e:
        get(name).combine([], 4)
    assert "\n" not in str(e.value)


def test_majority_vote_refuses_payloads_of_another_numel():
    """decompress refuses a numel the payload was not made from; the vote of signSGD's
    combine gave a tensor of the wrong length instead (16 elements for numel 100, 15 for -1),
    and payloads of different lengths a RuntimeError from torch.stack."""
    s = SignSGD()
    p10, p20 = s.compress(torch.randn(10)), s.compress(torch.randn(20))
    assert s.combine([p10, p10], 10).shape == (10,)
    for numel in (100, 3, -1, 10.0):
        with pytest.raises(GradwireError, match="majority_vote: "):
            s.combine([p10], numel)
    with pytest.raises(GradwireError, match="majority_vote: "):
        majority_vote([p10, p20], 10)


def test_error_feedback_refuses_a_residual_of_another_shape_everywhere():
    """correct() refused a residual that no longer matches the gradient; residual() and
    flush() handed it over, and a 1-element x then broadcast over a 5-element residual:
    x's mass added five times, and a result of the wrong length."""
    ef = ErrorFeedback(TopK(k=1))
    ef.residual("b", torch.zeros(5)).fill_(1.0)
    for call in (lambda: ef.residual("b", torch.zeros(1)),
                 lambda: ef.flush("b", torch.ones(1)),
                 lambda: ef.residual("b", torch.zeros(5, dtype=torch.float64)),
                 lambda: ef.flush("b", torch.ones(5, dtype=torch.float16))):
        with pytest.raises(GradwireError, match=r"key 'b': residual is \(5,\) torch.float32.*"
                                                r"call reset\(\)"):
            call()
    assert torch.equal(ef.residuals["b"], torch.ones(5))  # refused: nothing changed
    e = ef.residual("b", torch.zeros(5))
    values, idx = feedback.feed(e, torch.full((5,), 2.0), 1)
    assert float(values.sum() + e.sum()) == 15.0  # 5 of residual + 10 of gradient
    assert torch.equal(ef.flush("b", torch.zeros(5)), e.new_full((5,), 3.0).index_fill_(0, idx, 0))


@pytest.mark.parametrize("dtype,value,n", [(torch.float16, 1000.0, 10_000),
                                           (torch.float16, 60000.0, 2),
                                           (torch.bfloat16, 3e38, 4),
                                           (torch.float32, 3e38, 3)])
@pytest.mark.parametrize("s", [1, 3, 25, 255, 1000])
def test_qsgd_of_finite_values_is_finite_and_unbiased_in_their_dtype(dtype, value, n, s):
    """QSGD sends levels of ||x||₂/s; where ||x||₂ is beyond x's dtype (an fp16 bucket of
    10 000 values of 1000 has a norm of 100 000, above 65 504; two fp32 values of 3e38 a norm
    above fp32's range) level s came back as inf, or every element as NaN (0 · inf). Any
    norm' ≥ max|x| keeps the rounding unbiased, so finite x gives finite values."""
    x = torch.full((n,), value, dtype=torch.float64)
    x[1::2] *= -1
    x = x.to(dtype)
    q = QSGD(s=s, seed=1)
    total = torch.zeros(n, dtype=torch.float64)
    draws = 50 if n < 10 else 3
    for _ in range(draws):
        got = q.decompress(q.compress(x), n)
        assert got.dtype == dtype and torch.isfinite(got).all()
        assert (got.double() * x.double() >= 0).all()  # the sign is kept
        total += got.double()
    if n < 10:  # mean of 50 draws within 4 sd of x (the spread of one is ≤ max|x|·s/s)
        assert torch.allclose(total / draws, x.double(), rtol=0, atol=4 * abs(value) / 50**0.5)
    else:  # many elements: the magnitudes sum to about those of x (4 sd at s = 1)
        assert abs(float(total.abs().sum()) / draws / (value * n) - 1) <= 0.2


def test_qsgd_in_range_is_unchanged():
    """The bound only acts beyond the dtype's range: an ordinary bucket is sent as before."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    p = QSGD(s=4).compress(x)
    assert torch.allclose(p.norm, torch.linalg.vector_norm(x).reshape(1))


def test_dgc_capacity_is_the_ceiling_of_slack_times_k_not_of_its_rounding_error():
    """1.1 · 10 is 11.000000000000002 in floating point: ⌈slack·k⌉ is 11 pairs, not 12 (as
    select_count rounds density·n before its ceiling)."""
    assert DGC(k=10, slack=1.1).capacity(1000) == 11
    assert DGC(k=100, slack=1.1).capacity(1000) == 110  # 110.00000000000001
    assert DGC(k=4).capacity(1000) == 5 and DGC(k=5).capacity(1000) == 7
    c = DGC(k=10, slack=1.1)
    p = c.compress(torch.randn(1000))
    assert p.indices.numel() == 11 and p.nbytes == c.wire_bytes(1000, torch.float32) == 92


def test_a_powersgd_state_that_lacks_a_field_leaves_the_compressor_as_it_was():
    from gradwire.compress import get

    c = get("powersgd", rank=1)
    before = c.state_dict()
    with pytest.raises(KeyError):
        c.load_state_dict({"step": 7})
    assert c.state_dict() == before
