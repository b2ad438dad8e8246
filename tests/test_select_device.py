"""The device path of selection, the ⊤ merge, the wire and the dense average, run on CPU tensors
under ``device_paths()``: the same sets and bits as the host path (or as the tie rule itself,
where the host path departs from it), fixed shapes, and no host-device synchronisation."""

from __future__ import annotations

import contextlib
import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sync_guard import SyncGuard

import gradwire.compress.select as selection
from gradwire.compress.base import generator
from gradwire.compress.select import (
    device_capacity,
    device_threshold,
    magnitude_keys,
    select,
)
from gradwire.dtypes import acc_dtype
from gradwire.sparse.allreduce import SparseResult
from gradwire.sparse.topk import average_into, merge_following, top_merge
from gradwire.sparse.wire import PAD, Entries, add_into, pack, unpack
from gradwire.syncfree import device_paths

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
       torch.float64: torch.int64}
FAST = settings(derandomize=True, max_examples=300, deadline=None)


# data ---------------------------------------------------------------------------------------

def payload_nans(count: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """``count`` NaNs of random sign and payload."""
    bits = INT[dtype]
    inf = torch.tensor(float("inf"), dtype=dtype).view(bits)
    mantissa = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}[dtype]
    low = torch.randint(1, 2 ** min(mantissa, 30), (count,), generator=g).to(bits)
    sign = torch.where(torch.rand(count, generator=g) < 0.5, 0, torch.iinfo(bits).min)
    nan = (inf | low | sign.to(bits)).view(dtype)
    assert bool(torch.isnan(nan).all())
    return nan


def make(n: int, dtype: torch.dtype, seed: int, mode: str, nans: int, infs: int,
         negzeros: int) -> torch.Tensor:
    """n values of ``dtype``: ``mode`` "ties" (a few distinct magnitudes), "spread" (normal),
    or "sparse" (mostly exact zeros), with NaNs (any payload), ±inf and -0.0 put at random."""
    g = torch.Generator().manual_seed(seed)
    if mode == "ties":
        x = torch.randint(-3, 4, (n,), generator=g).double() / 2
    elif mode == "spread":
        x = torch.randn(n, generator=g, dtype=torch.float64)
    else:
        x = torch.randn(n, generator=g, dtype=torch.float64)
        x *= torch.rand(n, generator=g) < 0.05
    x = x.to(dtype)
    if n:
        put = torch.randperm(n, generator=g)
        nans = min(nans, n)
        infs = min(infs, n - nans)
        x[put[:nans]] = payload_nans(nans, dtype, g)
        x[put[nans : nans + infs]] = torch.where(torch.rand(infs, generator=g) < 0.5,
                                                 float("inf"), -float("inf")).to(dtype)
        x[put[nans + infs : nans + infs + negzeros]] = -0.0
    return x


def vectors(low: int = 0, high: int = 300) -> st.SearchStrategy[torch.Tensor]:
    return st.builds(make, st.integers(low, high), st.sampled_from(DTYPES),
                     st.integers(0, 2**20), st.sampled_from(["ties", "spread", "sparse"]),
                     st.sampled_from([0, 0, 1, 5]), st.sampled_from([0, 0, 1, 5]),
                     st.sampled_from([0, 3, 50]))


def rule(values: torch.Tensor, k: int, indices: torch.Tensor | None = None) -> list[int]:
    """The tie rule long-hand: the k largest |value| (NaN above everything, among equals the
    smaller index), as a sorted list of indices."""
    v = values.double().tolist()
    at = list(range(len(v))) if indices is None else indices.tolist()
    order = sorted(range(len(v)), key=lambda i: (not math.isnan(v[i]),
                                                 0.0 if math.isnan(v[i]) else -abs(v[i]), at[i]))
    return sorted(at[i] for i in order[:k])


def host_follows_the_rule(x: torch.Tensor) -> bool:
    """The host selectors count a NaN as tied with ±inf (not above it): they agree with the
    rule unless both occur."""
    return not (bool(torch.isnan(x).any()) and bool(torch.isinf(x).any()))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT[t.dtype])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, -0.0 apart from 0.0, except that any NaN equals any NaN: a NaN's payload
    after an add differs between kernels (the host's index_add_ and a plain add here) and
    between devices, and means nothing."""
    nan = torch.isnan(a)
    return (a.shape == b.shape and a.dtype == b.dtype and torch.equal(nan, torch.isnan(b))
            and torch.equal(bits(a)[~nan], bits(b)[~nan]))


def real(e: Entries) -> Entries:
    """The real entries of a padded list, checking that the padding is at the end."""
    r = e.indices != PAD
    count = int(r.sum())
    assert bool(r[:count].all()) and not bool(r[count:].any()), e.indices
    assert bool((e.values[count:] == 0).all()) and not bool(torch.signbit(e.values[count:]).any())
    return Entries(e.values[:count], e.indices[:count])


def padded(e: Entries, length: int, g: torch.Generator, scatter: bool) -> Entries:
    """``e`` padded to ``length`` entries, the padding at the end or scattered."""
    more = length - len(e)
    v = torch.cat([e.values, torch.zeros(more, dtype=e.values.dtype)])
    i = torch.cat([e.indices, torch.full((more,), PAD)])
    if scatter:
        p = torch.randperm(length, generator=g)
        v, i = v[p], i[p]
    return Entries(v, i)


def ascending_distinct(idx: torch.Tensor) -> bool:
    return idx.dtype == torch.int64 and bool((idx[1:] > idx[:-1]).all())


# selection ----------------------------------------------------------------------------------

@FAST
@given(x=vectors(), k=st.integers(0, 320))
def test_device_exact_is_the_rule_and_the_hosts_set(x, k):
    want = rule(x, k)
    with device_paths():
        got = select(x, k, "exact")
    assert got.numel() == min(k, x.numel()) and ascending_distinct(got)
    assert got.tolist() == want
    if host_follows_the_rule(x):
        assert sorted(select(x, k, "exact").tolist()) == want


def test_magnitude_keys_tie_signed_zeros_and_rank_every_nan_above_inf():
    g = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        nans = payload_nans(6, dtype, g)
        x = torch.cat([torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1.0, -1.0],
                                    dtype=dtype), nans])
        key = magnitude_keys(x)
        assert key[0] == key[1] == 0 and key[2] == key[3] and key[4] == key[5]
        assert bool((key[6:] == key[6]).all()) and bool((key[6:] > key[2]).all())
        with device_paths():  # NaNs of any payload tie: the smaller index first
            assert select(x, 7).tolist() == [2, 6, 7, 8, 9, 10, 11]
            assert select(x, 9).tolist() == [2, 3, 4, 6, 7, 8, 9, 10, 11]


@pytest.mark.xfail(strict=True, reason="the host selectors rank NaN level with inf")
def test_host_exact_ranks_nan_above_inf():
    assert select(torch.tensor([float("inf"), float("nan")]), 1).tolist() == [1]


@pytest.mark.xfail(strict=True, reason="threshold_topk never takes an unsampled NaN")
def test_host_threshold_takes_every_nan():
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    x[12_345] = float("nan")
    assert 12_345 in select(x, 100, "threshold").tolist()


def sampled_threshold(x: torch.Tensor, k: int, seed: int, sample: float, min_sample: int
                      ) -> tuple[int, int, int, int]:
    """(candidate count, capacity, threshold key, s) as device_threshold draws them."""
    n = x.numel()
    s = selection._sample_size(n, sample, min_sample)
    key = magnitude_keys(x)
    drawn = key[torch.randint(n, (s,), generator=generator(seed, 0))]
    j = max(1, min(s, selection._with_margin(k * s / n)))
    t = max(1, int(torch.topk(drawn, j).values.min()))
    return int((key >= t).sum()), device_capacity(n, k, s, j), t, s


# The threshold's slack and the capacity's, in standard deviations: the defaults, then settings
# that make the sample miss (too high a threshold: fewer than k candidates; too few slots:
# more candidates than fit), so that every branch below is taken.
SLACKS = [(selection.MARGIN_SD, selection.CAPACITY_SD), (-8.0, selection.CAPACITY_SD),
          (selection.MARGIN_SD, -30.0)]


@FAST
@given(x=vectors(2, 400), share=st.floats(0, 1), seed=st.integers(0, 99),
       sample=st.sampled_from([0.02, 0.1]), min_sample=st.sampled_from([8, 32]),
       slack=st.sampled_from(SLACKS))
def test_device_threshold_is_exact_when_the_candidates_bracket_k(x, share, seed, sample,
                                                                min_sample, slack):
    """The rule's set whenever the candidates number k to the capacity; on a miss, k distinct
    indices: every candidate and some others (too few), or k of the first candidates (too
    many)."""
    n = x.numel()
    k = 1 + int(share**2 * (n - 2))  # 0 < k < n, more often small
    with mock.patch.object(selection, "MARGIN_SD", slack[0]), \
            mock.patch.object(selection, "CAPACITY_SD", slack[1]):
        with device_paths():
            got = device_threshold(x, k, generator(seed, 0), sample, min_sample)
        count, cap, t, _ = sampled_threshold(x, k, seed, sample, min_sample)
    assert got.numel() == k and ascending_distinct(got) and 0 <= int(got[0])
    assert int(got[-1]) < n
    if 2 * selection._sample_size(n, sample, min_sample) >= n:  # the exact selector
        assert got.tolist() == rule(x, k)
        return
    key = magnitude_keys(x)
    if k <= count <= cap or (count < k and t == 1):
        assert got.tolist() == rule(x, k)
    elif count < k:  # every candidate, then some of the others
        assert set(torch.nonzero(key >= t).squeeze(1).tolist()) <= set(got.tolist())
    else:  # k of the first cap candidates
        assert bool((key[got] >= t).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["ties", "spread", "sparse"])
def test_device_threshold_through_select_matches_the_host(dtype, mode):
    x = make(30_000, dtype, 7, mode, 0, 0, 100)
    host = select(x, 300, "threshold").sort().values
    with device_paths():
        got = select(x, 300, "threshold")
    assert torch.equal(got, host)


def test_device_threshold_misses_give_k_distinct_indices(monkeypatch):
    x = make(20_000, torch.float32, 1, "spread", 0, 0, 0)
    exact = rule(x, 200)
    monkeypatch.setattr(selection, "MARGIN_SD", -8.0)  # too high a threshold: too few
    with device_paths():
        few = select(x, 200, "threshold")
    count, _, t, _ = sampled_threshold(x, 200, 0, selection.SAMPLE, selection.MIN_SAMPLE)
    assert count < 200 and few.numel() == 200 and ascending_distinct(few)
    keys = magnitude_keys(x)
    above = set(torch.nonzero(keys >= t).squeeze(1).tolist())
    assert above <= set(few.tolist()) and few.tolist() != exact
    assert set(few.tolist()) - above <= set(range(200))  # the rest from x[:k]
    monkeypatch.setattr(selection, "MARGIN_SD", 4.0)
    monkeypatch.setattr(selection, "CAPACITY_SD", -30.0)  # too few slots: too many
    with device_paths():
        many = select(x, 200, "threshold")
    count, cap, t, _ = sampled_threshold(x, 200, 0, selection.SAMPLE, selection.MIN_SAMPLE)
    assert count > cap >= 200 and many.numel() == 200 and ascending_distinct(many)
    first = torch.nonzero(keys >= t).squeeze(1)[:cap]
    assert many.tolist() == rule(x[first], 200, first)


def test_device_threshold_on_mostly_zeros_is_exact():
    x = torch.zeros(50_000)
    x[torch.arange(7, 50_000, 997)] = torch.arange(1.0, 52.0)  # 51 nonzeros: a zero threshold
    x[3] = -0.0
    for k in (20, 51, 120):
        with device_paths():
            got = select(x, k, "threshold")
        assert got.tolist() == rule(x, k) == sorted(select(x, k, "threshold").tolist())


def test_device_select_edge_sizes():
    x = torch.tensor([1.0, -2.0, 3.0])
    with device_paths():
        assert select(x, 0).numel() == 0 and select(x, 0, "threshold").numel() == 0
        assert select(x, 3).tolist() == select(x, 9, "threshold").tolist() == [0, 1, 2]
        assert select(torch.zeros(0), 4).numel() == 0


# the ⊤ merge --------------------------------------------------------------------------------

def lists(seed: int, numel: int, k: int, dtype: torch.dtype, mode: str, specials: int
          ) -> tuple[Entries, Entries]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        c = int(torch.randint(0, min(k, numel) + 1, (1,), generator=g))
        idx = torch.randperm(numel, generator=g)[:c].sort().values
        vals = make(c, dtype, int(torch.randint(0, 2**20, (1,), generator=g)), mode,
                    specials, specials, 2)
        out.append(Entries(vals, idx))
    return out[0], out[1]


@FAST
@given(seed=st.integers(0, 2**20), numel=st.integers(1, 60), k=st.integers(1, 40),
       dtype=st.sampled_from(DTYPES), mode=st.sampled_from(["ties", "spread"]),
       specials=st.sampled_from([0, 0, 1, 3]), shuffled=st.booleans(), scatter=st.booleans())
def test_device_merge_is_the_hosts_bit_for_bit(seed, numel, k, dtype, mode, specials, shuffled,
                                                scatter):
    a, b = lists(seed, numel, k, dtype, mode, specials)
    g = torch.Generator().manual_seed(seed)
    if shuffled:  # a rank's own selection may come in any order
        p = torch.randperm(len(a), generator=g)
        a = Entries(a.values[p], a.indices[p])
    host_kept, host_dropped = top_merge(a, b, k)
    with device_paths():
        kept, dropped = top_merge(padded(a, k, g, scatter), padded(b, k, g, scatter), k)
    assert len(kept) == len(dropped) == k
    kept, dropped = real(kept), real(dropped)
    assert ascending_distinct(kept.indices) and ascending_distinct(dropped.indices)
    union = torch.cat([host_kept.indices, host_dropped.indices])
    sums = torch.cat([host_kept.values, host_dropped.values])
    if host_follows_the_rule(sums):
        assert torch.equal(kept.indices, host_kept.indices)
        assert torch.equal(dropped.indices, host_dropped.indices)
        assert same_bits(kept.values, host_kept.values)
        assert same_bits(dropped.values, host_dropped.values)
    else:  # the same union and sums; which are kept by the rule
        assert kept.indices.tolist() == rule(sums, k, union)
        got = torch.cat([kept.indices, dropped.indices])
        order, want = got.argsort(), union.argsort()
        assert torch.equal(got[order], union[want])
        assert same_bits(torch.cat([kept.values, dropped.values])[order], sums[want])


@FAST
@given(seed=st.integers(0, 2**20), numel=st.integers(1, 60), k=st.integers(0, 40),
       mode=st.sampled_from(["ties", "spread"]), shuffled=st.booleans(), scatter=st.booleans(),
       on_device=st.booleans())
def test_a_merge_says_where_each_of_its_first_lists_entries_went(seed, numel, k, mode, shuffled,
                                                                 scatter, on_device):
    """merge_following's third result: a's entry i is kept.entries[where[i]], or where[i] is −1
    and its index is not kept (a padding entry: always −1); kept and dropped are top_merge's."""
    a, b = lists(seed, numel, max(k, 1), torch.float32, mode, 0)
    g = torch.Generator().manual_seed(seed)
    if shuffled:
        p = torch.randperm(len(a), generator=g)
        a = Entries(a.values[p], a.indices[p])
    a, b = Entries(a.values[:k], a.indices[:k]), Entries(b.values[:k], b.indices[:k])
    with device_paths() if on_device else contextlib.nullcontext():
        if on_device:
            a, b = padded(a, k, g, scatter), padded(b, k, g, scatter)
        kept, dropped, where = merge_following(a, b, k)
        plain = top_merge(a, b, k)
    assert torch.equal(kept.indices, plain[0].indices)
    assert torch.equal(dropped.indices, plain[1].indices)
    assert where.dtype == torch.int64 and where.shape == (len(a),)
    kept_at = {int(i): j for j, i in enumerate(kept.indices.tolist()) if i >= 0}
    for i, w in zip(a.indices.tolist(), where.tolist(), strict=True):
        assert w == (kept_at.get(i, -1) if i >= 0 else -1)


def test_device_merge_of_short_and_empty_lists():
    a = Entries(torch.tensor([1.0, -0.0]), torch.tensor([4, 2]))
    empty = Entries(torch.zeros(0), torch.zeros(0, dtype=torch.int64))
    with device_paths():
        kept, dropped = top_merge(a, empty, 3)
        assert kept.indices.tolist() == [2, 4, PAD] and dropped.indices.tolist() == [PAD] * 3
        assert bits(kept.values).tolist() == bits(torch.tensor([-0.0, 1.0, 0.0])).tolist()
        kept, dropped = top_merge(empty, empty, 0)
        assert len(kept) == len(dropped) == 0


# the dense average --------------------------------------------------------------------------

def host_average(sent: list[Entries], numel: int, world_size: int, out: torch.Tensor
                 ) -> torch.Tensor:
    """The host path: topk_plan's finish() on the real entries, then SparseResult.average."""
    dtype = sent[0].values.dtype
    where, slot = torch.unique(torch.cat([e.indices for e in sent]), sorted=True,
                               return_inverse=True)
    sums = torch.zeros(where.numel(), dtype=acc_dtype(dtype))
    start = 0
    for e in sent:
        sums.index_add_(0, slot[start : start + len(e)], e.values.to(sums.dtype))
        start += len(e)
    return SparseResult(Entries(sums.to(dtype), where), numel, world_size, None).average(out)


@FAST
@given(seed=st.integers(0, 2**20), numel=st.integers(1, 50), k=st.integers(0, 30),
       world_size=st.integers(1, 5), dtype=st.sampled_from(DTYPES),
       mode=st.sampled_from(["ties", "spread"]), specials=st.sampled_from([0, 0, 1, 3]),
       scatter=st.booleans())
def test_average_into_is_the_hosts_bit_for_bit(seed, numel, k, world_size, dtype, mode,
                                               specials, scatter):
    g = torch.Generator().manual_seed(seed)
    sent = []
    for r in range(world_size):
        c = int(torch.randint(0, min(k, numel) + 1, (1,), generator=g))
        idx = torch.randperm(numel, generator=g)[:c]
        sent.append(Entries(make(c, dtype, seed + r, mode, specials, specials, 2), idx))
    out = torch.full((numel,), 7.0, dtype=dtype)
    with device_paths():
        got = average_into([padded(e, k, g, scatter) for e in sent], numel, world_size, out)
    assert got is out
    want = host_average(sent, numel, world_size, torch.full((numel,), 5.0, dtype=dtype))
    assert same_bits(got, want)
    # gTop-k: one list, already the sum
    one = sent[0]
    with device_paths():
        got = average_into([padded(one, k, g, scatter)], numel, world_size, out, summed=True)
    want = SparseResult(one, numel, world_size, None).average(torch.ones(numel, dtype=dtype))
    assert same_bits(got, want)


def test_average_into_checks_out():
    e = Entries(torch.ones(2), torch.tensor([0, PAD]))
    with pytest.raises(Exception, match="out must be"):
        average_into([e], 4, 1, torch.zeros(5))
    with pytest.raises(Exception, match="out must be"):
        average_into([e], 4, 1, torch.zeros(4, dtype=torch.float64))


# the wire -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_padded_lists_pack_and_unpack_on_the_device_path(dtype):
    e = Entries(torch.tensor([1.5, -0.0, 3.0, 0.0], dtype=dtype), torch.tensor([9, 0, 4, PAD]))
    with device_paths():
        buf = pack(e, 6, 10)
        got = unpack(buf, 6, 10, dtype)
    assert got.indices.tolist() == [9, 0, 4, PAD, PAD, PAD]
    assert torch.equal(bits(got.values), bits(torch.cat([e.values, torch.zeros(2, dtype=dtype)])))
    host = unpack(buf, 6, 10, dtype)
    assert host.indices.tolist() == [9, 0, 4] and torch.equal(bits(host.values), bits(e.values[:3]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_into_adds_real_entries_exactly_and_padding_not_at_all(dtype):
    dense = torch.tensor([-0.0, 1.0, -0.0, float("nan"), 2.0], dtype=dtype)
    e = Entries(torch.tensor([0.0, 0.0, 1.0, -0.0, 0.0], dtype=dtype),
                torch.tensor([PAD, 1, 4, 2, PAD]))
    want = dense.clone().index_add_(0, e.indices[1:4], e.values[1:4])
    with device_paths():
        got = add_into(dense, e)
    assert got is dense and torch.equal(bits(got), bits(want))
    assert bool(torch.signbit(got[0])) and bool(torch.signbit(got[2]))


# no synchronisation -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_the_device_path_makes_no_host_sync(dtype):
    n, k, p = 30_000, 300, 3
    x = make(n, dtype, 3, "spread", 2, 2, 10)
    sparse = make(n, dtype, 4, "sparse", 0, 0, 10)
    with SyncGuard() as guard, device_paths():
        with guard.watching():
            picked = [select(v, k, sel) for v in (x, sparse) for sel in ("exact", "threshold")]
            sent = [Entries(x[i], i) for i in picked[:p]]
            got = [unpack(pack(e, k, n), k, n, dtype) for e in sent]
            kept, dropped = top_merge(got[0], got[1], k)
            average_into(got, n, p, torch.empty(n, dtype=dtype))
            average_into([kept], n, p, torch.empty(n, dtype=dtype), summed=True)
            add_into(torch.zeros(n, dtype=dtype), dropped)
            top_merge(kept, Entries(torch.zeros(k, dtype=dtype), torch.full((k,), PAD)), k)
        assert guard.calls == [], guard.report()
    assert all(t.numel() == k for t in picked)


def test_the_guard_counts_what_waits_only_on_cuda():
    """Calls that cost nothing on CPU tensors but copy from the host, and so wait for the GPU,
    on CUDA tensors: each is counted once; their device-side forms are not."""
    t, idx, two = torch.zeros(8), torch.tensor([1, 3]), torch.tensor(2)
    waits = [lambda: t.__setitem__(idx, 0), lambda: t.__setitem__(2, 1.5),
             lambda: t[two], lambda: t[:two],
             lambda: t[[1, 2]], lambda: torch.tensor([1.0, 2.0]),
             lambda: torch.equal(t, t), lambda: t.allclose(t), lambda: torch.where(t > 0),
             lambda: torch.is_nonzero(two)]
    free = [lambda: t.index_fill_(0, idx, 0), lambda: t.__setitem__(slice(0, 2), 0),
            lambda: t.__setitem__(idx, torch.ones(2)), lambda: t[idx], lambda: t[1:3],
            lambda: torch.as_tensor(t), lambda: torch.where(t > 0, t, 0.0),
            lambda: t.eq(t).all()]
    with SyncGuard() as guard:
        for call in waits + free:
            before = len(guard.calls)
            with guard.watching():
                call()
            assert len(guard.calls) - before == (call in waits), (call, guard.report())
