"""gradwire.sparse in one process: the ⊤ merge, the wire format, Table I against the cost model,
and, for P = 1…17 with all ranks simulated, conservation of gradient mass under error feedback
and equality with the long-hand reference (tests/sparse_reference.py)."""
import contextlib
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sparse_reference import reference

import gradwire.compress.select as selection
from gradwire.collectives.local import execute_local
from gradwire.errors import GradwireError
from gradwire.schedules import binomial, registry
from gradwire.schedules.check import run_symbolic
from gradwire.schedules.cost import CostParams, traffic
from gradwire.sparse import (
    Entries,
    entry_bytes,
    estimate,
    pack,
    schedule,
    select,
    sparse_allreduce,
    top_merge,
    unpack,
)
from gradwire.sparse.allreduce import check_args, plan
from gradwire.sparse.local import simulate

A, B = 0.436e-3, 3.6e-8  # the paper's 1 GbE α (s) and β (s per element)
TABLE1 = CostParams(A, B / 4)  # β per byte of a 4-byte element (fp32 value or int32 index)
S = B / 4  # each list of entries travels with its sender's 1-byte status (Table I has none)


def entries(pairs: dict[int, float], dtype=torch.float64) -> Entries:
    idx = sorted(pairs)
    return Entries(torch.tensor([pairs[i] for i in idx], dtype=dtype),
                   torch.tensor(idx, dtype=torch.long))


def as_dict(e: Entries) -> dict[int, float]:
    return dict(zip(e.indices.tolist(), e.values.tolist(), strict=True))


# the ⊤ operator -----------------------------------------------------------------------------

def test_top_merge_is_definition_1_with_drops():
    a = entries({1: 3.0, 4: -2.0, 7: 1.0})
    b = entries({4: -2.5, 7: 0.5, 9: 2.0})
    kept, dropped = top_merge(a, b, 3)
    assert as_dict(kept) == {1: 3.0, 4: -4.5, 9: 2.0}
    assert as_dict(dropped) == {7: 1.5}


def test_top_merge_ties_go_to_the_smaller_index():
    kept, dropped = top_merge(entries({5: 1.0, 2: -1.0}), entries({8: 1.0, 0: 1.0}), 2)
    assert as_dict(kept) == {0: 1.0, 2: -1.0}
    assert as_dict(dropped) == {5: 1.0, 8: 1.0}


def test_top_merge_keeps_everything_when_the_union_is_small():
    kept, dropped = top_merge(entries({3: 1.0}), entries({3: -1.0}), 4)
    assert as_dict(kept) == {3: 0.0} and len(dropped) == 0


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 40), st.integers(-3, 3), max_size=20),
       st.dictionaries(st.integers(0, 40), st.integers(-3, 3), max_size=20),
       st.integers(1, 45), st.booleans())
def test_top_merge_is_definition_1_for_any_lists(a, b, k, ascending):
    """Against a long-hand ⊤: union, sums, the k largest |sum| with ties to the smaller index,
    both results ascending. Lists in ascending or shuffled order (a caller's own selection)."""
    def listed(d: dict[int, int]) -> Entries:
        idx = sorted(d) if ascending else sorted(d, key=lambda i: (i * 7919) % 41)
        return Entries(torch.tensor([float(d[i]) for i in idx], dtype=torch.float64),
                       torch.tensor(idx, dtype=torch.long))

    union = {i: a.get(i, 0) + b.get(i, 0) for i in set(a) | set(b)}
    ranked = sorted(union, key=lambda i: (-abs(union[i]), i))
    kept, dropped = top_merge(listed(a), listed(b), k)
    assert kept.indices.tolist() == sorted(ranked[:k])
    assert dropped.indices.tolist() == sorted(ranked[k:])
    assert as_dict(kept) | as_dict(dropped) == {i: float(v) for i, v in union.items()}


# local selection ----------------------------------------------------------------------------

def test_select_exact_breaks_ties_by_index_and_takes_zeros_last():
    acc = torch.tensor([0.0, 2.0, -3.0, 2.0, 0.0, -2.0, 0.0])
    assert sorted(select(acc, 3).tolist()) == [1, 2, 3]
    assert sorted(select(acc, 5).tolist()) == [0, 1, 2, 3, 5]
    assert sorted(select(acc, 99).tolist()) == list(range(7))
    assert sorted(select(torch.zeros(5), 2).tolist()) == [0, 1]
    assert select(torch.zeros(0), 3).numel() == 0


@pytest.mark.parametrize("pad", [0, 30])  # k a large share of n (numpy's partition), or not
def test_select_counts_nan_as_largest(pad):
    acc = torch.tensor([1.0, float("nan"), -5.0, 2.0] + [0.5] * pad)
    assert sorted(select(acc, 2).tolist()) == [1, 2]


def test_select_finds_ties_across_chunks(monkeypatch):
    monkeypatch.setattr(selection, "TIE_CHUNK", 3)
    acc = torch.tensor([0.0] * 10 + [4.0] + [0.0] * 5)
    assert sorted(select(acc, 8).tolist()) == [0, 1, 2, 3, 4, 5, 6, 10]


def test_threshold_selector_finds_the_same_set():
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(3))
    assert torch.equal(select(x, 70, "threshold").sort().values,
                       select(x, 70, "exact").sort().values)


# wire format ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_pack_round_trip_without_promotion(dtype):
    e = entries({0: 1.5, 9: -2.0, 4: 3.0}, dtype)
    buf = pack(e, 5, 10)
    assert buf.dtype == torch.uint8 and buf.numel() == 5 * (dtype.itemsize + 4)
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), buf])[1:]  # odd storage offset
    got = unpack(shifted, 5, 10, dtype)
    assert got.values.dtype == dtype and as_dict(got) == as_dict(e)


def test_indices_are_int32_below_2_to_the_31():
    assert entry_bytes(2**31 - 1, torch.float32) == 8
    assert entry_bytes(2**31, torch.float32) == 12
    assert entry_bytes(10, torch.float16) == 6


# schedules and Table I ----------------------------------------------------------------------

@pytest.mark.parametrize("p", range(1, 18))
def test_tree_carries_a_custom_op(p):
    s = registry.schedule("allreduce", "tree", p, 5, op="gtopk")
    plain = binomial.allreduce(p, 5)
    assert [t.op for _, t in s.transfers()] == [
        "gtopk" if t.op == "sum" else t.op for _, t in plain.transfers()]
    run_symbolic(s)
    with pytest.raises(GradwireError, match="op must name a combine"):
        binomial.reduce(p, 5, op="copy")


@pytest.mark.parametrize("p", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("k", [1, 25_000])
def test_table_1_topk_allgather(p, k):
    m = 1000 * k
    assert estimate("topk", p, m, k, TABLE1) == pytest.approx(
        math.log2(p) * A + 2 * (p - 1) * k * B + (p - 1) * S, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("p", range(1, 18))
def test_table_1_gtopk_and_the_ring_allgather(p):
    k, m = 1000, 10**6
    lg = math.ceil(math.log2(p)) if p > 1 else 0
    assert estimate("gtopk", p, m, k, TABLE1, algo="tree") == pytest.approx(
        2 * lg * A + 4 * k * lg * B + 2 * lg * S, rel=1e-12, abs=1e-15)
    assert estimate("topk", p, m, k, TABLE1, algo="ring") == pytest.approx(
        (p - 1) * A + 2 * (p - 1) * k * B + (p - 1) * S, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("p", [1, 2, 4, 8, 16, 32])
def test_gtopk_on_the_butterfly_costs_half_the_tree_for_p_a_power_of_two(p):
    k, m, lg = 1000, 10**6, int(math.log2(p))
    assert estimate("gtopk", p, m, k, TABLE1, algo="rd") == pytest.approx(
        lg * A + 2 * k * lg * B + lg * S, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_gtopk_sends_8k_bytes_per_tree_edge(p):
    k = 37
    tr = traffic(schedule("gtopk", p, 1000, k, algo="tree"), 1)
    edges = np.argwhere(tr.bytes_sent)
    assert len(edges) == 2 * (p - 1)  # each tree edge once up, once down
    assert all(tr.bytes_sent[a, b] == 8 * k + 1 for a, b in edges)  # and the status byte


def test_dense_ring_row_of_table_1():
    p, m = 8, 25_000_000
    s = registry.schedule("allreduce", "ring", p, m, pipeline=1)
    from gradwire.schedules.cost import cost
    assert cost(s, TABLE1, 4) == pytest.approx(2 * (p - 1) * A + 2 * (p - 1) / p * m * B)


# all ranks in one process ---------------------------------------------------------------------

def run(method, xs, rs, k, **kw):
    """simulate on torch copies; returns (results, residuals after)."""
    rs = [r.clone() for r in rs]
    return simulate([x.clone() for x in xs], rs, k, method, **kw), rs


@st.composite
def cases(draw):
    p = draw(st.integers(1, 17))
    n = draw(st.integers(0, 24))
    k = draw(st.sampled_from([1, 2, 3, max(1, n // 2), max(1, n), n + 3]))
    small = st.integers(-3, 3)  # many ties and zeros
    xs = [draw(st.lists(small, min_size=n, max_size=n)) for _ in range(p)]
    rs = [draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)) for _ in range(p)]
    return p, n, k, xs, rs


@settings(max_examples=200, deadline=None, derandomize=True)
@given(case=cases(), method=st.sampled_from(["topk", "gtopk/tree", "gtopk", "gtopk/rd"]),
       selector=st.sampled_from(["exact", "exact", "threshold"]))
def test_mass_is_conserved_and_matches_the_reference(case, method, selector):
    p, n, k, xs, rs = case
    tx = [torch.tensor(x, dtype=torch.float64) for x in xs]
    tr = [torch.tensor(r, dtype=torch.float64) for r in rs]
    method, _, algo = method.partition("/")
    results, after = run(method, tx, tr, k, selector=selector, algo=algo or None)
    before = torch.stack(tx).sum(0) + torch.stack(tr).sum(0)
    total = results[0].total()
    assert torch.equal(torch.stack(after).sum(0) + total, before)  # exact: integer values
    for res in results:
        assert torch.equal(res.total(), total) and torch.equal(res.indices, results[0].indices)
    assert torch.equal(results[0].average(), total / p)
    if method == "gtopk":
        assert len(results[0].indices) == min(k, n)
    if selector == "threshold":  # the same set up to which tied elements it takes
        return
    want, want_res = reference([np.array(x, dtype=np.float64) for x in xs],
                               [np.array(r, dtype=np.float64) for r in rs], k, method,
                               algo or "rd")
    assert np.array_equal(total.numpy(), want)
    for got, w in zip(after, want_res, strict=True):
        assert np.array_equal(got.numpy(), w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_random_floats_match_the_reference_bit_for_bit(dtype, method):
    g = torch.Generator().manual_seed(11)
    p, n, k = 6, 200, 17
    xs = [torch.randn(n, generator=g).to(dtype) for _ in range(p)]
    rs = [torch.randn(n, generator=g).to(dtype) for _ in range(p)]
    results, after = run(method, xs, rs, k)
    npd = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}
    want, want_res = reference([x.numpy() for x in xs], [r.numpy() for r in rs], k, method,
                               "rd")
    assert results[0].total().dtype == dtype
    assert np.array_equal(results[0].total().numpy(), want.astype(npd[dtype]))
    for got, w in zip(after, want_res, strict=True):
        assert np.array_equal(got.numpy(), w)
    if dtype == torch.float32:
        lhs = torch.stack(after).double().sum(0) + results[0].total().double()
        rhs = (torch.stack(xs).double() + torch.stack(rs).double()).sum(0)
        torch.testing.assert_close(lhs, rhs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ["topk", "gtopk"])
@pytest.mark.parametrize("k, numel", [(3, 8), (10, 7)])
def test_short_lists_are_padded(method, k, numel):
    lists = [{4: 2.0}, {1: -3.0, 4: 1.0, 6: 0.5}, {}]
    rs = [torch.zeros(numel) for _ in lists]
    plans = [plan(method, entries(d, torch.float32), k, numel, r, i, 3)
             for i, (d, r) in enumerate(zip(lists, rs, strict=True))]
    per_rank = 8 * min(k, numel) + 1  # the entries and the status byte
    assert plans[0].buffer.numel() == (per_rank if method == "gtopk" else 3 * per_rank)
    execute_local(plans[0].schedule, [q.buffer for q in plans], [q.combine for q in plans])
    assert as_dict(plans[2].finish().entries) == {1: -3.0, 4: 3.0, 6: 0.5}
    assert all(r.abs().sum() == 0 for r in rs)


def test_dense_forms_can_reuse_a_buffer():
    xs = [torch.tensor([1.0, -4.0, 2.0]), torch.tensor([3.0, 0.0, -1.0])]
    results, _ = run("topk", xs, [torch.zeros(3)] * 2, 2)
    out = torch.full((3,), 7.0)
    assert results[0].average(out) is out and out.tolist() == [1.5, -2.0, 0.5]
    assert results[0].mask().tolist() == [True, True, True]
    with pytest.raises(GradwireError, match="out must be a 1-D tensor of 3 torch.float32"):
        results[0].total(torch.zeros(3, dtype=torch.float64))


def test_a_value_dropped_inside_the_tree_is_not_lost():
    """The reference code's defect: at P=4, k=1, rank 0's 5 at index 0 loses to rank 1's 6 at
    the first merge, but index 0 wins the final merge through ranks 2 and 3 (4 + 4). Algorithm
    4 line 10 returns only selected values whose index is not in the final mask: the 5 is
    neither applied nor kept. On the tree rank 0, which dropped it, keeps it (and rank 1's 6,
    which the last merge, also rank 0's, dropped); on the butterfly each rank takes back its
    own: rank 0 its 5, rank 1 its 6."""
    xs = [torch.tensor([5.0, 0, 0]), torch.tensor([0, 6.0, 0]), torch.tensor([4.0, 0, 0]),
          torch.tensor([4.0, 0, 0])]
    tree_results, tree_after = run("gtopk", xs, [torch.zeros(3)] * 4, 1, algo="tree")
    assert tree_results[0].total().tolist() == [8.0, 0, 0]
    assert tree_after[0].tolist() == [5.0, 6.0, 0]
    assert all(a.abs().sum() == 0 for a in tree_after[1:])
    results, after = run("gtopk", xs, [torch.zeros(3)] * 4, 1)
    assert results[0].total().tolist() == [8.0, 0, 0]
    assert [a.tolist() for a in after] == [[5.0, 0, 0], [0, 6.0, 0], [0, 0, 0], [0, 0, 0]]
    mask = results[0].mask()
    line_10 = [x * ~mask for x in xs]  # Algorithm 4: own selection, not in the global mask
    assert sum(t.sum() for t in line_10) + results[0].total().sum() == 6 + 8  # 5 of 19 lost


@pytest.mark.parametrize("algo", ["tree", "rd"])
def test_error_feedback_over_iterations_applies_everything_eventually(algo):
    """Every gradient is applied once the residuals drain. On the butterfly each rank keeps its
    own drops, so an index whose entries cancel across ranks (sum 0: never selected) may stay
    in their residuals, summing to zero."""
    p, n = 5, 12
    g = torch.Generator().manual_seed(0)
    rs = [torch.zeros(n, dtype=torch.float64) for _ in range(p)]
    sent = torch.zeros(n, dtype=torch.float64)
    grads = torch.randint(-9, 10, (p, n), generator=g).double()
    results, rs = run("gtopk", list(grads), rs, 3, algo=algo)
    sent += results[0].total()
    for _ in range(40):  # zero gradients: the residuals drain
        results, rs = run("gtopk", [torch.zeros(n, dtype=torch.float64)] * p, rs, 3, algo=algo)
        sent += results[0].total()
    assert torch.equal(sent, grads.sum(0)) and torch.stack(rs).sum(0).abs().sum() == 0
    if algo == "tree":
        assert all(r.abs().sum() == 0 for r in rs)


# errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    ({"method": "dense"}, "method must be one of 'topk', 'gtopk'"),
    ({"k": 0}, "k must be an integer >= 1"),
    ({"k": True}, "k must be an integer >= 1"),
    ({"k": 2.0}, "k must be an integer >= 1"),
    ({"selector": "dgc"}, "selector must be one of 'exact', 'threshold'"),
    ({"x": torch.zeros(2, 3)}, "x must be a 1-D float tensor"),
    ({"x": torch.zeros(4, dtype=torch.int32)}, "x must be a 1-D float tensor"),
    ({"residual": torch.zeros(5)}, "residual must match x"),
    ({"residual": torch.zeros(4, dtype=torch.float64)}, "residual must match x"),
    ({"method": "gtopk", "algo": "ring"}, "gtopk runs on the butterfly"),
    ({"method": "topk", "algo": "nope"}, "unknown allgather algorithm"),
    ({"residual": torch.zeros(1).expand(4)}, "residual is written in place, so its elements"),
])
def test_bad_arguments_say_what_is_allowed(kw, match):
    args = {"x": torch.zeros(4), "residual": torch.zeros(4), "k": 2, "method": "gtopk", **kw}
    x, r = args.pop("x"), args.pop("residual")
    with pytest.raises(GradwireError, match=match) as e:
        simulate([x, x], [r, r.clone()], **args)
    assert "\n" not in str(e.value)


def test_out_must_match_x():
    with pytest.raises(GradwireError, match=r"out must match x \(\(4,\) torch.float32"):
        check_args(torch.zeros(4), torch.zeros(4), 2, "gtopk", "exact", None, torch.zeros(3))


def test_entries_given_twice_at_one_index_are_summed_not_dropped(one_rank):
    """gtopk_allreduce once kept only one of two values at a repeated index (P = 1: a total
    of 2 where topk_allreduce gave 3)."""
    from gradwire.sparse import gtopk_allreduce, topk_allreduce

    values, indices = torch.tensor([1.0, 2.0]), torch.tensor([3, 3])
    g = gtopk_allreduce(values, indices, 5, torch.zeros(5), k=2)
    t = topk_allreduce(values, indices, 5, k=2)
    assert g.total().tolist() == t.total().tolist() == [0.0, 0.0, 0.0, 3.0, 0.0]


@pytest.mark.parametrize("kw, says", [
    ({"transport": "x"}, "sparse_allreduce: transport must be None or a gradwire.transport."
                         "Transport, got 'x'"),
    ({"group": "x"}, "sparse_allreduce: group must be None (the default group) or a "
                     "torch.distributed ProcessGroup"),
])
def test_a_transport_or_group_of_the_wrong_kind_is_one_line(kw, says):
    with pytest.raises(GradwireError) as e:
        sparse_allreduce(torch.ones(4), torch.zeros(4), 2, **kw)
    assert says in str(e.value) and "\n" not in str(e.value)


# the NaN/Inf policy, over gloo with one rank ---------------------------------------------------

@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_finite_values_whose_sum_overflows_are_compressed_without_a_warning(one_rank, method):
    """[3e38, 3e38] in fp32 is finite: their fp32 sum (inf) once sent it dense with a NaN/Inf
    warning."""
    x, residual = torch.tensor([3e38, 3e38]), torch.zeros(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = sparse_allreduce(x, residual, 1, method)
    big = x[0].item()  # 3e38 in fp32
    assert got.tolist() == [big, 0.0] and residual.tolist() == [0.0, big]  # k = 1 sent


@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_an_fp16_overflow_is_sent_dense_and_the_residual_kept(one_rank, method):
    residual = torch.tensor([65504.0, 1.0, 0.0, -8.0], dtype=torch.float16)
    x = torch.tensor([64.0, 2.0, 3.0, 4.0], dtype=torch.float16)  # 65504 + 64 overflows
    before = residual.clone()
    with pytest.warns(RuntimeWarning, match="gradient \\+ residual overflows float16 on some "
                                            "rank; aggregated dense this call \\(where it "
                                            "overflows: the gradient alone, the residual kept"):
        got = sparse_allreduce(x.clone(), residual, 1, method)
    assert torch.equal(got, x) and torch.equal(residual, before)


@given(pairs=st.lists(st.tuples(st.integers(-2047, 2047), st.integers(-2047, 2047)),
                      min_size=1, max_size=20),
       k=st.integers(1, 25), method=st.sampled_from(["topk", "gtopk"]))
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_overflow_policy_conserves_mass_near_the_fp16_limit(one_rank, pairs, k, method):
    """fp16 multiples of 32 up to ±65504, whose sums are exact unless they overflow: the
    residual stays finite, nothing non-finite is applied, and residual_after + applied =
    residual_before + x exactly; a warning exactly when residual + x overflows."""
    x = torch.tensor([32.0 * a for a, _ in pairs], dtype=torch.float16)
    residual = torch.tensor([32.0 * b for _, b in pairs], dtype=torch.float16)
    before = residual.clone()
    overflows = not (x.double() + before.double()).abs().le(65504).all()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = sparse_allreduce(x.clone(), residual, k, method)
    assert residual.isfinite().all() and got.isfinite().all()
    assert torch.equal(residual.double() + got.double(), before.double() + x.double())
    assert [str(w.message).count("overflows float16") for w in caught] == [1] * overflows


# edge cases ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_short_lists_on_the_device_path_give_no_padding_in_the_result(one_rank, method):
    """topk_allreduce and gtopk_allreduce on a GPU (here: device_paths) once returned the wire's
    padding (index −1) among the result's indices: mask() then marked the last element, and
    total() wrote the padding's 0 there as well as the real value (on CUDA either may win)."""
    from gradwire.sparse import gtopk_allreduce, topk_allreduce
    from gradwire.syncfree import device_paths

    values, indices = torch.tensor([1.0, 2.0]), torch.tensor([0, 2])
    with device_paths():
        if method == "topk":
            got = topk_allreduce(values, indices, 5, k=4)
        else:
            got = gtopk_allreduce(values, indices, 5, torch.zeros(5), k=4)
    assert got.indices.tolist() == [0, 2]
    assert got.mask().tolist() == [True, False, True, False, False]
    assert got.total().tolist() == [1.0, 0.0, 2.0, 0.0, 0.0]


@pytest.mark.parametrize("device_path", [False, True])
@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_a_gradient_that_requires_grad_is_aggregated_as_data(one_rank, method, device_path):
    """x.requires_grad once stopped the host's selection with torch's "Can't call numpy() on
    Tensor that requires grad", and on the device path tied the residual to autograd's graph
    (a graph kept from step to step). Now the call reads the data, as a dense allreduce does."""
    from gradwire.syncfree import device_paths

    data = torch.tensor([1.0, -3.0, 2.0, 0.5])
    want_res = torch.zeros(4)
    want = sparse_allreduce(data.clone(), want_res, 2, method)
    x, residual = data.clone().requires_grad_(), torch.zeros(4)
    with device_paths() if device_path else contextlib.nullcontext():
        got = sparse_allreduce(x, residual, 2, method)
        assert sparse_allreduce(x, torch.zeros(4), 2, method, out=x) is x  # written over x
    assert torch.equal(got, want) and torch.equal(residual, want_res)
    assert residual.grad_fn is None and not residual.requires_grad
    residual = torch.zeros(4)
    results = simulate([data.clone().requires_grad_()], [residual], 2, method)
    assert torch.equal(results[0].average(), want) and residual.grad_fn is None


def test_device_paths_blocks_may_overlap_across_threads():
    """A thread leaving its device_paths() block once switched the host path back on for every
    other thread still inside a block of its own."""
    import threading

    from gradwire.syncfree import device_paths, on_host

    t, seen = torch.zeros(1), []
    entered, left = threading.Event(), threading.Event()

    def other() -> None:
        with device_paths():
            entered.set()
            left.wait(10)
            seen.append(on_host(t))

    with device_paths():
        thread = threading.Thread(target=other)
        thread.start()
        assert entered.wait(10)
    left.set()
    thread.join(10)
    assert seen == [False] and on_host(t)


@pytest.mark.parametrize("kw, says", [
    ({"k": 2.5}, "k (entries per rank) must be an integer >= 0, got 2.5"),
    ({"k": None}, "k (entries per rank) must be an integer >= 0, got None"),
    ({"k": -1}, "k (entries per rank) must be an integer >= 0, got -1"),
    ({"numel": -5}, "numel must be an integer >= 0, got -5"),
    ({"dtype": torch.int32}, "dtype must be a float torch.dtype, got torch.int32"),
])
@pytest.mark.parametrize("method", ["topk", "gtopk"])
def test_schedule_arguments_are_checked(kw, says, method):
    """k = 2.5 once costed 2.5 entries (20 bytes and a status byte), k = -1 failed as "element
    count must be >= 0, got -7", k = None with a TypeError."""
    args = {"numel": 100, "k": 3, "dtype": torch.float32, **kw}
    with pytest.raises(GradwireError) as e:
        estimate(method, 4, args["numel"], args["k"], TABLE1, args["dtype"])
    assert says in str(e.value) and "\n" not in str(e.value)
