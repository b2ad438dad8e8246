"""The trace-driven simulator's timing at its edges: times that are not finite are errors (not
a hang or NaN results), a trace's header is checked whole, a rank's multicasts leave in the
order of their collectives, in-network aggregation pays the workers' latency, and parameter
servers pay γ for each push they sum."""
import math

import pytest

from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.collective import CollectiveOptions, simulate_collective
from gradwire.sim.engine import Engine, Network
from gradwire.sim.ps import PSOptions, simulate_ps
from gradwire.sim.replay import Replay


@pytest.mark.parametrize("forward, backward, first", [
    (math.nan, 0.02, 0.0), (0.01, math.inf, 0.0), (-1.0, 0.02, 0.0), (0.01, 0.02, math.nan)])
def test_a_synthetic_trace_takes_only_the_times_a_trace_file_may_hold(forward, backward, first):
    """An infinite backward time made a trace whose simulation never ended (the gradient's
    event never came due); NaN ran the ring to NaN iteration times."""
    with pytest.raises(GradwireError, match="synthetic trace's .*time must be from 0"):
        tr.synthetic("m", [4000, 8000], forward, backward, first)


@pytest.mark.parametrize("t", [math.nan, math.inf])
def test_an_event_at_a_time_that_is_not_finite_is_an_error_not_a_hang(t):
    eng = Engine(Network.uniform(2, 1.0))
    with pytest.raises(GradwireError, match="not finite"):
        eng.at(t, lambda: None)
    with pytest.raises(GradwireError, match="not finite"):
        eng.unicast(0, 1, t, lambda _: None)


def test_a_ring_over_a_trace_made_in_python_with_nan_is_an_error_not_nan():
    """A Trace built directly skips the file's checks; the ring's numpy path returned
    iteration times of NaN as a result."""
    t = tr.Trace("m", (tr.Param("a", 4000), tr.Param("b", 8000)),
                 (tr.Iteration(0, 0, math.nan, (0.0, 0.0), (0.01, 0.0)),))
    with pytest.raises(GradwireError, match="ring: an iteration ended at nan s"):
        simulate_collective(t, SimCluster(3, 1e9, iterations=2), CollectiveOptions("ring"))


def test_a_header_with_a_worker_key_is_still_checked_for_nan():
    """The header's keys are metadata: one named ``forward`` holding NaN passed because the
    header also had a ``worker`` key, and was written back as null."""
    lines = tr.dumps(tr.synthetic("m", [8, 16], 1.0, 2.0)).splitlines()
    head = '{"format": "gradwire-trace", "version": 1, "model": "m", "worker": 0, "forward": NaN}'
    with pytest.raises(GradwireError, match=r"^<trace>:1: field 'forward': NaN"):
        tr.loads("\n".join([head, *lines[1:]]))


def test_a_ranks_multicasts_leave_in_the_order_of_their_collectives():
    """Rank 0 sends three reduce-scatters at once; rank 1 is late, so collectives 0 and 1
    finish on rank 0 while its port sends collective 2's long message: the multicast of 1 was
    put ahead of the multicast of 0, already waiting."""
    eng = Engine(Network.uniform(2, 1e6), record=True)
    sizes = [400, 400, 4_000_000]

    def done(c: int, r: int, t: float) -> None:
        rp.multicast(c, r, [1 - r], sizes[c] // 2, lambda t: None, f"mc {c} {r}")

    rp = Replay(eng, [0, 1], 1, 0.0, 0.0, done)
    for n in sizes:
        rp.add(registry.schedule("reducescatter", "ring", 2, n))
    for c in range(len(sizes)):
        eng.at(0.0, lambda c=c: rp.ready(c, 0))
        eng.at(1e-3, lambda c=c: rp.ready(c, 1))
    eng.run()
    # one port: rank 0's flows end in the order they start
    sent = [label for label, *_ in eng.log if label.startswith("mc") and label.endswith(" 0")]
    assert sent == ["mc 0 0", "mc 1 0", "mc 2 0"]


def test_in_network_aggregation_with_one_worker_costs_what_a_parameter_server_does():
    """One worker's push crosses the same links either way (its up link, the switch, the
    server's down link), so it pays the same α and the latency at both ends; the switch's
    sum paid only the server's latency, and arrived a worker's latency early."""
    t = tr.synthetic("m", [1000], 0.01, 0.02)
    c = SimCluster(1, 8e6, alpha=1e-3, latency=1e-4, iterations=2)
    ps = simulate_ps(t, c, PSOptions())
    ina = simulate_ps(t, c, PSOptions(ina=True))
    assert ina.ends == pytest.approx(ps.ends, rel=1e-12)
    # and on the ideal network the switch still costs nothing
    ideal = SimCluster(1, 8e6, alpha=0.0, latency=0.0, iterations=2)
    assert simulate_ps(t, ideal, PSOptions(ina=True)).ends == pytest.approx(
        simulate_ps(t, ideal, PSOptions()).ends, rel=1e-12)


def test_a_parameter_server_pays_gamma_for_each_push_it_sums():
    """Two workers, one 1000-byte parameter at 1 MB/s on the ideal network: distribution
    ends at 1 ms and 2 ms, the pushes at 2 ms and 3 ms; each costs the server γ·1000 = 0.1 ms
    to add, the second after the first, so the iteration ends at 3.1 ms, not 3 ms. In-network
    aggregation sums at the switch: no γ."""
    t = tr.Trace("one", (tr.Param("p", 1000),), (tr.Iteration(0, 0, 0.0, (0.0,), (0.0,)),))
    base = SimCluster(2, 8e6, alpha=0.0, latency=0.0, iterations=1)
    slow = SimCluster(2, 8e6, alpha=0.0, latency=0.0, gamma=1e-7, iterations=1)
    assert simulate_ps(t, base, PSOptions()).ends == pytest.approx([3e-3])
    assert simulate_ps(t, slow, PSOptions()).ends == pytest.approx([3.1e-3])
    assert (simulate_ps(t, slow, PSOptions(ina=True)).ends
            == pytest.approx(simulate_ps(t, base, PSOptions(ina=True)).ends))
