"""The emulated cluster's edges found in a hunt: a machine tuned to start TCP sockets large,
state files gradwire never writes, inputs that only look valid, and emulations too large for
a cluster."""
import json
import re
import socket
import subprocess

import pytest
from conftest import gradwire_leftovers, needs_netns
from rich.console import Console

import gradwire.cluster
from gradwire.cluster import (
    Cluster,
    cluster_down,
    cluster_up,
    list_clusters,
    load_cluster,
    loopback_cluster,
    netns,
)
from gradwire.cluster.netns import call_in, cap_send_buffer
from gradwire.errors import GradwireError
from gradwire.sim import emulate
from gradwire.sim import mechanisms as mech
from gradwire.sim.trace import save, synthetic


def _wmem(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/tcp_wmem"],
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


@needs_netns
def test_a_host_socket_never_starts_above_the_send_buffer_ceiling(monkeypatch, tmp_path):
    """A machine tuned to start TCP sockets at 87380 bytes (tcp_wmem "4096 87380 16777216",
    common advice; a namespace copies it) kept that start under a 64 KiB ceiling: autotuning
    only grows a buffer, so every socket of a 100mbit host held 87380 bytes."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    c = cluster_up(1, "none")  # unshaped: the namespace keeps what it was given
    try:
        ns = c.hosts[0].netns
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c",
                        "echo '4096 87380 16777216' > /proc/sys/net/ipv4/tcp_wmem"], check=True)
        assert cap_send_buffer(ns, 65536)
        assert _wmem(ns) == [4096, 65536, 65536]
        start = call_in(ns, lambda: socket.socket().getsockopt(socket.SOL_SOCKET,
                                                              socket.SO_SNDBUF))
        assert start <= 65536
    finally:
        cluster_down(c.name)
    assert gradwire_leftovers(c.name) == []


def test_an_emulation_too_large_for_a_cluster_is_refused_before_anything_runs(monkeypatch,
                                                                              tmp_path):
    """250 workers: the ring fits a cluster, the parameter server (251 hosts) does not; it was
    refused only after the calibration and the whole ring had run, as "--hosts must be between
    1 and 250, got 251", an option `simulate --emulate` does not have."""
    started = []

    def refuse(hosts, *args, **kwargs):
        started.append(hosts)
        raise AssertionError(f"a cluster of {hosts} hosts was made")

    monkeypatch.setattr(gradwire.cluster, "ephemeral_cluster", refuse)
    path = save(synthetic("toy", [4096], 0.01, 0.01), tmp_path / "t.jsonl")
    with pytest.raises(GradwireError, match=r"^ps with 250 workers and 1 server needs 251 "
                                            r"emulated hosts: .* at most 250$"):
        emulate.validate(path, 250, 1, "1gbit", mech.parse_list("ring,ps"),
                         Console(quiet=True), iterations=2)
    assert started == []


def _state(name: str, **changes) -> str:
    host = {"rank": 0, "netns": f"{name}-h0", "addr": "10.213.7.1", "ifname": "eth0"}
    good = json.loads(Cluster(name, 1e9, subnet=7).to_json())
    return json.dumps({**good, "hosts": [host], **changes})


@pytest.mark.parametrize("changes,why", [
    ({"subnet": [7]}, "subnet that is not an integer"),
    ({"subnet": 300}, "subnet that is not an integer"),
    ({"hosts": [{"rank": 1, "netns": "gw0cafe1-h0", "addr": "10.213.7.1", "ifname": "eth0"}]},
     "ranks are not 0, 1"),
])
def test_a_state_file_with_a_subnet_or_ranks_gradwire_never_writes_is_unreadable(
        changes, why, monkeypatch, tmp_path):
    """A subnet that is a list passed, and every later cluster up failed with "unhashable
    type: 'list'" while it looked for a free subnet; a host of rank 1 in a one-host cluster
    made the launcher fail with an IndexError."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    assert Cluster.from_json(_state("gw0cafe1")).subnet == 7
    with pytest.raises(ValueError, match=why):
        Cluster.from_json(_state("gw0cafe1", **changes))
    (tmp_path / "gw0cafe1.json").write_text(_state("gw0cafe1", **changes))
    assert list_clusters() == []
    assert netns._free_subnet() == 1
    with pytest.raises(GradwireError, match=f"gw0cafe1.json is unreadable .*{why}"):
        load_cluster("gw0cafe1")


def test_a_state_file_naming_another_cluster_is_not_that_cluster(monkeypatch, tmp_path):
    """gw0cafe2.json holding gw0cafe3 (a copied file): its run's cleanup, once stale, tore
    down gw0cafe3 (maybe another run's live cluster) and left the file to do so at every
    cluster up; `--cluster gw0cafe2` ran on gw0cafe3."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    (tmp_path / "gw0cafe2.json").write_text(_state("gw0cafe3", owner=[2**22 + 1, 1]))
    assert list_clusters() == []
    with pytest.raises(GradwireError, match="gw0cafe2.json is unreadable .*holds cluster "
                                            "'gw0cafe3'"):
        load_cluster("gw0cafe2")


@pytest.mark.parametrize("hosts", [2.5, "2", True, None])
def test_a_host_count_that_is_no_whole_number_makes_nothing(hosts, builds, monkeypatch,
                                                            tmp_path):
    """2.5 passed `1 <= hosts <= 250`: the name was claimed and the bridge made, then
    range(2.5) failed with a TypeError traceback; "2" and None failed the comparison with
    one; True made a cluster of one host."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    for make in (lambda: cluster_up(hosts, "1gbit"), lambda: loopback_cluster(hosts)):
        with pytest.raises(GradwireError, match=r"--hosts must be between 1 and 250, got "):
            c = make()
            if c.name != "loopback":
                cluster_down(c.name)
    assert builds == [] and list(tmp_path.glob("*.json")) == []


def test_a_machine_hosts_file_that_is_not_utf8_goes_to_the_hosts_as_it_is(monkeypatch,
                                                                          tmp_path):
    """An /etc/hosts with a Latin-1 comment failed every cluster up, once its hosts were made,
    with a UnicodeDecodeError traceback."""
    from gradwire.cluster import names
    from gradwire.cluster.state import Host

    machine = b"127.0.0.1\tlocalhost\n# caf\xe9 server\n10.0.0.5\tnas\n"
    (tmp_path / "hosts").write_bytes(machine)
    monkeypatch.setattr(names, "MACHINE_HOSTS", tmp_path / "hosts")
    monkeypatch.setattr(names, "NETNS_ETC", tmp_path / "netns")
    c = Cluster("gw0cafe4", 1e9, [Host(i, f"gw0cafe4-h{i}", f"10.213.7.{i + 1}", "eth0")
                                  for i in range(2)], subnet=7)
    names.write_hosts_files(c)
    for i in range(2):
        got = (tmp_path / "netns" / f"gw0cafe4-h{i}" / "hosts").read_bytes()
        assert got.endswith(b"\n10.213.7.2\tgw0cafe4-h1\n::ffff:10.213.7.1\tgw0cafe4-h0\n"
                            b"::ffff:10.213.7.2\tgw0cafe4-h1\n" + machine)
    assert names.clusters_with_hosts_files() == {"gw0cafe4"}
    names.remove_hosts_files("gw0cafe4")
    assert names.clusters_with_hosts_files() == set()


@pytest.mark.parametrize("name", [123, b"gw0cafe5"])
def test_a_cluster_name_that_is_no_string_is_a_one_line_error(name, builds, monkeypatch,
                                                              tmp_path):
    """`cluster_up(1, "1gbit", 123)`, `cluster_down(123)` and `load_cluster(b"gw...")` failed
    with "TypeError: expected string or bytes-like object" (or matched a bytes name)."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    for call in (lambda: cluster_up(1, "1gbit", name), lambda: cluster_down(name),
                 lambda: load_cluster(name)):
        with pytest.raises(GradwireError, match=re.escape(f"cluster name {name!r} is not "
                                                          "valid")):
            call()
    assert builds == [] and list(tmp_path.glob("*.json")) == []


def test_the_label_of_an_unshaped_cluster_or_of_one_host_reads_as_english():
    """`gradwire run --hosts 1 --bandwidth none` told its ranks (GRADWIRE_NETWORK) and every
    report "emulated 1 hosts, none links"."""
    from gradwire.cluster.state import Cluster, Host

    def label(hosts: int, bps: float | None) -> str:
        c = Cluster(name="gw00fe01", bandwidth_bps=bps, tcp="cubic")
        c.hosts = [Host(i, f"gw00fe01-h{i}", f"10.213.9.{i + 1}", "eth0") for i in range(hosts)]
        return c.label

    assert label(1, None) == "emulated 1 host, unshaped links, TCP cubic"
    assert label(2, None) == "emulated 2 hosts, unshaped links, TCP cubic"
    assert label(3, 1e9) == "emulated 3 hosts, 1gbit links, TCP cubic"
