"""Build and tear down an emulated cluster with iproute2.

Layout for a cluster named ``gw3f9a1c`` with N hosts::

    namespace gw3f9a1c-h0 .. -h{N-1}   eth0 = 10.213.S.(i+1)/24, lo up
    veth pair gw3f9a1c-vI  <->  eth0   host side enslaved to the bridge
    bridge    gw3f9a1c-br              a non-blocking switch, no address in the root namespace

Each host link is shaped in both directions with ``tc qdisc ... tbf``: on eth0 (the host's
upload) and on the bridge-side veth (the host's download). Links carry Ethernet frames of
``mtu`` bytes of IP packet (1500 by default; 9000 for the jumbo frames many clusters use): tbf
counts each frame's headers against the rate, so TCP's payload rate is at most
(mtu − 52)/(mtu + 14) of it, 95.6 % at 1500 and 99.3 % at 9000 (IP and TCP headers with
timestamps, 52 bytes; Ethernet's, 14). Hosts run TCP ``CONGESTION_CONTROL``
(cubic, Linux's default) whatever this machine's default is, and a shaped host's TCP send
buffer holds at most 4 ms of its link's traffic (:func:`tcp_send_buffer`), never more than this
machine's own ceiling (:func:`machine_send_buffer`). State lives in
``/run/gradwire/<name>.json`` so ``cluster down`` works from another process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gradwire import config
from gradwire.bandwidth import format_bandwidth, parse_bandwidth
from gradwire.errors import GradwireError

SUBNET_PREFIX = "10.213"  # 10.213.S.0/24, one S per live cluster; reserved for gradwire
NAME_RE = re.compile(r"^gw[0-9a-f]{6}$")
MAX_HOSTS = 250
MTU = 1500  # Ethernet's default
MTU_RANGE = (576, 65535)  # IPv4's smallest datagram every host must take; veth's largest
LOOPBACK = "loopback"
LOOPBACK_LABEL = "loopback, links not shaped"


@dataclass(frozen=True)
class Host:
    """One emulated host: where to run a rank and how peers reach it."""

    rank: int
    netns: str | None  # None on the loopback fallback
    addr: str
    ifname: str


@dataclass
class Cluster:
    """A live cluster (or the loopback fallback, ``name == 'loopback'``)."""

    name: str
    bandwidth_bps: float | None
    hosts: list[Host] = field(default_factory=list)
    subnet: int = 0
    # [pid, start time in clock ticks] of the run that made it for itself (ephemeral_cluster);
    # None for `gradwire cluster up`, which stays until `cluster down`.
    owner: list[int] | None = None
    # The hosts' TCP congestion control (CONGESTION_CONTROL when every host took it); None:
    # the machine's default.
    tcp: str | None = None
    mtu: int = MTU
    # The ceiling on every host's TCP send buffer (bytes) when every host took it; None: the
    # machine's own (unshaped, or a kernel that keeps tcp_wmem for the whole machine).
    sndbuf: int | None = None

    @property
    def stale(self) -> bool:
        """A run's cluster whose run has exited without removing it (SIGKILL, a crash of the
        machine's session): nothing can use it any more."""
        return self.owner is not None and _start_ticks(self.owner[0]) != self.owner[1]

    @property
    def shaped(self) -> bool:
        return self.name != LOOPBACK and self.bandwidth_bps is not None

    @property
    def burst_bytes(self) -> int:
        """The token bucket of each shaped link (:func:`tbf_burst`), 0 when not shaped."""
        return tbf_burst(self.bandwidth_bps) if self.shaped else 0  # type: ignore[arg-type]

    @property
    def send_buffer_bytes(self) -> int | None:
        """The hosts' ceiling on a TCP send buffer as cluster up set it (:func:`host_send_buffer`);
        None where they keep the machine's own (not shaped, or the setting failed)."""
        return self.sndbuf if self.shaped else None

    @property
    def label(self) -> str:
        """How every report names the network this ran on."""
        if self.name == LOOPBACK:
            return LOOPBACK_LABEL
        tcp = f", TCP {self.tcp}" if self.tcp else ""
        mtu = f", MTU {self.mtu}" if self.mtu != MTU else ""
        return (f"emulated {len(self.hosts)} hosts, {format_bandwidth(self.bandwidth_bps)} links"
                f"{tcp}{mtu}")

    @property
    def link_key(self) -> str:
        """What a calibration of these links is saved under: the rate (``1gbit``), with the
        MTU when it is not Ethernet's default (``1gbit-mtu9000``); ``loopback`` unshaped."""
        if not self.shaped:
            return "loopback"
        rate = format_bandwidth(self.bandwidth_bps)
        return rate if self.mtu == MTU else f"{rate}-mtu{self.mtu}"

    @property
    def bridge(self) -> str:
        return f"{self.name}-br"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> Cluster:
        """Parse a state file; ValueError unless every name it holds is one gradwire makes
        (they go to ``ip netns exec`` as arguments: nothing that starts with '-' or lies
        outside the cluster may pass)."""
        d = json.loads(text)
        d["hosts"] = [Host(**h) for h in d["hosts"]]
        c = Cluster(**d)
        ns = re.compile(rf"^{re.escape(c.name)}-h\d+$")
        if c.owner is not None and not (isinstance(c.owner, list) and len(c.owner) == 2 and all(
                isinstance(x, int) for x in c.owner)):
            raise ValueError(f"cluster state {c.name!r} has an owner that is not [pid, start]")
        if c.tcp is not None and not (isinstance(c.tcp, str) and CC_NAME_RE.fullmatch(c.tcp)):
            raise ValueError(f"cluster state {c.name!r} names no TCP congestion control")
        if c.sndbuf is not None and not (type(c.sndbuf) is int and c.sndbuf > 0):
            raise ValueError(f"cluster state {c.name!r} has a send buffer that is not bytes > 0")
        if not _mtu_ok(c.mtu):
            raise ValueError(f"cluster state {c.name!r} has an MTU outside {MTU_RANGE}")
        if not NAME_RE.match(c.name) or any(
                h.netns is None or not ns.match(h.netns) or not re.match(r"^[\w.]+$", h.addr)
                or not re.match(r"^\w+$", h.ifname) for h in c.hosts):
            raise ValueError(f"cluster state {c.name!r} holds names gradwire does not make")
        return c


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip"] + (["-n", netns] if netns else []) + list(args)
    return _sh(cmd, check=check)


def _tc(*args: str, netns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", netns] if netns else []) + ["tc"] + list(args)
    _sh(cmd)


def _sh(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    # Arguments go straight to execve: no shell, and every name we build matches NAME_RE.
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise GradwireError(f"`{' '.join(cmd)}` failed: {p.stderr.strip() or p.returncode}")
    return p


def netns_available() -> tuple[bool, str]:
    """Whether this process can build namespaces; the reason when it cannot."""
    if os.geteuid() != 0:
        return False, "the emulated cluster needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is missing: install iproute2 (apt-get install iproute2)"
    probe = f"gwprobe{secrets.token_hex(3)}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return False, f"network namespaces are not supported here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


def tbf_burst(bps: float) -> int:
    """Bytes of the token bucket shaping a link of ``bps``: at least one timer tick (HZ=250) of
    traffic at the rate. Smaller buckets cost throughput here when flows share links (64 KiB at
    1gbit: a 4-host allreduce of 64 MiB 1.54 s against 0.84 s with 500 kB), so a transfer after
    an idle spell may start faster than the rate (1 MiB at 1.7 Gbit/s after 50 ms idle;
    benchmarks/results/tbf_burst.json)."""
    return max(256 * 1024, int(bps / 8 / 250))


SEND_BUFFER_S = 4e-3  # of the link's traffic that a host's TCP send buffer may hold


def tcp_send_buffer(bps: float) -> int:
    """Bytes a shaped host's TCP send buffer may hold: 4 ms of traffic at the link's rate, at
    least 64 KiB (500 kB at 1 Gbit/s). A gloo send completes once its bytes are in the kernel;
    with Linux's default ceiling (4 MiB) a rank that sends to one peer and then another had
    megabytes of the first send still queued behind it, the two sharing its link, so the first
    peer (which a tree then forwards from) got the rest at half the rate. Neither smaller nor
    larger is better: at 2 ms the double binary tree, whose ranks feed several sockets at once,
    lost 8 % at 64 MiB in a probe; at 8 ms (1 MB) Rabenseifner's allreduce of 64 MiB at P = 8
    took 1.29 s against 1.02 s with 4 ms (1.42 s with the default), while the double tree at
    P = 4 gained 4 % (benchmarks/results/tcp_sndbuf.json, tcp_sndbuf_3way_20261126.json,
    docs/cluster.md)."""
    return max(64 * 1024, int(bps / 8 * SEND_BUFFER_S))


TCP_WMEM = Path("/proc/sys/net/ipv4/tcp_wmem")


def machine_send_buffer() -> int:
    """This machine's ceiling on a TCP send buffer (bytes): ``tcp_wmem``'s third field."""
    return int(TCP_WMEM.read_text().split()[2])


def host_send_buffer(bps: float) -> int:
    """The ceiling cluster up gives a host on a link of ``bps``: :func:`tcp_send_buffer`, but
    never above the machine's own (a cap, not a raise: from about 8.4 Gbit/s up, 4 ms of the
    link is more than Linux's default 4 MiB, which the hosts then keep)."""
    return min(tcp_send_buffer(bps), machine_send_buffer())


def cap_send_buffer(ns: str, ceiling: int) -> bool:
    """Make ``ceiling`` the largest TCP send buffer of namespace ``ns`` (``tcp_wmem``'s third
    field; for sockets made after); False, with a warning, where the kernel does not keep the
    setting per namespace (before Linux 4.15 it is the whole machine's: then nothing changes)."""
    path = str(TCP_WMEM)
    machine = TCP_WMEM.read_text()
    p = _sh(["ip", "netns", "exec", ns, "cat", path], check=False)
    sizes = p.stdout.split()
    if p.returncode == 0 and len(sizes) != 3:
        p = subprocess.CompletedProcess(p.args, 1, "", f"{path} reads {p.stdout!r}")
    if p.returncode == 0:  # keep the smallest and the initial size
        p = _sh(["ip", "netns", "exec", ns, "sh", "-c",
                 f"echo '{sizes[0]} {sizes[1]} {int(ceiling)}' > {path}"], check=False)
    if TCP_WMEM.read_text() != machine:  # not per namespace: put the machine's back
        TCP_WMEM.write_text(machine)
        p = subprocess.CompletedProcess(p.args, 1, "", "tcp_wmem is not per namespace")
    if p.returncode != 0:
        why = " ".join(p.stderr.split()) or f"exit {p.returncode}"
        warnings.warn(f"the hosts' TCP send buffers keep this machine's ceiling ({why})",
                      stacklevel=2)
    return p.returncode == 0


# With BBR (some machines' default, this one's included) a flow that keeps a queue at a shaped
# link drains it in ProbeRTT every 10 s, its window cut for 200 ms or more: collectives of
# 64 MiB on 4 hosts took up to 1.5 s instead of 0.85 s now and then, while with cubic every
# iteration took 0.84-0.87 s (benchmarks/results/tcp_cc.json).
CONGESTION_CONTROL = "cubic"
CC_NAME_RE = re.compile(r"[a-z0-9_]+")  # what a congestion control's name may hold
_ALLOWED_CC = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def set_congestion_control(ns: str, algo: str = CONGESTION_CONTROL) -> bool:
    """Make ``algo`` the TCP congestion control of namespace ``ns`` (for sockets made after);
    False, with a warning, if the kernel refuses. A namespace may pick only an algorithm the
    machine lists as allowed, so ``algo`` is listed for that moment and the list restored."""
    if not CC_NAME_RE.fullmatch(algo):
        raise GradwireError(f"TCP congestion control {algo!r} is not a valid name: expected "
                            "lower-case letters, digits and '_' (e.g. cubic, reno, bbr)")
    config.state_dir().mkdir(parents=True, exist_ok=True)
    with open(config.state_dir() / "tcp.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other runs add to and restore the same list
        allowed = _ALLOWED_CC.read_text().split()
        added = False
        if algo not in allowed:
            with contextlib.suppress(OSError):  # an algorithm the kernel does not have
                _ALLOWED_CC.write_text(" ".join([*allowed, algo]))
                added = True
        try:
            p = _sh(["ip", "netns", "exec", ns, "sh", "-c",
                     f"echo {algo} > /proc/sys/net/ipv4/tcp_congestion_control"], check=False)
        finally:
            if added:
                _ALLOWED_CC.write_text(" ".join(allowed))
    if p.returncode != 0:
        why = " ".join(p.stderr.split()) or f"exit {p.returncode}"
        warnings.warn(f"TCP {algo} is not available here ({why}): the emulated "
                      "hosts keep this machine's default congestion control", stacklevel=2)
    return p.returncode == 0


def _tbf(dev: str, bps: float, netns: str | None) -> None:
    burst = tbf_burst(bps)
    _tc("qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(bps)}bit",
        "burst", str(burst), "latency", "100ms", netns=netns)


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None if there is no such
    process: a pid with the same start time is the same process, not a reuse of its number."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def reap_stale() -> list[str]:
    """Remove the clusters of runs that exited without removing them; returns their names."""
    gone = [c.name for c in list_clusters() if c.stale]
    for name in gone:
        _teardown(name)
    return gone


def _free_subnet() -> int:
    used = {c.subnet for c in list_clusters()}
    for s in range(1, 255):
        if s not in used:
            return s
    raise GradwireError("all 254 gradwire subnets are in use: run `gradwire cluster down --all`")


def _mtu_ok(mtu: object) -> bool:
    return (isinstance(mtu, int) and not isinstance(mtu, bool)
            and MTU_RANGE[0] <= mtu <= MTU_RANGE[1])


def check_mtu(mtu: int) -> int:
    """``mtu`` if a link may carry it, else a GradwireError saying what is allowed."""
    lo, hi = MTU_RANGE
    if not _mtu_ok(mtu):
        raise GradwireError(f"--mtu must be an integer number of bytes from {lo} to {hi} "
                            f"(1500: Ethernet's default; 9000: jumbo frames), got {mtu!r}")
    return mtu


def cluster_up(hosts: int, bandwidth: str = "1gbit", name: str | None = None,
               owned: bool = False, mtu: int = MTU) -> Cluster:
    """Create a cluster of ``hosts`` namespaces; on any failure everything made is removed.

    ``mtu``: the largest IP packet on every link (bytes); the bridge and both ends of every
    veth pair take it.

    ``owned``: the cluster belongs to this process (``ephemeral_cluster``); should the process
    die without removing it, the next cluster made on this machine removes it first. Stale
    clusters of other runs are removed here in any case."""
    if not 1 <= hosts <= MAX_HOSTS:
        raise GradwireError(f"--hosts must be between 1 and {MAX_HOSTS}, got {hosts}")
    bps = parse_bandwidth(bandwidth)
    check_mtu(mtu)
    ok, why = netns_available()
    if not ok:
        raise GradwireError(f"{why}; without it use the loopback fallback ({LOOPBACK_LABEL})")
    name = name or f"gw{secrets.token_hex(3)}"
    if not NAME_RE.match(name):
        raise GradwireError(f"cluster name {name!r} is not valid: expected 'gw' + 6 hex digits")
    if (config.state_dir() / f"{name}.json").exists():
        raise GradwireError(f"cluster {name} already exists")
    config.state_dir().mkdir(parents=True, exist_ok=True)
    reap_stale()
    owner = [os.getpid(), _start_ticks(os.getpid()) or 0] if owned else None
    cluster = Cluster(name=name, bandwidth_bps=bps, subnet=_free_subnet(), owner=owner, mtu=mtu)
    # The state file is written first so that a crash half-way still leaves a record to clean up.
    _save(cluster)
    with _cleanup_on_failure(cluster):
        _ip("link", "add", cluster.bridge, "mtu", str(mtu), "type", "bridge")
        _ip("link", "set", cluster.bridge, "up")
        took_all, capped_all = True, True
        ceiling = host_send_buffer(bps) if bps is not None else None
        for i in range(hosts):
            host = Host(i, f"{name}-h{i}", f"{SUBNET_PREFIX}.{cluster.subnet}.{i + 1}", "eth0")
            took, capped = _add_host(cluster, host, bps, ceiling)
            took_all, capped_all = took_all and took, capped_all and capped
            cluster.tcp = CONGESTION_CONTROL if took_all else None
            cluster.sndbuf = ceiling if capped_all else None
            cluster.hosts.append(host)
            _save(cluster)
    return cluster


def _add_host(cluster: Cluster, host: Host, bps: float | None,
              ceiling: int | None) -> tuple[bool, bool]:
    """Make ``host``; whether it took CONGESTION_CONTROL, and (shaped links) the send buffer
    ``ceiling``."""
    ns, outer, inner = host.netns, f"{cluster.name}-v{host.rank}", f"{cluster.name}-i{host.rank}"
    assert ns is not None
    _sh(["ip", "netns", "add", ns])
    _ip("link", "add", outer, "mtu", str(cluster.mtu), "type", "veth", "peer", "name", inner,
        "mtu", str(cluster.mtu))
    _ip("link", "set", inner, "netns", ns)
    _ip("link", "set", inner, "name", host.ifname, netns=ns)
    _ip("addr", "add", f"{host.addr}/24", "dev", host.ifname, netns=ns)
    _ip("link", "set", host.ifname, "up", netns=ns)
    _ip("link", "set", "lo", "up", netns=ns)
    took = set_congestion_control(ns)
    _ip("link", "set", outer, "master", cluster.bridge)
    _ip("link", "set", outer, "up")
    capped = False
    if bps is not None:
        capped = ceiling is not None and cap_send_buffer(ns, ceiling)
        _tbf(host.ifname, bps, ns)  # upload: host -> switch
        _tbf(outer, bps, None)  # download: switch -> host
    return took, capped


@contextlib.contextmanager
def _cleanup_on_failure(cluster: Cluster) -> Iterator[None]:
    """Remove the half-built cluster on an error, Ctrl-C or SIGTERM while it is being built."""
    with _signals_raise():
        try:
            yield
        except BaseException:
            _teardown(cluster.name)
            raise


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM (and SIGHUP) into KeyboardInterrupt so `finally` blocks run."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: signals stay as they are
        pass
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _save(cluster: Cluster) -> None:
    path = config.state_dir() / f"{cluster.name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(cluster.to_json())
    tmp.replace(path)


def load_cluster(name: str) -> Cluster:
    """The live cluster called ``name``."""
    if not NAME_RE.match(name):
        raise GradwireError(f"cluster name {name!r} is not valid: expected 'gw' + 6 hex digits")
    path = config.state_dir() / f"{name}.json"
    if not path.exists():
        known = ", ".join(c.name for c in list_clusters()) or "none"
        raise GradwireError(f"no cluster named {name} (live clusters: {known})")
    try:
        return Cluster.from_json(path.read_text())
    except (ValueError, TypeError, KeyError) as e:
        raise GradwireError(f"cluster state file {path} is unreadable ({e}): remove the "
                            f"cluster with `gradwire cluster down {name}`") from None


def list_clusters() -> list[Cluster]:
    """Every cluster with a state file, oldest first."""
    if not config.state_dir().is_dir():
        return []
    out = []
    for p in sorted(config.state_dir().glob("gw*.json"), key=lambda p: p.stat().st_mtime):
        with contextlib.suppress(ValueError, TypeError, KeyError):
            out.append(Cluster.from_json(p.read_text()))
    return out


def _kill_netns_pids(ns: str) -> None:
    p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    for pid in p.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _teardown(name: str) -> None:
    """Remove every namespace, veth and bridge of ``name``, whatever state it is in."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in netns.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(f"{name}-h"):
            _kill_netns_pids(ns)
            # Deleting the namespace destroys its veth end, and with it the bridge-side peer.
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for m in re.finditer(rf"^\d+: ({re.escape(name)}-[a-z0-9]+)[@:]", links, re.M):
        subprocess.run(["ip", "link", "del", m.group(1)], capture_output=True)
    with contextlib.suppress(FileNotFoundError):
        (config.state_dir() / f"{name}.json").unlink()


def _orphans() -> set[str]:
    """Names of clusters whose namespaces or links exist, state file or not."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = {m.group(1) for m in re.finditer(r"^(gw[0-9a-f]{6})-h\d+", out, re.M)}
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return names | {m.group(1) for m in re.finditer(r"^\d+: (gw[0-9a-f]{6})-", links, re.M)}


def cluster_down(name: str | None = None, all_: bool = False) -> list[str]:
    """Tear down one cluster (or all of them, including orphans); returns the names removed."""
    found = {c.name for c in list_clusters()} | _orphans()
    if all_:
        names = found
    else:
        if name is None:
            live = list_clusters()
            if len(live) != 1:
                raise GradwireError(
                    f"name the cluster to take down ({len(live)} live: "
                    f"{', '.join(c.name for c in live) or 'none'}), or pass --all")
            name = live[0].name
        if name not in found:
            load_cluster(name)  # raises the "no cluster named" error with the live names
        names = {name}
    for n in sorted(names):
        _teardown(n)
    return sorted(names)


def loopback_cluster(hosts: int) -> Cluster:
    """The fallback without namespaces: every rank on 127.0.0.1, links not shaped."""
    if not 1 <= hosts <= MAX_HOSTS:
        raise GradwireError(f"--hosts must be between 1 and {MAX_HOSTS}, got {hosts}")
    return Cluster(LOOPBACK, None, [Host(i, None, "127.0.0.1", "lo") for i in range(hosts)])


@contextlib.contextmanager
def ephemeral_cluster(hosts: int, bandwidth: str, loopback: bool = False,
                      mtu: int = MTU) -> Iterator[Cluster]:
    """A cluster that lives for one ``with`` block and is removed on any exit, signals included.

    ``loopback=True`` (or no namespace support) gives the unshaped loopback fallback instead
    (``mtu`` checked, then not used: loopback's own MTU is 64 KiB).
    """
    if loopback:
        parse_bandwidth(bandwidth)
        check_mtu(mtu)
        yield loopback_cluster(hosts)
        return
    cluster = cluster_up(hosts, bandwidth, owned=True, mtu=mtu)
    with _signals_raise():
        try:
            yield cluster
        finally:
            _teardown(cluster.name)
