"""The performance model: communication from schedules (summaries equal cost()), the gTop-k
paper's Fig. 9 from Table I, and the iteration model's invariants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire import catalogue, profiles
from gradwire.errors import GradwireError
from gradwire.perf import codecs, comm
from gradwire.perf.model import Aggregation, ClusterModel, buckets, predict
from gradwire.schedules.cost import CostParams, cost
from gradwire.schedules.registry import schedule
from gradwire.sparse import estimate
from gradwire.sparse.allreduce import schedule as schedule_of
from gradwire.sparse.allreduce import spec

PARAMS = CostParams(307e-6, 8.36e-9, 0.11e-9)
CASES = [("allreduce", "ring", {"pipeline": 1}), ("allreduce", "rhd", {}),
         ("allreduce", "tree", {}), ("allgather", "ring", {"pipeline": 1}),
         ("allgather", "rd", {}), ("reducescatter", "ring", {"pipeline": 2})]


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASES), p=st.integers(1, 17), data=st.data())
def test_summary_costs_exactly_what_cost_gives_up_to_the_reference_count(case, p, data):
    collective, algo, params = case
    count = data.draw(st.integers(0, comm.ref_count(p, params.get("pipeline"))))
    want = cost(schedule(collective, algo, p, count, **params), PARAMS, 4)
    got = comm.seconds(collective, algo, p, count, 4, PARAMS.alpha, PARAMS.beta, PARAMS.gamma,
                       **params)
    assert float(got) == pytest.approx(want, rel=1e-12, abs=1e-15)


@settings(max_examples=30, deadline=None)
@given(case=st.sampled_from(CASES), p=st.integers(2, 17), data=st.data())
def test_scaled_summary_is_within_a_thousandth_of_cost(case, p, data):
    # Above the reference count blocks differ by at most one element from the scaled ones:
    # at most (β+γ)·4 bytes per message against the α each message pays.
    collective, algo, params = case
    count = data.draw(st.integers(comm.ref_count(p, params.get("pipeline")), 10**6))
    want = cost(schedule(collective, algo, p, count, **params), PARAMS, 4)
    got = comm.seconds(collective, algo, p, count, 4, PARAMS.alpha, PARAMS.beta, PARAMS.gamma,
                       **params)
    assert float(got) == pytest.approx(want, rel=1e-3)


A, B, G = 307e-6, 8.36e-9, 0.11e-9


@settings(max_examples=30, deadline=None)
@given(case=st.sampled_from(CASES), p=st.integers(2, 17), data=st.data())
def test_one_node_holding_every_rank_costs_its_own_link(case, p, data):
    collective, algo, params = case
    count = data.draw(st.integers(0, 5000))
    inside = comm.Node(p, 50e-6, 0.1e-9)
    got = comm.seconds(collective, algo, p, count, 4, A, B, G, node=inside, **params)
    want = comm.seconds(collective, algo, p, count, 4, 50e-6, 0.1e-9, G, **params)
    assert float(got) == pytest.approx(float(want), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("p", [4, 6, 8, 16])
def test_a_ring_sends_one_message_per_node_so_two_per_node_cost_the_same(p):
    # Consecutive placement: rank 2i+1 -> 2i+2 leaves the node, 2i -> 2i+1 stays inside.
    same = comm.Node(2, A, B)
    for count in (10**3, 10**6):
        one = comm.seconds("allreduce", "ring", p, count, 4, A, B, G, pipeline=1)
        two = comm.seconds("allreduce", "ring", p, count, 4, A, B, G, node=same, pipeline=1)
        assert float(two) == pytest.approx(float(one), rel=1e-12)


def test_ranks_of_a_node_share_its_link_between_nodes():
    # Butterfly over 4 ranks, 2 per node: distance 1 stays inside (α_i + nβ_i), distance 2
    # sends both ranks' n bytes through each node's link at once (α + 2nβ); both reduce n.
    n = 4 * 1000
    inside = comm.Node(2, 50e-6, 0.1e-9)
    got = comm.seconds("allreduce", "rd", 4, 1000, 4, A, B, G, node=inside)
    want = (50e-6 + n * 0.1e-9 + n * G) + (A + 2 * n * B + n * G)
    assert float(got) == pytest.approx(want, rel=1e-12)


def test_cluster_ranks_per_node_reaches_the_model_and_bad_values_are_refused():
    agg = Aggregation("topk")
    one = predict(TOY, ClusterModel(16, 1e9, 307e-6), agg, TABLE)
    eight = predict(TOY, ClusterModel(16, 1e9, 307e-6, ranks_per_node=8), agg, TABLE)
    assert float(eight.communicate) > float(one.communicate)  # 8 ranks' entries per link
    with pytest.raises(GradwireError, match="cluster: ranks per node must be an integer >= 1"):
        ClusterModel(4, 1e9, 307e-6, ranks_per_node=0)


def test_summary_of_a_ring_is_one_row_per_phase() -> None:
    s = comm.summary("allreduce", "ring", 64, 10**6, pipeline=1)
    # 63 reduce-scatter steps, then 63 allgather steps; every rank alike in each.
    assert [(steps, len(rows)) for steps, rows in s.groups] == [(63, 1), (63, 1)]


# gTop-k paper, §IV-C and Fig. 9: α = 0.436 ms, β = 3.6e-5 ms per 4-byte element, m = 25e6,
# ρ = 0.001 (k = 25 000). Table I in ms: dense 2(P−1)α + 2(P−1)/P·mβ; TopKAllReduce
# lgP·α + 2(P−1)kβ; gTopKAllReduce 2lgP·α + 4k·lgP·β. Values worked out by hand from Table I.
FIG9 = CostParams(0.436e-3, 3.6e-8 / 4)
FIG9_LEFT_MS = {  # P: (dense, topk, gtopk)
    4: (1352.616, 6.272, 8.944),
    8: (1581.104, 13.908, 13.416),
    16: (1700.58, 28.744, 17.888),
    32: (1770.782, 57.98, 22.36),
    64: (1826.811, 116.016, 26.832),
    128: (1896.6815, 231.652, 31.304),
}


def _fig9(method: str, p: int, m: int) -> float:
    if method == "dense":
        return 1e3 * float(comm.seconds("allreduce", "ring", p, m, 4, FIG9.alpha, FIG9.beta,
                                        pipeline=1))
    # the paper's gTop-k runs on its binomial tree (gradwire's default is the butterfly)
    coll, algo, count, params = spec(method, p, m, round(m * 0.001),
                                     algo="tree" if method == "gtopk" else None)
    return 1e3 * float(comm.seconds(coll, algo, p, count, 1, FIG9.alpha, FIG9.beta, **params))


@pytest.mark.parametrize("p", sorted(FIG9_LEFT_MS))
def test_fig9_left_worker_sweep_from_table_i(p: int) -> None:
    got = tuple(_fig9(method, p, 25_000_000) for method in ("dense", "topk", "gtopk"))
    assert got == pytest.approx(FIG9_LEFT_MS[p], rel=1e-4)
    for method in ("topk", "gtopk"):  # the sparse module's own estimate agrees
        want = estimate(method, p, 25_000_000, 25_000, FIG9,
                        algo="tree" if method == "gtopk" else None) * 1e3
        assert _fig9(method, p, 25_000_000) == pytest.approx(want, rel=1e-12)


def test_fig9_gtopk_overtakes_topk_at_eight_workers() -> None:
    faster = [p for p in (4, 8, 16, 32, 64, 128)
              if _fig9("gtopk", p, 25_000_000) < _fig9("topk", p, 25_000_000)]
    assert faster == [8, 16, 32, 64, 128]


def test_fig9_right_message_sweep_at_32_workers() -> None:
    # At P = 32: topk 5α + 62ρmβ, gtopk 10α + 20ρmβ; gtopk wins once 42ρmβ > 5α,
    # m > 1.44e6 elements; at m = 1e8 topk is 2.7x slower.
    assert _fig9("topk", 32, 1_000_000) < _fig9("gtopk", 32, 1_000_000)
    assert _fig9("topk", 32, 2_000_000) > _fig9("gtopk", 32, 2_000_000)
    assert _fig9("topk", 32, 100_000_000) == pytest.approx(2.18 + 62 * 3.6, rel=1e-4)
    assert _fig9("gtopk", 32, 100_000_000) == pytest.approx(4.36 + 20 * 3.6, rel=1e-4)


TABLE = codecs.load("h100")
TOY = profiles.parse("""{"format": 1, "model": "toy", "forward_s": 0.05, "backward_s": 0.1,
  "step_s": 0.01, "params": [["c", 1000000], ["b", 3000000], ["a", 4000000]]}""", "toy")


def test_one_worker_runs_compute_only() -> None:
    r = predict(TOY, ClusterModel(1, 1e9, 307e-6), Aggregation("dense"), TABLE)
    assert float(r.iteration) == pytest.approx(0.16) and float(r.exposed) == 0
    assert r.wire_bytes == 0 and float(r.communicate) == 0  # nothing is sent
    assert predict(TOY, ClusterModel(2, 1e9, 307e-6), Aggregation("dense"), TABLE).wire_bytes > 0


def test_buckets_follow_ddp_caps_in_backward_order() -> None:
    got = buckets(TOY, Aggregation("dense", bucket_mb=10, first_bucket_mb=1))
    # 4 MB fills the 1 MiB first bucket; 12 MB fills a 10 MiB one; 16 MB the rest.
    assert [n for n, _ in got] == [1_000_000, 3_000_000, 4_000_000]
    assert [t for _, t in got] == pytest.approx([0.0125, 0.05, 0.1])
    assert buckets(TOY, Aggregation("dense", mode="model")) == [(8_000_000, pytest.approx(0.1))]


@pytest.mark.parametrize("bucket_mb", [None, 10.0, 3.0, 0.5])
def test_buckets_are_the_ones_ddp_forms_with_its_cap_given_or_not(bucket_mb) -> None:
    """DDP closes its first bucket at 1 MiB only under its default cap; given bucket_cap_mb,
    every bucket closes at it (the model had a 1 MiB first bucket under every cap). Checked
    against DDP's own assignment (torch.distributed._compute_bucket_assignment_by_size, the
    limits DDP passes it)."""
    agg = Aggregation("dense") if bucket_mb is None else Aggregation("dense", bucket_mb=bucket_mb)
    got = [n for n, _ in buckets(TOY, agg)]
    cap = (25.0 if bucket_mb is None else bucket_mb) * 2**20
    first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES if bucket_mb is None else cap
    tensors = [torch.empty(size) for _, size in TOY.params]  # backward order, as DDP's
    groups, _ = torch.distributed._compute_bucket_assignment_by_size(
        tensors, [int(first), int(cap)])
    assert got == [sum(TOY.params[i][1] for i in g) for g in groups]


def test_single_bucket_dense_is_compute_plus_the_ring_allreduce() -> None:
    agg = Aggregation("dense", mode="model")
    r = predict(TOY, ClusterModel(4, 1e9, 307e-6, beta=8.36e-9, check_calls=False), agg, TABLE)
    ring = cost(schedule("allreduce", "ring", 4, 8_000_000, pipeline=1), CostParams(307e-6,
                8.36e-9), 4)
    assert float(r.iteration) == pytest.approx(0.05 + 0.1 + ring + 0.01, rel=1e-9)
    assert float(r.efficiency) == pytest.approx(0.15 / float(r.iteration))


def test_backward_slowed_beside_communication_counts_against_efficiency() -> None:
    """Eq. 4 of the gTop-k paper: e = (t_f + t_b)/t_iter with t_b the backward of a worker
    alone; κ·t_b − t_b is a cost of communicating, as the communication is."""
    cluster = ClusterModel(4, 100e9, 1e-6, check_calls=False)
    alone = predict(TOY, cluster, Aggregation("dense", bucket_mb=10, first_bucket_mb=1), TABLE)
    slowed = predict(TOY, cluster, Aggregation("dense", bucket_mb=10, first_bucket_mb=1), TABLE,
                     overlap_slowdown=1.5)
    assert slowed.backward == pytest.approx(1.5 * alone.backward)
    assert float(slowed.efficiency) == pytest.approx(0.15 / float(slowed.iteration))
    assert float(slowed.efficiency) < float(alone.efficiency)


@pytest.mark.parametrize("method, mode, calls", [("gtopk", "bucket", 0), ("gtopk", "model", 0),
                                                 ("dense", "bucket", 0), ("qsgd", "bucket", 3)])
@pytest.mark.parametrize("p", [2, 5, 8])
def test_the_header_exchanges_of_agree_are_charged(method, mode, calls, p) -> None:
    """In steady state none where the NaN/Inf status travels with the data (gTop-k) or there
    is none (dense), one per bucket where the ranks agree on it first (QSGD)."""
    agg = Aggregation(method, mode=mode, bucket_mb=10, first_bucket_mb=1)
    on, off = (predict(TOY, ClusterModel(p, 1e9, 307e-6, beta=8.36e-9, check_calls=c), agg, TABLE)
               for c in (True, False))
    # agree.py's exchange: recursive-doubling allgather of one 168-byte header per rank
    header = cost(schedule("allgather", "rd", p, 168 * p, itemsize=1), CostParams(307e-6,
                  8.36e-9), 1)
    assert float(on.communicate - off.communicate) == pytest.approx(calls * header, rel=1e-9)
    # the one header of a step in bucket mode runs while backward still computes
    assert float(on.iteration) >= float(off.iteration)


@settings(max_examples=25, deadline=None)
@given(method=st.sampled_from(["dense", "fp16", "topk", "gtopk", "powersgd", "signsgd",
                               "randomk", "qsgd"]), p=st.integers(2, 40),
       slowdown=st.floats(1, 1.5))
def test_iteration_is_at_least_compute_and_falls_with_bandwidth(method, p, slowdown) -> None:
    rates = np.array([1e8, 1e9, 1e10, 1e11])
    r = predict(TOY, ClusterModel(p, rates, 307e-6, 0.1e-9), Aggregation(method), TABLE,
                overlap_slowdown=slowdown)
    assert (r.iteration >= r.forward + r.backward + r.step - 1e-12).all()
    assert (np.diff(r.iteration) <= 1e-12).all() and (r.efficiency <= 1 + 1e-12).all()
    assert (r.exposed >= -1e-12).all()


def test_gathered_methods_pay_decode_per_rank_and_sparse_ones_do_not() -> None:
    a = predict(TOY, ClusterModel(8, 1e9, 0), Aggregation("signsgd"), TABLE).coding
    b = predict(TOY, ClusterModel(16, 1e9, 0), Aggregation("signsgd"), TABLE).coding
    per_rank = TABLE.seconds("signsgd", TOY.numel, 2)[1] - TABLE.seconds("signsgd", TOY.numel, 1)[1]
    assert b - a == pytest.approx(8 * per_rank)
    assert predict(TOY, ClusterModel(8, 1e9, 0), Aggregation("topk"), TABLE).coding == \
        predict(TOY, ClusterModel(16, 1e9, 0), Aggregation("topk"), TABLE).coding


def test_a_vote_pays_its_fixed_decode_once_and_the_per_rank_part_per_rank() -> None:
    t = codecs.CodecTable("t", 1000, {"signsgd": {"encode_s": 1.0, "decode_s": 0.1,
                                                  "decode_fixed_s": 2.0}}, "")
    assert t.seconds("signsgd", 1000, 1) == pytest.approx((1.0, 2.1))
    assert t.seconds("signsgd", 2000, 8) == pytest.approx((2.0, 2 * 2.8))


def test_sparse_methods_pay_their_measured_merges_and_per_rank_sums() -> None:
    t = codecs.CodecTable("t", 1000, {
        "topk": {"encode_s": 1.0, "decode_s": 0.5, "decode_rank_s": 0.1},
        "gtopk": {"encode_s": 1.0, "decode_s": 0.5, "merge_s": 0.2}}, "")
    assert t.seconds("topk", 1000, 8) == pytest.approx((1.0, 0.5 + 8 * 0.1))
    assert t.seconds("gtopk", 2000, 8) == pytest.approx((2.0, 2 * (0.5 + 3 * 0.2)))
    assert t.seconds("gtopk", 1000, 5) == pytest.approx((1.0, 0.5 + 3 * 0.2))  # with the fold
    assert t.seconds("gtopk", 1000, 1) == pytest.approx((1.0, 0.5))


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 200), algo=st.sampled_from(["rd", "tree"]))
def test_the_merges_priced_are_those_of_the_busiest_rank_of_the_schedule(p, algo) -> None:
    s = schedule_of("gtopk", p, 10_000, 10, algo=algo)
    made = [0] * p
    for step in s.steps:
        for t in step.transfers:
            made[t.dst] += t.op == "gtopk"
    assert codecs.merges(p) == max(made)


@pytest.mark.parametrize("method", ["fp16", "bf16"])
def test_a_half_precision_sum_pays_its_own_gamma(method) -> None:
    """The cast's ring reduces (P − 1)/P of its 2-byte payload on each rank, at the γ its
    dtype was measured at; dense, which sums fp32, keeps γ."""
    p, name = 4, {"fp16": "float16", "bf16": "bfloat16"}[method]
    slow = ClusterModel(p, 1e9, 1e-5, gamma=1e-10, gamma_dtype=((name, 3e-9),))
    fast = dataclasses.replace(slow, gamma_dtype=())
    extra = (predict(TOY, slow, Aggregation(method), TABLE).communicate
             - predict(TOY, fast, Aggregation(method), TABLE).communicate)
    assert float(extra) == pytest.approx(TOY.numel * 2 * (p - 1) / p * (3e-9 - 1e-10), rel=1e-3)
    assert float(predict(TOY, slow, Aggregation("dense"), TABLE).iteration) == float(
        predict(TOY, fast, Aggregation("dense"), TABLE).iteration)
    with pytest.raises(GradwireError, match="gamma of float16"):
        ClusterModel(2, 1e9, 0, gamma_dtype=(("float16", -1.0),))


def test_model_refuses_profiles_without_compute_and_bad_options() -> None:
    with pytest.raises(GradwireError, match="no compute times"):
        predict(profiles.load("alexnet"), ClusterModel(4, 1e9, 1e-4), Aggregation("dense"), TABLE)
    with pytest.raises(GradwireError, match="unknown aggregation 'topkk'.*did you mean"):
        Aggregation("topkk")
    with pytest.raises(GradwireError, match="has no encode/decode time for 'qsgd'"):
        predict(TOY, ClusterModel(4, 1e9, 1e-4), Aggregation("qsgd"), codecs.load("v100"))
    assert dataclasses.replace(Aggregation("topk"), density=0.01).label == "topk ρ=0.01"


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 17), n=st.integers(17, 5_000_000))
def test_cpu_of_a_ring_allreduce_is_its_steps_bytes_and_reductions(p, n) -> None:
    """With a non-empty block for every rank (n ≥ P), every rank of a ring takes part in all
    2(P−1) steps, sends and receives 2(P−1)/P of the bytes and reduces (P−1)/P of them; the
    scaled count is exact to one element per message, so the comparison allows that."""
    step, per_byte, gamma = 3e-4, 0.7e-9, 0.12e-9
    got = comm.cpu_seconds("allreduce", "ring", p, n, 4, step, per_byte, gamma, pipeline=1)
    want = 2 * (p - 1) * step + 2 * (p - 1) / p * 4 * n * per_byte + (p - 1) / p * 4 * n * gamma
    assert got == pytest.approx(want, rel=1e-9, abs=2 * (p - 1) * 4 * (per_byte + gamma) + 1e-15)
    assert comm.cpu_seconds("allreduce", "ring", 1, n, 4, step, per_byte, gamma) == 0


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 17), n=st.integers(0, 3_000_000),
       algo=st.sampled_from(["ring", "tree", "rhd", "master"]))
def test_busiest_bytes_are_the_most_any_rank_sends_or_receives(p, n, algo) -> None:
    """What a token bucket's credit can save: counted on the schedule built at the count (up
    to ref_count) and scaled above it, within one element per message."""
    got = comm.busiest_bytes("allreduce", algo, p, n, 4)
    if p == 1 or n == 0:
        assert got == 0
        return
    s = schedule("allreduce", algo, p, n)
    sent, received = [0] * p, [0] * p
    for step in s.steps:
        for x in step.transfers:
            sent[x.src] += x.count * 4
            received[x.dst] += x.count * 4
    messages = sum(len(step.transfers) for step in s.steps)
    assert got == pytest.approx(max(*sent, *received), abs=4 * messages + 1e-9)


def test_cpu_of_a_tree_is_the_mean_over_its_ranks() -> None:
    """Binomial gTop-k tree at P = 8: a leaf takes part in two of its steps, the root in all;
    ranks sharing cores share their sum, so a rank is charged the mean."""
    c, a, n, prm = spec("gtopk", 8, 1_000_000, 1000, algo="tree")
    s = schedule(c, a, 8, n, **prm)
    taking_part = sum(len({r for x in st.transfers for r in (x.src, x.dst)}) for st in s.steps)
    got = comm.cpu_seconds(c, a, 8, n, 1, 1.0, 0.0, 0.0, **prm)
    assert got == pytest.approx(taking_part / 8) and got < len(s.steps)
    per_byte = comm.cpu_seconds(c, a, 8, n, 1, 0.0, 1.0, 0.0, **prm)
    assert per_byte == pytest.approx(sum(x.count for st in s.steps for x in st.transfers) / 8)


def _shared(p: int, **kw) -> ClusterModel:
    return ClusterModel(p, 1e9, 307e-6, 0.1e-9, beta=8.36e-9, cores=2, cpu_ranks=p,
                        **{"cpu_step": 3e-4, "cpu_byte": 0.7e-9, **kw})


@pytest.mark.parametrize("method", ["dense", "topk", "signsgd", "powersgd"])
def test_ranks_sharing_cores_are_bound_by_their_cpu(method) -> None:
    """8 ranks on 2 cores: an iteration takes at least 4·D/u + S·s, D = the rank's own CPU
    (the profile's compute) + coding + its part of the schedules, S the schedule steps it
    takes part in (the headers and the method's collectives); without ``cores`` nothing
    changes."""
    agg = Aggregation(method)
    free = predict(TOY, ClusterModel(8, 1e9, 307e-6, 0.1e-9, beta=8.36e-9), agg, TABLE)
    assert free.cpu_bound == 0 and free.cpu_comm == 0 and free.steps == 0
    assert free.cpu == pytest.approx(0.16 + free.coding)
    r = predict(TOY, _shared(8, cpu_share=0.9, cpu_sync=1e-3, cpu_slowdown=1.5), agg, TABLE)
    assert r.cpu == pytest.approx(0.16 + 1.5 * r.coding + r.cpu_comm) and r.cpu_comm > 0
    per_bucket = 2 if method in ("powersgd", "signsgd") else 1  # signsgd: and a header
    n = len(buckets(TOY, agg))
    assert r.calls == n * per_bucket  # in steady state no step header
    if method == "dense":
        # per bucket the ring allreduce (2·(8 − 1) = 14), no header
        assert r.steps == n * 14
    assert r.steps > r.calls
    assert r.cpu_bound == pytest.approx(4 * r.cpu / 0.9 + r.steps * 1e-3)
    assert float(r.iteration) >= r.cpu_bound
    # fewer ranks than cores: each has one of its own, and still needs its own CPU time
    two = predict(TOY, _shared(2), agg, TABLE)
    assert two.cpu_bound == pytest.approx(two.cpu)


@pytest.mark.parametrize("method", ["dense", "powersgd", "signsgd", "topk", "gtopk"])
def test_a_backend_call_costs_its_calibrated_cpu_instead_of_its_steps(method) -> None:
    """With ``cpu_call`` set, each data call of a method on the backend's own collectives
    (dense, PowerSGD, the gathered methods) costs ``cpu_call`` and its bytes, not
    ``cpu_step`` per step; the headers and the sparse methods' schedules run on gradwire's
    executor and keep ``cpu_step``; the steps each call waits (``cpu_sync``) are the same."""
    agg = Aggregation(method)
    base = predict(TOY, _shared(8), agg, TABLE)
    called = predict(TOY, _shared(8, cpu_call=2e-3), agg, TABLE)
    assert (called.steps, called.calls) == (base.steps, base.calls)
    if catalogue.get(method).path.on_transport:
        assert called.cpu_comm == base.cpu_comm
        return
    headers = len(buckets(TOY, agg)) if method == "signsgd" else 0  # one a bucket
    stepless = predict(TOY, _shared(8, cpu_call=2e-3, cpu_step=0.0), agg, TABLE)
    bytes_only = predict(TOY, _shared(8, cpu_step=0.0), agg, TABLE)
    assert stepless.cpu_comm == pytest.approx(bytes_only.cpu_comm
                                              + (base.calls - headers) * 2e-3)
    if headers:  # the headers keep their steps' CPU
        assert called.cpu_comm > stepless.cpu_comm
    else:
        assert called.cpu_comm == pytest.approx(stepless.cpu_comm)
    with pytest.raises(GradwireError, match="CPU per backend call"):
        _shared(8, cpu_call=-1e-3)


# TOY with little compute: what the CPU bound leaves to the timeline shows
LIGHT = dataclasses.replace(TOY.with_compute(5e-5, 5e-5, "a test's"), step_s=0.0)


def test_ranks_sharing_cores_code_at_once() -> None:
    """On shared cores every rank encodes and decodes at once: in the timeline coding takes
    L·slowdown/u its one-rank time (L = ranks/cores), and on cores of one's own its time."""
    agg = Aggregation("signsgd", mode="model")  # one bucket: coding all on the critical path
    slow = dict(link_bps=1e8, alpha=307e-6, beta=8.36e-8)
    free = predict(LIGHT, ClusterModel(8, **slow), agg, TABLE)
    shared = predict(LIGHT, ClusterModel(8, **slow, cores=2, cpu_ranks=8, cpu_share=0.8,
                                    cpu_slowdown=1.2), agg, TABLE)
    assert float(shared.iteration) > shared.cpu_bound  # the timeline binds, not the CPU
    assert shared.coding == free.coding > 0
    assert float(shared.iteration - free.iteration) == pytest.approx(
        (4 * 1.2 / 0.8 - 1) * free.coding)
    own = predict(LIGHT, ClusterModel(2, **slow, cores=2, cpu_ranks=2), agg, TABLE)
    assert float(own.iteration) == pytest.approx(float(predict(LIGHT, ClusterModel(2, **slow),
                                                               agg, TABLE).iteration))


@pytest.mark.parametrize(("p", "cores"), [(8, 2), (2, 2), (8, 4), (3, 4), (8, 1)])
def test_the_slowest_ranks_lead_is_paid_in_the_timeline_not_the_cpu_bound(p, cores) -> None:
    """Ranks sharing cores: the straggler wait w lengthens the iteration's timeline by w,
    and leaves the CPU bound alone: ranks that wait give their cores to ranks that compute
    (point 6 of the model)."""
    agg = Aggregation("topk")
    # a slow link: the timeline binds, not the CPU
    cl = ClusterModel(p, 1e7, 307e-6, beta=8e-7, cores=cores, cpu_ranks=p, cpu_step=3e-4)
    plain, waited = (predict(LIGHT, dataclasses.replace(cl, straggle=s), agg, TABLE)
                     for s in (0.0, 0.004))
    assert waited.cpu_bound == plain.cpu_bound
    assert float(waited.exposed - plain.exposed) == pytest.approx(0.004)
    assert float(waited.iteration) >= float(waited.cpu_bound)


def test_cluster_refuses_bad_cpu_settings() -> None:
    for kw, msg in (({"cores": 0}, "cores per machine must be a finite number > 0"),
                    ({"cores": float("inf")}, "cores per machine must be a finite number > 0"),
                    ({"cpu_share": 0}, r"CPU share must be in \(0, 1\]"),
                    ({"cpu_share": 1.5}, r"CPU share must be in \(0, 1\]"),
                    ({"cpu_step": -1}, "CPU per step must be a finite number >= 0"),
                    ({"cpu_byte": float("nan")}, "CPU per byte must be a finite number >= 0"),
                    ({"cpu_sync": -1e-3}, "sync wait per step must be a finite number >= 0"),
                    ({"cpu_ranks": 0}, "ranks per machine"),
                    ({"cpu_slowdown": 0.5}, "CPU slowdown must be a finite number >= 1"),
                    ({"cpu_slowdown": float("inf")}, "CPU slowdown must be a finite number")):
        with pytest.raises(GradwireError, match=msg):
            ClusterModel(4, 1e9, 1e-4, **kw)


@pytest.mark.parametrize(("args", "kw", "msg"), [
    ((0, 1e9, 1e-4), {}, "workers must be a whole number from 1 to 4096"),
    ((10**7, 1e9, 1e-4), {}, "workers must be a whole number from 1 to 4096"),
    ((4.0, 1e9, 1e-4), {}, "workers must be a whole number"),
    ((True, 1e9, 1e-4), {}, "workers must be a whole number"),
    ((4, float("nan"), 1e-4), {}, "link rates must be finite numbers of bit/s > 0"),
    ((4, [1e9, float("inf")], 1e-4), {}, "link rates must be finite"),
    ((4, -1e9, 1e-4), {}, "link rates must be finite"),
    ((4, [], 1e-4), {}, "link rates must be finite"),
    ((4, "1gbit", 1e-4), {}, "link rates must be finite"),
    ((4, 1e9, -1e-4), {}, r"alpha \(seconds per message\) must be a finite number >= 0"),
    ((4, 1e9, float("nan")), {}, "alpha"),
    ((4, 1e9, 1e-4, float("inf")), {}, r"gamma \(seconds per byte reduced\) must be"),
    ((4, 1e9, 1e-4), {"beta": 0.0}, "beta must be finite seconds per byte > 0"),
    ((4, 1e9, 1e-4), {"intra_bps": float("inf")}, "the link inside a node"),
])
def test_cluster_refuses_what_would_make_predictions_nan_or_endless(args, kw, msg) -> None:
    with pytest.raises(GradwireError, match=msg):
        ClusterModel(*args, **kw)


@pytest.mark.parametrize(("kw", "msg"), [
    ({"compute_speedup": 0}, "compute speedup must be a finite number > 0"),
    ({"compute_speedup": float("inf")}, "compute speedup must be a finite number > 0"),
    ({"overlap_slowdown": float("nan")}, "overlap slowdown must be a finite number >= 1"),
])
def test_predict_refuses_bad_speedups(kw, msg) -> None:
    with pytest.raises(GradwireError, match=msg):
        predict(TOY, ClusterModel(4, 1e9, 1e-4), Aggregation("dense"), TABLE, **kw)


@pytest.mark.parametrize(("kw", "msg"), [
    ({"rank": 0}, "PowerSGD rank must be an integer >= 1"),
    ({"bucket_mb": 0}, r"bucket size \(MiB\) must be a finite number > 0"),
    ({"first_bucket_mb": float("nan")}, r"first bucket size \(MiB\) must be a finite"),
    ({"density": float("nan")}, r"density must be in \(0, 1\]"),
])
def test_aggregation_refuses_bad_settings(kw, msg) -> None:
    with pytest.raises(GradwireError, match=msg):
        Aggregation("powersgd", **kw)


@pytest.mark.parametrize("p", [1, 2, 8])
def test_the_straggler_wait_is_paid_once_an_iteration(p) -> None:
    agg = Aggregation("gtopk")
    plain, waited = (predict(TOY, ClusterModel(p, 1e9, 307e-6, straggle=s), agg, TABLE)
                     for s in (0.0, 0.004))
    extra = 0.004 if p > 1 else 0.0  # one rank alone waits for nobody
    assert float(waited.iteration - plain.iteration) == pytest.approx(extra, rel=1e-9)
    assert float(waited.exposed - plain.exposed) == pytest.approx(extra, rel=1e-9)


ZERO = codecs.CodecTable("zero", 1, {"dense": {"encode_s": 0.0, "decode_s": 0.0}}, "test")


def test_a_lone_bucket_starts_with_a_full_token_bucket() -> None:
    # forward, step and backward idle the links far longer than a 500 kB bucket takes to fill,
    # and the first 500 kB each rank sends then pass at once
    agg, beta, burst = Aggregation("dense", mode="model"), 8.36e-9, 500e3
    credited, plain = (predict(TOY, ClusterModel(4, 1e9, 307e-6, beta=beta, check_calls=False,
                                            burst=b), agg, ZERO) for b in (burst, 0.0))
    ring = cost(schedule("allreduce", "ring", 4, 8_000_000, pipeline=1),
                CostParams(307e-6, beta), 4)
    assert float(plain.communicate) == pytest.approx(ring, rel=1e-9)
    assert float(credited.communicate) == pytest.approx(ring - burst * beta, rel=1e-9)


def test_buckets_queued_behind_a_busy_link_start_with_no_credit() -> None:
    # at 100 Mbit/s the first bucket's allreduce outlasts the backward that readies the others
    agg, beta, burst = Aggregation("dense", bucket_mb=10, first_bucket_mb=1), 8e-8, 256 * 1024
    cluster = ClusterModel(4, 1e8, 307e-6, beta=beta, check_calls=True, burst=burst)
    r = predict(TOY, cluster, agg, ZERO)
    rings = sum(cost(schedule("allreduce", "ring", 4, n, pipeline=1), CostParams(307e-6, beta), 4)
                for n in (1_000_000, 3_000_000, 4_000_000))
    assert float(r.communicate) == pytest.approx(rings - burst * beta, rel=1e-9)
    assert float(r.header) == 0  # none in steady state


def test_a_payload_smaller_than_the_credit_pays_only_its_messages() -> None:
    # Top-k at P = 4 sends 3 × 8000 entries of 8 bytes and receives as many: 192 kB, in credit
    agg, beta = Aggregation("topk", mode="model"), 8e-8
    cluster = ClusterModel(4, 1e8, 307e-6, beta=beta, check_calls=False, burst=256 * 1024)
    r = predict(TOY, cluster, agg, TABLE)
    plain = cost(schedule("allgather", "rd", 4, 4 * 8000 * 8, itemsize=1),
                 CostParams(307e-6, beta), 1)
    assert float(r.communicate) == pytest.approx(plain - 3 * 8000 * 8 * beta, rel=1e-9)
    assert float(r.communicate) == pytest.approx(2 * 307e-6, rel=1e-9)  # lg 4 messages


@settings(max_examples=20, deadline=None)
@given(method=st.sampled_from(["dense", "fp16", "topk", "gtopk", "powersgd", "signsgd"]),
       p=st.integers(1, 9), burst=st.floats(0, 2e6))
def test_a_token_bucket_never_makes_an_iteration_longer(method, p, burst) -> None:
    rates = np.array([1e8, 1e9])
    plain, credited = (predict(TOY, ClusterModel(p, rates, 307e-6, 0.1e-9, burst=b),
                               Aggregation(method), TABLE) for b in (0.0, burst))
    assert (credited.iteration <= plain.iteration + 1e-12).all()
    assert (credited.communicate >= 0).all()


@pytest.mark.parametrize(("kw", "msg"), [
    ({"straggle": -1e-3}, "straggler wait per iteration must be a finite number >= 0"),
    ({"straggle": float("inf")}, "straggler wait per iteration must be a finite number"),
    ({"burst": float("nan")}, r"token bucket \(bytes\) must be a finite number >= 0"),
    ({"burst": -1.0}, r"token bucket \(bytes\) must be a finite number >= 0"),
])
def test_cluster_refuses_bad_stragglers_and_buckets(kw, msg) -> None:
    with pytest.raises(GradwireError, match=msg):
        ClusterModel(4, 1e9, 1e-4, **kw)


@pytest.mark.parametrize(("hosts", "steps"), [(2, 1), (4, 2), (8, 3)])
def test_a_calibrations_sync_wait_is_charged_per_schedule_step(hosts, steps) -> None:
    """calibrate's sync wait is per call of its recursive-doubling probe (log2 P steps); the
    model charges it per step: ``cpu_sync_step_s`` where a file has it, else the per-call
    wait over the probe's steps."""
    from gradwire.perf.whatif import CpuSetting, sync_probe_steps

    d = {"cores_per_machine": 2, "cpu_ranks_per_machine": hosts, "cpu_step_s": 3e-4,
         "cpu_byte_s": 5e-10, "cpu_share": 0.95, "cpu_sync_s": 1.2e-3}
    assert sync_probe_steps(hosts) == steps
    assert CpuSetting.from_calibration(d, hosts).sync == pytest.approx(1.2e-3 / steps)
    assert CpuSetting.from_calibration(d | {"cpu_sync_step_s": 2e-4}, hosts).sync == 2e-4
    assert "µs wait per step" in CpuSetting.from_calibration(d, hosts).describe()


def test_compute_as_the_ranks_run_it_scales_forward_backward_and_step() -> None:
    """Point 10: a compute slowdown of 2 doubles forward, backward and the step (one bucket,
    dense: compute, then the ring)."""
    agg = Aggregation("dense", mode="model")
    base = ClusterModel(4, 1e9, 307e-6, beta=8.36e-9, check_calls=False)
    r = predict(TOY, dataclasses.replace(base, compute_slowdown=2.0), agg, TABLE)
    ring = cost(schedule("allreduce", "ring", 4, 8_000_000, pipeline=1), CostParams(307e-6,
                8.36e-9), 4)
    assert (r.forward, r.backward, r.step) == pytest.approx((0.1, 0.2, 0.02))
    assert float(r.iteration) == pytest.approx(0.1 + 0.2 + ring + 0.02, rel=1e-9)


@pytest.mark.parametrize("method, on_transport", [("topk", True), ("gtopk", True),
                                                   ("dense", False), ("powersgd", False)])
def test_the_executor_s_alpha_prices_what_runs_on_gradwire_s_transport(method,
                                                                        on_transport) -> None:
    """Point 9: the sparse schedules run on gradwire's executor and take its α; the backend's
    collectives (dense's ring, PowerSGD's allreduces) keep the backend's."""
    agg = Aggregation(method, mode="model")
    base = ClusterModel(4, 1e9, 307e-6, beta=8.36e-9, check_calls=False)
    same = predict(TOY, dataclasses.replace(base, alpha_transport=307e-6), agg, TABLE)
    slow = predict(TOY, dataclasses.replace(base, alpha_transport=3e-3), agg, TABLE)
    assert float(same.communicate) == pytest.approx(float(predict(TOY, base, agg,
                                                                  TABLE).communicate))
    assert (float(slow.communicate) > float(same.communicate)) == on_transport


@pytest.mark.parametrize("method", ["topk", "gtopk", "dgc"])
def test_a_bucket_that_goes_dense_is_priced_as_dense(method) -> None:
    """At a density whose pairs are no smaller than the bucket the hook sends it dense, over
    torch.distributed, encoding nothing; the model charged the method's encode and decode
    and the executor's α all the same."""
    base = ClusterModel(4, 1e9, 307e-6, beta=8.36e-9, alpha_transport=3e-3, check_calls=False)
    got = predict(TOY, base, Aggregation(method, density=0.6, mode="model"), TABLE)
    want = predict(TOY, base, Aggregation("dense", mode="model"), TABLE)
    assert float(got.coding) == 0.0
    assert float(got.communicate) == pytest.approx(float(want.communicate))
