"""Edges of the emulated cluster: names that only look valid, signals a caller ignores, the
fastest links' queues, state files gradwire never writes."""
import json
import os
import re
import signal
import subprocess
import time

import pytest
from conftest import gradwire_leftovers, needs_netns

from gradwire.cluster import Cluster, cluster_down, cluster_up, ephemeral_cluster, netns
from gradwire.cluster.shaping import tbf_burst, tbf_limit
from gradwire.errors import GradwireError
from gradwire.interrupts import Interrupted


@needs_netns
@pytest.mark.parametrize("name", ["gw5e5e5e\n", ""])
def test_a_name_that_only_looks_valid_makes_nothing(name, builds, monkeypatch, tmp_path):
    """'$' let a name end in a line break through (the state file was written, then `ip link
    add` failed on two lines); an empty name made a cluster under a random one."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    with pytest.raises(GradwireError, match=re.escape(f"cluster name {name!r} is not valid")):
        made = cluster_up(1, "1gbit", name)
        cluster_down(made.name)  # made after all: leave nothing behind the failed check
    assert builds == [] and list(tmp_path.glob("*.json")) == []


def test_a_state_file_naming_a_host_with_a_line_break_is_refused():
    good = json.loads(Cluster("gw00000b", 1e9, subnet=3).to_json())
    host = {"rank": 0, "netns": "gw00000b-h0", "addr": "10.213.3.1", "ifname": "eth0"}
    assert Cluster.from_json(json.dumps({**good, "hosts": [host]})).hosts[0].netns
    for bad in ({"name": "gw00000b\n"}, {"hosts": [{**host, "netns": "gw00000b-h0\n"}]},
                {"hosts": [{**host, "addr": "10.213.3.1\n"}]},
                {"hosts": [{**host, "ifname": "eth0\n"}]}):
        with pytest.raises(ValueError, match="holds names gradwire does not make"):
            Cluster.from_json(json.dumps({**good, **bad}))


@needs_netns
def test_an_ignored_sighup_stays_ignored_while_a_cluster_is_built_and_used(monkeypatch):
    """`nohup gradwire run ...`: a hang-up while its cluster was built or its ranks ran tore the
    cluster down and stopped the run (on loopback it ran on)."""
    real_write = netns.write_hosts_files

    def hang_up_then_write(cluster):  # the last step of a build
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.05)
        real_write(cluster)

    monkeypatch.setattr(netns, "write_hosts_files", hang_up_then_write)
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    names = []
    try:
        with ephemeral_cluster(1, "none") as c:
            names.append(c.name)
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert c.hosts[0].netns in subprocess.run(["ip", "netns", "list"],
                                                      capture_output=True, text=True).stdout
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    except Interrupted as e:
        pytest.fail(f"an ignored SIGHUP interrupted the cluster: {e}")
    finally:
        signal.signal(signal.SIGHUP, before)
        for name in names:
            with pytest.raises(GradwireError):  # gone with its block
                cluster_down(name)
    assert names and gradwire_leftovers(names[0]) == []


def _lat_us(dev, ns=None):
    cmd = ["tc", "-j", "qdisc", "show", "dev", dev]
    out = subprocess.run(["ip", "netns", "exec", ns, *cmd] if ns else cmd, capture_output=True,
                         text=True, check=True).stdout
    (tbf,) = [q for q in json.loads(out) if q["kind"] == "tbf"]
    return tbf["options"].get("lat")  # absent where the queue is shorter than the bucket


def test_a_tbf_queue_fits_tbf_and_holds_100_ms_beyond_the_bucket():
    assert tbf_limit(1e9) == 12_500_000 + tbf_burst(1e9) == 13_000_000  # tc's `latency 100ms`
    assert tbf_limit(1e5) == 1250 + 256 * 1024
    assert tbf_limit(4e11) == tbf_limit(330.4e9) == 2**32 - 1


@needs_netns
@pytest.mark.parametrize("rate", ["400gbit", "330.4gbit"])
def test_the_fastest_links_keep_their_queue(rate):
    """tc wrapped its queue limit past 2**32 bytes: 400gbit links queued 14 ms, 330.4gbit ones
    less than their own bucket."""
    c = cluster_up(1, rate)
    try:
        h = c.hosts[0]
        for lat in (_lat_us(h.ifname, h.netns), _lat_us(f"{c.name}-v0")):
            assert lat is not None and lat >= 80_000, (rate, lat)
    finally:
        cluster_down(c.name)
    assert gradwire_leftovers(c.name) == []


@pytest.mark.parametrize("bps", ["1gbit", True, 0, -1e9, 1e999])
def test_a_state_file_with_a_rate_gradwire_never_writes_is_unreadable(bps):
    """`gradwire cluster status` read such a file, then failed with a traceback formatting it."""
    good = json.loads(Cluster("gw00000c", 1e9, subnet=3).to_json())
    with pytest.raises(ValueError, match="bandwidth that is not bit/s > 0"):
        Cluster.from_json(json.dumps({**good, "bandwidth_bps": bps}))
    assert Cluster.from_json(json.dumps({**good, "bandwidth_bps": None})).bandwidth_bps is None
