"""Shaping is real: a 2-host 1gbit link carries 64 MB at about 1 Gbit/s each way; `none` is
much faster. Bounds are loose on purpose: this checks the mechanism, the benchmark the rate."""
import re
import sys

from conftest import BENCH_RANKS, gradwire_leftovers, host_pair, needs_netns

from gradwire.cluster import cluster_down, cluster_up, ephemeral_cluster
from gradwire.cluster.shaping import tcp_send_buffer
from gradwire.launcher import launch


def _rates(bandwidth: str, floor: dict[str, float]) -> dict[str, list[float]]:
    """Gbit/s each way over a 2-host cluster of ``bandwidth`` links, every measurement: one
    more, three in all at most, while a direction's best is at or below its ``floor``. A
    transfer timed on a loaded machine is slowed by the CPU it does not get, never sped up."""
    rates: dict[str, list[float]] = {}
    with ephemeral_cluster(2, bandwidth) as c:
        for _ in range(3):
            lines: list[str] = []
            res = launch(c, [sys.executable, str(BENCH_RANKS / "p2p_rate.py")], timeout=120,
                         sink=lines.append)
            assert res.returncode == 0, "\n".join(lines)
            for line in lines:
                if m := re.search(r"RATE (\d->\d) ([\d.]+)", line):
                    rates.setdefault(m.group(1), []).append(float(m.group(2)))
            if all(max(rates.get(d, [0.0])) > f for d, f in floor.items()):
                break
    return rates


@needs_netns
def test_1gbit_is_shaped_both_ways_and_none_is_not():
    shaped = _rates("1gbit", {"0->1": 0.8, "1->0": 0.8})
    assert set(shaped) == {"0->1", "1->0"}
    for direction, gbps in shaped.items():
        assert 0.8 <= max(gbps) <= 1.0, (direction, gbps)
    best = {direction: max(gbps) for direction, gbps in shaped.items()}
    free = _rates("none", {direction: 2.0 * gbps for direction, gbps in best.items()})
    assert set(free) == set(shaped)
    for direction, gbps in free.items():
        assert max(gbps) > 2.0 * best[direction], (direction, gbps)


def test_send_buffers_hold_four_milliseconds_of_the_link_at_least_64_kib():
    from gradwire.cluster.netns import Cluster, tcp_send_buffer

    assert tcp_send_buffer(1e9) == 500_000
    assert tcp_send_buffer(10e9) == 5_000_000
    assert tcp_send_buffer(100e6) == tcp_send_buffer(1e6) == 65_536
    assert Cluster("gw000000", None).send_buffer_bytes is None  # unshaped: the machine's own
    assert Cluster("loopback", 1e9).send_buffer_bytes is None
    assert Cluster("gw000000", 1e9).send_buffer_bytes is None  # the cap was not set
    assert Cluster("gw000000", 1e9, sndbuf=500_000).send_buffer_bytes == 500_000


def test_hosts_never_get_a_larger_send_buffer_than_the_machine(monkeypatch, tmp_path):
    from gradwire.cluster import netns

    wmem = tmp_path / "tcp_wmem"
    monkeypatch.setattr(netns, "TCP_WMEM", wmem)
    wmem.write_text("4096\t16384\t4194304\n")  # Linux's default ceiling, 4 MiB
    assert netns.machine_send_buffer() == 4_194_304
    assert netns.host_send_buffer(1e9) == 500_000
    assert netns.host_send_buffer(10e9) == 4_194_304  # 4 ms would be 5 MB: a cap, not a raise
    wmem.write_text("4096 16384 262144\n")
    assert netns.host_send_buffer(1e9) == 262_144


def test_a_cluster_state_with_a_bad_send_buffer_is_refused():
    import json

    import pytest

    from gradwire.cluster.netns import Cluster

    good = json.loads(Cluster("gw00000a", 1e9, sndbuf=500_000).to_json())
    assert Cluster.from_json(json.dumps(good)).sndbuf == 500_000
    for bad in (0, -1, "500000", 1.5, True):
        with pytest.raises(ValueError, match="send buffer that is not bytes > 0"):
            Cluster.from_json(json.dumps({**good, "sndbuf": bad}))


def test_a_send_buffer_holds_two_packets_of_the_mtu():
    assert tcp_send_buffer(100e6, 65535) == 2 * 65535
    assert tcp_send_buffer(100e6, 9000) == tcp_send_buffer(100e6) == 65_536
    assert tcp_send_buffer(1e9, 65535) == 500_000

def _payload_mbit(c, megabytes: int) -> float:
    """Mbit/s of payload one TCP transfer of ``megabytes`` MB from host 0 to host 1 got."""
    addr = c.hosts[1].addr
    serve = (f"import socket, time; s = socket.create_server(('{addr}', 45127)); "
             "print(1, flush=True); c = s.accept()[0]; n, t0 = 0, None\n"
             "while b := c.recv(1 << 20):\n"
             "    t0 = t0 or time.monotonic(); n += len(b)\n"
             "print(n * 8 / (time.monotonic() - t0) / 1e6)")
    send = (f"import socket; s = socket.create_connection(('{addr}', 45127), timeout=30); "
            f"s.sendall(b'x' * {megabytes * 1_000_000}); s.close()")
    return float(host_pair(c, serve, send)[1])


@needs_netns
def test_a_jumbo_mtu_on_a_slow_link_keeps_its_rate():
    """MTU 65535 at 100mbit: with a 64 KiB send buffer one segment filled it, and the link
    carried 13.7 Mbit/s (the receiver's delayed ACK paced it); two packets' worth, about 100."""
    c = cluster_up(2, "100mbit", mtu=65535)
    try:
        assert c.sndbuf == 2 * 65535
        assert _payload_mbit(c, 6) > 60
    finally:
        cluster_down(c.name)
    assert gradwire_leftovers(c.name) == []
