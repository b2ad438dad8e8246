"""Promises docs/cluster.md and docs/architecture.md make to a user that no other test held to:
the pieces `cluster up` builds (names, addresses, the bridge, each link's tbf bucket and queue),
cubic listed as allowed only while it is set and under the machine-wide lock, the hosts left
with the machine's congestion control or send buffer where the kernel will not have them set,
`gradwire cluster up` and `cluster down NAME` from the command line, a failed `gradwire run`
and every exit of `gradwire demo` removing their cluster, the demo's loopback fallback, --mtu
reaching the cluster of every command that makes one, calibrations kept per link and MTU, the
first free subnet, `cluster down --all` taking orphans, and the layer diagram and interfaces
of docs/architecture.md."""

import ast
import io
import json
import re
import secrets
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import calibration_doc
import pytest
from conftest import (
    ROOT,
    Started,
    gradwire_leftovers,
    needs_netns,
    netns_names,
    run_cli,
)

import gradwire
from gradwire import config
from gradwire.cluster import cluster_down, cluster_up, load_cluster, netns
from gradwire.cluster.state import LOOPBACK_LABEL, Cluster, Host, save_cluster
from gradwire.errors import GradwireError

ALLOWED_CC = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def _kernel_has_cubic() -> bool:
    try:
        return "cubic" in Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text()
    except OSError:
        return False


def _ip_json(*args: str, ns: str | None = None) -> list[dict]:
    cmd = ["ip", *(["-n", ns] if ns else []), "-j", *args]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def _tbf(dev: str, ns: str | None = None) -> dict:
    cmd = ["tc", "-j", "qdisc", "show", "dev", dev]
    out = subprocess.run(["ip", "netns", "exec", ns, *cmd] if ns else cmd, capture_output=True,
                         text=True, check=True).stdout
    (tbf,) = [q for q in json.loads(out) if q["kind"] == "tbf"]
    return tbf["options"]


def _in_ns(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                          check=True).stdout.strip()


# ---- docs/cluster.md: what `cluster up` builds

@needs_netns
@pytest.mark.parametrize("rate,bps", [("100mbit", 100e6), ("1gbit", 1e9)])
def test_cluster_up_builds_the_documented_namespaces_veths_bridge_and_buckets(rate, bps,
                                                                             builds):
    """cluster.md: "one network namespace per host | `gwXXXXXX-h{i}` | `lo` up, `eth0` =
    `10.213.S.(i+1)/24`"; "one veth pair per host | `gwXXXXXX-v{i}` ↔ `eth0` | bridge side
    enslaved to the switch"; "one bridge | `gwXXXXXX-br`"; "tc tbf on `eth0` ... `rate R
    burst B limit L`: B = max(256 KiB, R/2000 bytes) ..., L = 100 ms of traffic + B", and on
    `gwXXXXXX-v{i}` "the same"; "`XXXXXX` is random per cluster"."""
    c = cluster_up(2, rate)
    try:
        assert re.fullmatch(r"gw[0-9a-f]{6}", c.name), c.name
        bucket = max(256 * 1024, int(bps / 2000))
        limit = min(int(bps / 8 * 0.1) + bucket, 2**32 - 1)
        # what tc was given, each link in both directions
        given = {}
        for cmd in (x for x in builds if "tbf" in x):
            dev = cmd[cmd.index("dev") + 1]
            where = cmd[3] if cmd[:3] == ["ip", "netns", "exec"] else None
            given[(dev, where)] = {k: cmd[cmd.index(k) + 1] for k in ("rate", "burst", "limit")}
        assert given == {dev: {"rate": f"{int(bps)}bit", "burst": str(bucket),
                               "limit": str(limit)}
                         for h in c.hosts for dev in (("eth0", h.netns), (f"{c.name}-v{h.rank}",
                                                                            None))}
        for i, h in enumerate(c.hosts):
            assert h.netns == f"{c.name}-h{i}" and h.netns in netns_names()
            links = {x["ifname"]: x for x in _ip_json("addr", "show", ns=h.netns)}
            assert "UP" in links["lo"]["flags"]
            eth0 = links["eth0"]
            v4 = [(a["local"], a["prefixlen"]) for a in eth0["addr_info"]
                  if a["family"] == "inet"]
            assert v4 == [(f"10.213.{c.subnet}.{i + 1}", 24)]
            (veth,) = _ip_json("link", "show", "dev", f"{c.name}-v{i}")
            assert veth.get("master") == f"{c.name}-br"
            # the pair: each end names the other's index
            assert veth["link_index"] == eth0["ifindex"] and eth0["link_index"] == veth["ifindex"]
            for opts in (_tbf("eth0", h.netns), _tbf(f"{c.name}-v{i}")):
                # the kernel keeps the bucket as a time: tc reads it back within a few bytes
                assert opts["rate"] == bps / 8 and abs(opts["burst"] - bucket) < 16, opts
                # and the queue limit as the time it holds beyond the bucket
                assert opts["lat"] == 100_000, opts
        (bridge,) = _ip_json("addr", "show", "dev", f"{c.name}-br")
        assert [a for a in bridge["addr_info"] if a["family"] == "inet"] == []
    finally:
        cluster_down(c.name)
    assert gradwire_leftovers(c.name) == []


def _ipv6_on() -> bool:
    try:
        return Path("/proc/sys/net/ipv6/conf/default/disable_ipv6").read_text().strip() == "0"
    except OSError:
        return False


@needs_netns
@pytest.mark.skipif(not _ipv6_on(), reason="IPv6 is off here: no link-local address to find")
def test_the_bridge_has_no_address_in_the_root_namespace():
    """cluster.md: "one bridge | `gwXXXXXX-br` | a non-blocking switch; no address in the root
    namespace". The kernel gave the bridge, and the veths' outer ends, an IPv6 link-local
    address."""
    c = cluster_up(2, "1gbit")
    try:
        for dev in (c.bridge, f"{c.name}-v0", f"{c.name}-v1"):
            (link,) = _ip_json("addr", "show", "dev", dev)
            assert link["addr_info"] == [], (dev, link["addr_info"])
    finally:
        cluster_down(c.name)
    assert gradwire_leftovers(c.name) == []


# ---- docs/cluster.md: the hosts' TCP congestion control and send buffer

@needs_netns
@pytest.mark.skipif(not _kernel_has_cubic(), reason="this kernel has no TCP cubic")
def test_cubic_is_allowed_only_while_it_is_set_under_the_machine_wide_lock(monkeypatch,
                                                                         tmp_path):
    """cluster.md: "cluster up lists cubic for the moment it sets it, then restores the list
    (under a machine-wide lock, `/run/lock/gradwire-tcp.lock`, or in the temporary folder
    where there is no `/run/lock`, whatever `GRADWIRE_STATE_DIR` is)"."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    run_lock = Path("/run/lock")
    lock = (run_lock if run_lock.is_dir() else Path(tempfile.gettempdir())) / "gradwire-tcp.lock"
    with netns._machine_lock("gradwire-tcp"):  # no other run is adding to the list meanwhile
        before = ALLOWED_CC.read_text()
    locks: list[Path] = []
    allowed_while_set: list[list[str]] = []
    real_lock, real_sh = netns._lock, netns._sh

    def recording_lock(path):
        locks.append(Path(path))
        return real_lock(path)

    def sh(cmd, check=True):
        if "tcp_congestion_control" in cmd[-1]:
            allowed_while_set.append(ALLOWED_CC.read_text().split())
        return real_sh(cmd, check)

    monkeypatch.setattr(netns, "_lock", recording_lock)
    monkeypatch.setattr(netns, "_sh", sh)
    c = cluster_up(2, "none")
    try:
        assert c.tcp == "cubic"
        assert len(allowed_while_set) == 2 and all("cubic" in a for a in allowed_while_set)
        assert lock in locks and not [p for p in locks if tmp_path in p.parents
                                      and p.name.startswith("gradwire-tcp")]
    finally:
        cluster_down(c.name)
    with real_lock(lock):
        assert ALLOWED_CC.read_text() == before
    assert gradwire_leftovers(c.name) == []


@needs_netns
def test_without_cubic_the_hosts_keep_the_machines_default_with_a_warning(monkeypatch):
    """cluster.md: "Where the kernel has no cubic, the hosts keep the machine's default, with a
    warning. Every report names the network with it" (its label then names no TCP)."""
    real = netns.set_congestion_control
    monkeypatch.setattr(netns, "set_congestion_control", lambda ns: real(ns, "nosuchcc"))
    machine = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    with pytest.warns(UserWarning, match="hosts keep this machine's default congestion"):
        c = cluster_up(2, "1gbit")
    try:
        for h in c.hosts:
            assert _in_ns(h.netns, "cat", "/proc/sys/net/ipv4/tcp_congestion_control") == machine
        assert c.tcp is None and load_cluster(c.name).tcp is None
        assert c.label == "emulated 2 hosts, 1gbit links"
    finally:
        cluster_down(c.name)
    assert gradwire_leftovers(c.name) == []


@needs_netns
def test_a_machine_wide_tcp_wmem_leaves_the_hosts_default_and_sndbuf_null(monkeypatch,
                                                                        capsys, tmp_path):
    """cluster.md: "Where the kernel keeps `tcp_wmem` for the whole machine (before Linux 4.15)
    the hosts keep the default, with a warning. The cluster's state records the ceiling its
    hosts took (`sndbuf`, null where they kept the machine's), and `gradwire cluster status`
    shows it". The old kernel is played by a stand-in for the machine's file that a host's
    write reaches."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path / "state"))
    machine = tmp_path / "tcp_wmem"
    machine.write_text(netns.TCP_WMEM.read_text())
    was = machine.read_text()
    monkeypatch.setattr(netns, "TCP_WMEM", machine)
    real = netns._sh

    def sh(cmd, check=True):
        if cmd[:3] == ["ip", "netns", "exec"] and "tcp_wmem" in cmd[-1] and ">" in cmd[-1]:
            machine.write_text(cmd[-1].split("'")[1] + "\n")  # the machine's, not the host's
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return real(cmd, check)

    monkeypatch.setattr(netns, "_sh", sh)
    with pytest.warns(UserWarning, match=r"send buffers keep this machine's ceiling \(tcp_wmem "
                                         "is not per namespace"):
        c = cluster_up(2, "1gbit")
    try:
        assert machine.read_text() == was  # put back
        assert c.sndbuf is None and load_cluster(c.name).sndbuf is None
        code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status", "--json"])
        assert code == 0 and [x["sndbuf"] for x in json.loads(out)] == [None], err
        code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status"])
        assert ("links: tc tbf 1gbit each direction, bucket 500 kB; hosts' TCP send buffer at "
                "most this machine's") in " ".join(out.split()), out
    finally:
        cluster_down(c.name)
    assert gradwire_leftovers(c.name) == []


# ---- docs/cluster.md: `gradwire cluster up` and `cluster down NAME` from the command line

SLEEP = "61.0417"  # an argument no other `sleep` on this machine is likely to have


@needs_netns
def test_cluster_up_stays_until_cluster_down_which_kills_its_processes(monkeypatch, capsys,
                                                                     tmp_path):
    """cluster.md: "`gradwire cluster up --hosts N --bandwidth R [--mtu M]` builds"; "Clusters
    made by `gradwire cluster up` have no owner once built and stay until `cluster down`";
    "`gradwire cluster down NAME` kills every process in the cluster's namespaces, deletes them
    (which deletes their veth ends and the peers), deletes the bridge and the state file"."""
    from gradwire.cluster.names import NETNS_ETC

    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    name = f"gw{secrets.token_hex(3)}"
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "up", "--hosts", "2",
                                                   "--bandwidth", "100mbit", "--name", name])
    sleeper = None
    try:
        assert code == 0, err
        c = load_cluster(name)
        flat = " ".join(out.split())
        assert f"cluster {name} up: {c.label}" in flat and c.label.startswith(
            "emulated 2 hosts, 100mbit links"), out
        assert f"{name}-h0" in out and f"{name}-h1" in out  # the hosts' table
        assert c.owner is None and not c.stale and c.ready
        assert {f"{name}-h0", f"{name}-h1"} <= netns_names()  # still there
        code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status", "--json"])
        (mine,) = [x for x in json.loads(out) if x["name"] == name]
        assert mine["owner"] is None and mine["stale"] is None
        sleeper = subprocess.Popen(["ip", "netns", "exec", f"{name}-h1", "sleep", SLEEP])
        for _ in range(100):
            pids = subprocess.run(["ip", "netns", "pids", f"{name}-h1"], capture_output=True,
                                  text=True).stdout.split()
            if str(sleeper.pid) in pids:
                break
            time.sleep(0.05)
        code, out, err = run_cli(monkeypatch, capsys, ["cluster", "down", name])
        assert code == 0 and out.strip() == f"removed: {name}", (out, err)
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert gradwire_leftovers(name) == []
        assert not (tmp_path / f"{name}.json").exists()
        assert sorted(NETNS_ETC.glob(f"{name}-*")) == []
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        if gradwire_leftovers(name) or (tmp_path / f"{name}.json").exists():
            cluster_down(name)


# ---- docs/cluster.md: `gradwire run`'s cluster and its ranks' environment

RANK_SH = ("printf 'ENV|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s\\n' \"$RANK\" \"$WORLD_SIZE\" "
           "\"$LOCAL_RANK\" \"$LOCAL_WORLD_SIZE\" \"$GROUP_RANK\" \"$MASTER_ADDR\" "
           "\"$GLOO_SOCKET_IFNAME\" \"$NCCL_SOCKET_IFNAME\" \"$NCCL_HOSTID\" \"$OMP_NUM_THREADS\" "
           "\"$GLIBC_TUNABLES\" \"$(cat /sys/class/net/eth0/mtu)\" \"$GRADWIRE_NETWORK\"; "
           # rank 1 fails once rank 0 has printed its line (a file they share says so)
           "if [ \"$RANK\" = 0 ]; then touch \"$GW_TEST_FLAG\"; exec sleep 30; fi; i=0; "
           "while [ ! -e \"$GW_TEST_FLAG\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); "
           "done; exit 3")


@needs_netns
def test_a_failed_run_removes_its_cluster_and_its_ranks_had_the_documented_environment(
        monkeypatch, capsys, tmp_path):
    """cluster.md: "`gradwire run` and `gradwire demo` make an ephemeral cluster that is removed
    on every exit: success, failure, ..."; "A run's cluster records its owner (pid and start
    time) in the state file"; `gradwire run` "take[s] `--mtu` for the cluster [it] make[s]",
    which "says so in every report"; each rank gets `LOCAL_RANK=0`, `LOCAL_WORLD_SIZE=1`,
    `GROUP_RANK`, `MASTER_ADDR` (host 0), `NCCL_SOCKET_IFNAME` (its host's link, as for gloo),
    its own `NCCL_HOSTID`, `OMP_NUM_THREADS=1` unless set, `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`
    (`gradwire.launcher.MALLOC_TUNABLES`) unless set, and `GRADWIRE_NETWORK`."""
    import os

    import gradwire.cli.cluster
    from gradwire.cluster.state import process_start_ticks
    from gradwire.launcher import MALLOC_TUNABLES

    assert MALLOC_TUNABLES == "glibc.malloc.hugetlb=1"
    for name in ("OMP_NUM_THREADS", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GW_TEST_FLAG", str(tmp_path / "rank0-printed"))
    seen: dict = {}
    real = gradwire.cli.cluster.launch

    def launch(c, cmd, **kw):
        seen["cluster"], seen["owner"] = c, load_cluster(c.name).owner
        return real(c, cmd, **kw)

    monkeypatch.setattr(gradwire.cli.cluster, "launch", launch)
    code, out, err = run_cli(monkeypatch, capsys, ["run", "--hosts", "2", "--mtu", "9000",
                                                   "--timeout", "60", "--", "sh", "-c", RANK_SH])
    c = seen["cluster"]
    try:
        assert code == 3, (out, err)
        assert err.startswith("gradwire run: rank 1 exited with status 3"), err
        assert seen["owner"] == [os.getpid(), process_start_ticks(os.getpid())]
        assert c.label.startswith("emulated 2 hosts, 1gbit links") and c.label.endswith(
            ", MTU 9000"), c.label
        rows = sorted(line.split("ENV|", 1)[1].split("|") for line in out.splitlines()
                      if "ENV|" in line)
        assert len(rows) == 2, out
        for r, row in enumerate(rows):
            assert row[:8] == [str(r), "2", "0", "1", str(r), c.hosts[0].addr, "eth0", "eth0"]
            assert row[9:] == ["1", MALLOC_TUNABLES, "9000", c.label], row
        assert len({row[8] for row in rows}) == 2  # an NCCL host id each
        assert gradwire_leftovers(c.name) == []
        assert not (config.state_dir() / f"{c.name}.json").exists()
    finally:
        if gradwire_leftovers(c.name):
            cluster_down(c.name)


# ---- docs/cluster.md: `gradwire demo`'s cluster

def _demo_args(tmp_path: Path) -> list[str]:
    return ["demo", "--hosts", "2", "--agg", "dense", "--epochs", "1", "--model", "mlp-small",
            "--plot", str(tmp_path / "demo.png")]


@needs_netns
@pytest.mark.parametrize("ending,status", [("success", 0), ("failure", 2),
                                           ("SIGINT", 130), ("SIGTERM", 143)])
def test_the_demos_cluster_is_removed_on_every_exit(monkeypatch, capsys, tmp_path, ending,
                                                    status):
    """cluster.md: "`gradwire run` and `gradwire demo` make an ephemeral cluster that is removed
    on every exit: success, failure, Ctrl-C and SIGTERM" (`gradwire run`'s are held by
    test_cluster.py, test_launcher_signals.py and the test above). The demo's training is a
    stand-in that ends each way while the cluster is up."""
    import gradwire.demo

    seen: dict = {}

    def run_demo(cluster, *args, **kwargs):
        seen["name"] = cluster.name
        seen["up"] = {h.netns for h in cluster.hosts} <= netns_names()
        if ending == "failure":
            raise GradwireError("the stand-in training failed")
        if ending != "success":
            signal.raise_signal(getattr(signal, ending))
        return []

    monkeypatch.setattr(gradwire.demo, "run_demo", run_demo)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's shell
    try:
        code, out, err = run_cli(monkeypatch, capsys, _demo_args(tmp_path))
    finally:
        signal.signal(signal.SIGINT, old)
        if seen.get("name") and gradwire_leftovers(seen["name"]):
            cluster_down(seen["name"])
    assert seen["up"] is True and re.fullmatch(r"gw[0-9a-f]{6}", seen["name"])
    assert code == status, (out, err)
    assert gradwire_leftovers(seen["name"]) == []


def test_the_demo_without_namespaces_says_why_in_one_line_and_runs_on_loopback(
        monkeypatch, capsys, tmp_path):
    """cluster.md: "Without root, `ip`/`tc`, or namespace support, `gradwire run` and `gradwire
    demo` say why on one line and run every rank on `127.0.0.1` (`GLOO_SOCKET_IFNAME=lo`).
    Links are not shaped there, and every report ... says so: `"network": "loopback, links
    not shaped"`" (`gradwire run`'s is held by test_doc_promises_tools.py)."""
    import gradwire.cli.options
    import gradwire.demo

    monkeypatch.setattr(gradwire.cli.options, "netns_available",
                        lambda: (False, "network namespaces need root"))
    seen = []
    monkeypatch.setattr(gradwire.demo, "run_demo", lambda c, *a, **k: seen.append(c) or [])
    code, out, err = run_cli(monkeypatch, capsys, _demo_args(tmp_path))
    assert code == 0, err
    assert [x for x in err.splitlines() if x.strip()] == [
        f"gradwire: network namespaces need root; falling back to {LOOPBACK_LABEL}"]
    (c,) = seen
    assert c.label == "loopback, links not shaped" and not c.shaped
    assert [(h.addr, h.ifname) for h in c.hosts] == [("127.0.0.1", "lo")] * 2


@pytest.mark.parametrize("command", [["run", "--", "true"], ["bench"], ["calibrate"],
                                     _demo_args(Path("."))[:-2]], ids=lambda c: c[0])
def test_every_command_that_makes_a_cluster_takes_mtu_for_it(monkeypatch, capsys, tmp_path,
                                                             command):
    """cluster.md: "`gradwire run`, `train`, `demo`, `bench` and `calibrate` take `--mtu` for
    the cluster they make" (`train`'s is held by test_demo_report_edges.py)."""
    import gradwire.cli.options
    import gradwire.cli.train

    made = []

    def cluster(hosts, bandwidth, loopback, mtu, progress=None):
        made.append(mtu)
        raise Started

    for module in (gradwire.cli.options, gradwire.cli.train):
        monkeypatch.setattr(module, "ephemeral_cluster", cluster)
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = ([*command[:1], "--mtu", "9000", *command[1:]] if command[0] == "run"
            else [*command, "--mtu", "9000"])
    code, _, err = run_cli(monkeypatch, capsys, args, started=(Started,))
    assert code == 0 and made == [9000], err


# ---- docs/cluster.md: calibrations per link and MTU

def test_calibrate_saves_the_bucket_under_the_links_rate_and_mtu(monkeypatch, tmp_path):
    """cluster.md: "`gradwire calibrate` saves the bucket with α, β and γ (`burst_bytes`)";
    "A cluster at another MTU says so in every report (`"network": "emulated 8 hosts, 1gbit
    links, TCP cubic, MTU 9000"`), and `gradwire calibrate` on it saves under
    `1gbit-mtu9000`, apart from the 1500-byte calibration `bench` uses for `1gbit`"."""
    import contextlib

    from rich.console import Console

    import gradwire.jobs
    from gradwire.bench import calibrate as cal
    from gradwire.bench.run import model_params

    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))

    def cluster(mtu: int) -> Cluster:
        return Cluster("gw0dc0a1", 1e9, [Host(i, f"gw0dc0a1-h{i}", f"10.213.9.{i + 1}", "eth0")
                                         for i in range(8)], subnet=9, tcp="cubic", mtu=mtu)

    for mtu, alpha in ((9000, 3e-5), (1500, 4e-5)):
        monkeypatch.setattr(gradwire.jobs, "run_ranks",
                            lambda *a, alpha=alpha, **k: calibration_doc.doc(alpha_s=alpha))
        cal.calibrate(lambda mtu=mtu: contextlib.nullcontext(cluster(mtu)), None, [], "test",
                      60, Console(file=io.StringIO()))
    jumbo = json.loads(cal.calibration_path("1gbit-mtu9000").read_text())
    plain = json.loads(cal.calibration_path("1gbit").read_text())
    assert jumbo["network"] == "emulated 8 hosts, 1gbit links, TCP cubic, MTU 9000"
    assert plain["network"] == "emulated 8 hosts, 1gbit links, TCP cubic"
    assert jumbo["burst_bytes"] == plain["burst_bytes"] == 500_000  # 4 ms at 1 Gbit/s
    assert (jumbo["alpha_s"], plain["alpha_s"]) == (3e-5, 4e-5)
    for mtu, alpha, file in ((9000, 3e-5, "1gbit-mtu9000.json"), (1500, 4e-5, "1gbit.json")):
        params, source = model_params(cluster(mtu))
        assert params.alpha == alpha and params.burst == 500_000 and file in source, source


# ---- docs/cluster.md: subnets, and what `cluster down --all` takes

def test_a_cluster_takes_the_first_subnet_no_live_cluster_uses(monkeypatch, tmp_path):
    """cluster.md: "`S` (1…254) is the first subnet no live cluster uses"."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    for name, s in (("gw0dc0b1", 1), ("gw0dc0b3", 3)):
        save_cluster(Cluster(name, 1e9, [Host(0, f"{name}-h0", f"10.213.{s}.1", "eth0")],
                             subnet=s, ready=False, owner=None))
    assert netns._claim(Cluster("gw0dc0b2", 1e9)).subnet == 2
    assert netns._claim(Cluster("gw0dc0b4", 1e9)).subnet == 4
    monkeypatch.setattr(netns, "list_clusters",
                        lambda: [Cluster(f"gw0d{s:04x}", 1e9, subnet=s) for s in range(1, 255)])
    with pytest.raises(GradwireError, match="all 254 gradwire subnets are in use"):
        netns._claim(Cluster("gw0dc0b5", 1e9))


def test_down_all_removes_orphans_found_by_namespace_link_or_hosts_file(monkeypatch, capsys,
                                                                       tmp_path):
    """cluster.md: "It also removes an orphan (namespaces left by a crashed process with no
    state file) by name; `--all` removes every gradwire cluster on the machine". Nothing real is
    removed: `ip` reads as a machine holding one orphan of each kind and a probe namespace."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    (tmp_path / "gw0dc0c1.json").write_text("{}")  # a state file, read or not
    listed = {("ip", "netns", "list"): "gw0dc0c2-h0 (id: 7)\ngwprobe0a1b2c\n",
              ("ip", "-o", "link", "show"): "1: lo: <LOOPBACK,UP>\n9: gw0dc0c3-br: <UP>\n"}
    ran: list[list[str]] = []

    def run(cmd, *args, **kwargs):
        ran.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 0, stdout=listed.get(tuple(cmd), ""), stderr="")

    removed: list[str] = []
    monkeypatch.setattr(netns, "_run", run)
    monkeypatch.setattr(netns, "_remove", removed.append)
    monkeypatch.setattr(netns, "clusters_with_hosts_files", lambda: {"gw0dc0c4"})
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "down", "--all"])
    want = ["gw0dc0c1", "gw0dc0c2", "gw0dc0c3", "gw0dc0c4"]
    assert code == 0 and removed == want, (out, err)
    assert out.strip() == f"removed: {', '.join(want)}"
    assert ["ip", "netns", "del", "gwprobe0a1b2c"] in ran


# ---- docs/architecture.md

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _diagram_layers() -> list[tuple[str, ...]]:
    """The layers of architecture.md's diagram, lowest first, each its modules' names."""
    text = ARCHITECTURE.read_text()
    (block,) = [b for b in re.findall(r"^```\n(.*?)^```", text, re.S | re.M) if "__main__" in b]
    layers: list[list[str]] = []
    joined = False
    for line in block.splitlines():
        names = re.split(r"\s{2,}", line.strip())[0] if line.strip() else ""
        if not line.startswith("  ") or line[2] == " " or not names or names[0] in "─┴":
            continue
        found = [n.strip() for n in re.split(r"[│,]", names) if n.strip()]
        if joined:
            layers[-1] += found
        else:
            layers.append(found)
        joined = names.endswith(",")
    return [tuple(layer) for layer in reversed(layers)]


def test_the_layer_diagram_is_the_order_test_layers_holds():
    """architecture.md: "gradwire is built in layers. A module imports only from layers below
    its own; `tests/test_layers.py` fails on any import that points up" (its LAYERS must be the
    diagram's, or it holds another order); "config, dtypes, bandwidth, sizes, jsonfile,
    interrupts, syncfree ... side by side, none imports another"."""
    import test_layers

    assert _diagram_layers() == test_layers.LAYERS


def _imports_of(package: str) -> set[str]:
    out = set()
    for path in (Path(gradwire.__file__).parent / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
    return out


def test_the_catalogues_three_consumers_each_read_it():
    """architecture.md: "The three consumers of the aggregation catalogue (hooks, performance
    model, simulator) sit side by side and never import one another: each reads the
    catalogue"."""
    for package in ("hooks", "perf", "sim"):
        imported = _imports_of(package)
        assert any(m == "gradwire.catalogue" or m.startswith("gradwire.catalogue.")
                   for m in imported), package
        others = {"hooks", "perf", "sim"} - {package}
        assert not [m for m in imported if m.split(".")[:2] in
                    [["gradwire", o] for o in others]], package


NAMED = ["gradwire.catalogue.METHODS", "gradwire.catalogue.Method.plan",
         "gradwire.catalogue.CollectiveCall", "gradwire.catalogue.issuer",
         "gradwire.catalogue.start", "gradwire.perf.model.operations",
         "gradwire.sim.collective.bucket_calls", "gradwire.hooks.state.hook",
         "gradwire.hooks.layout", "gradwire.hooks.comm.Worker", "gradwire.collectives.agree",
         "gradwire.compress.feedback.ErrorFeedback.correct",
         "gradwire.compress.feedback.ErrorFeedback.update", "gradwire.compress.feedback.feed",
         "gradwire.compress.Compressor.compress", "gradwire.compress.Compressor.combine",
         "gradwire.compress.select", "gradwire.collectives.all_reduce",
         "gradwire.collectives.all_gather_into_tensor", "gradwire.sparse.sparse_allreduce",
         "gradwire.sparse.topk_allreduce", "gradwire.sparse.gtopk_allreduce",
         "gradwire.schedules.registry", "gradwire.collectives.executor",
         "gradwire.transport.Transport", "gradwire.syncfree", "gradwire.errors.GradwireError"]


def _resolve(dotted: str) -> object:
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_the_interfaces_the_page_names_are_there():
    """architecture.md: "`gradwire.catalogue.METHODS` maps a method name to a `Method`";
    "`Method.plan(numel, world, ...)` returns the `CollectiveCall`s one bucket issues, in
    order, with their sizes, and the payload bytes of one rank"; and the modules and names
    "The path of one gradient" walks through (`hooks.state.hook(state, bucket)`,
    `hooks.comm.Worker`, `collectives.agree`, `ErrorFeedback.correct`, `feedback.feed`,
    `Compressor.compress`, `compress.select`, `sparse.sparse_allreduce`, `schedules.registry`,
    `collectives.executor`, `transport.Transport`, `Compressor.combine`,
    `ErrorFeedback.update`, `gradwire.syncfree`), `errors`: "GradwireError and its kinds"."""
    import inspect

    import torch

    from gradwire import catalogue, errors

    missing = []
    for dotted in NAMED:
        try:
            _resolve(dotted)
        except (ImportError, AttributeError):
            missing.append(dotted)
    assert not missing, missing
    assert catalogue.METHODS and all(isinstance(m, catalogue.Method)
                                     for m in catalogue.METHODS.values())
    assert list(inspect.signature(catalogue.Method.plan).parameters)[1:3] == ["numel", "world"]
    assert list(inspect.signature(_resolve("gradwire.hooks.state.hook")).parameters) == [
        "state", "bucket"]
    m = catalogue.get("topk")
    plan = m.plan(10_000, 4, torch.float32, m.make_compressor(0.01), 0.01, "ring", None)
    assert plan.calls and all(isinstance(c, catalogue.CollectiveCall) and c.count > 0
                              for c in plan.calls)
    assert plan.sent > 0
    kinds = [v for v in vars(errors).values() if isinstance(v, type)
             and issubclass(v, errors.GradwireError) and v is not errors.GradwireError]
    assert kinds
