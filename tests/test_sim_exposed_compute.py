"""The simulator's compute and exposed-communication columns: compute is taken over the
iterations the steady time covers, and from each iteration's slowest worker, so that a run
with nothing to communicate shows none exposed."""
import pytest

from gradwire.sim import mechanisms
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster

# Three recorded iterations of very different compute (0.06, 0.6 and 0.25 s), as a loaded
# machine records them.
TRACE = tr.Trace("m", (tr.Param("a", 4000), tr.Param("b", 8000)), (
    tr.Iteration(0, 0, 0.02, (0.0, 0.01), (0.04, 0.02)),
    tr.Iteration(0, 1, 0.2, (0.0, 0.1), (0.4, 0.2)),
    tr.Iteration(0, 2, 0.05, (0.0, 0.02), (0.2, 0.1)),
))
ALL = mechanisms.PAPER


@pytest.mark.parametrize("name", ALL)
def test_one_worker_on_an_ideal_network_exposes_no_communication(name):
    """One worker, no host costs: nothing is sent that compute does not hide, yet the
    iteration (the mean of iterations 2 and 3) was set against the mean compute of all three,
    and 0.1 s showed as exposed communication (or an iteration shorter than its compute)."""
    c = SimCluster(1, 400e9, latency=0, alpha=0, iterations=3)
    r = mechanisms.parse(name).run(TRACE, c, False)
    assert r.compute_s == pytest.approx(r.iteration_s, rel=1e-6, abs=1e-6)
    assert r.exposed_s < 1e-6


@pytest.mark.parametrize("name", ["ring", "butterfly", "multicast+ina"])
def test_a_stragglers_wait_is_not_counted_as_communication(name):
    """Four workers replaying different recorded iterations: the iteration waits for the
    slowest one's compute, which the mean over workers counted as 0.2 s and more of exposed
    communication on links 400 Gbit/s fast."""
    c = SimCluster(4, 400e9, latency=0, alpha=0, iterations=4, seed=3)
    r = mechanisms.parse(name).run(TRACE, c, False)
    assert r.exposed_s < 1e-3
    assert r.compute_s == pytest.approx(r.iteration_s, abs=1e-3)
