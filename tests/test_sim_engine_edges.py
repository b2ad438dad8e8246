"""The trace-driven simulator's engine and mechanisms at their edges: a link that never finishes
a flow, a parameter of no bytes under even sharding, errors a trace brings out naming their
mechanism; and more bandwidth never slower."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.errors import GradwireError
from gradwire.sim import mechanisms
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.engine import Engine, Network
from gradwire.sim.ps import PSOptions, simulate_ps


@pytest.mark.parametrize("bps", [5e-324, 1e-300])
@pytest.mark.parametrize("mech", ["ps", "multicast+ina", "butterfly", "ring+multicast"])
def test_a_rate_too_small_to_finish_a_flow_is_an_error_not_a_deadlock(bps, mech):
    """A bandwidth that underflows to 0 bytes/s (or bytes / rate past the largest float) left
    flows whose end never came: the engine stopped as if done and the mechanism said "a
    deadlock: report this"."""
    t = tr.synthetic("m", [4000, 2**40], 0.01, 0.02)
    with pytest.raises(GradwireError, match="never ends: a time, size or rate"):
        mechanisms.parse(mech).run(t, SimCluster(3, bps, iterations=2), False)


def test_the_engine_refuses_a_link_of_no_capacity():
    eng = Engine(Network([0.0, 1.0], [1.0, 1.0]))
    eng.unicast(0, 1, 10.0, lambda t: None)
    with pytest.raises(GradwireError, match="flow of 10 bytes at 0 bytes/s that never ends"):
        eng.run()


@pytest.mark.parametrize("opts", [PSOptions(sharding="even"),
                                  PSOptions(sharding="even", multicast=True, ina=True),
                                  PSOptions(sharding="even", barrier=False)])
def test_even_sharding_of_a_parameter_of_no_bytes_is_sent_as_tensor_sharding_sends_it(opts):
    """A Trace made in Python may hold a parameter of 0 bytes: ``sharding=even`` dropped its
    every (empty) piece, so no worker ever had it and the run stopped as a deadlock."""
    t = tr.Trace("m", (tr.Param("a", 0), tr.Param("b", 400)),
                 (tr.Iteration(0, 0, 0.01, (0.0, 0.005), (0.02, 0.01)),))
    c = SimCluster(3, 1e9, servers=2, iterations=2)
    even = simulate_ps(t, c, opts)
    tensor = simulate_ps(t, c, PSOptions(multicast=opts.multicast, ina=opts.ina,
                                         barrier=opts.barrier))
    assert len(even.ends) == 2
    # b is 400 bytes: whole on server 1 (tensor) or 200 + 200 (even); a has no bytes either way
    assert even.link_bytes == pytest.approx(tensor.link_bytes)


def test_an_error_the_trace_brings_out_names_its_mechanism():
    """``ring:pipeline=10000`` parses (checked on 2 elements) and fails on a 4 MB tensor; in a
    --mechanism list the message did not say which mechanism, after the others had run."""
    t = tr.synthetic("m", [4_000_000], 0.01, 0.02)
    ms = [mechanisms.parse("ring"), mechanisms.parse("ring:pipeline=10000")]
    with pytest.raises(GradwireError, match=r"^mechanism 'ring:pipeline=10000': pipeline=10000 "
                                            r"cuts"):
        mechanisms.run(t, SimCluster(5, 1e9, iterations=1), ms)
    # an error that names its mechanism already is left as it is
    bad = tr.Trace("m", (tr.Param("a", 4000),),
                   (tr.Iteration(0, 0, float("nan"), (0.0,), (0.01,)),))
    with pytest.raises(GradwireError, match=r"^ring: an iteration ended at nan s"):
        mechanisms.run(bad, SimCluster(2, 1e9, iterations=1), [mechanisms.parse("ring")])


MECHS = ["ps", "multicast", "ina", "multicast+ina", "ps:order=block", "ring", "butterfly",
         "ring+multicast"]


@given(sizes=st.lists(st.integers(1, 2_000_000), min_size=1, max_size=4),
       p=st.integers(1, 5), servers=st.integers(1, 2), lo=st.sampled_from([1e8, 1e9]),
       factor=st.sampled_from([1.5, 4.0, 100.0]))
@settings(max_examples=12, deadline=None, derandomize=True)
def test_more_bandwidth_is_never_slower(sizes, p, servers, lo, factor):
    t = tr.synthetic("m", sizes, 0.004, 0.008, 0.001)
    for name in MECHS:
        m = mechanisms.parse(name)
        s = servers if name.startswith(("ps", "multicast", "ina")) else 1
        slow = m.run(t, SimCluster(p, lo, servers=s, iterations=2), False)
        fast = m.run(t, SimCluster(p, lo * factor, servers=s, iterations=2), False)
        assert fast.ends[-1] <= slow.ends[-1] * (1 + 1e-9), name


def test_a_ring_simulation_keeps_none_of_its_tables():
    """A ring's table is 2(P−1)P transfers a bucket (33 M at 4096 workers, 1.6 GB): every
    distinct bucket's was kept in the schedule cache after the run, 12.5 GB for resnet20 at
    4096 workers. Each is now built, compiled and dropped."""
    import gc
    import tracemalloc

    t = tr.synthetic("m", [4000 + 8 * i for i in range(12)], 0.01, 0.02)
    mech = mechanisms.parse("ring")
    mech.run(t, SimCluster(130, 1e9, iterations=1), False)  # imports and warm caches
    gc.collect()
    tracemalloc.start()
    try:
        mech.run(t, SimCluster(128, 1e9, iterations=1), False)
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 2_000_000, kept  # the 12 tables were 5 MB each


@pytest.mark.parametrize("mech, record", [("ring", True), ("butterfly", True),
                                          ("ring+multicast", True), ("ring+multicast", False),
                                          ("butterfly", False), ("ps", True), ("ps", False)])
def test_a_run_too_large_to_replay_or_record_is_refused(monkeypatch, mech, record):
    """A timeline of a ring on 1024 workers ran for an hour towards 140 GB, and a
    ring+multicast on 4096 workers for hours: the messages are counted first where the
    schedules give them (a PS's, as the engine finishes them), and past the bound the run is
    one line."""
    from gradwire.sim import engine

    monkeypatch.setattr(engine, "MAX_RECORDED" if record else "MAX_REPLAYED", 500)
    t = tr.synthetic("m", [4000] * 5, 0.01, 0.02)
    which = "a timeline holds at most 500 messages" if record else "sends more than 500"
    with pytest.raises(GradwireError, match=which):
        mechanisms.parse(mech).run(t, SimCluster(32, 1e9, iterations=2), record)
    mechanisms.parse(mech).run(t, SimCluster(4, 1e9, iterations=1), record)  # within it
