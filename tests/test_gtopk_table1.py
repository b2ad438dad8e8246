"""Table I and Fig. 9 of the gTop-k paper (Shi et al. 2019) at any P, from the schedules
gradwire runs: TopKAllReduce (allgather), gTopKAllReduce on the paper's tree, and the dense
ring allreduce; and Top-k's allgather at P not a power of two (Bruck) run for real over gloo.
"""
import math
import os

import pytest
import torch
import torch.multiprocessing as mp

from gradwire import catalogue
from gradwire.schedules import registry
from gradwire.schedules.cost import CostParams, cost
from gradwire.sparse import estimate, schedule
from gradwire.sparse.allreduce import spec

# The paper's 1 GbE cluster: α per message, β per 4-byte element. A packed entry (value,
# index) is 8 bytes, the paper's 2 elements; CostParams take β per byte.
ALPHA, BETA = 0.436e-3, 3.6e-8
PARAMS = CostParams(ALPHA, BETA / 4)
RHO = 0.001
WORLDS = [4, 8, 16, 32, 48, 64, 96, 128]
SIZES = [25_000_000, 60_000_000]  # Fig. 9's m (ResNet-50), and a larger model
TOLERANCE = 0.25


def lg(p: int) -> int:
    """The paper's log(P), a number of tree levels or doubling steps: ⌈lg P⌉ where P is not a
    power of two (log2(48) = 5.58 rounds would not be a whole number of messages)."""
    return math.ceil(math.log2(p))


def within(ours: float, paper: float, rel: float, what: str) -> None:
    assert abs(ours / paper - 1) <= rel, (
        f"{what}: gradwire {ours * 1e3:.2f} ms, Table I {paper * 1e3:.2f} ms "
        f"({ours / paper:.3f}x, allowed ±{rel:.0%})")


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("p", WORLDS)
def test_topk_allreduce_is_table_1s_allgather(p, m):
    k = round(RHO * m)
    paper = lg(p) * ALPHA + 2 * (p - 1) * k * BETA
    within(estimate("topk", p, m, k, PARAMS), paper, TOLERANCE, f"TopKAllReduce P={p} m={m}")


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("p", WORLDS)
def test_gtopk_allreduce_on_the_tree_is_table_1s(p, m):
    k = round(RHO * m)
    paper = 2 * lg(p) * ALPHA + 4 * k * lg(p) * BETA
    within(estimate("gtopk", p, m, k, PARAMS, algo="tree"), paper, TOLERANCE,
           f"gTopKAllReduce (tree) P={p} m={m}")


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("p", WORLDS)
def test_dense_ring_allreduce_is_table_1s(p, m):
    paper = 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * m * BETA
    ours = cost(registry.schedule("allreduce", "ring", p, m), PARAMS, 4)
    within(ours, paper, 0.03, f"DenseAllReduce (ring) P={p} m={m}")


@pytest.mark.parametrize("p", [3, 5, 6, 12, 48, 96])
def test_topks_allgather_at_other_p_beats_recursive_doubling_and_the_ring(p):
    m = 25_000_000
    k = round(RHO * m)
    ours = estimate("topk", p, m, k, PARAMS)
    for algo in ("rd", "ring"):
        other = estimate("topk", p, m, k, PARAMS, algo=algo)
        assert ours <= other, (f"P={p}: default allgather {ours * 1e3:.2f} ms, "
                               f"{algo} {other * 1e3:.2f} ms")


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 7, 8, 48, 64, 96, 128])
def test_executor_model_and_catalogue_pick_the_same_allgather(p):
    numel, k = 100_000, 100
    want = "rd" if p & (p - 1) == 0 else "bruck"
    assert spec("topk", p, numel, k)[1] == want
    assert schedule("topk", p, numel, k).algo == want  # what topk_plan, so the executor, runs
    call, = catalogue.get("topk").plan(numel, p, density=k / numel).calls
    assert (call.collective, call.algo) == ("allgather", want)


# Bruck run for real: sparse_allreduce's topk over gloo at P not a power of two -----------------
N, K = 500, 20


def _data(rank: int) -> torch.Tensor:
    """Distinct magnitudes (whole numbers, so every sum is exact), different on every rank."""
    g = torch.Generator().manual_seed(rank)
    signs = torch.randint(0, 2, (N,), generator=g) * 2 - 1
    return ((torch.randperm(N, generator=g) + 1) * signs).to(torch.float64)


def _expected(world: int) -> torch.Tensor:
    total = torch.zeros(N, dtype=torch.float64)
    for r in range(world):
        x = _data(r)
        top = x.abs().topk(K).indices
        total[top] += x[top]
    return total / world


def _check(rank: int, world: int, group: object) -> None:
    from gradwire.sparse import sparse_allreduce, topk_allreduce

    want = _expected(world)
    got = {}
    for algo in (None, "rd"):
        x, residual = _data(rank), torch.zeros(N, dtype=torch.float64)
        got[algo] = sparse_allreduce(x, residual, K, "topk", algo=algo, group=group)
    assert torch.equal(got[None], want), f"P={world} rank {rank}: bruck topk is not the sum"
    assert torch.equal(got["rd"], want), f"P={world} rank {rank}: rd topk is not the sum"
    x = _data(rank)
    top = x.abs().topk(K).indices
    r = topk_allreduce(x[top], top, N, group=group)
    assert r.schedule.algo == "bruck", f"P={world} rank {rank}: ran {r.schedule.algo}"
    assert torch.equal(r.average(), want), f"P={world} rank {rank}: topk_allreduce differs"


def _rank(rank: int, init: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=6)
    try:
        three = dist.new_group([0, 1, 2])  # every rank must make the group
        _check(rank, 6, None)
        if rank < 3:
            _check(rank, 3, three)
    finally:
        dist.destroy_process_group()


def test_topk_runs_bruck_over_gloo_at_p_3_and_6_and_sums_every_ranks_selection(tmp_path):
    # one spawn of 6 ranks, with ranks 0-2 also a group of 3: starting ranks is what takes time
    init = "file://" + os.fspath(tmp_path / "store")
    mp.start_processes(_rank, args=(init,), nprocs=6, start_method="spawn")
