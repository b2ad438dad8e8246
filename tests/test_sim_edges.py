"""Edge cases of the trace-driven simulator: one send port per host for every message a host
sends (a multicast too), zero-byte messages on the ideal network, numbers that are not
numbers, and malformed trace lines and options that must be one line, not a traceback."""
import pytest
from rich.console import Console

from gradwire.errors import GradwireError
from gradwire.sim import emulate
from gradwire.sim import mechanisms as mech
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.collective import CollectiveOptions, simulate_ring_multicast
from gradwire.sim.engine import Engine, Network
from gradwire.sim.ps import PSOptions, simulate_ps

GOOD = tr.dumps(tr.synthetic("m", [8, 16], 1.0, 2.0)).splitlines()


def test_ring_multicast_pays_alpha_on_the_send_port_for_its_multicast():
    """Every host sends one message at a time, each paying α on its port: the multicast of a
    rank's reduced block is one of its messages, so with links this fast a tensor costs the
    reduce-scatter's P − 1 messages plus the multicast, one after another: P·α each."""
    p, alpha, tensors = 4, 1e-3, 10
    t = tr.synthetic("m", [400] * tensors, 0.0, 0.0)
    c = SimCluster(p, 8e12, latency=0.0, alpha=alpha, iterations=1)
    r = simulate_ring_multicast(t, c, CollectiveOptions("ring", multicast=True))
    assert r.iteration_s == pytest.approx(tensors * p * alpha, rel=1e-3)
    # each rank sends (P − 1)/P·n in the reduce-scatter and its n/P block once: n
    assert r.link_bytes["worker up"] == pytest.approx(p * t.total_bytes)


def test_zero_byte_messages_on_the_ideal_network_do_not_recurse():
    """A send buffer larger than every message leaves a zero-byte head per message; with no α
    and no latency each used to finish inside the call that sent it, and the next message's
    send inside that: a RecursionError after a few hundred messages."""
    t = tr.synthetic("m", [1000] * 400, 0.0, 0.0)
    c = SimCluster(4, 8e9, latency=0.0, alpha=0.0, iterations=1, send_buffer=4_000_000)
    r = simulate_ps(t, c, PSOptions())
    assert r.link_bytes["server up"] == pytest.approx(4 * t.total_bytes)
    assert r.iteration_s >= 2 * 4 * t.total_bytes / 1e9 * (1 - 1e-9)


def test_a_zero_byte_flow_finishes_after_send_returns_at_the_same_time():
    eng = Engine(Network.uniform(2, 1.0))
    out = []
    eng.unicast(0, 1, 0, lambda t: out.append(t))
    assert out == []  # not inside send
    eng.run()
    assert out == [0.0]


@pytest.mark.parametrize("field", ["bandwidth_bps", "latency", "alpha", "gamma", "send_buffer"])
def test_a_bool_is_not_a_number_of_the_cluster(field):
    kw = {"workers": 2, "bandwidth_bps": 1e9, field: True}
    with pytest.raises(GradwireError, match=field.split("_")[0]):
        SimCluster(**kw)


@pytest.mark.parametrize("line, where", [
    (0, '"version": true'),
    (1, '"bytes": 1' + "0" * 5000),
    (1, '"bytes": 8, "bytes": 9'),
])
def test_malformed_trace_values_are_one_line(line, where):
    lines = list(GOOD)
    old = '"version": 1' if line == 0 else '"bytes": 8'
    lines[line] = lines[line].replace(old, where)
    with pytest.raises(GradwireError, match=rf"x\.jsonl:{line + 1}") as e:
        tr.loads("\n".join(lines), "x.jsonl")
    assert "\n" not in str(e.value)


def test_emulate_needs_two_iterations_before_any_rank_starts(tmp_path, monkeypatch):
    """The measured iteration is the interval between iteration ends (the first end is the
    reference): one iteration measures 0 s, and the simulated / measured error divided by it."""
    path = tr.save(tr.synthetic("toy", [4096], 0.01, 0.01), tmp_path / "t.jsonl")

    def fake_run(*a, **k):
        return [{"iteration_s": 0.0, "ends": [0.0], "alpha_s": 1e-4,
                 "link_bytes": {}}]
    monkeypatch.setattr(emulate, "run", fake_run)
    with pytest.raises(GradwireError, match="iterations") as e:
        emulate.validate(path, 2, 1, "1gbit", mech.parse_list("ring"), Console(quiet=True),
                         iterations=1, calibration={"alpha_s": 1e-4, "beta_s_per_byte": 8e-9,
                                                    "gamma_s_per_byte": 0.0})
    assert "\n" not in str(e.value)


def test_a_trace_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Windows editors save UTF-8 with a leading byte-order mark; JSON allows a reader to
    ignore it, and gradwire used to refuse the whole file at its first line."""
    t = tr.synthetic("m", [8, 16], 1.0, 2.0)
    path = tmp_path / "bom.trace"
    path.write_bytes(b"\xef\xbb\xbf" + tr.dumps(t).encode())
    assert tr.load(path) == t


@pytest.mark.parametrize("key", ["format", "version", "model", "source"])
def test_metadata_naming_a_header_field_is_refused_not_written_over_it(key):
    """A metadata key ``format`` replaced the header's format, and the file written could
    not be read back; ``model`` or ``source`` silently changed what was read."""
    t = tr.synthetic("m", [8, 16], 1.0, 2.0)
    bad = tr.Trace(t.model, t.params, t.iterations, t.source, {key: "x", "run": 1})
    with pytest.raises(GradwireError, match=f"metadata key '{key}'"):
        tr.dumps(bad)
    ok = tr.Trace(t.model, t.params, t.iterations, t.source, {"run": 1})
    assert tr.loads(tr.dumps(ok)).meta == {"run": 1}
