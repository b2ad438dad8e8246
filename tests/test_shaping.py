"""Shaping is real: a 2-host 1gbit link carries 64 MB at about 1 Gbit/s each way; `none` is
much faster. Bounds are loose on purpose: this checks the mechanism, the benchmark the rate."""
import re
import sys

from conftest import BENCH_RANKS, needs_netns

from gradwire.cluster import ephemeral_cluster
from gradwire.launcher import launch


def _rates(bandwidth: str) -> dict[str, float]:
    lines: list[str] = []
    with ephemeral_cluster(2, bandwidth) as c:
        cmd = [sys.executable, str(BENCH_RANKS / "p2p_rate.py")]
        res = launch(c, cmd, timeout=120, sink=lines.append)
    assert res.returncode == 0, "\n".join(lines)
    return {m.group(1): float(m.group(2)) for line in lines
            if (m := re.search(r"RATE (\d->\d) ([\d.]+)", line))}


@needs_netns
def test_1gbit_is_shaped_both_ways_and_none_is_not():
    shaped = _rates("1gbit")
    assert set(shaped) == {"0->1", "1->0"}
    for direction, gbps in shaped.items():
        assert 0.8 <= gbps <= 1.0, (direction, gbps)
    free = _rates("none")
    for direction, gbps in free.items():
        assert gbps > 2.0 * shaped[direction], (direction, gbps)


def test_send_buffers_hold_four_milliseconds_of_the_link_at_least_64_kib():
    from gradwire.cluster.netns import Cluster, tcp_send_buffer

    assert tcp_send_buffer(1e9) == 500_000
    assert tcp_send_buffer(10e9) == 5_000_000
    assert tcp_send_buffer(100e6) == tcp_send_buffer(1e6) == 65_536
    assert Cluster("gw000000", None).send_buffer_bytes is None  # unshaped: the machine's own
    assert Cluster("loopback", 1e9).send_buffer_bytes is None
