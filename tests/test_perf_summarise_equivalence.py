"""comm.summarise, and the ring summaries that share its dedupe (comm._distinct), give what
the step-by-step code before fa15c5c gave (the reference in test_perf_summarise_vectorised.py,
the old dedupe below): the same groups in the same order, each with the same multiplicity and
the same rows, to the bit.

Drawn over every algorithm of the registry with the parameters that change its schedule
(op, itemsize, a block or the figures that choose one, servers and sharding), P from 1,
ranks per node from none to more than P, blocks of a few steps (as at large P), and over
raw tables with empty steps, self-sends and a transfer repeated within a step.

The one difference allowed: the old rows of a block with no transfers were int64 zeros
(numpy's bincount of nothing), the new ones float64 zeros, the same bytes."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from test_perf_summarise_vectorised import _reference_hash, _reference_summarise

from gradwire.errors import GradwireError
from gradwire.perf import comm
from gradwire.schedules import registry
from gradwire.schedules.ir import Table

# The code before fa15c5c (src/gradwire/perf/comm.py), kept as the reference -----------------


def _old_distinct(rows: np.ndarray) -> np.ndarray | None:
    if (rows == rows[:1]).all():
        return rows[:1]
    _, first_of = np.unique(_reference_hash(rows), return_index=True)
    if len(np.unique(rows, axis=0)) != len(first_of):
        return None
    return rows[first_of]


# ----------------------------------------------------------------------------------------------


def _same(new: comm.Summary | None, old: comm.Summary | None) -> None:
    if old is None or new is None:
        assert new is old
        return
    assert new.count == old.count
    assert [m for m, _ in new.groups] == [m for m, _ in old.groups]
    for (_, r), (_, q) in zip(new.groups, old.groups, strict=True):
        assert r.dtype == np.float64 and r.shape == q.shape
        assert q.dtype == np.float64 or (q.dtype == np.int64 and not q.any()), q.dtype
        assert r.tobytes() == q.tobytes()


@st.composite
def _registry_tables(draw) -> Table:
    """A schedule of the registry, with parameters drawn where the algorithm takes them; a
    combination the registry refuses is rejected (so is the same refusal in both codes)."""
    a = draw(st.sampled_from(registry.algorithms()))
    p = draw(st.integers(1, 48))
    count = draw(st.integers(0, 3000) | st.sampled_from([1 << 12, 3 << 13, 1 << 16]))
    params: dict[str, object] = {}
    if registry.takes_op(a):
        params["op"] = draw(st.sampled_from(["sum", "copy", "max"]))
    if draw(st.booleans()):
        params["itemsize"] = draw(st.sampled_from([1, 2, 4, 8, 16]))
    known = registry.parameters(a)
    if "pipeline" in known:
        params["pipeline"] = draw(st.none() | st.integers(1, 4))
    if "block" in known:
        if draw(st.booleans()):
            params["block"] = draw(st.integers(1, 64)) + count // 1000
        else:
            params["alpha"] = draw(st.sampled_from([0.0, 1e-6, 5e-5, 1e-3]))
            params["beta"] = draw(st.sampled_from([1e-10, 1e-9, 1e-7]))
    if "sndbuf" in known and draw(st.booleans()):
        params["sndbuf"] = draw(st.integers(1, 4096))
    if "servers" in known:
        params["servers"] = draw(st.integers(1, p))
        if draw(st.booleans()) and count > 0:
            cuts = sorted(draw(st.lists(st.integers(0, count), max_size=6)))
            params["sharding"] = "roundrobin"
            params["tensor_sizes"] = [b - a for a, b in zip([0, *cuts], [*cuts, count],
                                                            strict=True)]
    try:
        return registry.table(a.collective, a.name, p, count, cached=False, **params)
    except GradwireError:
        reject()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(t=_registry_tables(), ranks_per_node=st.integers(-1, 60),
       block_rows=st.none() | st.integers(1, 200))
def test_summarise_gives_what_the_old_code_gave_for_registry_schedules(t, ranks_per_node,
                                                                       block_rows):
    rows = comm._BLOCK_ROWS if block_rows is None else block_rows
    with mock.patch.object(comm, "_BLOCK_ROWS", rows):
        _same(comm.summarise(t, ranks_per_node), _reference_summarise(t, ranks_per_node))


@st.composite
def _raw_tables(draw) -> Table:
    """Transfers as no builder makes them: empty steps (leading, inner, whole blocks), ranks
    sending to themselves, a (src, dst) pair repeated within a step, sizes that are equal (so
    rows often tie) or large (so hashes round)."""
    p = draw(st.integers(1, 10))
    pairs = draw(st.lists(st.tuples(st.integers(0, 12), st.integers(0, p - 1),
                                    st.integers(0, p - 1)), max_size=40))
    repeats = draw(st.lists(st.integers(1, 3), min_size=len(pairs), max_size=len(pairs)))
    pairs = sorted(x for x, n in zip(pairs, repeats, strict=True) for _ in range(n))
    n = len(pairs)
    size = draw(st.lists(st.sampled_from([1, 2, 3, 2**40 + 1, 2**53 - 1]), min_size=n,
                         max_size=n))
    reduces = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    step, src, dst = (np.array([x[j] for x in pairs], dtype=np.int64).reshape(-1)
                      for j in range(3))
    return Table(p, 100, step, src, dst, np.zeros(n, dtype=np.int64),
                 np.array(size, dtype=np.int64), np.array(reduces, dtype=bool))


@settings(max_examples=200, deadline=None)
@given(t=_raw_tables(), ranks_per_node=st.integers(0, 12), block_rows=st.integers(1, 30))
def test_summarise_gives_what_the_old_code_gave_for_any_transfers(t, ranks_per_node,
                                                                  block_rows):
    with mock.patch.object(comm, "_BLOCK_ROWS", block_rows):
        _same(comm.summarise(t, ranks_per_node), _reference_summarise(t, ranks_per_node))


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 40), count=st.integers(1, 2000), ranks_per_node=st.integers(1, 41),
       collective=st.sampled_from(["allreduce", "reducescatter", "allgather"]))
def test_the_ring_summaries_give_what_the_old_dedupe_gave(p, count, ranks_per_node,
                                                          collective):
    """ring_summary and ring_node_summary keep a step's rows by comm._distinct, which lost
    its shortcut for a step of equal rows."""
    phases = comm._ring_phases(collective, "ring", p, count, {"pipeline": 1})
    assert phases is not None
    one = comm.ring_summary.__wrapped__
    node = comm.ring_node_summary.__wrapped__
    new = one(p, count, phases), node(p, count, phases, ranks_per_node)
    with mock.patch.object(comm, "_distinct", _old_distinct):
        old = one(p, count, phases), node(p, count, phases, ranks_per_node)
    _same(new[0], old[0])
    _same(new[1], old[1])


def test_a_table_of_no_transfers_and_a_world_of_one():
    empty = Table(3, 0, *(np.zeros(0, dtype=np.int64) for _ in range(5)), np.zeros(0, bool))
    assert comm.summarise(empty).groups == () == _reference_summarise(empty).groups
    one = registry.table("allreduce", "ring", 1, 100, cached=False)
    _same(comm.summarise(one, 4), _reference_summarise(one, 4))
