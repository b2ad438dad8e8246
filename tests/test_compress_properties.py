"""Property tests of what the compressors promise (src/gradwire/compress/, docs/compression.md),
over random sizes (0, 1, odd, not multiples of a block), dtypes and values (zeros, ties, signed
zeros, subnormals, values near the dtype's largest, mixed signs).

Every test is deterministic: hypothesis runs derandomized, and the statistical ones (QSGD and
TernGrad unbiased) average a fixed set of seeds against a bound of many standard deviations."""
import inspect
import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradwire.compress import (
    COMPRESSORS,
    DGC,
    QSGD,
    EFSignSGD,
    ErrorFeedback,
    Int8,
    PowerSGD,
    PowerSGDCompressor,
    RandomK,
    SignSGD,
    TernGrad,
    TopK,
    blocks,
    exact_topk,
    get,
    majority_vote,
    matrix_shape,
    threshold_topk,
    to_matrix,
)
from gradwire.compress.base import generator
from gradwire.compress.bits import WIDTHS, decode_codes, pack_bits, packed_bytes, unpack_bits
from gradwire.compress.feedback import Status, feed, local_status, settle, status
from gradwire.compress.lowrank import layout
from gradwire.compress.quantize import (
    INT8_BLOCK,
    INT8_MAX,
    int8_budget,
    int8_cap,
    int8_exponent,
    int8_exponent_limit,
    int8_quantize,
    int8_steps,
)
from gradwire.compress.select import device_exact, dgc_select
from gradwire.dtypes import FLOATS, acc_dtype
from gradwire.syncfree import device_paths

FAST = settings(max_examples=30, derandomize=True, deadline=None)
FEW = settings(max_examples=12, derandomize=True, deadline=None)
NAMES = list(COMPRESSORS)
EF_NAMES = [n for n, c in COMPRESSORS.items() if c.error_feedback]


# --- strategies -------------------------------------------------------------------------------

def _palette(dtype: torch.dtype, huge: bool) -> list[float]:
    fi = torch.finfo(dtype)
    sub = fi.smallest_normal * 2.0**-3  # a subnormal of every float dtype
    out = [0.0, -0.0, 1.0, -1.0, 0.5, -3.0, 3.0, fi.smallest_normal, -sub, sub, 1e-3]
    if huge:
        out += [fi.max, -fi.max, fi.max / 2, -fi.max / 3]
    return out


@st.composite
def buckets(draw, dtypes=FLOATS, max_size=300, huge=True, sizes=()):
    """A 1-D tensor of one of ``dtypes``: a mix of special values and random ones at a drawn
    scale, every element finite in its dtype."""
    dtype = draw(st.sampled_from(dtypes))
    n = draw(st.sampled_from(sizes) if sizes else st.integers(0, max_size))
    fi = torch.finfo(dtype)
    scales = [1.0, 1e-3, fi.smallest_normal * 64] + ([fi.max / 4] if huge else [])
    scale = draw(st.sampled_from(scales))
    special = st.sampled_from(_palette(dtype, huge))
    plain = st.floats(-1, 1).map(lambda v: v * scale)
    values = draw(st.lists(st.one_of(special, plain, plain), min_size=n, max_size=n))
    x = torch.tensor(values, dtype=torch.float64).clamp(-fi.max, fi.max).to(dtype)
    assert x.isfinite().all()
    return x


def big_bucket(n: int, dtype: torch.dtype, seed: int, ties: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    if ties:
        x = x.mul(4).round()
    return x.to(dtype)


def reference_topk(x: torch.Tensor, k: int) -> set[int]:
    """The tie rule, long-hand: the k largest |x|, ties to the smaller index."""
    a = x.double().abs().numpy()
    order = np.lexsort((np.arange(a.size), -a))
    return set(order[:k].tolist())


def same_payload(a, b) -> bool:
    return all(torch.equal(s, t) for s, t in zip(a.tensors(), b.tensors(), strict=True))


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


# --- the contract, every compressor ------------------------------------------------------------

def _finite_on_its_wire(name: str, x: torch.Tensor) -> bool:
    """Whether a finite ``x`` must decompress finite: a cast overflows where its wire's range
    is smaller than the bucket's (documented): from the wire's largest value plus half its
    last step, which rounds to inf (65520 for fp16; about 3.3961e38 for bf16, below fp32's
    largest value)."""
    if name in ("fp16", "bf16") and x.numel():
        fi = torch.finfo(torch.float16 if name == "fp16" else torch.bfloat16)
        overflow = fi.max + 2.0 ** (math.frexp(fi.max)[1] - 1) * fi.eps / 2
        return bool(x.double().abs().max() < overflow)
    return True


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(x=buckets())
@example(x=torch.zeros(0))
@example(x=torch.full((1,), torch.finfo(torch.float32).max))
@example(x=torch.full((1025,), -torch.finfo(torch.float16).max, dtype=torch.float16))
@example(x=torch.tensor([65519.0, -65520.0, 3.3961e38]))
def test_round_trip_shape_dtype_wire_bytes(name, x):
    c = get(name)
    n = x.numel()
    payload = c.compress(x)
    assert payload.dtype == x.dtype
    assert payload.nbytes == sum(t.nbytes for t in payload.tensors()) == c.wire_bytes(n, x.dtype)
    y = c.decompress(payload, n)
    assert y.shape == x.shape and y.dtype == x.dtype
    if _finite_on_its_wire(name, x):
        assert y.isfinite().all()
    into = torch.full_like(x, float("nan"))
    assert torch.equal(c.decompress_into(payload, into), y)


# --- error feedback ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", EF_NAMES)
@FAST
@given(xs=st.lists(buckets(max_size=200, huge=False, sizes=(0, 1, 2, 3, 17, 100, 1025)),
                   min_size=1, max_size=3),
       dtype=st.sampled_from(FLOATS))
def test_error_feedback_conserves_mass(name, xs, dtype):
    """e_after + sent = e_before + x, exactly for the sparsifiers (they send acc's own values),
    within one rounding of each step otherwise; nothing non-finite from finite input."""
    n = xs[0].numel()
    ef = ErrorFeedback(get(name))
    e = torch.zeros(n, dtype=dtype)
    for x in xs:
        x = (x if x.numel() == n else xs[0]).to(dtype)
        payload = ef.compress("b", x)
        sent = ef.compressor.decompress(payload, n)
        after = ef.residuals["b"]
        assert after.dtype == dtype and sent.isfinite().all() and after.isfinite().all()
        lhs, rhs = after.double() + sent.double(), e.double() + x.double()
        if name in ("topk", "randomk", "dgc"):
            corrected = x + e  # rounded once, in x's dtype, as ErrorFeedback does
            assert torch.equal(after + sent, corrected)
            assert set(torch.nonzero(after == 0).squeeze(1).tolist()) >= \
                set(torch.nonzero(sent).squeeze(1).tolist())
        else:
            tol = eps(dtype) * (after.double().abs() + rhs.abs()) + torch.finfo(dtype).tiny
            assert ((lhs - rhs).abs() <= tol).all()
        e = after.clone()


@pytest.mark.parametrize("name", EF_NAMES)
@FEW
@given(x=buckets(max_size=80, sizes=(1, 2, 5, 16, 30, 64)))
@example(x=torch.tensor([3.0e38, -3.0e38, 3.0e38, -3.0e38]))
@example(x=torch.tensor([60000.0, -60000.0, 1.0, 60000.0], dtype=torch.float16))
def test_error_feedback_stays_finite_near_the_dtype_max(name, x):
    """A finite gradient, however large, leaves a finite residual and a finite sent value in the
    first step (from a zero residual nothing can overflow x + e). PowerSGD's M̂ is a projection
    of M's columns, |M̂_ij| ≤ √rows·max|M|, on either side of x: its residual is finite while
    (1 + √rows)·max|x| is within the dtype (beyond, see the report: it can overflow)."""
    ef = ErrorFeedback(get(name))
    payload = ef.compress("b", x)
    sent = ef.compressor.decompress(payload, x.numel())
    assert sent.isfinite().all()
    if name == "powersgd":
        rows, _ = matrix_shape(x.numel())
        if (1 + math.sqrt(rows)) * float(x.double().abs().max()) > torch.finfo(x.dtype).max:
            return
    assert ef.residuals["b"].isfinite().all()


# --- top-k ------------------------------------------------------------------------------------

@st.composite
def with_k(draw, max_size=300, tie_heavy=True):
    x = draw(buckets(max_size=max_size))
    if tie_heavy and draw(st.booleans()):
        x = x.double().clamp(-4, 4).round().to(x.dtype)  # many ties, signed zeros included
    k = draw(st.integers(0, x.numel() + 2))
    return x, k


@FAST
@given(xk=with_k(), selector=st.sampled_from(["exact", "threshold"]))
@example(xk=(torch.tensor([0.0, -0.0, 0.0, 1.0, -1.0]), 3), selector="exact")
def test_topk_keeps_exactly_k_largest_ties_to_the_smaller_index(xk, selector):
    x, k = xk
    c = TopK(k=max(k, 1), selector=selector)
    payload = c.compress(x)
    want = min(max(k, 1), x.numel())
    idx = payload.indices.long().tolist()
    assert len(idx) == len(set(idx)) == want
    assert set(idx) == reference_topk(x, want)
    assert torch.equal(payload.values, x[payload.indices.long()])


@FAST
@given(xk=with_k(max_size=400), seed=st.integers(0, 2**20),
       sample=st.sampled_from([0.01, 0.05, 0.2]))
def test_threshold_selector_returns_the_exact_set(xk, seed, sample):
    """With a small sample the sampled threshold runs on small buckets too (2·s < n)."""
    x, k = xk
    k = min(k, x.numel())
    got = threshold_topk(x, k, generator(seed, 0), sample=sample, min_sample=2)
    assert set(got.tolist()) == set(exact_topk(x, k).tolist()) == reference_topk(x, k)
    assert got.numel() == k


@pytest.mark.parametrize("n, k, ties", [(9000, 9, False), (9000, 90, True), (20000, 2000, True)])
def test_threshold_selector_on_buckets_past_the_minimum_sample(n, k, ties):
    for seed in range(3):
        x = big_bucket(n, torch.float32, seed, ties)
        got = TopK(k=k).compress(x).indices.long()
        assert set(got.tolist()) == reference_topk(x, k)


@FAST
@given(xk=with_k())
def test_device_path_exact_selector_keeps_the_rule(xk):
    x, k = xk
    k = min(k, x.numel())
    if not 0 < k < x.numel():
        return
    with device_paths():
        got = device_exact(x, k)
    assert got.tolist() == sorted(reference_topk(x, k))


# --- DGC --------------------------------------------------------------------------------------

@FAST
@given(x=buckets(max_size=400, huge=False), density=st.sampled_from([0.01, 0.05, 0.2, 0.5]),
       slack=st.sampled_from([1.0, 1.1, 1.25, 2.0]), seed=st.integers(0, 1000),
       sample=st.sampled_from([0.01, 0.1]))
def test_dgc_selects_the_largest_within_capacity(x, density, slack, seed, sample):
    n = x.numel()
    c = DGC(density=density, slack=slack, seed=seed, sample=sample)
    payload = c.compress(x)
    cap, count = c.capacity(n), int(payload.count[0])
    assert payload.indices.numel() == payload.values.numel() == cap
    assert 0 <= count <= cap
    idx = payload.indices[:count].long()
    assert idx.unique().numel() == count
    assert torch.equal(payload.values[:count], x[idx])
    assert not payload.values[count:].any() and not payload.indices[count:].any()
    mask = torch.zeros(n, dtype=torch.bool)
    mask[idx] = True
    if 0 < count < n:  # a threshold: nothing left out is larger than what was taken
        assert x[mask].double().abs().min() >= x[~mask].double().abs().max()
    if n:
        assert count >= 1


@FAST
@given(n=st.integers(50, 3000), k=st.integers(1, 200), slack=st.sampled_from([1.0, 1.1, 1.25, 1.5]),
       seed=st.integers(0, 1000))
def test_dgc_count_within_its_bounds_when_passes_suffice(n, k, slack, seed):
    """Distinct values and passes enough: k²/capacity ≤ count ≤ capacity (the verdict's rule;
    about k/slack)."""
    k = min(k, n)
    cap = min(n, math.ceil(slack * k))
    x = big_bucket(n, torch.float64, seed)
    idx = dgc_select(x, k, cap, generator(seed, 1), 0.05, passes=64, min_sample=8)
    assert k * k <= idx.numel() * cap and idx.numel() <= cap
    assert reference_topk(x, idx.numel()) == set(idx.tolist())


# --- random-k ---------------------------------------------------------------------------------

@FAST
@given(x=buckets(max_size=400), density=st.sampled_from([0.001, 0.1, 0.5, 0.9, 1.0]),
       seed=st.integers(0, 2**31), steps=st.integers(0, 3))
def test_randomk_same_indices_on_every_rank_for_seed_and_step(x, density, seed, steps):
    n = x.numel()
    ranks = [RandomK(density=density, seed=seed) for _ in range(2)]
    other = x.flip(0) * 3  # ranks' gradients differ; their indices must not
    for _ in range(steps):
        for r in ranks:
            r.compress(x)
    a, b = ranks[0].compress(x), ranks[1].compress(other)
    assert a.step == b.step == steps
    idx = ranks[0].indices(n, steps)
    assert torch.equal(idx, ranks[1].indices(n, steps))
    assert idx.numel() == idx.unique().numel() == ranks[0].count(n)
    assert bool(((idx >= 0) & (idx < n)).all())
    assert torch.equal(a.values, x[idx]) and torch.equal(b.values, other[idx])
    # no rescaling by n/k (documented): the sum decompresses to the sum of the values
    dense = ranks[0].decompress(a, n)
    assert torch.equal(dense[idx], x[idx]) and dense.count_nonzero() <= idx.numel()


# --- quantizers -------------------------------------------------------------------------------

DRAWS = 300


def _mean_of_draws(make, x: torch.Tensor) -> torch.Tensor:
    total = torch.zeros(x.numel(), dtype=torch.float64)
    for seed in range(DRAWS):
        c = make(seed)
        total += c.decompress(c.compress(x), x.numel()).double()
    return total / DRAWS


@FEW
@given(x=buckets(max_size=60, huge=False), s=st.sampled_from([1, 2, 3, 7, 255, 300]))
@example(x=torch.tensor([1e-38, -3e-39, 2e-38, 0.0]), s=255)
@example(x=torch.tensor([0.3, 0.3, -0.3], dtype=torch.float16), s=1)
def test_qsgd_unbiased_and_levels_in_range(x, s):
    """E[decompress] = x: the mean of 400 fixed seeds within 6 standard deviations of the
    rounding (a level step is norm/s, its variance at most step²/4), plus the dtype's rounding
    of the decoded levels."""
    c = QSGD(s=s)
    payload = c.compress(x)
    norm = float(payload.norm[0])
    assert norm >= x.double().abs().max() * (1 - 1e-6) if x.numel() else norm == 0
    w = c._level_width()
    lev = unpack_bits(payload.levels, w, x.numel()) if isinstance(w, int) else payload.levels
    assert int(lev.max()) <= s if x.numel() else True
    mean = _mean_of_draws(lambda seed: QSGD(s=s, seed=seed), x)
    unit = norm / s
    bound = 6 * unit / 2 / math.sqrt(DRAWS) + eps(x.dtype) * x.double().abs() + unit * 1e-6 \
        + torch.finfo(x.dtype).tiny
    assert ((mean - x.double()).abs() <= bound).all()


@FEW
@given(x=buckets(max_size=60, huge=False))
def test_terngrad_unbiased(x):
    scale = float(x.double().abs().max()) if x.numel() else 0.0
    mean = _mean_of_draws(lambda seed: TernGrad(seed=seed), x)
    bound = 6 * scale / 2 / math.sqrt(DRAWS) + eps(x.dtype) * x.double().abs() \
        + torch.finfo(x.dtype).tiny
    assert ((mean - x.double()).abs() <= bound).all()


@FAST
@given(x=buckets())
def test_signsgd_and_efsignsgd_scales(x):
    n = x.numel()
    signs = torch.where(x >= 0, 1.0, -1.0).double()  # 0 and -0 count as +
    assert torch.equal(SignSGD().decompress(SignSGD().compress(x), n).double(), signs)
    p = EFSignSGD().compress(x)
    l1 = x.double().abs().sum() / max(n, 1)  # ||x||₁/n
    scale = float(p.scale[0])
    assert p.scale.dtype == acc_dtype(x.dtype)
    assert abs(scale - float(l1)) <= eps(acc_dtype(x.dtype)) * float(l1)
    y = EFSignSGD().decompress(p, n).double()
    assert torch.equal(y, signs * p.scale.to(x.dtype).double())


# --- int8 -------------------------------------------------------------------------------------

@FAST
@given(x=buckets(sizes=(0, 1, 3, 1023, 1024, 1025, 2049)))
@example(x=torch.full((1025,), 1e-44))
def test_int8_block_scale_covers_the_block_max(x):
    p = Int8().compress(x)
    n = x.numel()
    assert p.scale.numel() == -(-n // INT8_BLOCK)
    assert p.values.dtype == torch.int8 and bool((p.values.abs() <= INT8_MAX).all())
    y = Int8().decompress(p, n).double()
    xd = x.double()
    for b in range(p.scale.numel()):
        blk, scale = slice(b * INT8_BLOCK, (b + 1) * INT8_BLOCK), float(p.scale[b])
        top = float(xd[blk].abs().max())
        if scale == 0:  # nothing sent (a zero or too small block): error feedback keeps it
            assert not y[blk].any()
            continue
        # 127 levels of the scale reach the block's largest |x|, to a rounding
        assert INT8_MAX * scale >= top * (1 - 4 * eps(p.scale.dtype))
        assert INT8_MAX * scale <= top * (1 + 4 * eps(p.scale.dtype))
        # and each element is within half a level (and the dtype's rounding) of x
        err = (y[blk] - xd[blk]).abs()
        assert (err <= scale * (0.5 + 1e-6) + eps(x.dtype) * xd[blk].abs()).all()


@FAST
@given(world=st.integers(1, 127), x=buckets(max_size=2100, sizes=(1, 7, 1024, 1500, 2100)),
       shift=st.integers(-6, 6))
def test_int8_levels_of_every_rank_sum_without_overflow(world, x, shift):
    """⌊127/P⌋ levels a rank, at most what keeps step·level within the dtype: the sum of all
    P ranks' int8 values fits in int8, and the average they stand for is finite."""
    budget = int8_budget(world)
    assert budget * world <= INT8_MAX
    dtype = acc_dtype(x.dtype)
    bound = x.double().abs().reshape(-1, 1)
    bounds = torch.stack([bound[i : i + INT8_BLOCK].max()
                          for i in range(0, x.numel(), INT8_BLOCK)]).to(dtype)
    limit = int8_exponent_limit(x.dtype)
    exponent = (int8_exponent(bounds, budget, limit) + shift).clamp(-limit, limit)
    step, inv = int8_steps(exponent, dtype)
    cap = int8_cap(step, budget, x.dtype)
    assert bool((cap <= budget).all() and (cap >= 0).all())
    t, q = int8_quantize(x, inv, cap)
    assert bool((q.abs() <= budget).all()) and torch.equal(t, q.to(t.dtype))
    total = q.to(torch.int32) * world  # every rank at this rank's largest levels
    assert bool((total.abs() <= INT8_MAX).all())
    avg = torch.empty(x.numel(), dtype=dtype)
    blocks.mul(q.to(dtype) * world, step / world, INT8_BLOCK, out=avg)
    assert avg.to(x.dtype).isfinite().all()
    # at the step int8_exponent gives, nothing up to the bound is clipped (to a rounding),
    # unless the bound is past what the largest exponent reaches
    within = (exponent < limit) & (cap == budget)
    if shift >= 0:
        assert bool((budget * step >= bounds * (1 - 4 * eps(dtype)))[within].all())


# --- PowerSGD ---------------------------------------------------------------------------------

@FEW
@given(x=buckets(max_size=120, huge=False, dtypes=(torch.float32, torch.float64)),
       rank=st.integers(1, 12))
def test_powersgd_full_rank_reconstructs(x, rank):
    """A rank at least the matrix's smaller side projects onto every column: M̂ = M."""
    c = PowerSGDCompressor(rank=rank)
    rows, cols = matrix_shape(x.numel())
    y = c.decompress(c.compress(x), x.numel())
    if rank >= min(rows, cols):
        scale = float(x.double().abs().max()) if x.numel() else 0.0
        tol = 1e3 * eps(acc_dtype(x.dtype)) * scale * max(rows, 1)
        assert ((y.double() - x.double()).abs() <= tol).all()


# --- state_dict -------------------------------------------------------------------------------

def _seeded(name: str):
    takes_seed = "seed" in inspect.signature(COMPRESSORS[name]).parameters
    return get(name, seed=3) if takes_seed else get(name)


@pytest.mark.parametrize("name", NAMES)
@FEW
@given(xs=st.lists(buckets(max_size=150, huge=False, sizes=(1, 5, 64, 150)),
                   min_size=2, max_size=4))
def test_state_dict_round_trip_reproduces_the_next_step(name, xs):
    """Saved after some steps, loaded into a fresh compressor (and error feedback): the next
    step is bit for bit the original's, even after the original ran on past the save."""
    xs = [x if x.numel() == xs[0].numel() else xs[0] for x in xs]
    xs = [x.to(xs[0].dtype) for x in xs]
    ef, other = ErrorFeedback(_seeded(name)), ErrorFeedback(_seeded(name))
    for x in xs[:-1]:
        ef.compress("b", x)
    saved = ef.state_dict()
    want = ef.compress("b", xs[-1])
    ef.compress("b", xs[0])  # the original runs on: a saved state must not follow it
    other.load_state_dict(saved)
    got = other.compress("b", xs[-1])
    assert same_payload(want, got)


# --- bits -------------------------------------------------------------------------------------

@FAST
@given(width=st.sampled_from(WIDTHS), codes=st.lists(st.integers(0, 255), max_size=70))
def test_bit_packing_round_trips(width, codes):
    c = torch.tensor(codes, dtype=torch.uint8) & ((1 << width) - 1)
    packed = pack_bits(c, width)
    assert packed.numel() == packed_bytes(c.numel(), width)
    assert torch.equal(unpack_bits(packed, width, c.numel()), c)
    values = torch.arange(1 << width, dtype=torch.float32) * -1.5
    assert torch.equal(decode_codes(packed, width, c.numel(), values), values[c.long()])


@FEW
@given(shapes=st.lists(st.lists(st.integers(0, 9), min_size=0, max_size=3), max_size=6),
       rank=st.integers(1, 5))
def test_powersgd_layout_covers_every_element_once(shapes, rank):
    """Batches and plain spans partition the bucket; a matrix is compressed exactly when
    rows·cols > 2(rows + cols)·r (PyTorch's rule)."""
    numel = sum(math.prod(s) for s in shapes)
    lay = layout(numel, shapes, rank)
    covered = torch.zeros(numel, dtype=torch.int64)
    for b in lay.batches:
        assert b.r == min(rank, b.rows, b.cols)
        assert b.rows * b.cols > 2 * (b.rows + b.cols) * b.r
        for at, n in b.spans:
            covered[at : at + n] += 1
    for at, n in lay.plain:
        covered[at : at + n] += 1
    assert bool((covered == 1).all())


@FEW
@given(world=st.integers(1, 3), x=buckets(max_size=150, huge=False, sizes=(1, 9, 20, 64, 150),
                                         dtypes=(torch.float32, torch.float64)),
       rank=st.integers(1, 4))
def test_powersgd_two_allreduces_approximate_the_sum(world, x, rank):
    """Every rank ends with the same M̂ and the same warm start; at a rank of at least the
    matrix's smaller side M̂ is the sum of the ranks' M (to rounding)."""
    xs = [x * (i + 1) - i for i in range(world)]  # the ranks' gradients differ
    states = [PowerSGD(rank=rank) for _ in range(world)]
    for _ in range(2):  # the second step starts warm
        ms = [to_matrix(t) for t in xs]
        p = sum(s.p(m, key=0) for s, m in zip(states, ms, strict=True))
        mine = [p.clone() for _ in states]  # each rank's copy of the reduced P
        q = sum(s.q(m, pr, key=0) for s, m, pr in zip(states, ms, mine, strict=True))
        outs = [s.decompress(pr, q.clone(), key=0) for s, pr in zip(states, mine, strict=True)]
        assert all(torch.equal(o, outs[0]) for o in outs)
        # after q(), P's columns are orthogonal, each of norm 2^t, 2^t the least ≥ √rows
        t = ((ms[0].shape[0] - 1).bit_length() + 1) // 2
        gram = mine[0].mT.double() @ mine[0].double()
        eye = torch.eye(gram.shape[-1], dtype=torch.float64) * 4.0**t
        assert torch.allclose(gram, eye, atol=1e-4 * 4.0**t)
        assert all(torch.equal(s.memory[0], states[0].memory[0]) for s in states)
        assert outs[0].isfinite().all()
    total = sum(m.double() for m in ms)
    rows, cols = total.shape
    if rank >= min(rows, cols):
        tol = 1e3 * eps(acc_dtype(x.dtype)) * float(total.abs().max()) * max(rows, cols)
        assert ((outs[0].double() - total).abs() <= tol).all()


# --- the NaN/Inf policy and the in-place top-k feed --------------------------------------------

def _brute_status(x: torch.Tensor, e: torch.Tensor | None) -> Status:
    if not x.isfinite().all() or (e is not None and not e.isfinite().all()):
        return Status.NONFINITE
    if e is not None and not (x + e).isfinite().all():
        return Status.OVERFLOW
    return Status.OK


@st.composite
def extreme_pairs(draw):
    dtype = draw(st.sampled_from(FLOATS))
    top = torch.finfo(dtype).max
    pal = [0.0, 1.0, -1.0, top, -top, top / 2, -top / 2, 1e-3]
    odd = [math.inf, -math.inf, math.nan]
    n = draw(st.integers(0, 6))
    pick = st.sampled_from(pal + odd) if draw(st.booleans()) else st.sampled_from(pal)
    x = torch.tensor(draw(st.lists(pick, min_size=n, max_size=n)), dtype=torch.float64)
    e = torch.tensor(draw(st.lists(pick, min_size=n, max_size=n)), dtype=torch.float64)
    return x.to(dtype), (e.to(dtype) if draw(st.booleans()) else None)


@FAST
@given(pair=extreme_pairs())
def test_status_host_exact_device_conservative(pair):
    x, e = pair
    want = _brute_status(x, e)
    assert status(x, e) is want
    assert local_status(x, e)[0] == want
    with device_paths():  # from the largest magnitudes: never misses, may see overflow
        mine = int(local_status(x, e)[0])
    assert mine == want or (want is Status.OK and mine == Status.OVERFLOW)


@FAST
@given(pair=extreme_pairs(), k=st.integers(0, 7))
def test_feed_and_settle_conserve_mass(pair, k):
    """feed: residual_after + sent = residual_before + x exactly; where x + e overflows,
    settle's dense sum with the residual it keeps conserves it too, with nothing non-finite."""
    x, e = pair
    if _brute_status(x, e) is Status.NONFINITE:
        return
    residual = e.clone() if e is not None else torch.zeros_like(x)
    before = residual.clone()
    mine, keep = local_status(x, residual)
    values, idx = feed(residual, x, k, keep=keep)
    assert idx.numel() == min(k, x.numel())
    if mine == Status.OK:
        acc = residual.clone()
        acc[idx] = values
        assert torch.equal(acc, before + x)
        return
    residual[idx] = values  # what was selected, put back before the dense call
    with pytest.warns(RuntimeWarning):
        out = settle(mine, x, residual, residual, keep, "test")
    assert out.isfinite().all() and residual.isfinite().all()
    assert torch.equal(residual.double() + out.double(), before.double() + x.double())


@FAST
@given(world=st.sampled_from([1, 2, 3, 4, 255, 256, 300]), n=st.integers(0, 40),
       seed=st.integers(0, 100))
def test_majority_vote_is_the_sign_of_the_summed_signs(world, n, seed):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(world, n, generator=g).round()  # zeros included: they vote +
    pm = torch.where(xs >= 0, 1.0, -1.0)
    want = torch.sign(pm.sum(0))
    c = SignSGD()
    assert torch.equal(majority_vote([c.compress(x) for x in xs], n), want)
    assert torch.equal(c.combine([c.compress(x) for x in xs], n), want)
