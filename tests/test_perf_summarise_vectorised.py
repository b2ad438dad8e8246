"""comm.summarise deduplicates a block of steps at once (a sort of each step's row hashes) and
gives, to the bit, what the step-by-step version below gives: the same groups in the same
order, the same rows in the same order, the same multiplicities."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.perf import comm
from gradwire.schedules import registry
from gradwire.schedules.ir import Table

# The step-by-step summarise, kept as the reference --------------------------------------------


def _reference_hash(rows: np.ndarray) -> np.ndarray:
    h = rows[:, 0] * comm._HASH[0]
    for j in range(1, rows.shape[1]):
        h = h + rows[:, j] * comm._HASH[j]
    return h


def _reference_summarise(t: Table, ranks_per_node: int = 1) -> comm.Summary:
    p = t.world_size
    g = max(1, min(ranks_per_node, p))
    node = np.arange(p) // g
    n_steps = int(t.step[-1]) + 1 if len(t.step) else 0
    block = max(1, comm._BLOCK_ROWS // max(p, 1))
    edges = np.searchsorted(t.step, np.arange(0, n_steps + block, block))
    seen: dict[bytes, list] = {}
    for b, lo in enumerate(range(0, n_steps, block)):
        k = min(block, n_steps - lo)
        part = slice(edges[b], edges[b + 1])
        rows = _reference_rows(t, part, lo, k, node, g)
        alike = (rows == rows[:, :1]).all(axis=(1, 2))
        for i in range(k):
            r = rows[i]
            if alike[i]:
                r = r[:1]
            else:
                _, first = np.unique(_reference_hash(r), return_index=True)
                r = r[first]
            key = r.tobytes()
            if key in seen:
                seen[key][0] += 1
            else:
                seen[key] = [1, r]
    return comm.Summary(t.count, tuple((m, r) for m, r in seen.values()))


def _reference_rows(t: Table, part: slice, first: int, k: int, node: np.ndarray, g: int
                    ) -> np.ndarray:
    p, nodes = len(node), int(node[-1]) + 1
    step = t.step[part] - first
    src, dst, n, red = t.src[part], t.dst[part], t.size[part], t.reduces[part]
    intra = node[src] == node[dst]

    def per(index: np.ndarray, weights: np.ndarray, width: int) -> np.ndarray:
        return np.bincount(step * width + index, weights, k * width).reshape(k, width)

    ni, ne = n * intra, n * ~intra
    m_out_e, m_in_e = per(src, ~intra, p), per(dst, ~intra, p)
    b_out_e, b_in_e = per(node[src], ne, nodes), per(node[dst], ne, nodes)
    if g == 1:
        top_out, top_in = m_out_e, m_in_e
    else:
        pad = ((0, 0), (0, nodes * g - p))
        top_out = np.pad(m_out_e, pad).reshape(k, nodes, g).max(axis=2)
        top_in = np.pad(m_in_e, pad).reshape(k, nodes, g).max(axis=2)
    return np.stack([per(src, intra, p), per(src, ni, p), per(dst, intra, p), per(dst, ni, p),
                     top_out[:, node], b_out_e[:, node], top_in[:, node], b_in_e[:, node],
                     per(dst, n * red, p)], axis=2)


# ----------------------------------------------------------------------------------------------


def _assert_identical(got: comm.Summary, want: comm.Summary) -> None:
    """The same count, groups in the same order, each the same multiplicity and the same
    rows (shape and bits) in the same order; ``got``'s rows float64. (The reference's rows
    of a block with no transfers are int64 zeros, numpy's bincount of nothing: the same
    bits.)"""
    assert got.count == want.count
    assert [m for m, _ in got.groups] == [m for m, _ in want.groups]
    for (_, r), (_, q) in zip(got.groups, want.groups, strict=True):
        assert (r.dtype, r.shape) == (np.float64, q.shape)
        assert r.tobytes() == q.tobytes()


def _params(name: str, p: int, count: int, draw) -> dict:
    """Parameters of algorithm ``name`` that change its schedule, drawn where it has them
    (a block of at most 1000 per count: lp refuses more than 16384 blocks)."""
    if name == "ring":
        return {"pipeline": draw(st.integers(1, 3))}
    if name in ("lp", "dbtree"):
        block = draw(st.none() | st.integers(1, 40).map(lambda b: b + count // 1000))
        return {} if block is None else {"block": block}
    if name == "ps":
        return {"servers": draw(st.integers(1, p))}
    return {}


@settings(max_examples=300, deadline=None)
@given(algo=st.sampled_from(registry.algorithms()), p=st.integers(1, 40),
       count=st.integers(0, 3000) | st.sampled_from([1 << 12, 1 << 16]),
       ranks_per_node=st.integers(1, 45), data=st.data())
def test_summarise_is_the_step_by_step_summary_of_every_algorithm(algo, p, count,
                                                                  ranks_per_node, data):
    params = _params(algo.name, p, count, data.draw)
    t = registry.table(algo.collective, algo.name, p, count, cached=False, **params)
    _assert_identical(comm.summarise(t, ranks_per_node), _reference_summarise(t, ranks_per_node))


@st.composite
def _tables(draw) -> Table:
    """Any transfers: steps with gaps and none, ranks sending to themselves, few sizes (so
    that ranks in a step often hold equal rows, and some differ)."""
    p = draw(st.integers(1, 12))
    n = draw(st.integers(0, 60))
    step = np.sort(np.array(draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)),
                            dtype=np.int64))
    ranks = st.lists(st.integers(0, p - 1), min_size=n, max_size=n)
    src, dst = (np.array(draw(ranks), dtype=np.int64) for _ in range(2))
    size = np.array(draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)), dtype=np.int64)
    reduces = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    return Table(p, 100, step, src, dst, np.zeros(n, dtype=np.int64), size, reduces)


@settings(max_examples=300, deadline=None)
@given(t=_tables(), ranks_per_node=st.integers(1, 13), block_rows=st.integers(1, 40))
def test_summarise_is_the_step_by_step_summary_of_any_transfers(t, ranks_per_node, block_rows):
    # Blocks of a few steps (or one) as at large P: groups span blocks as they span steps.
    with mock.patch.object(comm, "_BLOCK_ROWS", block_rows):
        _assert_identical(comm.summarise(t, ranks_per_node),
                          _reference_summarise(t, ranks_per_node))


def test_rows_are_floats_where_a_block_has_no_transfers():
    # one step a block, and none in step 0
    t = Table(2, 10, *(np.array([v]) for v in (1, 0, 1, 0, 10)), np.array([False]))
    with mock.patch.object(comm, "_BLOCK_ROWS", 2):
        s = comm.summarise(t)
    assert [(m, r.dtype) for m, r in s.groups] == [(1, np.float64), (1, np.float64)]


@pytest.mark.parametrize(("collective", "name", "p", "count", "ranks_per_node", "params"), [
    ("allreduce", "lp", 512, 1 << 20, 1, {}),
    ("allreduce", "lp", 512, 1 << 20, 8, {}),
    ("broadcast", "scatter_ag", 512, 1 << 20, 1, {}),
    ("allreduce", "dbtree", 512, 1 << 20, 4, {}),
    ("allreduce", "ring", 256, 1 << 20, 1, {"pipeline": 2}),
    ("allreduce", "ring", 300, 12345, 7, {"pipeline": 1}),
    ("allreduce", "ps", 300, 12345, 1, {"servers": 7}),
])
def test_summarise_is_the_step_by_step_summary_at_large_p(collective, name, p, count,
                                                           ranks_per_node, params):
    t = registry.table(collective, name, p, count, cached=False, **params)
    _assert_identical(comm.summarise(t, ranks_per_node), _reference_summarise(t, ranks_per_node))
