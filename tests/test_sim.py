"""The trace-driven simulator: trace format and validation, the max-min fair engine, schedule
replay against the cost model, and the paper's mechanisms on hand-checked toy cases."""
import json
import math

import numpy as np
import pytest
from conftest import gradwire_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.schedules.cost import CostParams, cost
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.collective import (
    CollectiveOptions,
    bucket_calls,
    bucket_shapes,
    buckets,
    simulate_collective,
)
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
    ([*GOOD[:3], GOOD[3][:-1]], r":4: line 1, column \d+: not valid JSON"),
    ([*GOOD, GOOD[3]], r":5: field 'iteration'"),
    ([GOOD[0], GOOD[3]], r"no parameter lines"),
    ([GOOD[0], GOOD[1].replace("}", ', "shape": [3]}'), *GOOD[2:]],
     r":2: field 'shape': 8 bytes are not a whole number of the shape's 3 elements"),
    ([GOOD[0], GOOD[1].replace("}", ', "shape": [4, 0]}'), *GOOD[2:]], r":2: field 'shape'"),
    ([GOOD[0], GOOD[1].replace("}", ', "shape": [9, 9]}'), *GOOD[2:]], r":2: field 'shape'"),
    ([GOOD[0], GOOD[1], GOOD[2].replace("}", ', "shape": "4x4"}'), GOOD[3]],
     r":3: field 'shape'"),
])
def test_malformed_trace_names_line_and_field(lines, where):
    with pytest.raises(GradwireError, match=where) as e:
        tr.loads("\n".join(lines), "x.jsonl")
    assert "\n" not in str(e.value)


# A small network in forward order: three weight matrices, their biases, a 0-d scale.
NET = [(32, 16), (32,), (64, 32), (64,), (10, 64), (10,), ()]


def shaped_trace() -> tr.Trace:
    return tr.synthetic("net", [4 * math.prod(s) for s in NET], 0.01, 0.02, shapes=NET)


def test_trace_shapes_round_trip_and_old_traces_still_load():
    t = shaped_trace()
    text = tr.dumps(t)
    assert '"shape": [32, 16]' in text and '"shape": []' in text
    assert tr.loads(text) == t
    assert [p.shape for p in tr.loads(text).params] == NET
    old = tr.loads("\n".join(GOOD))  # written without shapes
    assert [p.shape for p in old.params] == [None, None]
    assert '"shape"' not in tr.dumps(old)
    # bytes a whole multiple of the elements, not necessarily 4 per element (fp16: 2)
    half = tr.synthetic("h", [2 * 6, 8], 1.0, 2.0, shapes=[(2, 3), None])
    assert tr.loads(tr.dumps(half)) == half
    with pytest.raises(GradwireError, match="p0: shape: 12 bytes are not a whole number"):
        tr.synthetic("h", [12, 8], 1.0, 2.0, shapes=[(5,), None])


def test_edits_keep_shapes_of_unchanged_params_only():
    t = shaped_trace()
    assert tr.scale_compute(t, 2.0).params == t.params
    resized = tr.resize(t, "p2", 100)
    assert resized.params[2] == tr.Param("p2", 100)  # its shape no longer holds
    assert [p.shape for i, p in enumerate(resized.params) if i != 2] == NET[:2] + NET[3:]
    assert tr.resize(t, "p2", t.params[2].bytes).params == t.params
    big = tr.add_layers(t, 2, 1000, 0.01, 0.02, after=1)
    assert [p.shape for p in big.params] == NET[:2] + [None, None] + NET[2:]
    assert tr.loads(tr.dumps(big)) == big


def test_paper_traces_carry_the_profiles_shapes_in_forward_order():
    from gradwire import profiles
    from gradwire.sim.paper import paper_trace

    t = paper_trace("vgg16")
    prof = profiles.load("vgg16")
    assert [p.shape for p in t.params] == list(reversed(prof.shapes))
    assert t.params[0].shape == (64, 3, 3, 3)  # the first convolution comes first
    assert all(p.bytes == 4 * math.prod(p.shape) for p in t.params)


def _up_bytes(t: tr.Trace, o: CollectiveOptions, world: int) -> int:
    """Bytes over the workers' up links per iteration."""
    c = SimCluster(world, 1e9, iterations=2)
    return round(simulate_collective(t, c, o).link_bytes["worker up"] / c.iterations)


@pytest.mark.parametrize("world", [2, 5])
def test_powersgd_prices_each_weight_of_a_bucket_as_its_own_matrix(world):
    import torch

    from gradwire import catalogue

    t = shaped_trace()
    numel = t.total_bytes // 4
    o = CollectiveOptions("ring", bucket_bytes=t.total_bytes, compressor="powersgd",
                          compressor_params={"rank": 2})
    [group] = buckets(t, o.bucket_bytes)
    shapes = bucket_shapes(t, group)
    assert sorted(shapes) == sorted(NET)
    m = catalogue.get("powersgd")
    compressor, density = m.compressor_from(o.compressor_params)

    def want(shapes):
        plan = m.plan(numel, world, torch.float32, compressor, density, "ring", shapes)
        return int(plan.bytes_sent(world).sum())

    assert _up_bytes(t, o, world) == want(NET)  # the order of the tensors moves no bytes
    flat = tr.synthetic("net", [p.bytes for p in t.params], 0.01, 0.02)
    assert _up_bytes(flat, o, world) == want(None) != want(NET)
    calls, item = bucket_calls(t.total_bytes, world, o, shapes)
    assert item == 4 and [c.what for c in calls] == ["P", "Q"]
    assert [c.count for c in calls] != [c.count for c in bucket_calls(t.total_bytes, world,
                                                                       o)[0]]


def test_a_bucket_is_shaped_only_when_every_tensor_is_float32_with_a_shape():
    t = shaped_trace()
    everything = list(range(len(t.params)))
    assert bucket_shapes(t, everything) == tuple(NET)
    assert bucket_shapes(tr.resize(t, "p0", 7), everything) is None  # p0 lost its shape
    half = tr.synthetic("h", [2 * 6, 4 * 6], 1.0, 2.0, shapes=[(2, 3), (2, 3)])
    assert bucket_shapes(half, [0, 1]) is None  # fp16: the simulator prices float32
    assert bucket_shapes(half, [1]) == ((2, 3),)


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
    for after in (-1, 5, 1.5):
        with pytest.raises(GradwireError, match=r"after must be a parameter index in 0\.\.4"):
            tr.add_layers(t, 1, 1000, 0.01, 0.02, after=after)


HEAD = '{"format": "gradwire-trace", "version": 1, "model": "m"'
ONE_PARAM = ['{"param": 0, "name": "a", "bytes": 4}',
             '{"worker": 0, "iteration": 0, "forward_s": 0, "forward": [0], "backward": [0]}']


@pytest.mark.parametrize("lines, where", [
    ([HEAD + ', "format2": NaN}', *ONE_PARAM], r"x\.jsonl:1: field 'format2': NaN: a trace "
     r"holds finite numbers only \(strict JSON has no NaN or Infinity\)$"),
    ([HEAD + ', "x": {"y": [Infinity]}}', *ONE_PARAM], r"x\.jsonl:1: field 'x': Infinity"),
    ([HEAD + ', "x": [1e999]}', *ONE_PARAM],
     r"x\.jsonl:1: field 'x': Infinity \(or a number too large for a float\)"),
    ([HEAD + "}", ONE_PARAM[0].replace("}", ', "extra": -Infinity}'), ONE_PARAM[1]],
     r"x\.jsonl:2: field 'extra': -Infinity"),
    ([HEAD + "}", ONE_PARAM[0], ONE_PARAM[1].replace("}", ', "note": [NaN]}')],
     r"x\.jsonl:3: field 'note': NaN"),
    ([HEAD + "}", ONE_PARAM[0], ONE_PARAM[1].replace('"forward_s": 0', '"forward_s": NaN')],
     r"x\.jsonl:3: field 'forward_s': NaN"),
    ([HEAD + "}", ONE_PARAM[0], ONE_PARAM[1].replace('"forward": [0]', '"forward": [NaN]')],
     r"x\.jsonl:3: field 'forward\[0\]': expected seconds from 0 to 1e\+06, got nan"),
])
def test_a_trace_with_nan_or_infinity_is_refused(lines, where):
    """JSON has no NaN or Infinity: Python's reader takes them, and a header key kept as
    metadata was written back as NaN, a file other readers refuse."""
    with pytest.raises(GradwireError, match=where) as e:
        tr.loads("\n".join(lines), "x.jsonl")
    assert "\n" not in str(e.value)


def test_a_trace_is_written_as_strict_json(tmp_path):
    from conftest import strict_json

    t = tr.loads("\n".join([HEAD + ', "note": "NaN", "n": 1.5}', *ONE_PARAM]))
    assert t.meta == {"note": "NaN", "n": 1.5}  # a string "NaN" is no number: kept
    t = tr.Trace("m", t.params, t.iterations, meta={"loss": math.nan, "top": [math.inf]})
    text = tr.dumps(t)
    for line in text.splitlines():
        strict_json(line)
    assert tr.loads(text).meta == {"loss": None, "top": [None]}
    # the command line: a header with NaN is an error, not a trace written back with NaN
    src = tmp_path / "nan.jsonl"
    src.write_text("\n".join([HEAD + ', "format2": NaN}', *ONE_PARAM]) + "\n")
    out = tmp_path / "out.jsonl"
    r = gradwire_cli("trace", "--from", str(src), "-o", str(out))
    assert r.returncode == 2 and not out.exists()
    assert r.stderr.startswith("gradwire: error: ") and "nan.jsonl:1: field 'format2': NaN" \
        in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_parameter_names_must_be_unique():
    """``--resize NAME`` resized every parameter of that name: a trace names each one once."""
    lines = [HEAD + "}", ONE_PARAM[0], ONE_PARAM[0].replace('"param": 0', '"param": 1'),
             ONE_PARAM[1].replace("[0]", "[0, 0]")]
    with pytest.raises(GradwireError, match=r"x\.jsonl:3: field 'name': 'a' is already the "
                       r"name of the parameter on line 2") as e:
        tr.loads("\n".join(lines), "x.jsonl")
    assert "\n" not in str(e.value)
    with pytest.raises(GradwireError, match=r"'b' is given twice \(parameters 1 and 3\)"):
        tr.synthetic("m", [4, 4, 4, 4], 1.0, 2.0, names=["a", "b", "c", "b"])
    twice = tr.Trace("m", (tr.Param("a", 4), tr.Param("a", 8)), TOY.iterations[:0])
    with pytest.raises(GradwireError, match="2 parameters are named 'a'"):
        tr.resize(twice, "a", 16)


def test_layers_added_twice_have_names_of_their_own():
    """add_layers named its layers added0, added1, .. every time: added again, two parameters
    were named added0, and --resize added0=300 resized both."""
    t = tr.synthetic("m", [4000, 4000], 0.01, 0.02)
    once = tr.add_layers(t, 1, 1000, 0.001, 0.002)
    twice = tr.loads(tr.dumps(tr.add_layers(once, 2, 1000, 0.001, 0.002)))
    assert [p.name for p in twice.params] == ["p0", "added0", "added1", "added2", "p1"]
    assert [p.bytes for p in tr.resize(twice, "added0", 300).params] == [
        4000, 300, 1000, 1000, 4000]
    # numbered on from the highest addedN, whatever else is named
    odd = tr.synthetic("m", [4, 4, 4], 1.0, 2.0, names=["added7", "added", "addedx"])
    assert [p.name for p in tr.add_layers(odd, 2, 4, 0.0, 0.0).params] == [
        "added7", "added", "added8", "added9", "addedx"]
    with pytest.raises(GradwireError, match="no parameter 'added3'"):
        tr.resize(twice, "added3", 300)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_synthetic_backward_pass_takes_its_whole_time(n):
    """The last gradient (parameter 0's) is ready when the backward pass ends, and the first
    (the last parameter's) after the first layer's time, one parameter included."""
    it = tr.synthetic("m", [40] * n, 0.01, 0.02, first_backward_s=0.001).iterations[0]
    assert it.backward_s == pytest.approx(0.02) and it.backward[0] == pytest.approx(0.02)
    assert it.backward[-1] == pytest.approx(0.001 if n > 1 else 0.02)


def test_record_times_every_parameter():
    from gradwire.models import build_model

    t = tr.loads(tr.dumps(__import__("gradwire.sim.record", fromlist=["record"]).record(
        "mlp-small", iterations=2, batch_size=8)))
    model = build_model("mlp-small")
    assert len(t.params) == len(list(model.parameters()))
    assert t.total_bytes == sum(p.numel() * 4 for p in model.parameters())
    assert sorted(p.shape for p in t.params) == sorted(tuple(q.shape) for q in model.parameters())
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
# α is 0 or at least 1 ns, γ is 0 or at least 0.1 ps per element (40 TB/s, beyond any memory
# system): the engine merges events within a relative 1e-9 (EPS) of each other, so a step
# shorter than EPS·t (α of 1e-15 s; γ of 8e-16 s on 2 elements at t = 2e-5 s, both drawn once)
# is summed by the cost model and partly merged by the replay.
@given(lgp=st.integers(0, 5), n=st.integers(0, 5000),
       alpha=st.one_of(st.just(0.0), st.floats(1e-9, 1e-3)),
       gbit=st.floats(0.1, 100), gamma=st.one_of(st.just(0.0), st.floats(1e-13, 1e-9)))
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
    ideal = SimCluster(2, ONE_BYTE_PER_S, alpha=0.0, latency=0.0, iterations=1)
    r = simulate_ps(TOY, ideal, opts)
    assert r.ends == [end]
    # the default network adds each message's α and latency, nothing else
    slow = simulate_ps(TOY, SimCluster(2, ONE_BYTE_PER_S, iterations=1), opts)
    assert end < slow.ends[0] < end + 1e-3


def test_default_host_costs_are_a_datacenter_ethernet_and_zero_stays_possible(tmp_path):
    from gradwire.sim import simulate
    from gradwire.sim.cluster import DEFAULT_ALPHA_S, DEFAULT_LATENCY_S

    c = SimCluster(8, 25e9, iterations=1)
    assert (c.alpha, c.latency) == (DEFAULT_ALPHA_S, DEFAULT_LATENCY_S) == (10e-6, 1.5e-6)
    ideal = SimCluster(8, 25e9, alpha=0.0, latency=0.0, iterations=1)
    # one small tensor: its ring's 2(P-1) steps each pay α and the latency at both ends
    t = tr.synthetic("one", [4 * 8 * 16], 0.01, 0.02)
    ring = parse("ring")
    extra = ring.run(t, c, False).iteration_s - ring.run(t, ideal, False).iteration_s
    assert extra == pytest.approx(14 * (DEFAULT_ALPHA_S + 2 * DEFAULT_LATENCY_S), rel=1e-6)
    path = tr.save(t, tmp_path / "one.trace.jsonl")
    assert simulate.prepare([path]).cluster == SimCluster(32, 25e9)
    got = simulate.prepare([path], alpha_us=0, latency_us=0).cluster
    assert (got.alpha, got.latency) == (0.0, 0.0)


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
    c = SimCluster(4, 1e9, iterations=3)  # at 10 Gbit/s compute hides it: both the same
    on = simulate_ps(t, c, PSOptions(multicast=True, ina=True))
    off = simulate_ps(t, c, PSOptions(multicast=True, ina=True, barrier=False))
    assert off.ends[0] == pytest.approx(on.ends[0])
    assert len(off.ends) == 3 and off.ends[-1] < on.ends[-1] * (1 - 1e-3)


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


def test_cli_sweeps_and_tables_show_progress_when_piped(tmp_path):
    """Piped or logged, a sweep or a paper's table ran silent until its result: the spinner
    that shows progress on a terminal draws nothing there, and no stderr line stood in."""
    path = tr.save(small_trace(6), tmp_path / "s.trace.jsonl")
    sweep = gradwire_cli("simulate", "--trace", str(path), "--bandwidth", "10gbit",
                         "--mechanism", "ps,ring", "--sweep", "workers=2,4")
    table = gradwire_cli("simulate", "--trace", str(path), "--table", "4")
    for r in (sweep, table):
        assert r.returncode == 0, r.stderr
    said = [line.split(" (")[0] for line in sweep.stderr.splitlines()
            if line.startswith("gradwire simulate: ")]
    assert said == [f"gradwire simulate: workers={w}: simulating {m}"
                    for w in (2, 4) for m in ("ps", "ring")], sweep.stderr
    said = [line for line in table.stderr.splitlines() if line.startswith("gradwire simulate: ")]
    assert len(said) == 4 and all(": simulating " in line for line in said), table.stderr


def test_profile_and_trace_recordings_show_progress_when_piped(tmp_path):
    """profile --model and trace --model ran their iterations silent until the result (at
    --iters 1000 or a large batch, minutes); an edit of a trace is quick and says nothing."""
    prof = gradwire_cli("profile", "--model", "mlp-small", "--iters", "5", "--warmup", "3")
    rec = gradwire_cli("trace", "--model", "mlp-small", "--iterations", "3", "-o",
                       str(tmp_path / "t.jsonl"))
    edit = gradwire_cli("trace", "--from", str(tmp_path / "t.jsonl"), "--compute-speedup",
                        "2", "-o", str(tmp_path / "t2.jsonl"))
    for r in (prof, rec, edit):
        assert r.returncode == 0, r.stderr
    for r, label, total in ((prof, "profile mlp-small", 8), (rec, "trace mlp-small", 4)):
        said = [line.split(" (")[0] for line in r.stderr.splitlines()]
        assert said[-1] == f"gradwire {label}: {total}/{total} done", r.stderr
        assert len(said) == 4 and all(line.startswith(f"gradwire {label}: ") for line in said)
    assert "gradwire trace" not in edit.stderr, edit.stderr


def test_cli_simulate_and_bad_trace(tmp_path):
    path = tr.save(small_trace(6), tmp_path / "s.trace.jsonl")
    out = tmp_path / "r.json"
    r = gradwire_cli("simulate", "--trace", str(path), "--workers", "4", "--bandwidth", "10gbit",
                     "--json", str(out), "--timeline", str(tmp_path / "t.json"), columns=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())["results"]
    assert [x["mechanism"] for x in res] == ["ps", "multicast", "ina", "multicast+ina", "ring",
                                             "ring+multicast", "butterfly"]
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X"}
    # piped: each mechanism's start is a line on stderr; the table fits 120 columns whole
    said = [line.split(" (")[0] for line in r.stderr.splitlines()
            if line.startswith("gradwire simulate: ")]
    assert said == [f"gradwire simulate: simulating {m}" for m in [x["mechanism"] for x in res]]
    assert "ring+multicast " in r.stdout and "…" not in r.stdout, r.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().replace('"bytes": ', '"bytes": -', 1))
    r = gradwire_cli("simulate", "--trace", str(bad))
    assert r.returncode == 2
    assert r.stderr.startswith("gradwire: error: ") and ":2: field 'bytes'" in r.stderr


def test_cli_simulate_takes_alpha_and_gamma_from_a_calibration(tmp_path):
    import calibration_doc

    path = tr.save(small_trace(4), tmp_path / "s.trace.jsonl")
    cal, slow_sum = tmp_path / "cal.json", tmp_path / "slow_sum.json"
    cal.write_text(json.dumps(calibration_doc.doc(alpha_s=2.5e-4, gamma_s_per_byte=1e-10)))
    slow_sum.write_text(json.dumps(calibration_doc.doc(alpha_s=2.5e-4, gamma_s_per_byte=1e-8)))
    runs = {}
    for name, extra in (("calibrated", ["--calibration", str(cal)]), ("default", []),
                        ("slow_sum", ["--calibration", str(slow_sum)])):
        out = tmp_path / f"{name}.result.json"  # not the calibration it reads
        r = gradwire_cli("simulate", "--trace", str(path), "--workers", "4", "--bandwidth",
                         "10gbit", "--mechanism", "ring", "--json", str(out), *extra)
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads(out.read_text())["results"][0]
    assert "α 250.0 µs per message" in " ".join(gradwire_cli(
        "simulate", "--trace", str(path), "--workers", "4", "--mechanism", "ring",
        "--calibration", str(cal)).stdout.split())
    # 250 µs per message against the default 13: the ring's many messages cost more
    assert runs["calibrated"]["iteration_s"] > runs["default"]["iteration_s"]
    # and the calibration's γ prices the ring's sums: 10 ns/B against 0.1
    assert runs["slow_sum"]["iteration_s"] > runs["calibrated"]["iteration_s"]


@pytest.mark.parametrize("coll, algo, kw", [("allreduce", "ring", {}), ("allgather", "ring", {}),
                                            ("reducescatter", "ring", {"pipeline": 2})])
def test_table_is_the_schedule_as_arrays(coll, algo, kw):
    """The ring's table builder (others without one are Table.of their schedule) gives the
    schedule's arrays."""
    from gradwire.schedules.ir import Table

    for p in (1, 2, 5, 8):
        for n in (0, 3, 1000):
            want = Table.of(registry.schedule(coll, algo, p, n, **kw))
            got = registry.table(coll, algo, p, n, **kw)
            for f in ("step", "src", "dst", "start", "size", "reduces"):
                np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)


# ---------------------------------------------------------------- report and simulate


@pytest.mark.parametrize("workers", [2, 999, 1000, 4096])
def test_timeline_processes_never_collide(tmp_path, workers):
    """Process ids were 1000 * k + host: at 1000 hosts, PS's server 0 (host 1000) and the
    next mechanism's worker 0 were both process 1000, their events merged."""
    from conftest import strict_json

    from gradwire.sim.cluster import SimResult
    from gradwire.sim.report import write_timeline

    def result(name: str, hosts: int) -> SimResult:
        return SimResult(name, 1.0, [1.0], 0.5, {}, {}, [
            {"name": "x", "ph": "X", "pid": h, "tid": 1, "ts": 0.0, "dur": 1.0}
            for h in range(hosts)])

    results = [result("ps", workers + 1), result("multicast", workers),
               result("ring", workers)]
    doc = strict_json(write_timeline(results, workers, tmp_path / "t.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert len(names) == 3 * workers + 1  # one process per host per mechanism, none shared
    assert names[workers] == "ps: server 0"
    got = {(names[e["pid"]], e["pid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    assert len(got) == 3 * workers + 1
    if workers < 1000:  # as before: process 1000 k + host
        assert names[1000] == "multicast: worker 0" and names[2001] == "ring: worker 1"


def test_every_sweep_value_is_checked_before_the_sweep_runs(tmp_path):
    """A value the trace cannot take was refused when the sweep reached it, after the values
    before it had been simulated; prepare() says everything is checked before the run."""
    from gradwire.sim import simulate

    path = tr.save(tr.synthetic("m", [8, 8], 1e5, 4e5), tmp_path / "m.trace.jsonl")
    assert simulate.prepare([path], sweep="layers=1,2").sweep == "layers=1,2"
    assert simulate.prepare([path], sweep="speedup=1,0.4").sweep == "speedup=1,0.4"
    for sweep, msg in [
            ("layers=1,99999", r"^--sweep layers=99999: layers to add must be from 0 to 99998"),
            ("speedup=1,2,0.1", r"^--sweep speedup=0\.1: compute speed-up 0\.1 would make a "
                                r"pass take 4e\+06 s")]:
        with pytest.raises(GradwireError, match=msg) as e:
            simulate.prepare([path], sweep=sweep)
        assert "\n" not in str(e.value)
