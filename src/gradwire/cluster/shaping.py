"""What each emulated link and host is set to, and the measurements behind each number: the
token bucket that shapes a link (tc tbf), the ceiling on a host's TCP send buffer, and the
hosts' TCP congestion control. :mod:`gradwire.cluster.netns` applies them.
"""

from __future__ import annotations

import re


def tbf_burst(bps: float) -> int:
    """Bytes of the token bucket shaping a link of ``bps``: at least one timer tick (HZ=250) of
    traffic at the rate. Smaller buckets cost throughput here when flows share links (64 KiB at
    1gbit: a 4-host allreduce of 64 MiB 1.54 s against 0.84 s with 500 kB), so a transfer after
    an idle spell may start faster than the rate (1 MiB at 1.7 Gbit/s after 50 ms idle;
    benchmarks/results/tbf_burst/latest.json)."""
    return max(256 * 1024, int(bps / 8 / 250))


TBF_LATENCY_S = 0.1  # of the link's traffic a tbf queue holds beyond its bucket
TBF_MAX_LIMIT = 2**32 - 1  # tbf's queue limit is a 32-bit count of bytes


def tbf_limit(bps: float) -> int:
    """Bytes a tbf shaping a link of ``bps`` may queue: 100 ms of traffic at the rate beyond its
    bucket (what tc makes of ``latency 100ms``), at most what tbf can hold. tc does not cap
    that sum itself: from about 330 Gbit/s up it wraps past 2**32 (a 400gbit link would get
    14 ms of queue)."""
    return min(int(bps / 8 * TBF_LATENCY_S) + tbf_burst(bps), TBF_MAX_LIMIT)


SEND_BUFFER_S = 4e-3  # of the link's traffic that a host's TCP send buffer may hold


MIN_SEGMENTS = 2  # full-sized TCP segments a host's send buffer holds at the least


def tcp_send_buffer(bps: float, mtu: int = 1500) -> int:
    """Bytes a shaped host's TCP send buffer may hold: 4 ms of traffic at the link's rate, at
    least 64 KiB (500 kB at 1 Gbit/s), and at least two packets of ``mtu`` bytes. Where one
    packet fills the buffer (an MTU near 64 KiB on a slow link), a sender has one segment in
    flight and the receiver acknowledges it only when its delayed-ACK timer fires: the link
    carries a small fraction of its rate (test_shaping holds a 100 Mbit/s link at MTU 65535
    to most of its rate).

    A gloo send completes once its bytes are in the kernel; with Linux's default ceiling
    (4 MiB) a rank that sends to one peer and then another had megabytes of the first send
    still queued behind it, the two sharing its link, so the first peer (which a tree then
    forwards from) got the rest at half the rate. Neither smaller nor
    larger is better: at 2 ms the double binary tree, whose ranks feed several sockets at once,
    lost 8 % at 64 MiB in a probe; at 8 ms (1 MB) Rabenseifner's allreduce of 64 MiB at P = 8
    took 1.29 s against 1.02 s with 4 ms (1.42 s with the default), while the double tree at
    P = 4 gained 4 % (benchmarks/results/tcp_sndbuf/: latest.json,
    ceilings_default_500k_1m.json; docs/cluster.md)."""
    return max(64 * 1024, MIN_SEGMENTS * int(mtu), int(bps / 8 * SEND_BUFFER_S))


# With BBR (some machines' default, this one's included) a flow that keeps a queue at a shaped
# link drains it in ProbeRTT every 10 s, its window cut for 200 ms or more: collectives of
# 64 MiB on 4 hosts took up to 1.5 s instead of 0.85 s now and then, while with cubic every
# iteration took 0.84-0.87 s (benchmarks/results/tcp_cc/latest.json).
CONGESTION_CONTROL = "cubic"
CC_NAME_RE = re.compile(r"[a-z0-9_]+")  # what a congestion control's name may hold
