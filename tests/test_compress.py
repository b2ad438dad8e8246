"""Every registered compressor against the interface contract, plus what each family promises:
exact top-k, the sampled selector's recall, unbiased quantizers, exact bit packing, PowerSGD's
rank-r reconstruction, and error feedback that never loses gradient mass."""
import dataclasses
import math
import warnings

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
    PowerSGD,
    PowerSGDCompressor,
    RandomK,
    SignSGD,
    TernGrad,
    TopK,
    blocks,
    feedback,
    from_matrix,
    get,
    majority_vote,
    matrix_shape,
    select,
    threshold_topk,
    to_matrix,
)
from gradwire.compress.base import generator
from gradwire.compress.bits import WIDTHS, decode_codes, pack_bits, packed_bytes, unpack_bits
from gradwire.compress.feedback import Status, fallback, status
from gradwire.compress.lowrank import layout
from gradwire.compress.quantize import (
    INT8_BLOCK,
    INT8_EXPONENT_LIMIT,
    INT8_HEADROOM,
    INT8_MOVES,
    int8_adopt,
    int8_budget,
    int8_exponent,
    int8_inverse,
    int8_quantize,
    int8_steps,
    int8_vote,
)
from gradwire.dtypes import index_dtype
from gradwire.errors import GradwireError

NAMES = list(COMPRESSORS)
SIZES = [0, 1, 2, 7, 1000]
# Every (compressor, dtype) pair is meaningful: half-precision buckets are compressed from their
# own dtype (norms, scales and PowerSGD's P, Q in fp32), so none is skipped.
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def data(n: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def magnitudes_ok(x: torch.Tensor, picked: torch.Tensor) -> bool:
    """``picked`` holds elements of largest |x|: none left out is larger than one taken."""
    a = x.abs().double()
    mask = torch.zeros(x.numel(), dtype=torch.bool)
    mask[picked.long()] = True
    if mask.all() or not mask.any():
        return True
    return bool(a[mask].min() >= a[~mask].max())


# --- the contract, for every compressor ------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_round_trip_shape_dtype_and_wire_bytes(name, dtype):
    c = get(name)
    for n in SIZES:
        x = data(n, dtype)
        payload = c.compress(x)
        y = c.decompress(payload, n)
        assert y.shape == (n,) and y.dtype == dtype
        assert not y.isnan().any()
        assert payload.nbytes == c.wire_bytes(n, dtype) == sum(t.nbytes for t in
                                                                payload.tensors())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_payload_never_aliases_input(name, dtype):
    """In every dtype: a cast to the input's own dtype (fp16 of fp16) is where a payload could
    be the input itself."""
    c = get(name)
    x = data(1000).to(dtype)
    payload = c.compress(x)
    before = c.decompress(payload, 1000).clone()
    x.fill_(float("nan"))
    assert torch.equal(c.decompress(payload, 1000), before)


@pytest.mark.parametrize("name", NAMES)
def test_strided_input_is_compressed_like_a_contiguous_one(name):
    x = data(2000)[::2]
    a, b = get(name).compress(x), get(name).compress(x.contiguous())
    assert all(torch.equal(s, t) for s, t in zip(a.tensors(), b.tensors(), strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_round_trip(name):
    c = get(name)
    for n in SIZES:
        x = data(n).cuda()
        payload = c.compress(x)
        assert all(t.is_cuda for t in payload.tensors())
        y = c.decompress(payload, n)
        assert y.is_cuda and y.shape == (n,) and payload.nbytes == c.wire_bytes(n, x.dtype)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_for_a_seed_and_state_dict_resumes(name):
    a, b = get(name), get(name)
    xs = [data(1000, seed=s) for s in range(3)]
    for x in xs:
        pa, pb = a.compress(x), b.compress(x)
        assert all(torch.equal(s, t) for s, t in zip(pa.tensors(), pb.tensors(), strict=True))
    resumed = get(name)
    resumed.load_state_dict(a.state_dict())
    x = data(1000, seed=9)
    pa, pr = a.compress(x), resumed.compress(x)
    assert all(torch.equal(s, t) for s, t in zip(pa.tensors(), pr.tensors(), strict=True))


@pytest.mark.parametrize("name", ["randomk", "qsgd", "terngrad"])
def test_seed_matters(name):
    x = data(1000)
    pa, pb = get(name, seed=1).compress(x), get(name, seed=2).compress(x)
    assert any(not torch.equal(s, t) for s, t in zip(pa.tensors(), pb.tensors(), strict=True))


def test_bad_input_and_foreign_payload_are_user_errors():
    with pytest.raises(GradwireError, match=r"topk: expected a 1-D float tensor"):
        TopK().compress(torch.zeros(2, 3))
    with pytest.raises(GradwireError, match=r"qsgd: expected a 1-D float tensor"):
        QSGD().compress(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(GradwireError, match=r"signsgd: expected a SignPayload to decompress, "
                                            r"got SparsePayload"):
        SignSGD().decompress(TopK().compress(data(10)), 10)


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decompress_into_writes_what_decompress_returns(name, dtype):
    c = get(name)
    payload = c.compress(data(100).to(dtype))
    out = torch.full((100,), 7.0, dtype=dtype)
    got = c.decompress_into(payload, out)
    assert got is out and torch.equal(out, c.decompress(payload, 100))
    # a wrong length fails as decompress does (where the payload can show it, see below)
    try:
        want = c.decompress(payload, 37)
    except GradwireError:
        with pytest.raises(GradwireError, match=f"{name}: "):
            c.decompress_into(payload, torch.zeros(37, dtype=dtype))
    else:
        assert torch.equal(c.decompress_into(payload, torch.zeros(37, dtype=dtype)), want)


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_decompress_refuses_a_numel_the_payload_was_not_made_from(name):
    c = get(name)
    payload = c.compress(data(100))
    assert c.decompress(payload, 100).numel() == 100
    for wrong in (0, -1, 100.0, "100", None):
        with pytest.raises(GradwireError, match=f"{name}: "):
            c.decompress(payload, wrong)
    # a numel whose wire bytes equal the payload's cannot be told apart (top-k's k is the same
    # for 100 and 200 elements at density 0.001); it may pass, but as a tensor of that length
    for numel in (99, 101, 200, 1000):
        try:
            assert c.decompress(payload, numel).numel() == numel
        except GradwireError as e:
            assert str(e).startswith(f"{name}: ")


# --- sparsifiers -----------------------------------------------------------------------------

@pytest.mark.parametrize("selector", ["exact", "threshold"])
def test_topk_selects_exactly_the_k_largest(selector):
    for n, density in [(1000, 0.01), (1000, 0.5), (20000, 0.001), (20000, 0.05), (7, 1.0)]:
        x = data(n)
        c = TopK(density=density, selector=selector)
        p = c.compress(x)
        assert p.indices.dtype == torch.int32 and p.values.dtype == x.dtype
        assert p.indices.numel() == c.count(n) and p.indices.unique().numel() == c.count(n)
        assert magnitudes_ok(x, p.indices)
        assert torch.equal(p.values, x[p.indices.long()])


@pytest.mark.parametrize("selector", ["exact", "threshold"])
def test_topk_ties_any_k_of_the_tied(selector):
    x = torch.zeros(30000)
    x[:100] = 2.0
    x[100:5000:2] = -1.0  # 2450 tied at |x| = 1 around the cut
    p = TopK(k=1000, selector=selector).compress(x)
    assert p.indices.numel() == 1000 and p.indices.unique().numel() == 1000
    assert magnitudes_ok(x, p.indices)


def test_topk_count_from_density_or_k():
    assert TopK(density=0.001).count(1000) == 1
    assert TopK(density=0.01).count(700) == 7  # not 8: 0.01 * 700 = 7.000000000000001
    assert TopK(density=0.001).count(1) == 1 and TopK().count(0) == 0
    assert TopK(k=50).count(10) == 10
    assert index_dtype(2**31 - 1) == torch.int32 and index_dtype(2**31) == torch.int64


DISTRIBUTIONS = {
    "gaussian": lambda g, n: torch.randn(n, generator=g),
    "laplace": lambda g, n: torch.empty(n).exponential_(generator=g)
    * torch.sign(torch.rand(n, generator=g) - 0.5),
    "student-t2": lambda g, n: torch.randn(n, generator=g)
    / torch.sqrt(torch.empty(n).exponential_(generator=g)),  # t with 2 degrees of freedom
}


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_threshold_selector_exact_count_and_recall(dist, n):
    x = DISTRIBUTIONS[dist](torch.Generator().manual_seed(n), n)
    for density in (0.001, 0.01, 0.1):
        k = TopK(density=density).count(n)
        picked = threshold_topk(x, k, generator(0, 0))
        assert picked.numel() == k and picked.unique().numel() == k
        exact = torch.topk(x.abs(), k).indices
        recall = torch.isin(picked, exact).float().mean().item()
        assert recall >= 0.99, (dist, n, density, recall)


def test_threshold_selector_correction_passes(monkeypatch):
    x = data(200_000)
    exact = set(torch.topk(x.abs(), 200).indices.tolist())
    passes: list[object] = []
    candidates, fallback = select._candidates, select.exact_topk
    monkeypatch.setattr(select, "_candidates", lambda *a: passes.append("pass") or candidates(*a))
    monkeypatch.setattr(select, "exact_topk", lambda *a: passes.append("exact") or fallback(*a))
    # The threshold set too high on purpose: a second pass suffices, or the fallback is needed.
    for margin, path in [(4.0, ["pass"]), (-1.0, ["pass", "pass"]),
                         (-1000.0, ["pass", "pass", "exact"])]:
        monkeypatch.setattr(select, "MARGIN_SD", margin)
        passes.clear()
        picked = threshold_topk(x, 200, generator(0, 0))
        assert set(picked.tolist()) == exact and passes == path
    sparse_x = torch.zeros(200_000)
    sparse_x[::1000] = 1.0  # 200 nonzeros, k = 500: the threshold is 0
    picked = threshold_topk(sparse_x, 500, generator(0, 0))
    assert picked.unique().numel() == 500 and magnitudes_ok(sparse_x, picked)


@given(values=st.lists(st.integers(-3, 3) | st.integers(-1000, 1000), min_size=20,
                       max_size=300),
       share=st.floats(0, 1), min_sample=st.integers(1, 8), seed=st.integers(0, 2**16))
@settings(max_examples=150, deadline=None, derandomize=True)
def test_threshold_selector_property(values, share, min_sample, seed):
    # Samples of a few elements against 20 to 300 reach every branch of both selectors: the
    # sampled threshold accepted at once, a zero threshold, too few candidates (another pass,
    # then the exact fallback) and, for DGC, too many.
    x = torch.tensor(values, dtype=torch.float32)
    k = min(int(share * (x.numel() + 1)), x.numel())  # 0 to n
    picked = threshold_topk(x, k, generator(seed, 0), min_sample=min_sample)
    dgc = select.dgc_select(x, k, min(x.numel(), k + k // 4), generator(seed, 0), 0.01, 3,
                            min_sample=min_sample)
    assert picked.numel() == k and picked.unique().numel() == k and magnitudes_ok(x, picked)
    # one tie rule: the sampled threshold picks exactly what the exact selector picks
    exact = sorted(select.exact_topk(x, k).tolist())
    assert sorted(picked.tolist()) == exact
    # torch.topk's answer only where no tie is left to break
    fast = select._untied_topk(x.abs(), k)
    assert fast is None or sorted(fast.tolist()) == exact
    if 0 < k < x.numel() and (x.abs() == x.abs().sort(descending=True).values[k - 1]).sum() == 1:
        assert fast is not None
    assert dgc.numel() <= min(x.numel(), k + k // 4) and dgc.unique().numel() == dgc.numel()
    assert magnitudes_ok(x, dgc)


def test_dgc_count_varies_within_capacity():
    x = data(1_000_000)
    c = DGC(density=0.001)
    counts = []
    for _ in range(5):
        p = c.compress(x)
        n = int(p.count[0])
        counts.append(n)
        assert magnitudes_ok(x, p.indices[:n]) and p.indices.numel() == c.capacity(x.numel())
        assert torch.equal(c.decompress(p, x.numel())[p.indices[:n].long()], x[p.indices[:n]
                                                                                .long()])
    assert all(1000 / 1.25 <= n <= 1250 for n in counts), counts
    assert len(set(counts)) > 1, counts  # a fresh sample each call: the count varies


def test_randomk_ranks_agree_and_payloads_sum():
    ranks = [RandomK(k=100, seed=7) for _ in range(3)]
    xs = [data(5000, seed=r) for r in range(3)]
    payloads = [c.compress(x) for c, x in zip(ranks, xs, strict=True)]
    idx = ranks[0].indices(5000, payloads[0].step)
    assert idx.unique().numel() == 100
    assert all(torch.equal(idx, c.indices(5000, p.step)) for c, p in zip(ranks, payloads,
                                                                          strict=True))
    summed = dataclasses.replace(payloads[0], values=sum(p.values for p in payloads))
    expected = sum(c.decompress(p, 5000) for c, p in zip(ranks, payloads, strict=True))
    assert torch.allclose(ranks[0].decompress(summed, 5000), expected)
    assert not torch.equal(ranks[0].indices(5000, 0), ranks[0].indices(5000, 1))
    assert RandomK(k=4000).indices(5000, 0).unique().numel() == 4000  # the randperm branch


# --- quantizers and casts --------------------------------------------------------------------

def test_bit_packing_round_trips():
    g = torch.Generator().manual_seed(0)
    for w in WIDTHS:
        for n in list(range(18)) + [1001]:
            codes = torch.randint(0, 1 << w, (n,), generator=g, dtype=torch.uint8)
            packed = pack_bits(codes, w)
            assert packed.dtype == torch.uint8 and packed.numel() == packed_bytes(n, w)
            assert torch.equal(unpack_bits(packed, w, n), codes)
    assert pack_bits(torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 1], dtype=torch.uint8), 1).tolist() \
        == [0b10000001, 0b1]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(WIDTHS), st.integers(0, 70), st.integers(0, 2**16))
def test_decoding_through_the_byte_table_is_a_plain_lookup(w, n, seed):
    """decode_codes = values[code] for every code unpacked, element for element (the
    quantizers' decompress goes through it; -0.0 and NaN kept where values hold them)."""
    g = torch.Generator().manual_seed(seed)
    packed = pack_bits(torch.randint(0, 1 << w, (n,), generator=g, dtype=torch.uint8), w)
    values = torch.randn(1 << w, generator=g)
    values[0] = -0.0
    if w > 1:
        values[1] = float("nan")
    want = values[unpack_bits(packed, w, n).long()]
    got = decode_codes(packed, w, n, values)
    assert got.shape == (n,) and got.dtype == values.dtype
    assert torch.equal(got.signbit(), want.signbit())
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    with pytest.raises(ValueError, match="need"):
        decode_codes(packed, w, n, values[:-1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_signs_exact_and_scaled(dtype):
    x = data(1001, dtype)
    x[:3] = torch.tensor([0.0, -0.0, -2.0])
    signs = SignSGD().decompress(SignSGD().compress(x), 1001)
    assert torch.equal(signs, torch.where(x >= 0, 1.0, -1.0).to(dtype))
    ef = EFSignSGD()
    p = ef.compress(x)
    assert torch.allclose(p.scale, x.double().abs().mean().to(p.scale.dtype), rtol=1e-5)
    assert torch.equal(ef.decompress(p, 1001), (signs.to(p.scale.dtype) * p.scale).to(dtype))


def test_majority_vote():
    votes = torch.tensor([[1, 1, -1, 1], [1, -1, -1, -1], [-1, 1, -1, -1]], dtype=torch.float32)
    expected = torch.tensor([1.0, 1.0, -1.0, -1.0])
    assert torch.equal(majority_vote(votes), expected)
    payloads = [SignSGD().compress(v) for v in votes]
    assert torch.equal(majority_vote(payloads, 4), expected)
    assert torch.equal(majority_vote(votes[:2]), torch.tensor([1.0, 0.0, -1.0, 0.0]))  # ties
    with pytest.raises(GradwireError, match="numel"):
        majority_vote(payloads)


@pytest.mark.parametrize("ranks", [1, 2, 3, 7, 8, 17, 255, 256, 300])
@pytest.mark.parametrize("n", [1, 9, 1001])
def test_majority_vote_of_payloads_counts_every_rank(ranks, n):
    """The packed vote equals the sign of the summed ±1 of every rank, ties 0, past the 255
    ranks a byte can count too."""
    g = torch.Generator().manual_seed(ranks * 1000 + n)
    x = torch.randn(ranks, n, generator=g)
    x[:, : n // 3] = x[:1, : n // 3]  # unanimous elements, where a byte count could wrap
    signs = torch.where(x >= 0, 1.0, -1.0)
    expected = torch.sign(signs.sum(0))
    got = majority_vote([SignSGD().compress(v) for v in x], n)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


@pytest.mark.parametrize("name,params,tol", [("qsgd", {"s": 4}, 0.15),
                                             ("qsgd", {"s": 1}, 0.3),
                                             ("terngrad", {}, 0.15)])
def test_stochastic_quantizers_are_unbiased(name, params, tol):
    x = data(48)
    x[:4] = torch.tensor([0.0, 0.0, 3.0, -3.0])
    c = get(name, **params)
    runs = 3000
    mean = sum(c.decompress(c.compress(x), 48).double() for _ in range(runs)) / runs
    assert (mean - x.double()).abs().max() < tol
    assert mean[:2].abs().max() == 0


def test_qsgd_levels_and_wide_levels():
    x = data(1000)
    p = QSGD(s=3).compress(x)
    assert p.levels.numel() == packed_bytes(1000, 2)
    assert unpack_bits(p.levels, 2, 1000).max() <= 3
    wide = QSGD(s=1000)
    y = wide.decompress(wide.compress(x), 1000)
    assert wide.compress(x).levels.dtype == torch.int16
    assert (y - x).abs().max() <= x.norm() / 1000 + 1e-6
    assert torch.equal(torch.sign(y[y != 0]), torch.sign(x[y != 0]))


def test_terngrad_values_are_ternary():
    x = data(1000)
    y = TernGrad().decompress(TernGrad().compress(x), 1000)
    assert set(y.unique().tolist()) <= {-x.abs().max().item(), 0.0, x.abs().max().item()}
    assert torch.equal(TernGrad().decompress(TernGrad().compress(torch.zeros(9)), 9),
                       torch.zeros(9))


@pytest.mark.parametrize("name,wire", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_casts_exact_on_representable_values_and_summable(name, wire):
    c = get(name)
    assert c.associative
    for dtype in DTYPES:
        x = data(1000, wire).to(dtype)  # every value representable in the wire dtype
        p = c.compress(x)
        assert p.values.dtype == wire and torch.equal(c.decompress(p, 1000), x)
    a, b = torch.arange(-64.0, 64.0), torch.arange(64.0, -64.0, -1)
    summed = dataclasses.replace(c.compress(a), values=c.compress(a).values
                                 + c.compress(b).values)
    assert torch.equal(c.decompress(summed, 128), a + b)


# --- PowerSGD --------------------------------------------------------------------------------

def test_matrix_shape():
    assert matrix_shape(0) == (0, 0) and matrix_shape(1) == (1, 1)
    for n in range(1, 400):
        rows, cols = matrix_shape(n)
        assert rows <= cols and n <= rows * cols < n + cols
    x = data(7)
    m = to_matrix(x)
    assert m.shape == (3, 3) and m.reshape(-1)[7:].eq(0).all()
    assert torch.equal(from_matrix(m, 7, x.dtype), x)


def low_rank(rows: int, cols: int, r: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, r, generator=g) @ torch.randn(cols, r, generator=g).T).reshape(-1)


def test_powersgd_reconstructs_a_rank_r_matrix():
    c = PowerSGDCompressor(rank=3)
    for seed in (0, 1, 1):  # a new matrix, another (warm start from the first), the same again
        x = low_rank(40, 40, 3, seed)
        y = c.decompress(c.compress(x), x.numel())
        assert torch.allclose(y, x, atol=1e-4 * x.abs().max())


def test_powersgd_steps_over_three_ranks_reconstruct_the_sum():
    ranks = [PowerSGD(rank=2, seed=5) for _ in range(3)]
    base = low_rank(30, 30, 2, 0).view(30, 30)
    ms = [base * (r + 1) for r in range(3)]  # the sum 6·base has rank 2
    for _ in range(2):
        p = sum(ps.p(m, key="b") for ps, m in zip(ranks, ms, strict=True))
        ps_copies = [p.clone() for _ in ranks]
        q = sum(ps.q(m, pc, key="b") for ps, m, pc in zip(ranks, ms, ps_copies, strict=True))
        outs = [ps.decompress(pc, q, key="b") for ps, pc in zip(ranks, ps_copies, strict=True)]
        for out in outs:
            assert torch.allclose(out, 6 * base, atol=1e-3 * base.abs().max() * 6)
    assert all(torch.equal(ps.memory["b"], q) for ps in ranks)


def test_powersgd_zero_gradient_gives_zero_without_nan_then_recovers():
    c = PowerSGDCompressor(rank=4)
    for n in (1, 7, 1000):
        y = c.decompress(c.compress(torch.zeros(n)), n)
        assert torch.equal(y, torch.zeros(n))
    x = low_rank(32, 32, 2, 3)[:1000]  # 1000 elements view as 32×32: rank ≤ 4 after padding
    c.compress(torch.zeros(1000))
    y = c.decompress(c.compress(x), 1000)
    assert not y.isnan().any() and torch.allclose(y, x, atol=1e-4 * x.abs().max())


def test_powersgd_warm_start_draws_nothing_on_the_host():
    """After the first step a warm-started matrix needs no random draw on the host (and so no
    copy to the device): its zero columns take a spare drawn once."""
    ps = PowerSGD(rank=2)
    m = low_rank(32, 32, 2, 3).reshape(32, 32)
    p = ps.p(m, key=0)
    ps.q(m, p, key=0)

    def refuse(*_a, **_k):
        raise AssertionError("drew on the host")

    ps._random = refuse
    for _ in range(3):
        p = ps.p(m, key=0)
        ps.q(m, p, key=0)
    ps.memory[0].zero_()  # a zero warm start: every column from the spare, drawn once
    assert ps.p(m, key=0).abs().sum() > 0


def test_powersgd_rank_is_capped_by_the_matrix():
    c = PowerSGDCompressor(rank=8)
    p = c.compress(data(7))
    assert p.p.shape == (3, 3) and p.q.shape == (3, 3)
    assert torch.allclose(c.decompress(p, 7), data(7), atol=1e-5)


def test_layout_is_pytorchs_one_matrix_per_weight():
    # conv (8, 4, 3, 3) → 8×36, linear (10, 8) → 10×8 twice (one batch), biases and a
    # matrix too small to gain (3×2 at r = 2: 6 < 2·5·2) as they are
    shapes = [(8,), (8, 4, 3, 3), (10, 8), (10,), (10, 8), (3, 2), ()]
    numel = sum(math.prod(s) for s in shapes)
    lay = layout(numel, shapes, rank=2)
    assert [(b.rows, b.cols, b.r, b.spans) for b in lay.batches] == [
        (8, 36, 2, ((8, 288),)), (10, 8, 2, ((296, 80), (386, 80)))]
    assert lay.plain == ((0, 8), (376, 10), (466, 6), (472, 1))
    assert lay.plain_count + sum(n for b in lay.batches for _, n in b.spans) == numel
    assert lay.p_count == (8 + 2 * 10) * 2 and lay.q_count == (36 + 2 * 8) * 2
    # a matrix no wider than the rank gains nothing; a flat bucket is one padded matrix
    assert layout(4000, [(4, 1000)], rank=4).batches == ()
    flat = layout(1000, None, rank=1)
    assert [(b.rows, b.cols, b.spans) for b in flat.batches] == [(32, 32, ((0, 1000),))]
    assert layout(6, None, rank=4).batches == ()  # nothing worth compressing
    with pytest.raises(GradwireError, match="shapes hold 6 elements, the bucket 7"):
        layout(7, [(2, 3)], rank=1)


@given(shapes=st.lists(st.lists(st.integers(1, 9), min_size=0, max_size=3), max_size=6),
       rank=st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_layout_gather_and_scatter_cover_every_element_once(shapes, rank):
    numel = sum(math.prod(s) for s in shapes)
    lay = layout(numel, shapes, rank)
    x = torch.arange(numel, dtype=torch.float32) + 1
    out = torch.zeros(numel)
    lay.scatter_plain(lay.gather_plain(x, torch.float32), out)
    for b in lay.batches:
        m = b.gather(x, torch.float64)
        assert m.shape == (len(b.spans), b.rows, b.cols) and m.dtype == torch.float64
        assert b.rows * b.cols >= 2 * (b.rows + b.cols) * b.r  # worth compressing
        b.scatter(m, out)
    assert torch.equal(out, x)
    # once: scatter copies, so an element in two spans would still come back right above
    spans = [*lay.plain, *(sp for b in lay.batches for sp in b.spans)]
    covered = torch.zeros(numel, dtype=torch.int64)
    for at, n in spans:
        covered[at : at + n] += 1
    assert bool((covered == 1).all())


def test_batched_steps_equal_one_matrix_at_a_time():
    ms = torch.stack([low_rank(12, 20, 2, s).view(12, 20) for s in range(3)])
    batched = PowerSGD(rank=2, seed=1)
    p = batched.p(ms, "b")
    q = batched.q(ms, p, "b")
    out = batched.decompress(p, q, "b")
    assert p.shape == (3, 12, 2) and q.shape == (3, 20, 2)
    for i in range(3):
        g = generator(1, 0)
        first_q = torch.randn(3, 20, 2, generator=g)[i]  # the batch's draw, this matrix's part
        pi = ms[i] @ first_q
        pi.copy_(torch.linalg.qr(pi).Q)
        # q() leaves P's columns of norm 2^t, 2^t >= sqrt(rows): 4 for 12 rows
        assert torch.allclose(p[i], 4 * pi, atol=1e-5)
        assert torch.allclose(out[i], pi @ (pi.T @ ms[i]), atol=1e-4)
        assert torch.allclose(out[i], ms[i], atol=1e-4 * ms.abs().max())  # rank 2 exactly
    assert batched.memory["b"].shape == (3, 20, 2)


# --- error feedback --------------------------------------------------------------------------

# (TopK's threshold selector is the exact one below 2·MIN_SAMPLE elements: its sampled passes
# are held to the exact set in test_threshold_selector_property)
EF_COMPRESSORS = {
    "topk-exact": lambda k: TopK(k=k, selector="exact"),
    "randomk": lambda k: RandomK(k=k, seed=3),
    "dgc": lambda k: DGC(k=k),
}
HALF = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("name", EF_COMPRESSORS)
@given(n=st.integers(0, 200), k=st.integers(1, 250), dtype=st.sampled_from(HALF),
       steps=st.lists(st.lists(st.integers(-4, 4), min_size=200, max_size=200), min_size=1,
                      max_size=3))
@settings(max_examples=40, deadline=None)
def test_error_feedback_conserves_mass_exactly(name, n, k, dtype, steps):
    ef = ErrorFeedback(EF_COMPRESSORS[name](k))
    residual = torch.zeros(n, dtype=dtype)
    for values in steps:
        g = torch.tensor(values[:n], dtype=dtype)
        g_before = g.clone()
        payload = ef.compress("bucket", g)
        applied = ef.compressor.decompress(payload, n)
        after = ef.residuals["bucket"]
        assert after.dtype == dtype and torch.equal(g, g_before)
        assert torch.equal(after + applied, residual + g)
        residual = after.clone()


def test_error_feedback_state_and_bucket_changes():
    ef = ErrorFeedback(TopK(k=2, selector="exact"))
    ef.compress(0, torch.tensor([5.0, 1.0, -3.0, 2.0]))
    assert torch.equal(ef.residuals[0], torch.tensor([0.0, 1.0, 0.0, 2.0]))
    other = ErrorFeedback(TopK(k=2, selector="exact"))
    other.load_state_dict(ef.state_dict())
    p = other.compress(0, torch.tensor([0.0, 1.5, 0.0, 0.0]))
    assert sorted(p.indices.tolist()) == [1, 3]
    with pytest.raises(GradwireError, match=r"key 0: residual is \(4,\) torch.float32 but the "
                                            r"gradient is \(5,\).*call reset\(\)"):
        other.compress(0, torch.zeros(5))
    other.reset(0)
    other.compress(0, torch.zeros(5))
    kept = {k: v.clone() for k, v in other.residuals.items()}
    for bad in ({"residuals": {"b": torch.ones(2)}}, {"residuals": [1]}, None,
                {"residuals": {"b": "x"}, "compressor": {"step": 0}}):
        with pytest.raises(GradwireError, match="error-feedback state_dict is malformed"):
            other.load_state_dict(bad)
        assert other.residuals.keys() == kept.keys()  # a refused state changes nothing
        assert all(torch.equal(other.residuals[k], kept[k]) for k in kept)


def test_error_feedback_with_powersgd_steps():
    ef = ErrorFeedback(PowerSGDCompressor(rank=1))
    x = low_rank(10, 10, 2, 0)
    corrected = ef.correct("b", x)
    approx = ef.compressor.decompress(ef.compressor.compress(corrected), 100)
    ef.update("b", corrected, approx)
    assert torch.allclose(ef.residuals["b"] + approx, x, atol=1e-5)



# --- the NaN/Inf policy (status and fallback) ------------------------------------------------

SPECIAL = [0.0, 1.0, -1.0, 3e38, -3e38, 1.7e38, 65504.0, -65504.0, 40000.0, -40000.0,
           3.3e38, 1e308, -1e308, float("inf"), float("-inf"), float("nan")]


def status_by_definition(x: torch.Tensor, e: torch.Tensor | None) -> Status:
    if not x.isfinite().all() or (e is not None and not e.isfinite().all()):
        return Status.NONFINITE
    if e is not None and not (x + e).isfinite().all():
        return Status.OVERFLOW
    return Status.OK


@given(dtype=st.sampled_from(HALF), with_residual=st.booleans(),
       pairs=st.lists(st.tuples(st.sampled_from(SPECIAL) | st.floats(-1e5, 1e5),
                                st.sampled_from(SPECIAL) | st.floats(-1e5, 1e5)),
                      max_size=40))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_status_is_the_definition_exactly(dtype, with_residual, pairs):
    """One aminmax per tensor decides, except near the dtype's limit: never a false alarm
    (3e38 + 3e38 in fp32 was counted non-finite by a sum) nor a missed one."""
    x = torch.tensor([a for a, _ in pairs], dtype=torch.float64).to(dtype)
    e = torch.tensor([b for _, b in pairs], dtype=torch.float64).to(dtype)
    e = e if with_residual else None
    assert status(x, e) is status_by_definition(x, e)


def test_finite_values_whose_sum_overflows_are_ok():
    assert status(torch.tensor([3e38, 3e38])) is Status.OK  # their fp32 sum is inf
    assert status(torch.tensor([3e38]), torch.tensor([3e38])) is Status.OVERFLOW
    assert status(torch.tensor([3e38, -1.0]), torch.tensor([-3e38, 3e38])) is Status.OK
    assert status(torch.tensor([float("nan")]), torch.tensor([3e38])) is Status.NONFINITE
    assert status(torch.empty(0), torch.empty(0)) is Status.OK


# fp16 multiples of 32 up to 65504: their sums are exact until they overflow (to inf).
FP16_NEAR_LIMIT = st.integers(-2047, 2047).map(lambda m: 32.0 * m)


@given(pairs=st.lists(st.tuples(FP16_NEAR_LIMIT, FP16_NEAR_LIMIT), min_size=1, max_size=30),
       worst=st.sampled_from([None, *Status]))
@example(pairs=[(40000.0, 40000.0), (32.0, -64.0)], worst=Status.NONFINITE)
@example(pairs=[(40000.0, 40000.0), (32.0, -64.0)], worst=None)
@settings(max_examples=200, deadline=None, derandomize=True)
def test_fallback_conserves_mass_and_leaves_nothing_non_finite(pairs, worst):
    """For finite fp16 x and residual near the limit, whatever the ranks agreed (their worst
    status, or None with the header exchange off): residual_after + what is summed dense
    = residual_before + x exactly, or the call compresses as usual; no residual is left
    non-finite by an overflow."""
    x = torch.tensor([a for a, _ in pairs], dtype=torch.float16)
    before = torch.tensor([b for _, b in pairs], dtype=torch.float16)
    mine = status(x, before)
    if worst is not None and worst < mine:
        worst = mine  # the worst over ranks is never better than this rank's own
    residual = before.clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dense = fallback(worst, x, residual, "test")
    assert residual.isfinite().all()
    if dense is None:  # compressed as usual; dropped first only with the exchange off
        dropped = worst is None and mine is Status.OVERFLOW
        assert torch.equal(residual, torch.zeros_like(before) if dropped else before)
        assert len(caught) == dropped
        return
    assert dense.data_ptr() != x.data_ptr() and len(caught) == 1
    assert issubclass(caught[0].category, RuntimeWarning)
    if worst == Status.OVERFLOW:  # x alone, the residual kept
        assert "overflows float16" in str(caught[0].message)
        assert torch.equal(dense, x) and torch.equal(residual, before)
    else:  # NaN elsewhere: x + residual, the residual cleared; the step will be skipped
        assert "NaN or Inf" in str(caught[0].message)
        assert torch.equal(dense, x + before) and not residual.any()
    if mine is Status.OK or worst == Status.OVERFLOW:
        assert torch.equal(residual.double() + dense.double(), before.double() + x.double())


def test_fallback_applies_and_clears_the_residual_when_x_is_not_finite():
    x, residual = torch.tensor([1.0, float("nan")]), torch.tensor([2.0, 3.0])
    with pytest.warns(RuntimeWarning, match="NaN or Inf on some rank"):
        dense = fallback(Status.NONFINITE, x, residual, "test")
    assert dense[0] == 3.0 and dense[1].isnan() and torch.equal(residual, torch.zeros(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fallback(None, x, residual, "test") is None  # exchange off: as it is

# --- parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,params,message", [
    ("topk", {"density": 0}, r"topk: density must be in \(0, 1\], got 0"),
    ("topk", {"density": 1.5}, r"topk: density must be in \(0, 1\], got 1.5"),
    ("topk", {"k": 0}, r"topk: k must be an integer >= 1, got 0"),
    ("topk", {"density": 0.1, "k": 3}, r"topk: give density or k, not both"),
    ("topk", {"selector": "fast"}, r"topk: selector must be 'threshold' or 'exact'"),
    ("randomk", {"k": 2.5}, r"randomk: k must be an integer >= 1, got 2.5"),
    ("dgc", {"slack": 0.5}, r"dgc: slack must be a finite number >= 1, got 0.5"),
    ("qsgd", {"s": 0}, r"qsgd: s must be an integer >= 1, got 0"),
    ("powersgd", {"rank": 0}, r"powersgd: rank must be an integer >= 1, got 0"),
    ("topk", {"densty": 0.1}, r"topk: unknown parameter 'densty' \(did you mean 'density'\?\): "
                              r"expected density, k, selector, sample, seed"),
    ("signsgd", {"seed": 1}, r"signsgd: unknown parameter 'seed': expected no parameters"),
    ("topx", {}, r"unknown compressor 'topx' \(did you mean 'topk'\?\): expected one of topk"),
])
def test_bad_parameters_are_one_line_errors(name, params, message):
    with pytest.raises(GradwireError, match=message) as e:
        get(name, **params)
    assert "\n" not in str(e.value)


def test_untied_topk_leaves_nan_and_ties_to_the_full_rule():
    nan = float("nan")
    mag = torch.tensor([1.0, nan, 5.0, 2.0])
    assert sorted(select._untied_topk(mag, 2).tolist()) == [1, 2]  # a NaN above the boundary
    assert select._untied_topk(torch.tensor([nan, 1.0, nan, 0.0]), 1) is None  # NaN at it
    assert select._untied_topk(torch.tensor([3.0, 1.0, 3.0, 3.0]), 2) is None  # a tie left
    assert sorted(select._untied_topk(torch.tensor([3.0, 1.0, 4.0, 2.0]), 2).tolist()) == [0, 2]


# --- int8: levels of a shared step size that sum in int8 -------------------------------------

@settings(max_examples=60, deadline=None)
@given(world=st.integers(1, 127), n=st.integers(1, 2500), seed=st.integers(0, 2**16),
       spread=st.floats(0.0, 30.0), shift=st.integers(-30, 30))
def test_int8_levels_of_every_rank_sum_without_overflow_and_keep_what_they_clip(
        world, n, seed, spread, shift):
    """Each rank sends round((e + x)/step) clipped to ±⌊127/P⌋, the step 2^(E/2) per block
    that the ranks share, E anywhere near or far from what the magnitudes need (``shift``
    half octaves off): the sum of every rank's int8 values stays within int8 for any P up to
    127, and what a rank sends plus what it keeps is exactly what it meant to send, within
    rounding where nothing is clipped."""
    g = torch.Generator().manual_seed(seed)
    world = min(world, 1 + 200_000 // n)  # at most 200 k elements in all
    xs = [torch.randn(n, generator=g, dtype=torch.float64).to(torch.float32)
          * math.exp(spread * float(torch.rand(1, generator=g))) for _ in range(world)]
    budget = int8_budget(world)
    bound = torch.stack([blocks.magnitude(x, INT8_BLOCK)[0] for x in xs]).amax(0)
    exponent = int8_exponent(bound, budget) + shift
    step, inv = int8_steps(exponent, torch.float32)
    assert torch.allclose(step * inv, torch.ones_like(step))
    total = torch.zeros(n, dtype=torch.int64)
    for x in xs:
        t, q = int8_quantize(x, inv, budget)
        assert q.dtype == torch.int8 and torch.equal(q.to(t.dtype), t)
        assert int(q.abs().max()) <= budget
        kept = x - blocks.mul(t, step, INT8_BLOCK, out=torch.empty_like(x))
        meant = blocks.mul(x, inv, INT8_BLOCK, out=torch.empty_like(x))
        unclipped = meant.abs() <= budget
        off = blocks.mul(kept, inv, INT8_BLOCK, out=torch.empty_like(x))[unclipped]
        assert not off.numel() or float(off.abs().max()) <= 0.5 + 1e-5
        # clipped: the level is the budget, with the value's sign, and the rest is kept
        assert torch.equal(t[~unclipped], meant[~unclipped].sign() * budget)
        total += q.to(torch.int64)
    assert int(total.abs().max()) <= 127


@settings(max_examples=80, deadline=None)
@given(world=st.integers(1, 16), blocks_=st.integers(1, 6), seed=st.integers(0, 2**16),
       start=st.integers(-40, 40))
def test_int8_votes_move_each_block_to_the_smallest_step_no_rank_clips(world, blocks_, seed,
                                                                        start):
    """Every rank votes for the smallest move of E (INT8_MOVES) after which its block would
    not be clipped were it twice as large (INT8_HEADROOM); the sum of the votes moves E by the
    largest: the smallest move that serves every rank, or the largest move there is when
    none does."""
    g = torch.Generator().manual_seed(seed)
    budget = int8_budget(world)
    bounds = torch.exp(torch.randn(world, blocks_, generator=g, dtype=torch.float64) * 3)
    exponent = torch.full((blocks_,), start, dtype=torch.int64)
    counts = sum(int8_vote(b, exponent, budget).to(torch.int64) for b in bounds)
    assert torch.equal(counts.sum(1), torch.full((blocks_,), world))
    new = int8_adopt(exponent, counts)
    step = int8_steps(new, torch.float64)[0]
    room = 2 ** (INT8_HEADROOM / 2)  # twice the bound
    for blk in range(blocks_):
        move = int(new[blk] - exponent[blk])
        assert move in INT8_MOVES
        serves = [m for m in INT8_MOVES if all(
            budget * 2 ** ((start + m) / 2) >= room * float(b[blk]) * (1 + 1e-12) for b in bounds)]
        assert move == (serves[0] if serves else INT8_MOVES[-1]), (blk, move, serves)
        if serves:
            assert budget * float(step[blk]) >= room * float(bounds[:, blk].max()) * (1 - 1e-12)


def test_int8_exponent_is_the_smallest_step_that_clips_nothing():
    bound = torch.tensor([0.0, 1e-30, 1.0, 63.0, 64.0, 3e38, float("nan")])
    e = int8_exponent(bound, 63)
    step = int8_steps(e, torch.float32)[0]
    for b, s, x in zip(bound.tolist()[1:6], step.tolist()[1:6], e.tolist()[1:6], strict=True):
        assert 63 * s >= b * (1 - 1e-6) and 63 * 2 ** ((x - 1) / 2) < b, (b, x)
    assert int(e[0]) == int(e[6]) == -INT8_EXPONENT_LIMIT  # nothing to send: the finest step
    assert torch.isfinite(step).all() and torch.isfinite(int8_steps(e, torch.float32)[1]).all()


def test_int8_refuses_128_ranks():
    assert int8_budget(1) == 127 and int8_budget(2) == 63 and int8_budget(127) == 1
    with pytest.raises(GradwireError, match="int8: 128 ranks leave no level to send"):
        int8_budget(128)


def test_int8_sends_nothing_for_a_zero_tiny_or_nonfinite_scale():
    x = torch.tensor([1.0, -2.0, 0.5])
    # 1e-38: levels/bound overflows fp32, and 0·inf would send NaN
    for bound in (0.0, float("inf"), float("nan"), 1e-38):
        inv, scale = int8_inverse(torch.tensor([bound]), 100)
        assert float(inv) == float(scale) == 0.0
        assert int8_quantize(x, inv, 100)[1].abs().sum() == 0


def test_int8_scales_each_block_by_its_own_largest_value_and_feeds_back_the_rest():
    n = 3 * INT8_BLOCK + 5
    x = data(n) * torch.logspace(0, 4, n)  # magnitudes growing 10^4 along the bucket
    c = get("int8")
    p = c.compress(x)
    assert p.values.dtype == torch.int8 and p.scale.numel() == 4
    assert p.nbytes == c.wire_bytes(n, torch.float32) == n + 4 * 4
    err = (c.decompress(p, n) - x).abs()
    for i, (lo, hi) in enumerate(((0, INT8_BLOCK), (INT8_BLOCK, 2 * INT8_BLOCK))):
        step = float(x[lo:hi].abs().max()) / 127
        assert float(err[lo:hi].max()) <= step / 2 * (1 + 1e-5), i
    ef = ErrorFeedback(c)
    sent = sum(c.decompress(ef.compress("b", x), n) for _ in range(3))
    assert torch.allclose(sent + ef.residuals["b"], 3 * x, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_a_gradient_that_requires_grad_is_compressed_as_its_values(name):
    """Under create_graph a gradient requires grad itself: compressing it must not fail (numpy
    reads, out= writes) and must give what its detached values give."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    opts = {"density": 0.05} if name in ("topk", "dgc", "randomk") else {}
    a, b = get(name, **opts), get(name, **opts)
    got = a.decompress(a.compress(x.clone().requires_grad_()), x.numel())
    assert not got.requires_grad
    assert torch.equal(got, b.decompress(b.compress(x), x.numel()))


def test_norm_and_mean_of_huge_finite_values_do_not_overflow():
    """QSGD's norm and EF-signSGD's mean magnitude are summed in fp64: fp32 squares overflow
    from a norm of about 1.8e19, and a sum of magnitudes from 3.4e38, where the norm and the
    mean are still finite."""
    x = torch.tensor([2e19, -2e19, 0.0])
    q = QSGD(s=4)
    got = q.decompress(q.compress(x), 3)
    assert torch.isfinite(got).all() and got[2] == 0 and got[0] >= 0 >= got[1]
    big = torch.tensor([3e38, 3e38])
    e = EFSignSGD()
    assert torch.equal(e.decompress(e.compress(big), 2), big)


def test_qsgd_levels_stay_exact_up_to_the_largest_s():
    """Every level up to s is exact in fp32 (s ≤ 2**24): the top one keeps its sign."""
    q = QSGD(s=2**24)
    x = torch.tensor([1.0, -3.0, 0.0])
    got = q.decompress(q.compress(x), 3)
    assert got[0] > 0 > got[1] and got[2] == 0
    assert torch.allclose(got, x, rtol=1e-6, atol=1e-6)
    one = q.compress(torch.tensor([5.0]))  # the top level, s itself
    assert one.levels.item() == 2**24 and q.decompress(one, 1).item() == 5.0


def test_error_feedback_state_dict_is_a_copy_both_ways():
    """A saved state must not change with later steps, and a loaded one is not the caller's:
    the residuals change in place from step to step."""
    ef = ErrorFeedback(TopK(k=1))
    ef.compress("k", torch.tensor([1.0, 2.0, 3.0]))
    saved = ef.state_dict()
    assert saved["residuals"]["k"].tolist() == [1.0, 2.0, 0.0]
    ef.flush("k", torch.zeros(3))  # zeroes the residual in place
    assert saved["residuals"]["k"].tolist() == [1.0, 2.0, 0.0]
    mine = {"residuals": {"k": torch.tensor([5.0, 0.0, 0.0])}, "compressor": {"step": 0}}
    ef2 = ErrorFeedback(TopK(k=1))
    ef2.load_state_dict(mine)
    feedback.feed(ef2.residual("k", torch.zeros(3)), torch.tensor([0.0, 1.0, 0.0]), 1)
    assert mine["residuals"]["k"].tolist() == [5.0, 0.0, 0.0]


def test_powersgd_forget_keeps_what_direct_calls_kept():
    """The hooks key PowerSGD's warm starts (bucket, rows, cols) and forget unused buckets;
    compress() called directly keys them (rows, cols), which forget must not read as a
    bucket."""
    c = PowerSGDCompressor(rank=1)
    c.compress(torch.randn(64))  # an 8 x 8 matrix: kept under (8, 8)
    c.power.memory[((0,), 8, 8)] = torch.ones(8, 1)
    c.power.memory[((1,), 8, 8)] = torch.ones(8, 1)
    c.forget({(1,)})
    assert set(c.power.memory) == {(8, 8), ((1,), 8, 8)}
