"""The trace-driven simulator: trace format and validation, the max-min fair engine, schedule
replay against the cost model, and the paper's mechanisms on hand-checked toy cases."""
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.schedules.cost import CostParams, cost
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.collective import CollectiveOptions, simulate_collective
from gradwire.sim.engine import EPS, Engine, Network, maxmin
from gradwire.sim.mechanisms import parse, parse_list
from gradwire.sim.ps import PSOptions, simulate_ps
from gradwire.sim.replay import Replay, dataflow, single_peer, step_arrays

# The paper's toy model (§8.1.1, Figure 2): 3 operations, each 3 s of compute and 3 s on the
# wire (3 bytes at 1 byte/s), backward gradients in reverse order.
TOY = tr.Trace("toy", tuple(tr.Param(f"p{i}", 3) for i in range(3)),
               (tr.Iteration(0, 0, 0.0, (0.0, 0.0, 0.0), (9.0, 6.0, 3.0)),))
ONE_BYTE_PER_S = 8.0


def small_trace(n: int = 12, seed: int = 0) -> tr.Trace:
    rng = np.random.default_rng(seed)
    return tr.synthetic("small", [int(x) for x in rng.integers(1_000, 2_000_000, n)], 0.05, 0.1,
                        0.01)


# ---------------------------------------------------------------- traces


def test_trace_round_trips_and_keeps_every_field():
    t = small_trace()
    t2 = tr.loads(tr.dumps(t))
    assert t2 == t
    assert t2.total_bytes == sum(p.bytes for p in t.params)
    assert t2.backward_order()[0] == len(t.params) - 1  # the last layer's gradient comes first


GOOD = tr.dumps(tr.synthetic("m", [8, 16], 1.0, 2.0)).splitlines()


@pytest.mark.parametrize("lines, where", [
    ([GOOD[0].replace('"version": 1', '"version": 2'), *GOOD[1:]], r":1: field 'version'"),
    ([GOOD[0], GOOD[1].replace('"bytes": 8', '"bytes": -1'), *GOOD[2:]], r":2: field 'bytes'"),
    ([GOOD[0], GOOD[1].replace('"param": 0', '"param": 1'), *GOOD[2:]], r":2: field 'param'"),
    ([*GOOD[:3], GOOD[3].replace('"forward_s": 1.0', '"forward_s": "x"')],
     r":4: field 'forward_s'"),
    ([*GOOD[:3], GOOD[3].replace('"backward": [', '"backward": [1.0, ')], r":4: field 'backward'"),
    ([*GOOD[:3], GOOD[3].replace('"forward": [0.0, ', '"forward": [0.9, ')],
     r":4: field 'forward\[1\]'"),
    ([*GOOD[:3], GOOD[3][:-1]], r":4: not JSON"),
    ([*GOOD, GOOD[3]], r":5: field 'iteration'"),
    ([GOOD[0], GOOD[3]], r"no parameter lines"),
])
def test_malformed_trace_names_line_and_field(lines, where):
    with pytest.raises(GradwireError, match=where):
        tr.loads("\n".join(lines), "x.jsonl")


def test_editing_helpers():
    t = small_trace(5)
    fast = tr.scale_compute(t, 2.0)
    assert fast.iterations[0].forward_s == pytest.approx(t.iterations[0].forward_s / 2)
    assert fast.iterations[0].backward_s == pytest.approx(t.iterations[0].backward_s / 2)
    big = tr.add_layers(t, 3, 1000, 0.01, 0.02)
    assert len(big.params) == 8 and big.total_bytes == t.total_bytes + 3000
    assert big.iterations[0].forward_s == pytest.approx(t.iterations[0].forward_s + 0.03)
    assert big.iterations[0].backward_s == pytest.approx(t.iterations[0].backward_s + 0.06)
    tr.loads(tr.dumps(big))  # still valid: forward times never decrease
    assert tr.resize(t, "p2", 7).params[2].bytes == 7
    with pytest.raises(GradwireError, match="did you mean 'p2'"):
        tr.resize(t, "p22", 7)


def test_record_times_every_parameter():
    from gradwire.models import build_model

    t = tr.loads(tr.dumps(__import__("gradwire.sim.record", fromlist=["record"]).record(
        "mlp-small", iterations=2, batch_size=8)))
    model = build_model("mlp-small")
    assert len(t.params) == len(list(model.parameters()))
    assert t.total_bytes == sum(p.numel() * 4 for p in model.parameters())
    assert len(t.iterations) == 2
    it = t.iterations[0]
    assert it.backward[-1] < it.backward[0]  # the output layer's gradient is ready first
    assert it.forward[0] <= it.forward[-1] <= it.forward_s


# ---------------------------------------------------------------- engine


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_maxmin_is_feasible_and_every_flow_is_bottlenecked(data):
    nl = data.draw(st.integers(1, 6))
    cap = np.array(data.draw(st.lists(st.floats(0.5, 10.0), min_size=nl, max_size=nl)))
    flows = data.draw(st.lists(st.lists(st.integers(0, nl - 1), min_size=1, max_size=3,
                                        unique=True), min_size=1, max_size=8))
    rates = maxmin(flows, cap)
    load = np.zeros(nl)
    for f, r in zip(flows, rates, strict=True):
        load[f] += r
    assert (load <= cap * (1 + 1e-9)).all()
    for f, r in zip(flows, rates, strict=True):
        assert r > 0
        # bottleneck: a full link on which no flow gets more than this one
        assert any(load[lk] >= cap[lk] * (1 - 1e-9)
                   and all(r >= q * (1 - 1e-9) for g, q in zip(flows, rates, strict=True)
                           if lk in g) for lk in f)


def test_engine_shares_a_down_link_and_is_deterministic():
    def run():
        eng = Engine(Network.uniform(3, 1.0))
        out = []
        eng.unicast(0, 2, 2.0, lambda t: out.append(("a", t)))
        eng.unicast(1, 2, 1.0, lambda t: out.append(("b", t)))
        eng.run()
        return out
    # both at 1/2 until b is done at 2; then a alone: its last byte at 3
    assert run() == [("b", 2.0), ("a", 3.0)] == run()
    assert EPS < 1e-6


# ---------------------------------------------------------------- replay vs the cost model


def _replay(s, p, alpha, bw, gamma, ready=None):
    eng = Engine(Network.uniform(p, bw))
    done = np.zeros(p)
    rp = Replay(eng, list(range(p)), 4, alpha, gamma, lambda c, r, t: done.__setitem__(r, t))
    c = rp.add(s)
    for r in range(p):
        eng.at(0.0 if ready is None else ready[r], lambda r=r: rp.ready(c, r))
    eng.run()
    return done


UNCONTENDED = [("allreduce", "ring", {}), ("allreduce", "ring", {"pipeline": 3}),
               ("reducescatter", "ring", {}), ("allgather", "ring", {}),
               ("allreduce", "rd", {}), ("allreduce", "rhd", {}), ("broadcast", "binomial", {})]


@pytest.mark.parametrize("coll, algo, kw", UNCONTENDED, ids=[f"{c}/{a}{k}" for c, a, k in
                                                             UNCONTENDED])
@given(lgp=st.integers(0, 5), n=st.integers(0, 5000), alpha=st.floats(0, 1e-3),
       gbit=st.floats(0.1, 100), gamma=st.floats(0, 1e-9))
@settings(max_examples=15, deadline=None)
def test_uncontended_replay_equals_the_cost_model(coll, algo, kw, lgp, n, alpha, gbit, gamma):
    p = 1 << lgp  # powers of two: no rank ever hears from two peers at once
    if algo == "rhd":
        n -= n % p  # uneven halves put a rank's next partner on a link still in use
    if kw.get("pipeline", 1) > 1:
        gamma = 0.0  # the replay sums sub-chunk j while j+1 arrives; the cost model after both
    s = registry.schedule(coll, algo, p, n, **kw)
    bw = gbit * 1e9 / 8
    want = cost(s, CostParams(alpha, 1 / bw, gamma), 4)
    assert _replay(s, p, alpha, bw, gamma).max() == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_incast_is_cheaper_than_the_cost_models_serial_alpha():
    # ps: p-1 messages into one rank; the network overlaps their α, the cost model adds them up
    s = registry.schedule("allreduce", "ps", 5, 1000, servers=1)
    got = _replay(s, 5, 1e-4, 1e8, 0.0).max()
    assert got < cost(s, CostParams(1e-4, 1e-8), 4)


@given(p=st.integers(2, 9), pipeline=st.integers(1, 3), seed=st.integers(0, 100))
@settings(max_examples=20, deadline=None)
def test_ring_dataflow_equals_the_event_engine(p, pipeline, seed):
    rng = np.random.default_rng(seed)
    scheds = [registry.schedule("allreduce", "ring", p, int(n), pipeline=pipeline)
              for n in rng.integers(1, 3000, 3)]
    assert single_peer(scheds)
    ready = np.sort(rng.random((3, p)) * 1e-4, axis=0)
    net = Network.uniform(p, 1e8)
    fast, _ = dataflow([step_arrays(s, 4) for s in scheds], ready, net, range(p), 2e-6, 1e-10)
    eng = Engine(net)
    done = np.zeros((3, p))
    rp = Replay(eng, list(range(p)), 4, 2e-6, 1e-10, lambda c, r, t: done.__setitem__((c, r), t))
    for c, s in enumerate(scheds):
        rp.add(s)
        for r in range(p):
            eng.at(ready[c, r], lambda c=c, r=r: rp.ready(c, r))
    eng.run()
    np.testing.assert_allclose(fast, done, rtol=1e-12)


# ---------------------------------------------------------------- mechanisms


@pytest.mark.parametrize("opts, end", [
    (PSOptions(), 36.0),                                # staggered: 18 s distribution
    (PSOptions(ina=True), 30.0),
    (PSOptions(multicast=True), 30.0),                  # 9 s distribution, 21 s aggregation
    (PSOptions(multicast=True, ina=True), 21.0),        # 9 + 12: the paper's 12 s with INA
    (PSOptions(order="block"), 30.0),                   # block beats round-robin (§9.4)
])
def test_paper_toy_model(opts, end):
    r = simulate_ps(TOY, SimCluster(2, ONE_BYTE_PER_S, iterations=1), opts)
    assert r.ends == [end]


def test_ps_moves_each_byte_once_per_worker_and_multicast_once():
    t = small_trace(6)
    c = SimCluster(4, 1e9, servers=2, iterations=2)
    ps = simulate_ps(t, c, PSOptions(sharding="even"))
    assert ps.link_bytes["server down"] == pytest.approx(4 * 2 * t.total_bytes)
    assert ps.link_bytes["server up"] == pytest.approx(4 * 2 * t.total_bytes)
    mc = simulate_ps(t, c, PSOptions(multicast=True, ina=True))
    assert mc.link_bytes["server up"] == pytest.approx(2 * t.total_bytes)
    assert mc.link_bytes["server down"] == pytest.approx(2 * t.total_bytes)
    assert mc.iteration_s < ps.iteration_s


def test_no_barrier_keeps_the_first_iteration_and_pipelines_the_rest():
    t = small_trace(8)
    c = SimCluster(4, 10e9, iterations=3)
    on = simulate_ps(t, c, PSOptions(multicast=True, ina=True))
    off = simulate_ps(t, c, PSOptions(multicast=True, ina=True, barrier=False))
    assert off.ends[0] == pytest.approx(on.ends[0])
    assert len(off.ends) == 3 and off.iteration_s <= on.iteration_s * (1 + 1e-9)


def test_collectives_fast_path_matches_engine_and_compression_helps():
    t = small_trace(10)
    c = SimCluster(6, 1e9, iterations=2, seed=3)
    fast = simulate_collective(t, c, CollectiveOptions("ring"), fast=True)
    slow = simulate_collective(t, c, CollectiveOptions("ring"), fast=False)
    assert fast.ends == pytest.approx(slow.ends, rel=1e-12)
    assert fast.link_bytes == pytest.approx(slow.link_bytes, rel=1e-9)
    fp16 = simulate_collective(t, c, CollectiveOptions("ring", compressor="fp16"))
    assert fp16.iteration_s < fast.iteration_s
    bucketed = simulate_collective(t, c, CollectiveOptions("ring", bucket_bytes=25 * 2**20))
    assert bucketed.iteration_s != fast.iteration_s
    topk = parse("ring:compress=topk:density=0.01").run(t, c, False)  # allgather of payloads
    assert topk.iteration_s < fast.iteration_s


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_ring_multicast_sends_each_block_once_and_ties_ring(p):
    """Reduce-scatter by the ring schedule, then one multicast of each rank's block: a worker
    sends (P−1)/P·n + n/P = n bytes per tensor and receives 2(P−1)/P·n, as ring does; with
    links this fast against compute it ties ring (the paper's Table 6 finding)."""
    t = small_trace(6)
    c = SimCluster(p, 1e9, iterations=2)
    rm = parse("ring+multicast").run(t, c, False)
    ring = parse("ring").run(t, c, False)
    n = sum(x.bytes for x in t.params)
    assert rm.link_bytes["worker up"] == pytest.approx(2 * p * n if p > 1 else 0)
    assert rm.link_bytes["worker down"] == pytest.approx(ring.link_bytes["worker down"])
    assert rm.iteration_s <= ring.iteration_s * 1.05
    assert parse("ring+multicast:bucket=4096").run(t, c, True).timeline  # records flows
    for bad, msg in [("ring+multicast:compress=fp16", "no compressor"),
                     ("ring+multicast:bucket=-1", "bucket must be")]:
        with pytest.raises(GradwireError, match=msg):
            parse(bad)


def test_mechanism_names_and_options_are_checked():
    assert [m.label for m in parse_list("ps,ring,butterfly,ps:order=block")] == [
        "ps", "ring", "butterfly", "ps:order=block"]
    for bad, msg in [("rign", "did you mean 'ring'"), ("ps:ordr=block", "did you mean 'order'"),
                     ("ps:barrier=maybe", "on or off"), ("ps:order=x", "order must be"),
                     ("ring:compress=nope", "unknown compressor")]:
        with pytest.raises(GradwireError, match=msg):
            parse(bad)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "gradwire.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_simulate_and_bad_trace(tmp_path):
    path = tr.save(small_trace(6), tmp_path / "s.trace.jsonl")
    out = tmp_path / "r.json"
    r = _cli("simulate", "--trace", str(path), "--workers", "4", "--bandwidth", "10gbit",
             "--json", str(out), "--timeline", str(tmp_path / "t.json"))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())["results"]
    assert [x["mechanism"] for x in res] == ["ps", "multicast", "ina", "multicast+ina", "ring",
                                             "ring+multicast", "butterfly"]
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().replace('"bytes": ', '"bytes": -', 1))
    r = _cli("simulate", "--trace", str(bad))
    assert r.returncode == 2
    assert r.stderr.startswith("gradwire: error: ") and ":2: field 'bytes'" in r.stderr


@pytest.mark.parametrize("coll, algo, kw", [("allreduce", "ring", {}), ("allgather", "ring", {}),
                                            ("reducescatter", "ring", {"pipeline": 2}),
                                            ("allreduce", "rd", {})])
def test_table_is_the_schedule_as_arrays(coll, algo, kw):
    from gradwire.schedules.ir import Table

    for p in (1, 2, 5, 8):
        for n in (0, 3, 1000):
            want = Table.of(registry.schedule(coll, algo, p, n, **kw))
            got = registry.table(coll, algo, p, n, **kw)
            for f in ("step", "src", "dst", "start", "size", "reduces"):
                np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
