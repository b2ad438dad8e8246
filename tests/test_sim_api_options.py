"""The trace-driven simulator: options built in Python that a run would have ignored, tensors of
no elements, and a trace header's source that is not text."""
import re

import pytest

from gradwire.errors import GradwireError
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.collective import (
    CollectiveOptions,
    simulate_collective,
    simulate_ring_multicast,
)
from gradwire.sim.ps import PSOptions


def _two(shaped: bool) -> tr.Trace:
    """A Trace made in Python whose first tensor holds no elements (torch.empty(0))."""
    shapes = ((0,), (100,)) if shaped else (None, None)
    return tr.Trace("m", (tr.Param("a", 0, shapes[0]), tr.Param("b", 400, shapes[1])),
                    (tr.Iteration(0, 0, 0.01, (0.0, 0.005), (0.02, 0.01)),))


@pytest.mark.parametrize("opts", [CollectiveOptions("ring"),
                                  CollectiveOptions("rd", bucket_bytes=1000),
                                  CollectiveOptions("ring", compressor="powersgd"),
                                  CollectiveOptions("ring", 1000, compressor="powersgd")])
def test_a_tensor_of_no_elements_is_priced_not_divided_by(opts):
    """bucket_itemsize divided a tensor's bytes by its shape's elements: a shape of (0,)
    raised ZeroDivisionError (every collective mechanism, on any bucket holding it)."""
    c = SimCluster(3, 1e9, iterations=2)
    shaped = simulate_collective(_two(True), c, opts)
    plain = simulate_collective(_two(False), c, opts)
    assert shaped.ends == pytest.approx(plain.ends)
    assert shaped.link_bytes == pytest.approx(plain.link_bytes)


def test_the_multicast_option_runs_ring_multicast():
    """simulate_collective ran a plain ring for CollectiveOptions(multicast=True): each rank
    sent 2(P-1)/P of a bucket up, not ring+multicast's (P-1)/P + 1/P."""
    t = tr.synthetic("m", [4000, 8000], 0.004, 0.008)
    c = SimCluster(4, 1e9, iterations=2)
    o = CollectiveOptions("ring", multicast=True)
    via = simulate_collective(t, c, o)
    assert via.link_bytes == simulate_ring_multicast(t, c, o).link_bytes
    assert via.link_bytes["worker up"] == 4 * 12000 * 2  # P·n per iteration, up
    assert via.link_bytes["worker down"] == 2 * 3 * 12000 * 2  # 2(P-1)·n, down


@pytest.mark.parametrize("opts", [CollectiveOptions("rd"),
                                  CollectiveOptions("ring", compressor="topk")])
def test_ring_multicast_refuses_what_it_would_not_run(opts):
    """simulate_ring_multicast always ran the dense ring's reduce-scatter: another algorithm
    or a compressor was dropped without a word."""
    t = tr.synthetic("m", [4000], 0.004, 0.008)
    with pytest.raises(GradwireError, match="ring\\+multicast runs the ring's reduce-scatter"):
        simulate_ring_multicast(t, SimCluster(3, 1e9), opts)


@pytest.mark.parametrize("multicast", [False, True])
def test_compressor_params_without_a_compressor_are_refused(multicast):
    """CollectiveOptions took compressor_params with no compressor and ran dense."""
    with pytest.raises(GradwireError, match="compressor_params are a compressor's options"):
        CollectiveOptions("ring", compressor_params={"density": 0.1}, multicast=multicast)


def test_a_multicast_parameter_server_refuses_an_order():
    """PSOptions(multicast=True, order="block") ran one multicast per parameter: the order was
    ignored (``multicast:order=block`` is refused when parsed; built in Python it was not)."""
    with pytest.raises(GradwireError, match="order=block is not taken with multicast"):
        PSOptions(multicast=True, ina=True, order="block")


@pytest.mark.parametrize("source, shown", [("null", "None"), ("[1]", "[1]"), ("7", "7")])
def test_a_trace_source_that_is_not_text_is_refused(source, shown):
    """A header's "source": null was read as the text "None" (and written back so), a list
    as its repr."""
    head = '{"format": "gradwire-trace", "version": 1, "model": "m", "source": ' + source
    text = (head + '}\n{"param": 0, "name": "a", "bytes": 4}\n'
            '{"worker": 0, "iteration": 0, "forward_s": 0.1, "forward": [0.0], '
            '"backward": [0.1]}\n')
    with pytest.raises(GradwireError, match=f"^t:1: field 'source': expected a string, got "
                                            f"{re.escape(shown)}"):
        tr.loads(text, "t")
