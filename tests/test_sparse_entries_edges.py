"""Edges of the sparse wire (pack, unpack), the ⊤ merge and the half-precision casts: what a
caller may hand the public functions, on the host path and on the device path."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.compress.cast import BF16, FP16
from gradwire.errors import GradwireError
from gradwire.sparse import Entries, pack, top_merge, unpack
from gradwire.syncfree import device_paths

PATHS = ["host", "device"]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FAST = settings(derandomize=True, max_examples=60, deadline=None)  # deterministic, modest


def on(path: str) -> contextlib.AbstractContextManager:
    return device_paths() if path == "device" else contextlib.nullcontext()


def dense(e: Entries, numel: int) -> torch.Tensor:
    """``e`` as a dense vector, its padding (index < 0) left out."""
    real = e.indices >= 0
    out = torch.zeros(numel, dtype=e.values.dtype)
    return out.index_put_((e.indices[real],), e.values[real])


def some_entries() -> tuple[Entries, Entries]:
    a = Entries(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 4, 7]))
    b = Entries(torch.tensor([5.0, -2.0]), torch.tensor([4, 9]))
    return a, b


# --- the merge ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k", [-1, 2.5, None, "2"])
def test_top_merge_refuses_a_k_that_is_no_count_in_one_line(path, k):
    """k = −1 kept all of the union but one on the device path (a slice from the end) and
    none on the host's; a fractional or missing k was a TypeError."""
    a, b = some_entries()
    with on(path), pytest.raises(GradwireError, match="k must be an integer >= 0"):
        top_merge(a, b, k)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int16, torch.uint8])
def test_top_merge_takes_narrow_indices_with_padding_on_both_paths(path, index_dtype):
    """The device path stopped on int32 (or narrower) indices with a RuntimeError: the
    padding's sort key, int64's largest value, does not fit them. The host took them."""
    a = Entries(torch.tensor([1.0, 2.0, 0.0]), torch.tensor([5, 3, -1]).to(index_dtype))
    b = Entries(torch.tensor([5.0, -2.0]), torch.tensor([3, 0]).to(index_dtype))
    if index_dtype == torch.uint8:  # no padding in an unsigned list
        a = Entries(a.values[:2], a.indices[:2])
    with on(path):
        kept, dropped = top_merge(a, b, 2)
    assert kept.indices.dtype == torch.int64
    assert torch.equal(dense(kept, 8), torch.tensor([-2.0, 0, 0, 7.0, 0, 0, 0, 0]))
    assert torch.equal(dense(dropped, 8), torch.tensor([0, 0, 0, 0, 0, 1.0, 0, 0]))


@pytest.mark.parametrize("path", PATHS)
def test_merges_refuse_lists_that_do_not_fit_together_in_one_line(path):
    a, b = some_entries()
    with on(path):
        with pytest.raises(GradwireError, match="one dtype"):  # was merged as fp32
            top_merge(a, Entries(b.values.half(), b.indices), 2)
        with pytest.raises(GradwireError, match="indices must be"):  # was an IndexError
            top_merge(Entries(torch.ones(2), torch.arange(3)), b, 2)
        with pytest.raises(GradwireError, match="expected Entries"):
            top_merge((a.values, a.indices), b, 2)


@FAST
@given(seed=st.integers(0, 2**16), numel=st.integers(1, 40), k=st.integers(0, 30),
       dtype=st.sampled_from(DTYPES), index_dtype=st.sampled_from([torch.int32, torch.int64]),
       path=st.sampled_from(PATHS))
def test_a_merge_loses_no_mass_whatever_its_index_dtype(seed, numel, k, dtype, index_dtype,
                                                        path):
    """kept + dropped = a + b, element by element and exactly (each shared index gets one add
    in the lists' dtype), and kept holds the min(k, |union|) largest."""
    g = torch.Generator().manual_seed(seed)
    lists = []
    for _ in range(2):
        c = int(torch.randint(0, numel + 1, (1,), generator=g))
        idx = torch.randperm(numel, generator=g)[:c]
        vals = torch.randint(-8, 9, (c,), generator=g).to(dtype) / 4
        lists.append(Entries(vals, idx.to(index_dtype)))
    a, b = lists
    with on(path):
        kept, dropped = top_merge(a, b, k)
    want = dense(Entries(a.values, a.indices.long()), numel)
    want.index_add_(0, b.indices.long(), b.values)
    assert torch.equal(dense(kept, numel) + dense(dropped, numel), want)
    union = torch.cat([a.indices, b.indices]).unique().numel()
    assert int((kept.indices >= 0).sum()) == min(k, union)


# --- the wire -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("e", "says"), [
    (Entries(torch.ones(3), torch.arange(2)), "indices must be"),  # was a RuntimeError
    (Entries(torch.ones(2), torch.tensor([1.7, 2.2])), "indices must be"),  # were truncated
    (Entries(torch.ones(2), torch.tensor([True, False])), "indices must be"),
    (Entries(torch.arange(3), torch.arange(3)), "values must be"),  # packed as int64 bytes
    (Entries(torch.ones(2, 2), torch.arange(4).view(2, 2)), "values must be"),
])
def test_pack_refuses_malformed_entries_in_one_line(path, e, says):
    with on(path), pytest.raises(GradwireError, match=says):
        pack(e, 4, 10)


@pytest.mark.parametrize("path", PATHS)
def test_pack_refuses_a_k_or_numel_that_is_no_count_in_one_line(path):
    a, _ = some_entries()
    with on(path):
        with pytest.raises(GradwireError, match="k must be"):  # was a TypeError of empty()
            pack(a, 4.0, 10)
        with pytest.raises(GradwireError, match="numel must be"):
            pack(a, 4, None)


@pytest.mark.parametrize("path", PATHS)
def test_unpack_refuses_a_buffer_that_is_no_byte_tensor(path):
    """A float buffer of as many elements as the packed list has bytes was read as garbage
    entries: the size check counted elements, not bytes."""
    with on(path):
        with pytest.raises(GradwireError, match="1-D uint8"):
            unpack(torch.zeros(8), 1, 10, torch.float32)
        with pytest.raises(GradwireError, match="dtype must be"):  # int values: no gradient
            unpack(torch.zeros(8, dtype=torch.uint8), 1, 10, torch.int32)
        with pytest.raises(GradwireError, match="k must be"):
            unpack(torch.zeros(8, dtype=torch.uint8), 1.0, 10, torch.float32)


@FAST
@given(numel=st.integers(1, 50), k=st.integers(0, 20), dtype=st.sampled_from(DTYPES),
       offset=st.integers(0, 7), seed=st.integers(0, 2**16))
def test_pack_round_trips_at_any_offset_with_specials(numel, k, dtype, offset, seed):
    """Every real entry comes back bit for bit (−0.0, ±inf, NaN, the largest values
    included), from a buffer at any byte offset; the host path drops the padding."""
    g = torch.Generator().manual_seed(seed)
    c = min(k, numel, int(torch.randint(0, k + 1, (1,), generator=g)))
    idx = torch.randperm(numel, generator=g)[:c]
    top = torch.finfo(dtype).max
    pool = torch.tensor([-0.0, 0.0, float("inf"), -float("inf"), float("nan"), top, -top,
                         torch.finfo(dtype).tiny / 2, 1.5], dtype=dtype)
    vals = pool[torch.randint(0, len(pool), (c,), generator=g)]
    buf = pack(Entries(vals, idx), k, numel)
    shifted = torch.cat([torch.zeros(offset, dtype=torch.uint8), buf])[offset:]
    got = unpack(shifted, k, numel, dtype)
    assert torch.equal(got.indices, idx)
    assert torch.equal(got.values.view(torch.uint8), vals.contiguous().view(torch.uint8))


# --- the casts ------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [FP16, BF16])
@pytest.mark.parametrize("out", [torch.empty(2, 3), torch.empty(6, dtype=torch.int32),
                                 [0.0] * 6])
def test_cast_decompress_into_refuses_an_out_that_is_no_1d_float_tensor(cls, out):
    """A 2-D out of six elements was a RuntimeError of the copy's broadcast; an int32 one was
    written, then a TypeError of finfo."""
    c = cls()
    p = c.compress(torch.randn(6, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(GradwireError, match="out must be a 1-D float tensor"):
        c.decompress_into(p, out)
