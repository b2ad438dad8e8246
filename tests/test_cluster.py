import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import cli_error, gradwire_leftovers, host_pair, needs_netns, netns_names

from gradwire.cluster import (
    cluster_down,
    cluster_up,
    ephemeral_cluster,
    list_clusters,
    load_cluster,
)
from gradwire.errors import GradwireError

pytestmark = needs_netns


def _qdiscs(c):
    out = []
    for h in c.hosts:
        inner = subprocess.run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "show", "dev",
                                h.ifname], capture_output=True, text=True).stdout
        outer = subprocess.run(["tc", "qdisc", "show", "dev", f"{c.name}-v{h.rank}"],
                               capture_output=True, text=True).stdout
        out.append((inner, outer))
    return out


def test_up_shapes_both_directions_and_down_removes_everything():
    c = cluster_up(3, "100mbit")
    try:
        assert [h.netns for h in c.hosts] == [f"{c.name}-h{i}" for i in range(3)]
        assert len({h.addr for h in c.hosts}) == 3
        assert {h.addr.rsplit(".", 1)[0] for h in c.hosts} == {f"10.213.{c.subnet}"}
        for inner, outer in _qdiscs(c):
            assert "tbf" in inner and "rate 100Mbit" in inner
            assert "tbf" in outer and "rate 100Mbit" in outer
        assert load_cluster(c.name).hosts == c.hosts
        assert c.name in {x.name for x in list_clusters()}
    finally:
        assert cluster_down(c.name) == [c.name]
    assert gradwire_leftovers(c.name) == []
    assert c.name not in {x.name for x in list_clusters()}


def test_unshaped_cluster_has_no_tbf():
    c = cluster_up(2, "none")
    try:
        for inner, outer in _qdiscs(c):
            assert "tbf" not in inner and "tbf" not in outer
    finally:
        cluster_down(c.name)


def _mtu(dev, netns=None):
    cmd = ["ip", "-o", "link", "show", dev]
    out = subprocess.run(["ip", "netns", "exec", netns, *cmd] if netns else cmd,
                         capture_output=True, text=True, check=True).stdout
    return int(out.split(" mtu ")[1].split()[0])


def _tcp_mss(c):
    """The segment size a TCP connection from host 0 to host 1 settles on."""
    addr = c.hosts[1].addr
    serve = (f"import socket; s = socket.create_server(('{addr}', 45123)); "
             "print(1, flush=True); s.accept()[0].recv(1)")
    ask = (f"import socket; s = socket.create_connection(('{addr}', 45123), timeout=10); "
           "print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)); s.send(b'x')")
    return int(host_pair(c, serve, ask, timeout=30)[0])


def test_mtu_reaches_the_bridge_and_both_ends_of_every_link():
    jumbo, default = cluster_up(2, "1gbit", mtu=9000), cluster_up(2, "1gbit")
    try:
        assert _mtu(jumbo.bridge) == 9000
        for h in jumbo.hosts:
            assert _mtu(h.ifname, h.netns) == _mtu(f"{jumbo.name}-v{h.rank}") == 9000
        assert load_cluster(jumbo.name).mtu == 9000
        assert _tcp_mss(jumbo) == 9000 - 52  # IP 20 + TCP 20 + timestamps 12: segments fill it
        assert jumbo.label.endswith(", MTU 9000") and jumbo.link_key == "1gbit-mtu9000"
        # Ethernet's default keeps the names reports and calibrations have always had.
        assert _mtu(default.hosts[0].ifname, default.hosts[0].netns) == 1500
        assert _tcp_mss(default) == 1500 - 52
        assert "MTU" not in default.label and default.link_key == "1gbit"
    finally:
        cluster_down(jumbo.name)
        cluster_down(default.name)
    assert gradwire_leftovers(jumbo.name) == gradwire_leftovers(default.name) == []


@pytest.mark.parametrize("mtu", [575, 65536, True, "9000", 1500.0])
def test_bad_mtu_makes_nothing(mtu, builds):
    with pytest.raises(GradwireError, match="--mtu must be an integer number of bytes from 576"):
        cluster_up(2, "1gbit", mtu=mtu)
    assert builds == []


def test_two_clusters_side_by_side_do_not_collide():
    a, b = cluster_up(2, "1gbit"), cluster_up(2, "1gbit")
    try:
        assert a.name != b.name and a.subnet != b.subnet
        assert not set(h.netns for h in a.hosts) & set(h.netns for h in b.hosts)
    finally:
        cluster_down(a.name)
        cluster_down(b.name)
    assert gradwire_leftovers(a.name) == gradwire_leftovers(b.name) == []


@pytest.mark.parametrize("hosts,bw,name,msg", [
    (0, "1gbit", None, "--hosts must be"),
    (2, "1gb", None, "bandwidth '1gb' is not valid"),
    (2, "1gbit", "bad;name", "cluster name"),
    (2, "1gbit", "gw12345", "cluster name"),
])
def test_bad_input_makes_nothing(hosts, bw, name, msg, builds):
    with pytest.raises(GradwireError, match=msg):
        cluster_up(hosts, bw, name)
    assert builds == []


@needs_netns
def test_builds_sees_what_a_cluster_makes(builds):
    """The `builds` fixture that the tests above rely on: it must see a real cluster's
    namespaces, veth links and qdiscs being made (or those tests could not fail)."""
    c = cluster_up(1, "1gbit")
    cluster_down(c.name)
    made = {tuple(cmd[:3]) for cmd in builds}
    assert ("ip", "netns", "add") in made and ("ip", "link", "add") in made, builds
    assert any("tbf" in cmd for cmd in builds), builds


def test_a_name_in_use_is_refused_and_the_first_cluster_stays():
    c = cluster_up(1, "1gbit")
    try:
        # Same name again: the state file exists, so nothing is made and the first stays intact.
        with pytest.raises(GradwireError, match="already exists"):
            cluster_up(2, "1gbit", c.name)
        assert c.hosts[0].netns in netns_names()
    finally:
        cluster_down(c.name)


def test_failure_half_way_rolls_back(monkeypatch):
    """A cluster that fails while its second host is being made (its link's shaping refused)
    leaves nothing: no namespace, link or state of the first host, the bridge or the second."""
    import secrets

    from gradwire.cluster import netns

    real, calls = netns._tbf, []

    def tbf(*args):
        calls.append(args)
        if len(calls) == 3:  # the second host's upload; the first host has both directions
            raise GradwireError("tc refused (test)")
        real(*args)

    monkeypatch.setattr(netns, "_tbf", tbf)
    name = f"gw{secrets.token_hex(3)}"
    with pytest.raises(GradwireError, match="tc refused"):
        cluster_up(3, "1gbit", name)
    assert len(calls) == 3 and gradwire_leftovers(name) == []
    assert name not in {c.name for c in list_clusters()}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_run_removes_the_cluster(sig):
    # `gradwire run` makes an ephemeral cluster; SIGTERM or SIGINT (Ctrl-C) to it must leave
    # nothing behind: no namespace, link or rank process. Its cluster is the one whose owner
    # is the run's process: clusters of other runs (tests side by side) are not ours to judge.
    # Ctrl-C's SIGINT as a terminal delivers it: a suite started in the background by a
    # non-interactive shell inherits SIGINT ignored, and Python then keeps it ignored.
    p = subprocess.Popen([sys.executable, "-m", "gradwire.cli", "run", "--hosts", "2", "--",
                          "sleep", SLEEP], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, preexec_fn=_default_sigint)
    mine: set[str] = set()
    for _ in range(200):
        mine = {c.name for c in list_clusters() if c.owner and c.owner[0] == p.pid}
        if mine and _running_sleep():
            break
        time.sleep(0.05)
    assert len(mine) == 1, "the run's cluster never came up"
    p.send_signal(sig)
    out, _ = p.communicate(timeout=30)
    assert p.returncode != 0
    for n in mine:
        assert gradwire_leftovers(n) == [], out
    assert not _running_sleep()


SLEEP = "60.0713"  # an argument no other `sleep` on this machine is likely to have


def _running_sleep() -> bool:
    out = subprocess.run(["pgrep", "-f", f"^sleep {SLEEP}$"], capture_output=True,
                         text=True).stdout
    return bool(out.strip())


def test_cli_status_json_and_down_unknown():
    c = cluster_up(1, "1gbit")
    try:
        out = subprocess.run([sys.executable, "-m", "gradwire.cli", "cluster", "status",
                              "--json"], capture_output=True, text=True, check=True).stdout
        (mine,) = [x for x in json.loads(out) if x["name"] == c.name]
        assert mine["sndbuf"] == 500_000
        out = subprocess.run([sys.executable, "-m", "gradwire.cli", "cluster", "status"],
                             capture_output=True, text=True, check=True).stdout
        assert ("links: tc tbf 1gbit each direction, bucket 500 kB; hosts' TCP send buffer at "
                "most 500 kB") in " ".join(out.split())
    finally:
        cluster_down(c.name)
    p = subprocess.run([sys.executable, "-m", "gradwire.cli", "cluster", "down", "gw000000"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("gradwire: error: no cluster named gw000000")
    assert "Traceback" not in p.stderr


def test_options_that_contradict_a_live_cluster_are_refused(monkeypatch, capsys):
    c = cluster_up(2, "1gbit")
    try:
        for args, msg in [(["run", "--hosts", "3"], "--hosts 3 does not match cluster"),
                          (["bench", "-b", "100mbit"], "--bandwidth 100mbit does not match"),
                          (["calibrate", "--mtu", "9000"], "--mtu 9000 does not match")]:
            code, err = cli_error(monkeypatch, capsys, *args, "--cluster", c.name,
                                  *(["--", "true"] if args[0] == "run" else []))
            assert code == 2 and msg in err, err
            assert len(err.strip().splitlines()) == 1, err
        # the same values typed out, or none at all, run on the cluster
        code, err = cli_error(monkeypatch, capsys, "run", "--cluster", c.name, "--hosts", "2",
                              "-b", "1gbit", "--", "sh", "-c", "exit 3")
        assert code == 3, err
    finally:
        cluster_down(c.name)


def test_down_removes_an_orphan_by_name():
    c = cluster_up(2, "1gbit")
    os.unlink(f"/run/gradwire/{c.name}.json")  # a crashed process left no state file
    # --all would also take down clusters of tests running side by side, so name it.
    assert cluster_down(c.name) == [c.name]
    assert gradwire_leftovers(c.name) == []


def test_a_killed_runs_cluster_is_stale_and_the_next_cluster_removes_it():
    # SIGKILL leaves no chance to clean up: the run's cluster stays, marked by its owner.
    p = subprocess.Popen([sys.executable, "-m", "gradwire.cli", "run", "--hosts", "2", "--",
                          "sleep", SLEEP], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mine = set()
    for _ in range(200):
        mine = {c.name for c in list_clusters() if c.owner and c.owner[0] == p.pid}
        if mine and _running_sleep():
            break
        time.sleep(0.05)
    assert mine, "the run's cluster never came up"
    (name,) = mine
    assert not load_cluster(name).stale  # its run is alive
    p.kill()
    p.wait()
    # stale, unless a run side by side has made a cluster (and so removed it) already
    assert all(c.stale for c in list_clusters() if c.name == name)
    out = subprocess.run([sys.executable, "-m", "gradwire.cli", "cluster", "status"],
                         capture_output=True, text=True).stdout
    # shown as stale, unless a run side by side has made a cluster (and so removed it) first
    assert ("stale" in out and name in out) or name not in {c.name for c in list_clusters()}
    up = cluster_up(1, "none")  # made by `cluster up`: no owner, never stale
    try:
        assert up.owner is None and not up.stale
        assert gradwire_leftovers(name) == [] and not _running_sleep()
    finally:
        cluster_down(up.name)


def _machine_tcp():
    out = []
    for k in ("congestion_control", "allowed_congestion_control", "wmem"):
        with open(f"/proc/sys/net/ipv4/tcp_{k}") as f:
            out.append(f.read().split())
    return out


def _kernel_has(algo):
    try:
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            return algo in f.read().split()
    except OSError:
        return False


def test_a_send_buffer_that_cannot_be_set_warns_and_leaves_the_machine_alone():
    from gradwire.cluster.netns import cap_send_buffer

    before = _machine_tcp()
    with pytest.warns(UserWarning, match="send buffers keep this machine's ceiling"):
        assert not cap_send_buffer("gw000000-h9", 65536)  # no such namespace
    assert _machine_tcp() == before


@pytest.mark.skipif(not _kernel_has("cubic"), reason="this kernel has no TCP cubic")
def test_hosts_run_cubic_with_small_send_buffers_and_the_machine_keeps_its_tcp_settings():
    from gradwire.cluster.netns import set_congestion_control

    before = _machine_tcp()
    c = cluster_up(2, "1gbit")
    try:
        for h in c.hosts:
            got = subprocess.run(["ip", "netns", "exec", h.netns, "cat",
                                  "/proc/sys/net/ipv4/tcp_congestion_control"],
                                 capture_output=True, text=True, check=True).stdout.strip()
            assert got == "cubic"
            wmem = subprocess.run(["ip", "netns", "exec", h.netns, "cat",
                                   "/proc/sys/net/ipv4/tcp_wmem"],
                                  capture_output=True, text=True, check=True).stdout.split()
            assert int(wmem[2]) == c.send_buffer_bytes == 500_000  # 4 ms at 1 Gbit/s
        assert load_cluster(c.name).send_buffer_bytes == 500_000  # kept in its state
        assert c.tcp == load_cluster(c.name).tcp == "cubic"
        assert c.label == "emulated 2 hosts, 1gbit links, TCP cubic"
        assert _machine_tcp() == before
        with pytest.warns(UserWarning, match="TCP nosuchcc is not available here"):
            assert not set_congestion_control(c.hosts[0].netns, "nosuchcc")
        assert _machine_tcp() == before
    finally:
        cluster_down(c.name)


# c10d looks up the name of every peer of its store; where a rank could not, it printed
# "[c10d] The hostname of the client socket cannot be retrieved. err=-3".
_NAMES = """
import os, socket
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
master = socket.getnameinfo((os.environ["MASTER_ADDR"], 0), socket.NI_NAMEREQD)[0]
me = master.rsplit("-h", 1)[0] + "-h" + os.environ["RANK"]
print("NAMES", master, me, socket.gethostbyname(me))
dist.destroy_process_group()
"""


def test_hosts_of_a_run_know_each_other_by_name_and_the_names_go_with_the_run():
    from gradwire.cluster.names import NETNS_ETC

    p = subprocess.run([sys.executable, "-m", "gradwire.cli", "run", "--hosts", "2", "--timeout",
                        "120", "--", sys.executable, "-c", _NAMES],
                       capture_output=True, text=True, timeout=180)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "hostname of the client socket cannot be retrieved" not in out, out
    found = [line.split()[-3:] for line in out.splitlines() if " NAMES " in line]
    assert len(found) == 2, out
    name = found[0][0].split("-")[0]
    assert {master for master, _, _ in found} == {f"{name}-h0"}
    assert {me for _, me, _ in found} == {f"{name}-h0", f"{name}-h1"}
    assert len({addr for _, _, addr in found}) == 2  # each its own eth0
    assert gradwire_leftovers(name) == []  # no namespace or link
    assert sorted(NETNS_ETC.glob(f"{name}-*")) == []


def test_every_host_lists_every_host_and_down_removes_the_files():
    from gradwire.cluster.names import NETNS_ETC

    c = cluster_up(3, "none")
    try:
        for h in c.hosts:
            text = (NETNS_ETC / str(h.netns) / "hosts").read_text()
            for peer in c.hosts:
                assert f"{peer.addr}\t{peer.netns}\n" in text
                assert f"::ffff:{peer.addr}\t{peer.netns}\n" in text
    finally:
        cluster_down(c.name)
    assert sorted(NETNS_ETC.glob(f"{c.name}-*")) == []


def test_down_removes_hosts_files_that_a_crash_left_without_their_cluster():
    import secrets
    import shutil

    from gradwire.cluster.names import NETNS_ETC

    name = f"gw{secrets.token_hex(3)}"
    folder = NETNS_ETC / f"{name}-h0"
    folder.mkdir(parents=True)
    (folder / "hosts").write_text("")
    try:
        assert cluster_down(name) == [name]
        assert not folder.exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_runs_starting_together_claim_different_subnets(monkeypatch, tmp_path):
    """Eight runs claim a cluster at the same moment, each seeing the live clusters 50 ms
    late (so that, unlocked, all would see none and take subnet 1): every one gets its own
    subnet, and a name already claimed is refused."""
    import threading

    from gradwire.cluster import netns, state

    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    listed = state.list_clusters

    def slow_list():
        found = listed()
        time.sleep(0.05)
        return found

    monkeypatch.setattr(netns, "list_clusters", slow_list)
    start, got = threading.Barrier(8), []

    def claim(i: int) -> None:
        start.wait()
        got.append(netns._claim(state.Cluster(name=f"gw0000{i:02x}", bandwidth_bps=1e9)))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c.subnet for c in got) == list(range(1, 9))
    assert sorted(c.subnet for c in list_clusters()) == list(range(1, 9))
    with pytest.raises(GradwireError, match="cluster gw000003 already exists"):
        netns._claim(state.Cluster(name="gw000003", bandwidth_bps=1e9))


def test_a_name_in_use_under_another_state_folder_is_refused_and_left_alone(monkeypatch,
                                                                            tmp_path):
    """Namespaces of a cluster made with another GRADWIRE_STATE_DIR: the name is taken, and
    the refusal removes nothing of them."""
    c = cluster_up(1, "1gbit")
    try:
        monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
        with pytest.raises(GradwireError, match="already exists on this machine"):
            cluster_up(1, "1gbit", c.name)
        assert c.hosts[0].netns in netns_names() and list(tmp_path.glob("gw*.json")) == []
        monkeypatch.delenv("GRADWIRE_STATE_DIR")
    finally:
        cluster_down(c.name)


def test_a_cluster_still_being_built_is_refused_to_runs(monkeypatch, capsys, tmp_path):
    """A state file written while cluster up makes its hosts (ready false): a run on it would
    get fewer ranks than asked for, or none."""
    from gradwire.cluster.state import Cluster, Host, save_cluster

    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    host = Host(0, "gw0bb0c1-h0", "10.213.9.1", "eth0")
    save_cluster(Cluster("gw0bb0c1", 1e9, [host], subnet=9, ready=False))
    code, err = cli_error(monkeypatch, capsys, "run", "--cluster", "gw0bb0c1", "--", "true")
    assert code == 2 and "cluster gw0bb0c1 is still being built" in err, err
    assert load_cluster("gw0bb0c1").ready is False
    save_cluster(Cluster("gw0bb0c1", 1e9, [host], subnet=9))
    assert load_cluster("gw0bb0c1").ready is True  # once built


def test_a_stale_cluster_is_refused_to_runs(monkeypatch, capsys, tmp_path):
    """A run's cluster whose run died is removed by the next cluster made on the machine: a
    run given it with --cluster would lose its hosts mid-run."""
    from gradwire.cluster.state import Cluster, Host, save_cluster

    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    host = Host(0, "gw0bb0c2-h0", "10.213.9.1", "eth0")
    save_cluster(Cluster("gw0bb0c2", 1e9, [host], subnet=9, owner=[os.getpid(), 1]))
    assert load_cluster("gw0bb0c2").stale  # this process did not start at tick 1
    code, err = cli_error(monkeypatch, capsys, "run", "--cluster", "gw0bb0c2", "--", "true")
    assert code == 2 and f"cluster gw0bb0c2 is stale (run {os.getpid()} exited without " in err, err


@needs_netns
def test_a_cluster_whose_namespaces_are_gone_is_stale(monkeypatch, capsys, tmp_path):
    """A state folder that outlived its namespaces (a reboot, with GRADWIRE_STATE_DIR on a
    disk): `cluster up`'s cluster too is stale, shown so, refused to runs, and removed by
    the next cluster made."""
    from gradwire.cluster.netns import reap_stale
    from gradwire.cluster.state import Cluster, Host, save_cluster

    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    host = Host(0, "gw0bb0c3-h0", "10.213.9.1", "eth0")
    save_cluster(Cluster("gw0bb0c3", 1e9, [host], subnet=9))  # no owner: made by cluster up
    assert load_cluster("gw0bb0c3").why_stale == "its namespace gw0bb0c3-h0 is gone"
    assert not Cluster("gw0bb0c3", 1e9, [host], subnet=9, ready=False).stale  # being built
    code, err = cli_error(monkeypatch, capsys, "run", "--cluster", "gw0bb0c3", "--", "true")
    assert code == 2 and "is stale (its namespace gw0bb0c3-h0 is gone)" in err, err
    out = subprocess.run([sys.executable, "-m", "gradwire.cli", "cluster", "status"],
                         capture_output=True, text=True).stdout
    assert "stale: its namespace gw0bb0c3-h0 is gone" in " ".join(out.split()), out
    assert reap_stale() == ["gw0bb0c3"] and list_clusters() == []


@needs_netns
def test_call_in_runs_in_the_hosts_namespace_and_leaves_this_one_alone():
    from gradwire.cluster.netns import call_in

    here = os.readlink("/proc/thread-self/ns/net")
    with ephemeral_cluster(2, "1gbit") as c:
        there = call_in(c.hosts[0].netns, lambda: os.readlink("/proc/thread-self/ns/net"))
        inside = subprocess.run(["ip", "netns", "exec", c.hosts[0].netns, "readlink",
                                 "/proc/self/ns/net"], capture_output=True, text=True)
        assert there == inside.stdout.strip() != here
        assert os.readlink("/proc/thread-self/ns/net") == here
        assert call_in(None, lambda: 7) == 7
        with pytest.raises(ZeroDivisionError):  # raised on the caller's thread
            call_in(c.hosts[1].netns, lambda: 1 / 0)
