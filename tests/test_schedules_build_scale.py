"""Schedules built as arrays at any world size: lp, dbtree, ps and scatter_ag made their
transfers one Transfer at a time and round-tripped them through lists (lp's allreduce of 4 MiB
on 4096 ranks took 39 s and 3.5 GB, scatter_ag's broadcast over a minute); their table
builders give exactly the transfers of that construction, kept here as the reference. No
schedule has more than MAX_TRANSFERS transfers: one that would is refused in one line before
any is made, and a block or pipeline chosen for the user fits."""
import signal
import tracemalloc
from contextlib import contextmanager
from functools import partial

import numpy as np
import pytest
from conftest import one_line_raised
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.schedules import dbtree, ir, lp, ps, registry, ring
from gradwire.schedules.ir import Table, Transfer, blocks, build, split
from gradwire.schedules.scatter_allgather import scatter_steps

MAX_TRANSFERS = 2 * 4095 * 4096  # ir.MAX_TRANSFERS (held below), named here for the messages


# The construction the table builders replace, one Transfer at a time -----------------------
def _merge_steps(*phases):
    n = max((len(ph) for ph in phases), default=0)
    return [[t for ph in phases if i < len(ph) for t in ph[i]] for i in range(n)]


def _pieces(count, block, start=0):
    return [(s, min(block, start + count - s)) for s in range(start, start + count, block)]


def _chain_steps(chain, parts, op, delay=0):
    links = len(chain) - 1
    steps = [[] for _ in range(delay + links + len(parts))]
    for i in range(links):
        for j, (start, size) in enumerate(parts):
            steps[delay + i + j].append(Transfer(chain[i], chain[i + 1], start, size, op))
    return steps


def _lp(collective, p, count, root, block, alpha, beta):
    if collective == "allreduce":
        b = lp.pick_block(count, max(p - 2, 1), block, alpha, beta, 4)
        parts = _pieces(count, b)
        steps = _merge_steps(_chain_steps(list(reversed(range(p))), parts, "sum"),
                             _chain_steps(list(range(p)), parts, "copy", delay=p - 1))
        return build("lp", "allreduce", p, count, steps, block=b)
    b = lp.pick_block(count, p - 2, block, alpha, beta, 4)
    chain = [(root + i) % p for i in range(p)]
    if collective == "reduce":
        chain = chain[::-1]
    op = "sum" if collective == "reduce" else "copy"
    return build("lp", collective, p, count, _chain_steps(chain, _pieces(count, b), op),
                 root=root, block=b)


def _tree_steps(parent, parts):
    height, depth = dbtree.heights(parent)
    top = max(height)
    steps = [[] for _ in range(2 * top + len(parts))]
    for r, up in enumerate(parent):
        if up < 0:
            continue
        for j, (start, size) in enumerate(parts):
            steps[height[r] + j].append(Transfer(r, up, start, size, "sum"))
            steps[top + depth[up] + j].append(Transfer(up, r, start, size))
    return steps


def _dbtree(p, count, block, alpha, beta, sndbuf):
    trees = dbtree.two_trees(p)
    halves = blocks(count, 2)
    fill = max(dbtree.heights(trees[0])[0]) / 2 if p > 2 else 0
    b = lp.pick_block(halves[0][1], fill, block, alpha, beta, 4, sndbuf,
                      of=f" (each half of {count})")
    steps = _merge_steps(*(_tree_steps(t, _pieces(n, b, start))
                           for t, (start, n) in zip(trees, halves, strict=True)))
    return build("dbtree", "allreduce", p, count, steps, block=b)


def _ps(p, count, servers, sharding, tensor_sizes):
    pieces = ps.shards(count, servers, sharding, tensor_sizes)
    push = [Transfer(w, s, start, size, "sum") for s, start, size in pieces
            for w in range(p) if w != s]
    pull = [Transfer(s, w, start, size) for s, start, size in pieces for w in range(p) if w != s]
    return build("ps", "allreduce", p, count, [push, pull], servers=servers, sharding=sharding)


def _scatter_ag(p, count, root):
    chunks = [split(c0, cn, 1) for c0, cn in blocks(count, p)]
    ring_steps = [[Transfer(r, (r + 1) % p, start, n) for r in range(p)
                   for start, n in chunks[(r - root - i) % p]] for i in range(p - 1)]
    return build("scatter_ag", "broadcast", p, count, scatter_steps(p, count, root) + ring_steps,
                 root=root)


def _same(collective, name, old, p, count, root, params):
    """The registry's schedule and the algorithm's table builder both give ``old``."""
    new = registry.schedule(collective, name, p, count, root, **params)
    assert new == old and new.params == old.params
    a = registry.get(collective, name)
    assert a.table is not None, f"{collective} {name} has no table builder"
    t, want = a.table(p, count, root=root, **params), Table.of(old)
    for col in ("step", "src", "dst", "start", "size", "reduces"):
        got, ref = getattr(t, col), getattr(want, col)
        assert got.dtype == ref.dtype and np.array_equal(got, ref), col
    assert t.world_size == p and t.count == count


# Exactly the old transfers ------------------------------------------------------------------
@given(p=st.integers(1, 24), count=st.integers(0, 400), block=st.none() | st.integers(1, 60),
       root=st.integers(0, 23), alpha=st.sampled_from([1e-6, 5e-5, 1e-3]),
       collective=st.sampled_from(["allreduce", "broadcast", "reduce"]))
@settings(max_examples=120, deadline=None)
def test_lp_tables_give_the_old_transfers(p, count, block, root, alpha, collective):
    root = 0 if collective == "allreduce" else root % p
    old = _lp(collective, p, count, root, block, alpha, 8e-9)
    params = {"alpha": alpha, "beta": 8e-9} if block is None else {"block": block}
    _same(collective, "lp", old, p, count, root, params)


@given(p=st.integers(1, 40), count=st.integers(0, 600), block=st.none() | st.integers(1, 60),
       sndbuf=st.none() | st.integers(4, 400))
@settings(max_examples=80, deadline=None)
def test_dbtree_table_gives_the_old_transfers(p, count, block, sndbuf):
    old = _dbtree(p, count, block, 1e-4, 8e-9, sndbuf)
    params = {"alpha": 1e-4, "beta": 8e-9, "sndbuf": sndbuf}
    if block is not None:
        params["block"] = block
    _same("allreduce", "dbtree", old, p, count, 0, params)


@given(p=st.integers(1, 20), sizes=st.lists(st.integers(0, 30), max_size=12),
       servers=st.integers(1, 20), roundrobin=st.booleans())
@settings(max_examples=80, deadline=None)
def test_ps_table_gives_the_old_transfers(p, sizes, servers, roundrobin):
    servers = min(servers, p)
    count = sum(sizes) if roundrobin else 7 * len(sizes)
    params = ({"sharding": "roundrobin", "tensor_sizes": tuple(sizes)} if roundrobin
              else {"sharding": "even"})
    old = _ps(p, count, servers, params["sharding"], params.get("tensor_sizes"))
    _same("allreduce", "ps", old, p, count, 0, {"servers": servers, **params})


@given(p=st.integers(1, 33), count=st.integers(0, 300), root=st.integers(0, 32))
@settings(max_examples=80, deadline=None)
def test_scatter_ag_table_gives_the_old_transfers(p, count, root):
    root %= p
    _same("broadcast", "scatter_ag", _scatter_ag(p, count, root), p, count, root, {})


@pytest.mark.parametrize(("p", "count", "block"), [(64, 2000, 7), (100, 3001, 50), (37, 999, 1)])
def test_longer_pipelines_give_the_old_transfers(p, count, block):
    """Steps where many links and many blocks overlap (the diagonals of a long pipeline)."""
    for collective in ("allreduce", "broadcast", "reduce"):
        root = 0 if collective == "allreduce" else p // 3
        _same(collective, "lp", _lp(collective, p, count, root, block, 0, 1), p, count, root,
              {"block": block})
    _same("allreduce", "dbtree", _dbtree(p, count, block, 0, 1, None), p, count, 0,
          {"block": block})


# At most MAX_TRANSFERS, refused before any is made --------------------------------------------
@contextmanager
def at_most(seconds):
    """Fail a body that runs past ``seconds``: a refusal made before building is instant,
    where building the transfers would take minutes."""
    def late(*_):
        raise AssertionError(f"still running after {seconds} s: the schedule was being built")

    old = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_max_transfers_is_the_ring_at_max_world():
    p = registry.MAX_WORLD
    assert ir.MAX_TRANSFERS == MAX_TRANSFERS == 2 * (p - 1) * p
    assert len(registry.table("allreduce", "ring", 16, 160, cached=False).step) == 2 * 15 * 16


@pytest.mark.parametrize(("collective", "name", "p", "count", "params", "needles"), [
    ("allreduce", "lp", 4096, 2**20, {"block": 64},
     ["allreduce lp on 4096 ranks", "134,184,960 transfers", "block >= 256"]),
    ("broadcast", "lp", 4096, 2**20, {"block": 64},
     ["broadcast lp on 4096 ranks", "67,092,480 transfers", "block >= 128"]),
    ("reduce", "lp", 3000, 2**14, {"block": 1},
     ["reduce lp on 3000 ranks", "49,135,616 transfers", "block >= 2"]),
    ("allreduce", "dbtree", 1024, 2**20, {"block": 32},
     ["allreduce dbtree on 1024 ranks", "67,043,328 transfers", "block >= 64"]),
    ("allreduce", "ps", 2048, 2**14, {"servers": 4, "sharding": "roundrobin",
                                      "tensor_sizes": (1,) * 2**14},
     ["allreduce ps on 2048 ranks", "67,076,096 transfers", "fewer tensors"]),
])
def test_a_schedule_past_max_transfers_is_refused_before_it_is_built(collective, name, p, count,
                                                                     params, needles):
    """Each of these is accepted by every other bound (blocks at most MAX_BLOCKS, tensors at
    most MAX_BLOCKS) and was built for minutes, into gigabytes."""
    with at_most(3):
        for make in (registry.schedule, registry.table):
            one_line_raised(partial(make, collective, name, p, count, **params), *needles,
                            f"at most {MAX_TRANSFERS:,}")


def test_every_command_that_builds_the_schedule_refuses_it_first():
    """The cost model, the simulator and bench all build through the registry, so each is
    refused in one line before any transfer is made, where each built for minutes."""
    from gradwire.bench.spec import check_schedules, parse_spec
    from gradwire.perf import comm
    from gradwire.sim import trace as tr
    from gradwire.sim.cluster import SimCluster
    from gradwire.sim.mechanisms import parse

    needles = ("allreduce lp on 4096 ranks", "134,184,960 transfers", "block >= 256")
    mechanism = parse(f"lp:block=64:bucket={4 * 2**20}")
    bucket = tr.synthetic("m", [4 * 2**20], 0.01, 0.02)  # one bucket of 2**20 floats
    with at_most(5):
        one_line_raised(partial(comm.bytes_sent, "allreduce", "lp", 4096, 2**20, 4, block=64),
                        *needles)
        one_line_raised(partial(mechanism.run, bucket, SimCluster(4096, 1e9, iterations=1),
                                False), *needles)
        one_line_raised(partial(check_schedules, "allreduce",
                                [parse_spec("allreduce", "lp:block=64")], {}, 4096, [2**20], 4),
                        "algorithm 'lp:block=64'", *needles)


def test_a_ring_pipeline_past_max_transfers_is_refused_before_it_is_built():
    """pipeline=8 at 4096 ranks passed max_pipeline (8 a chunk) and made 268 M transfers."""
    assert ring.max_pipeline(4096) == 1 and ring.max_pipeline(1024) == 16
    with at_most(3):
        one_line_raised(partial(registry.table, "allreduce", "ring", 4096, 8 * 4096,
                                pipeline=8),
                        "pipeline=8", "at most 1 at p=4096", f"{MAX_TRANSFERS:,} transfers")


@pytest.mark.parametrize(("p", "per_block"), [(4096, 2 * 4095), (2048, 2 * 2047), (4096, 4095)])
def test_a_chosen_block_keeps_within_max_transfers(p, per_block):
    """b* for 256 MiB at 4096 ranks cuts 13 261 blocks, 108 M transfers in an allreduce; the
    chosen block is raised to fit (as it is to cut at most MAX_BLOCKS), a given one refused
    (above). Up to 1024 ranks nothing changes."""
    count = 2**26
    most = lp.most_blocks(per_block)
    assert most * per_block <= MAX_TRANSFERS < (most + 1) * per_block
    b = lp.pick_block(count, p - 2, None, lp.ALPHA, lp.BETA, 4, most=most)
    assert -(-count // b) <= most
    assert -(-count // lp.pick_block(count, p - 2, None, lp.ALPHA, lp.BETA, 4)) > most
    assert lp.most_blocks(2 * 1023) == lp.most_blocks(4 * 511) == lp.MAX_BLOCKS


# Made as arrays: memory and time in proportion to the transfers -----------------------------
@pytest.mark.parametrize(("collective", "name", "p", "count"), [
    ("allreduce", "lp", 512, 2**18), ("broadcast", "lp", 512, 2**18),
    ("allreduce", "dbtree", 512, 2**22), ("broadcast", "scatter_ag", 512, 2**18),
    ("allreduce", "ps", 512, 2**18),
])
def test_tables_are_made_without_a_transfer_object_each(collective, name, p, count):
    """At most ~100 bytes a transfer at the peak (the columns are 41), where a Transfer each
    and their lists took 270–400 (3.5 GB for lp's 13.6 M at 4096 ranks)."""
    params = {"servers": p} if name == "ps" else {}
    tracemalloc.start()
    try:
        with at_most(10):
            t = registry.table(collective, name, p, count, cached=False, **params)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(t.step) > 100_000
    assert peak / len(t.step) < 100, peak / len(t.step)
