"""The engine's allocation for no flow or one flow in flight (about half a parameter server's:
its distribution sends one message at a time) skips progressive filling; its rates must be
progressive filling's, bit for bit, a link a flow lists twice included. And the bound on every
rate that lets the run loop divide bytes by rates without np.errstate."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.sim.engine import Engine, Network, _progressive, maxmin


def _entries(flows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.array([len(f) for f in flows], dtype=np.int64)
    lid = np.array([lk for f in flows for lk in f], dtype=np.int64)
    return lens, lid


@st.composite
def _links(draw, flows: tuple[int, int]) -> tuple[list[list[int]], np.ndarray]:
    """Between ``flows`` flows on up to 6 links; a flow may list a link twice (and so uses it
    twice: half of it when alone)."""
    nl = draw(st.integers(1, 6))
    cap = np.array(draw(st.lists(st.floats(1e-3, 1e12), min_size=nl, max_size=nl)))
    return draw(st.lists(st.lists(st.integers(0, nl - 1), min_size=1, max_size=5),
                         min_size=flows[0], max_size=flows[1])), cap


@given(st.sampled_from([(0, 1), (0, 1), (0, 3)]).flatmap(_links))
@settings(max_examples=300, deadline=None)
def test_few_flows_get_progressive_fillings_rates_exactly(case):
    flows, cap = case
    rates = maxmin(flows, cap)
    assert np.array_equal(rates, _progressive(*_entries(flows), cap))
    if len(flows) == 1:
        assert rates[0] == min(cap[lk] / flows[0].count(lk) for lk in flows[0])


@given(_links((1, 8)))
@settings(max_examples=200, deadline=None)
def test_no_rate_is_below_the_least_capacity_over_the_link_uses(case):
    flows, cap = case
    uses = sum(len(f) for f in flows)
    assert (maxmin(flows, cap) >= cap.min() / uses).all()


def test_one_flow_on_a_link_it_lists_twice_gets_half_of_it():
    cap = np.array([4.0, 3.0])
    assert maxmin([[0, 0, 1]], cap).tolist() == [2.0] == _progressive(*_entries([[0, 0, 1]]),
                                                                       cap).tolist()
    assert maxmin([], cap).tolist() == []


def test_a_flow_alone_ends_at_its_tightest_links_rate():
    eng = Engine(Network([8.0, 8.0], [8.0, 2.0]))
    out = []
    eng.send((0, 3, 3), 4.0, out.append)  # up of host 0 at 8, down of host 1 (1 B/s twice)
    eng.run()
    assert out == [4.0]


@pytest.mark.parametrize("flows", [[[]], [[0], []], [[], [0]]])
def test_a_flow_of_no_links_is_an_error_not_a_loop_for_ever(flows):
    with pytest.raises(ValueError):
        maxmin(flows, np.array([1.0, 3.0]))
