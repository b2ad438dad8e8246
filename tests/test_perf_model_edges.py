"""Edges of the performance model: a token bucket's credit spent once per bucket and only on
the links it shapes, coding on the device waiting for the last bucket's messages, equal
predictions ranked the same whatever order they were asked in, and an iteration of no time."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gradwire import profiles
from gradwire.perf import codecs, comm
from gradwire.perf.advise import rank
from gradwire.perf.model import Aggregation, ClusterModel, buckets, operations, predict

TABLE = codecs.load("h100")
# three weights with shapes (PowerSGD compresses each as its own matrix), backward order
SHAPED = profiles.parse("""{"format": 1, "model": "shaped", "forward_s": 0.05,
  "backward_s": 0.1, "step_s": 0.01, "params": [["c", 1000000, [1000, 1000]],
  ["b", 3000000, [1000, 3000]], ["a", 4000000, [2000, 2000]]]}""", "shaped")
TOY = profiles.parse("""{"format": 1, "model": "toy", "forward_s": 0.05, "backward_s": 0.1,
  "step_s": 0.01, "params": [["c", 1000000], ["b", 3000000], ["a", 4000000]]}""", "toy")


def test_a_buckets_calls_share_one_token_bucket_credit() -> None:
    """PowerSGD's bucket makes two allreduces (P, then Q) back to back; the links' credit is
    spent by the first and what is left goes to the second. Each call was given the whole
    credit, so a 100 kB bucket saved the time of 196 kB."""
    agg, beta, burst = Aggregation("powersgd", mode="model"), 8e-8, 100e3
    plain, credited = (predict(SHAPED, ClusterModel(4, 1e8, 307e-6, beta=beta,
                                                    check_calls=False, burst=b), agg, TABLE)
                       for b in (0.0, burst))
    # both calls together send more than the credit: it is all spent, once
    calls = operations(agg, SHAPED.numel, 4, "float32", SHAPED.shapes)[0]
    assert len(calls) == 2
    assert sum(comm.busiest_bytes(c, a, 4, n, e, **prm) for c, a, n, e, prm in calls) > burst
    saved = float(plain.communicate - credited.communicate)
    assert saved == pytest.approx(burst * beta, rel=1e-9)


@pytest.mark.parametrize("method", ["dense", "topk", "powersgd"])
def test_a_token_bucket_saves_nothing_inside_a_node_and_never_goes_below_zero(method) -> None:
    """The credit is on the shaped links between nodes. With every rank on one node the
    traffic never reaches them, so nothing is saved; the saving was priced at the shaped
    link's β for bytes that cross the node's fast link, and communication came out
    negative (−154 ms for a 6 ms dense allreduce)."""
    agg = Aggregation(method, mode="model")

    def cluster(p: int, burst: float) -> ClusterModel:
        return ClusterModel(p, 1e8, 307e-6, check_calls=False, burst=burst, ranks_per_node=4)

    one_node = [predict(SHAPED, cluster(4, b), agg, TABLE) for b in (0.0, 2e6)]
    assert float(one_node[1].communicate) == pytest.approx(float(one_node[0].communicate))
    plain, credited = (predict(SHAPED, cluster(8, b), agg, TABLE) for b in (0.0, 2e6))
    assert 0 <= float(credited.communicate) <= float(plain.communicate)
    assert float(credited.iteration) >= credited.forward + credited.backward + credited.step


def test_coding_on_the_device_waits_for_the_last_buckets_messages() -> None:
    """Point 8: with coding on the training device the last bucket's encode comes after all
    of backward and every earlier coding, its messages after it and its decode after them,
    so nothing on the device runs beside those messages. The bound left them out: a coded
    scheme's iteration did not depend on the link at all (PowerSGD on ResNet-50 at 64
    workers: 228.0 ms at 1 and at 10 Gbit/s)."""
    table = codecs.CodecTable("slow", TOY.numel, {"topk": {"encode_s": 0.4, "decode_s": 0.1}},
                              "test")
    agg = Aggregation("topk", density=0.01, bucket_mb=10, first_bucket_mb=1)
    rates = np.array([1e8, 1e9])
    cluster = ClusterModel(4, rates, 307e-6, check_calls=False, coding_slowdown=1.0)
    r = predict(TOY, cluster, agg, table)
    last = buckets(TOY, agg)[-1][0]
    t_last = sum(comm.seconds(c, a, 4, n, e, 307e-6, cluster.beta_s, **prm)
                 for c, a, n, e, prm in operations(agg, last, 4)[0])
    want = r.forward + r.backward + r.coding + t_last + r.step
    assert r.iteration == pytest.approx(want, rel=1e-9)
    assert r.iteration[0] > r.iteration[1]  # a slower link is slower
    # and in the compression-utility paper's own setting (the reference v100)
    from gradwire.perf import scenario

    times = [scenario.advise(scenario.Scenario(model="resnet50", agg="powersgd"), 64, bw,
                             1.0).ranked[0].seconds for bw in ("1gbit", "10gbit")]
    assert times[0] > times[1]
    # where the last bucket codes nothing, its allreduce needs nothing of the device
    free = codecs.CodecTable("t", 1, {"dense": {"encode_s": 0.0, "decode_s": 0.0}}, "test")
    d = predict(TOY, cluster, Aggregation("dense", bucket_mb=10, first_bucket_mb=1), free)
    assert d.device_bound == pytest.approx(d.forward + d.backward + d.step)


def test_equal_predictions_rank_the_same_whatever_order_they_were_given_in() -> None:
    """On one worker every scheme takes the compute's time; the ranking followed --agg's
    order, so `advise --workers 1 --agg topk,dense` advised Top-k, a compressor that saves
    nothing and may cost accuracy. Ties rank in the catalogue's order, dense first."""
    cluster = ClusterModel(1, 1e9, 50e-6)
    names = ["topk", "fp16", "dense"]
    orders = []
    for given in (names, names[::-1], ["fp16", "topk", "dense"]):
        ranked, _ = rank(TOY, cluster, [Aggregation(m) for m in given], TABLE)
        assert len({r.seconds for r in ranked}) == 1  # a tie, exactly
        orders.append([r.agg.method for r in ranked])
    assert orders == [["dense", "fp16", "topk"]] * 3


def test_an_iteration_of_no_time_has_efficiency_one_not_nan() -> None:
    """A profile of zero compute on one worker predicts 0 s: its efficiency was 0/0, NaN
    with a RuntimeWarning ("nan%" in whatif's and advise's tables)."""
    zero = profiles.parse('{"format": 1, "model": "zero", "forward_s": 0, "backward_s": 0, '
                          '"params": [["a", 1000]]}', "zero")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = predict(zero, ClusterModel(1, np.array([1e9, 1e10]), 50e-6), Aggregation("dense"),
                    TABLE)
        assert (r.iteration == 0).all()
        assert r.efficiency.tolist() == [1.0, 1.0]
        two = predict(zero, ClusterModel(2, 1e9, 50e-6), Aggregation("dense"), TABLE)
        assert float(two.efficiency) == 0.0  # all of it communication
