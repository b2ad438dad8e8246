"""Pipelined and sharded schedules: LP, scatter + allgather, double binary tree, parameter server.

Their closed forms (module docstrings) held against the cost model, their
non-default parameters checked on tokens, and the claims the docstrings make about block choice
and large-message behaviour."""
import math

import numpy as np
import pytest
import torch

import gradwire.collectives as gc
from gradwire.collectives import api
from gradwire.errors import GradwireError
from gradwire.schedules import dbtree, lp, ps, registry, scatter_allgather
from gradwire.schedules.check import check
from gradwire.schedules.cost import CostParams, cost, traffic
from gradwire.transport import Transport

A, B, G = 1e-4, 8e-9, 1e-9
P = CostParams(A, B, G)
SIZES = [0, 1, 2, 3, 5, 7, 13, 16, 24, 32, 64, 1000]


def lg(p: int) -> int:
    return (p - 1).bit_length()  # ⌈lg p⌉


def close(s, want: float) -> None:
    assert cost(s, P, 4) == pytest.approx(want, rel=1e-12, abs=1e-15)


# LP -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize("block,k", [(1, 1), (64, 7), (5040, 3), (1000, 40)])
def test_lp_broadcast_and_reduce_closed_forms(p, block, k):
    b = 4 * block
    for root in {0, p - 1}:
        close(lp.broadcast(p, block * k, root=root, block=block), (p - 2 + k) * (A + b * B))
        close(lp.reduce(p, block * k, root=root, block=block), (p - 2 + k) * (A + b * (B + G)))


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize("block", [1, 64, 5040])
def test_lp_allreduce_closed_form(p, block):
    b = 4 * block
    for k in sorted({max(2 * p - 3, 1), 2 * p, 50}):
        n = block * k
        want = ((k + 1) * (A + b * B) + 4 * n * G if p == 2 else
                2 * (k + p - 2) * (A + b * B) + (k + p - 3) * b * G)
        close(lp.allreduce(p, n, block=block), want)


@pytest.mark.parametrize("p", [3, 4, 8, 17])
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_lp_auto_block_is_b_star(p, itemsize):
    for n in (10, 1000, 1 << 20):
        want = max(1, min(n, round(math.sqrt(n * itemsize * A / ((p - 2) * B)) / itemsize)))
        for build in (lp.broadcast, lp.reduce, lp.allreduce):
            assert build(p, n, alpha=A, beta=B, itemsize=itemsize).params["block"] == want
    assert lp.broadcast(2, 1000).params["block"] == 1000  # no fill to amortise: one block


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_lp_allreduce_auto_block_is_near_optimal(p):
    n = 1 << 20
    s = lp.allreduce(p, n, alpha=A, beta=B)
    best = min(cost(lp.allreduce(p, n, block=int(s.params["block"] * f)), P, 4)
               for f in (0.5, 0.7, 1.4, 2))
    assert cost(s, P, 4) <= best


def test_lp_broadcast_tends_to_n_beta_whatever_p():
    n = 1 << 26  # elements: 256 MiB of fp32
    t = {p: cost(lp.broadcast(p, n, alpha=A, beta=B), P, 4) for p in (4, 8, 16)}
    assert 4 * n * B < t[8] < 1.05 * 4 * n * B
    assert t[16] < 1.05 * t[4]  # (√(dα) + √(nβ))²: the fill d = p − 2 barely shows


def test_lp_broadcast_beats_binomial_for_64_mib():
    p, n = 8, 16 << 20  # 64 MiB of fp32
    params = CostParams(100e-6, 8e-9)
    binomial = lg(p) * (params.alpha + 4 * n * params.beta)
    assert binomial / cost(lp.broadcast(p, n, alpha=100e-6, beta=8e-9), params, 4) >= 1.8


def test_lp_rejects_bad_block():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(GradwireError, match="block must be an int >= 1"):
            lp.broadcast(4, 100, block=bad)
    with pytest.raises(GradwireError, match="beta > 0"):
        lp.broadcast(4, 100, beta=0)


def test_pipelines_cut_at_most_max_blocks():
    """A block that would cut the buffer into more than MAX_BLOCKS messages per link is refused
    in one line when given, and b* is raised to the smallest block within it when chosen."""
    n = lp.MAX_BLOCKS * 3 + 1
    with pytest.raises(GradwireError, match=f"block=3 cuts {n} elements into "
                       f"{lp.MAX_BLOCKS + 1} blocks, .* so block >= 4 here"):
        lp.broadcast(4, n, block=3)
    with pytest.raises(GradwireError, match="block >= 4 here"):
        dbtree.allreduce(4, 2 * n, block=3)
    assert lp.broadcast(4, n, block=4).params["block"] == 4
    # α tiny against β: b* would be a block of 1, a message per element
    for build in (lp.broadcast, lp.reduce, lp.allreduce):
        assert build(8, n, alpha=1e-12, beta=B).params["block"] == 4
    assert dbtree.allreduce(8, 2 * n, alpha=1e-12, beta=B).params["block"] == 4


@pytest.mark.parametrize("alpha,beta", [(1e303, B), (A, 1e-320), (1.0, 5e-324)])
def test_a_block_past_any_float_is_one_block(alpha, beta):
    """b* = √(nα/(dβ)) overflowed to inf for a huge α or a tiny β (an OverflowError from
    round()): it is then the whole buffer, as b* is at any finite α/β that large."""
    for collective, algo in (("broadcast", "lp"), ("reduce", "lp"), ("allreduce", "lp"),
                             ("allreduce", "dbtree")):
        s = registry.schedule(collective, algo, 5, 1000, alpha=alpha, beta=beta)
        assert s.params["block"] == (500 if algo == "dbtree" else 1000)
        check(s)


def test_api_builds_with_the_buffers_itemsize(monkeypatch):
    seen = []
    real = registry.schedule

    def spy(*args, **params):
        seen.append(params)
        return real(*args, **params)

    monkeypatch.setattr(api.registry, "schedule", spy)
    class Alone(Transport):  # one rank of the default group: nothing is sent
        rank, world_size, backend, group = 0, 1, "gloo", None
        _device_type = "cpu"  # what gloo sends from

        def __init__(self) -> None:
            pass

    alone = Alone()
    for dtype, size in ((torch.float16, 2), (torch.float64, 8)):
        gc.broadcast(torch.zeros(10, dtype=dtype), algo="lp", transport=alone)
        assert seen[-1]["itemsize"] == size
    gc.broadcast(torch.zeros(10), algo="lp", transport=alone, itemsize=3)
    assert seen[-1]["itemsize"] == 3


# scatter + allgather --------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17, 32])
def test_scatter_allgather_closed_form(p):
    for n in (p * 5040, p * 65536):
        for root in {0, p // 2, p - 1}:
            close(scatter_allgather.broadcast(p, n, root=root),
                  (lg(p) + p - 1) * A + 2 * (p - 1) / p * 4 * n * B)


@pytest.mark.parametrize("p", [2, 5, 8])
def test_scatter_then_ring(p):
    s = scatter_allgather.broadcast(p, p * 10, root=1)
    assert len(s.steps) == lg(p) + p - 1
    ring = [{(t.src, t.dst) for t in st.transfers} for st in s.steps[lg(p):]]
    assert all(pairs == {(r, (r + 1) % p) for r in range(p)} for pairs in ring)
    assert traffic(s, 4).bytes_sent.sum(1)[1] == 4 * (p - 1) * 10 * 2  # scatter + ring


# double binary tree -----------------------------------------------------------------------------
@pytest.mark.parametrize("p", range(1, 18))
def test_dbtree_trees_are_complementary_binary_trees(p):
    for parent in dbtree.two_trees(p):
        assert parent.count(-1) == 1
        assert all(parent.count(r) <= 2 for r in range(p))
        assert max(dbtree.heights(parent)[0]) == p.bit_length() - 1  # ⌊lg p⌋
    leaves = [{r for r in range(p) if r not in parent} for parent in dbtree.two_trees(p)]
    assert leaves[0] & leaves[1] == ({0} if p % 2 else set())  # p odd: p + 1 leaves in all


@pytest.mark.parametrize("p", range(1, 18))
def test_dbtree_and_lp_pipelines_on_tokens(p):
    for n in SIZES:
        for block in (1, 2, 3, 7):
            check(dbtree.allreduce(p, n, block=block))
            check(lp.allreduce(p, n, block=block))
            for root in {0, p - 1}:
                check(lp.broadcast(p, n, root=root, block=block))
                check(lp.reduce(p, n, root=root, block=block))


def test_dbtree_two_ranks_is_one_exchange_each_way():
    n = 2 * 5040
    close(dbtree.allreduce(2, n), 2 * A + 4 * n * B + 4 * n / 2 * G)


@pytest.mark.parametrize("p", [2, 3, 4, 7, 8, 13])
def test_dbtree_sends_only_along_tree_edges(p):
    edges = {e for parent in dbtree.two_trees(p) for r, up in enumerate(parent) if up >= 0
             for e in ((r, up), (up, r))}
    tr = traffic(dbtree.allreduce(p, 1000, block=7), 4)
    assert {(i, j) for i in range(p) for j in range(p) if tr.bytes_sent[i, j]} == edges


@pytest.mark.parametrize("p", [3, 4, 5, 7, 8, 13, 16, 17, 32])
def test_dbtree_tends_to_twice_n_beta(p):
    """Large n: above the allreduce lower bound, and tending to at most 2nβ + nγ (p/(p−1) times
    the lower bound's bandwidth terms): within 5 % of it at 256 MiB."""
    ratios = []
    for n in (1 << 22, 1 << 26):
        nb = 4 * n
        t = cost(dbtree.allreduce(p, n, alpha=A, beta=B), P, 4)
        assert t >= lg(p) * A + (p - 1) / p * nb * (2 * B + G)
        ratios.append(t / (nb * (2 * B + G)))
    assert ratios[1] < ratios[0]
    assert ratios[1] < 1.05


@pytest.mark.parametrize("p", [3, 4, 8])
def test_dbtree_auto_block_is_capped_by_the_send_buffer(p):
    """An auto-chosen block is at most ``sndbuf`` bytes (a rank sends into both trees at once);
    an explicit block, a buffer bigger than b* and P ≤ 2 keep their blocks."""
    n, big = 1 << 24, dbtree.allreduce(p, 1 << 24, alpha=2e-4, beta=B)
    assert big.params["block"] * 4 > 500_000  # b* here is more than the buffer
    capped = dbtree.allreduce(p, n, alpha=2e-4, beta=B, sndbuf=500_000)
    assert capped.params["block"] == 125_000
    assert dbtree.allreduce(p, n, alpha=2e-4, beta=B, sndbuf=500_000,
                            itemsize=2).params["block"] == 250_000
    assert dbtree.allreduce(p, n, alpha=2e-4, beta=B, sndbuf=1 << 30).params == big.params
    assert dbtree.allreduce(p, n, block=4096, sndbuf=1000).params["block"] == 4096
    check(dbtree.allreduce(p, 1000, alpha=2e-4, beta=B, sndbuf=8))  # blocks of 2 elements
    assert (dbtree.allreduce(2, n, sndbuf=8).params
            == dbtree.allreduce(2, n).params)  # one block per half


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "1M"])
def test_dbtree_rejects_a_bad_send_buffer(bad):
    with pytest.raises(GradwireError, match="sndbuf must be an int >= 1"):
        dbtree.allreduce(4, 100, sndbuf=bad)


# parameter server ---------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8, 12, 17])
def test_ps_even_closed_form(p):
    for servers in sorted({1, 2, 3, p} & set(range(1, p + 1))):
        for n in (servers * 5040, servers * 65536):
            shard = 4 * n / servers
            close(ps.allreduce(p, n, servers=servers),
                  2 * (p - 1) * (A + shard * B) + (p - 1) * shard * G)


def test_ps_push_step_is_set_by_the_server():
    # p = 4, S = 2: a server receives 3 shards (and sends 1); a plain worker sends 2.
    s = registry.schedule("allreduce", "ps", 4, 2000, servers=2)
    shard = 4 * 1000
    push = cost(type(s)(s.algo, s.collective, 4, s.count, s.steps[:1]), P, 4)
    assert push == pytest.approx(3 * (A + shard * B) + 3 * shard * G, rel=1e-12)


def test_ps_roundrobin_places_whole_tensors():
    assert ps.shards(10, 2, "roundrobin", (3, 4, 0, 2, 1)) == [
        (0, 0, 3), (1, 3, 4), (0, 7, 0), (1, 7, 2), (0, 9, 1)]
    assert ps.shards(10, 3) == [(0, 0, 4), (1, 4, 3), (2, 7, 3)]
    s = registry.schedule("allreduce", "ps", 5, 10, servers=2, sharding="roundrobin",
                          tensor_sizes=(3, 4, 2, 1))
    assert {(t.dst, t.start, t.count) for t in s.steps[0].transfers} == {
        (0, 0, 3), (1, 3, 4), (0, 7, 2), (1, 9, 1)}
    assert len(s.steps[0].transfers) == 4 * 4  # 4 tensors, each from 4 workers
    # sizes as a list (what a user has at hand) give the same schedule
    assert registry.schedule("allreduce", "ps", 5, 10, servers=2, sharding="roundrobin",
                             tensor_sizes=[3, 4, 2, 1]) is s
    # and so do numpy's integers, which the registry takes as integers (ps refused them,
    # saying they were not element counts)
    # (built afresh: the registry's cache holds them equal to the ints above)
    assert ps.allreduce(5, 10, servers=2, sharding="roundrobin",
                        tensor_sizes=[np.int64(n) for n in (3, 4, 2, 1)]).steps == s.steps


@pytest.mark.parametrize("p", range(1, 18))
def test_ps_variants_on_tokens(p):
    for n in SIZES:
        for servers in {1, (p + 1) // 2, p}:
            check(ps.allreduce(p, n, servers=servers))
            sizes = (n // 3, 0, n - n // 3 - 1, 1) if n else ()
            check(ps.allreduce(p, n, servers=servers, sharding="roundrobin",
                               tensor_sizes=sizes))


@pytest.mark.parametrize("params,match", [
    ({"servers": 0}, r"servers must be an int in 1\.\.4"),
    ({"servers": 5}, r"servers must be an int in 1\.\.4"),
    ({"servers": 1.5}, "servers must be an int"),
    ({"servers": True}, "servers must be an int"),
    ({"sharding": "hash"}, "sharding must be one of even, roundrobin"),
    ({"sharding": "roundrobin"}, "tensor_sizes must be element counts"),
    ({"sharding": "roundrobin", "tensor_sizes": (5, 4)}, "sum to the buffer's 10 elements"),
    ({"sharding": "roundrobin", "tensor_sizes": (11, -1)}, "tensor_sizes must be"),
    ({"tensor_sizes": (10,)}, "only with sharding='roundrobin'"),
])
def test_ps_rejects_bad_parameters(params, match):
    with pytest.raises(GradwireError, match=match):
        ps.allreduce(4, 10, **params)
