"""Build and tear down an emulated cluster with iproute2.

Layout for a cluster named ``gw3f9a1c`` with N hosts::

    namespace gw3f9a1c-h0 .. -h{N-1}   eth0 = 10.213.S.(i+1)/24, lo up
    veth pair gw3f9a1c-vI  <->  eth0   host side enslaved to the bridge
    bridge    gw3f9a1c-br              a non-blocking switch, no address in the root namespace
    names     /etc/netns/gw3f9a1c-hI/hosts   every host by its namespace's name (cluster.names)
    neighbours every other host's address and MAC (host_mac), permanent, in each host

Each host link is shaped in both directions with ``tc qdisc ... tbf``: on eth0 (the host's
upload) and on the bridge-side veth (the host's download). Links carry Ethernet frames of
``mtu`` bytes of IP packet (1500 by default; 9000 for the jumbo frames many clusters use): tbf
counts each frame's headers against the rate, so TCP's payload rate is at most
(mtu − 52)/(mtu + 14) of it, 95.6 % at 1500 and 99.3 % at 9000 (IP and TCP headers with
timestamps, 52 bytes; Ethernet's, 14). Hosts run TCP ``CONGESTION_CONTROL``
(cubic, Linux's default) whatever this machine's default is, and a shaped host's TCP send
buffer holds at most 4 ms of its link's traffic (at least 64 KiB and two packets;
:func:`tcp_send_buffer`), never more than this
machine's own ceiling (:func:`machine_send_buffer`). State lives in
``/run/gradwire/<name>.json`` so ``cluster down`` works from another process.

The numbers each link and host gets, and why, are in :mod:`gradwire.cluster.shaping`; the
:class:`Cluster` record and its state file in :mod:`gradwire.cluster.state`. This module names
them too, for the callers that import them from here.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from gradwire import config
from gradwire.bandwidth import parse_bandwidth
from gradwire.cluster.names import (
    clusters_with_hosts_files,
    remove_hosts_files,
    write_hosts_files,
)
from gradwire.cluster.shaping import (
    CC_NAME_RE,
    CONGESTION_CONTROL,
    tbf_burst,
    tbf_limit,
    tcp_send_buffer,
)
from gradwire.cluster.state import (
    LOOPBACK_LABEL,
    MTU,
    NAME_RE,
    NETNS_DIR,
    Cluster,
    Host,
    check_hosts,
    check_mtu,
    check_name,
    list_clusters,
    load_cluster,
    loopback_cluster,
    process_start_ticks,
    save_cluster,
    state_files,
)
from gradwire.errors import GradwireError
from gradwire.interrupts import STOP_SIGNALS, Interrupted, on_signals

# what cluster_up's ``progress`` makes: a context whose value is ``update(made, hosts)``
Progress = Callable[[], contextlib.AbstractContextManager[Callable[[int, int], None]]]

SUBNET_PREFIX = "10.213"  # 10.213.S.0/24, one S per live cluster; reserved for gradwire


def host_addr(subnet: int, rank: int) -> str:
    """Host ``rank``'s address in the cluster on ``subnet``."""
    return f"{SUBNET_PREFIX}.{subnet}.{rank + 1}"


def host_mac(subnet: int, rank: int) -> str:
    """Host ``rank``'s MAC address (its eth0's) in the cluster on ``subnet``: fixed, so that
    every host can be given every other's before they are all made (locally administered:
    the first byte's second bit)."""
    return f"02:67:77:{subnet:02x}:{rank >> 8:02x}:{rank & 0xFF:02x}"


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip"] + (["-n", netns] if netns else []) + list(args)
    return _sh(cmd, check=check)


def _ip_batch(lines: list[str], netns: str | None = None) -> None:
    """``ip`` commands (each a line as after ``ip``) run by one ``ip -batch`` process, in that
    order: a process per command would be most of a host's build time. The first that fails stops
    the rest and is the error, named as ``_ip`` names it. Every name in them is one gradwire
    made (NAME_RE's) and every argument a word without spaces."""
    cmd = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    p = _run(cmd, input="".join(f"{line}\n" for line in lines), capture_output=True, text=True)
    if p.returncode != 0:
        failed = re.search(r"^Command failed -:(\d+)$", p.stderr, re.M)
        line = lines[int(failed.group(1)) - 1] if failed and int(failed.group(1)) <= len(lines) \
            else "-batch -"
        why = " ".join(x for x in p.stderr.splitlines() if not x.startswith("Command failed"))
        raise GradwireError(f"`{' '.join(cmd[:-2])} {line}` failed: "
                            f"{why.strip() or p.returncode}")


def _no_address(dev: str) -> None:
    """Keep the root namespace's side of a cluster (its bridge, the veths' outer ends) without
    an address: the kernel gives every link it brings up an IPv6 link-local one, which put this
    machine on the emulated switch. Where IPv6 is off there is none to keep off (the call
    fails, and is not needed)."""
    _ip("link", "set", dev, "addrgenmode", "none", check=False)


def _tc(*args: str, netns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", netns] if netns else []) + ["tc"] + list(args)
    _sh(cmd)


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    """``cmd`` run in a session of its own: a terminal's Ctrl-C goes to gradwire, which finishes
    what it is building or removing, not to the ``ip`` or ``tc`` under way (a second Ctrl-C
    during a teardown had killed its ``ip link del`` and left the bridge)."""
    return subprocess.run(cmd, start_new_session=True, **kwargs)  # type: ignore[call-overload]


def _sh(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    # Arguments go straight to execve: no shell, and every name we build matches NAME_RE.
    p = _run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise GradwireError(f"`{' '.join(cmd)}` failed: {p.stderr.strip() or p.returncode}")
    return p


PROBE_PREFIX = "gwprobe"  # netns_available's namespace, made and removed at once


def netns_available() -> tuple[bool, str]:
    """Whether this process can build namespaces; the reason when it cannot."""
    if os.geteuid() != 0:
        return False, "the emulated cluster needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is missing: install iproute2 (apt-get install iproute2)"
    probe = f"{PROBE_PREFIX}{secrets.token_hex(3)}"
    with _signals_deferred():  # made and removed with no signal between: none is left
        p = _run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if p.returncode == 0:
            _run(["ip", "netns", "del", probe], capture_output=True)
    if p.returncode != 0:
        return False, f"network namespaces are not supported here: {p.stderr.strip()}"
    return True, ""


TCP_WMEM = Path("/proc/sys/net/ipv4/tcp_wmem")


_CLONE_NEWNET = 0x40000000  # setns(2)'s flag for a network namespace
T = TypeVar("T")


def call_in(netns: str | None, fn: Callable[[], T]) -> T:
    """``fn()``, run in network namespace ``netns`` (None: this process's own), on a thread of
    its own: setns moves only the thread that calls it. Sockets ``fn`` makes stay in that
    namespace, and so do threads it starts, whoever uses them later."""
    if netns is None:
        return fn()
    done: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            with open(NETNS_DIR / netns, "rb") as f:
                if ctypes.CDLL(None, use_errno=True).setns(f.fileno(), _CLONE_NEWNET):
                    raise OSError(ctypes.get_errno(), f"setns into {netns} failed")
            done.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            done.append((False, e))

    t = threading.Thread(target=run, name=f"in {netns}")
    t.start()
    t.join()
    ok, value = done[0]
    if not ok:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


def machine_send_buffer() -> int:
    """This machine's ceiling on a TCP send buffer (bytes): ``tcp_wmem``'s third field."""
    return int(TCP_WMEM.read_text().split()[2])


def host_send_buffer(bps: float, mtu: int = MTU) -> int:
    """The ceiling cluster up gives a host on a link of ``bps`` carrying packets of ``mtu``
    bytes: :func:`tcp_send_buffer`, but never above the machine's own (a cap, not a raise: from
    about 8.4 Gbit/s up, 4 ms of the link is more than Linux's default 4 MiB, which the hosts
    then keep)."""
    return min(tcp_send_buffer(bps, mtu), machine_send_buffer())


def cap_send_buffer(ns: str, ceiling: int) -> bool:
    """Make ``ceiling`` the largest TCP send buffer of namespace ``ns`` (``tcp_wmem``'s third
    field; for sockets made after); False, with a warning, where the kernel does not keep the
    setting per namespace (before Linux 4.15 it is the whole machine's: then nothing changes)."""
    path = str(TCP_WMEM)
    machine = TCP_WMEM.read_text()
    p = _sh(["ip", "netns", "exec", ns, "cat", path], check=False)
    sizes = p.stdout.split()
    if p.returncode == 0 and (len(sizes) != 3 or not all(x.isdigit() for x in sizes)):
        p = subprocess.CompletedProcess(p.args, 1, "", f"{path} reads {p.stdout!r}")
    if p.returncode == 0:  # keep the smallest and the initial size, neither above the ceiling
        # A TCP socket starts with the initial size and autotuning only grows it: a machine
        # tuned to start larger (87380, 1 MiB) had its hosts' buffers start above the ceiling.
        low, initial = (min(int(s), int(ceiling)) for s in sizes[:2])
        p = _sh(["ip", "netns", "exec", ns, "sh", "-c",
                 f"echo '{low} {initial} {int(ceiling)}' > {path}"], check=False)
    if TCP_WMEM.read_text() != machine:  # not per namespace: put the machine's back
        TCP_WMEM.write_text(machine)
        p = subprocess.CompletedProcess(p.args, 1, "", "tcp_wmem is not per namespace")
    if p.returncode != 0:
        why = " ".join(p.stderr.split()) or f"exit {p.returncode}"
        warnings.warn(f"the hosts' TCP send buffers keep this machine's ceiling ({why})",
                      stacklevel=2)
    return p.returncode == 0


_ALLOWED_CC = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def set_congestion_control(ns: str, algo: str = CONGESTION_CONTROL) -> bool:
    """Make ``algo`` the TCP congestion control of namespace ``ns`` (for sockets made after);
    False, with a warning, if the kernel refuses. A namespace may pick only an algorithm the
    machine lists as allowed, so ``algo`` is listed for that moment and the list restored."""
    if not CC_NAME_RE.fullmatch(algo):
        raise GradwireError(f"TCP congestion control {algo!r} is not a valid name: expected "
                            "lower-case letters, digits and '_' (e.g. cubic, reno, bbr)")
    with _machine_lock("gradwire-tcp"):  # other runs add to and restore the same list
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
    _tc("qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(bps)}bit",
        "burst", str(tbf_burst(bps)), "limit", str(tbf_limit(bps)), netns=netns)


def reap_stale() -> list[str]:
    """Remove the clusters nothing can use any more (:attr:`Cluster.why_stale`); returns
    their names.

    Each is found stale and taken over under the lock that claims are made under: its state
    file then names this process as its owner, not ready, so that other runs find it in use
    (not stale, its name taken) until its teardown has removed that file, and stale again
    should this process die half way. The teardown, many `ip` calls, runs after the lock is
    let go, so that other runs' claims do not wait for it."""
    me = _this_process()
    with _state_lock("clusters"):
        gone = [c for c in list_clusters() if c.stale]
        for c in gone:
            c.owner, c.ready = me, False
            save_cluster(c)
    for c in gone:
        _teardown(c.name)
    return [c.name for c in gone]


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Hold the lock file ``path`` for the block: runs that change the same thing take
    turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _state_lock(what: str) -> Iterator[None]:
    """The lock ``what`` of the runs that share this state directory (their clusters)."""
    return _lock(config.state_dir() / f"{what}.lock")


def _machine_lock(what: str) -> Iterator[None]:
    """The lock ``what`` of every run on this machine, whatever state directory it keeps:
    for the machine's own settings."""
    run_lock = Path("/run/lock")
    return _lock((run_lock if run_lock.is_dir() else Path(tempfile.gettempdir()))
                 / f"{what}.lock")


def _claim(cluster: Cluster) -> Cluster:
    """``cluster`` with a subnet no live cluster has, its state file written: the name and
    the subnet are claimed under one lock, so that runs starting at the same moment get
    different ones. The file is written before anything is made, so that a crash half-way
    still leaves a record to clean up."""
    with _state_lock("clusters"):
        if (config.state_dir() / f"{cluster.name}.json").exists():
            raise GradwireError(f"cluster {cluster.name} already exists")
        listed = _run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if cluster.name in _orphans(listed):  # its namespaces or links, elsewhere
            raise GradwireError(f"cluster {cluster.name} already exists on this machine (its "
                                "namespaces or links are there, its state file elsewhere)")
        cluster.subnet = _free_subnet()
        save_cluster(cluster)
    return cluster


def _free_subnet() -> int:
    used = {c.subnet for c in list_clusters()}
    for s in range(1, 255):
        if s not in used:
            return s
    raise GradwireError("all 254 gradwire subnets are in use: run `gradwire cluster down --all`")


def cluster_up(hosts: int, bandwidth: str = "1gbit", name: str | None = None,
               owned: bool = False, mtu: int = MTU, progress: Progress | None = None) -> Cluster:
    """Create a cluster of ``hosts`` namespaces; on any failure everything made is removed.

    ``mtu``: the largest IP packet on every link (bytes); the bridge and both ends of every
    veth pair take it.

    ``owned``: the cluster belongs to this process (``ephemeral_cluster``); should the process
    die without removing it, the next cluster made on this machine removes it first. Every
    cluster belongs to this process while it is being built (a ``cluster up`` killed half way
    is removed the same way); one not ``owned`` belongs to no process once it is ready. Stale
    clusters of other runs are removed here in any case.

    ``progress``: a context manager factory entered around the hosts' build (exited before
    this returns), whose ``update(made, hosts)`` is called as each host is made."""
    check_hosts(hosts)
    bps = parse_bandwidth(bandwidth)
    check_mtu(mtu)
    ok, why = netns_available()
    if not ok:
        raise GradwireError(f"{why}; without it use the loopback fallback ({LOOPBACK_LABEL})")
    if name is None:  # an empty name is a name, and refused below
        name = f"gw{secrets.token_hex(3)}"
    check_name(name)
    reap_stale()
    me = _this_process()
    # the builder owns every cluster until it is ready: one whose build was killed is stale
    cluster = Cluster(name=name, bandwidth_bps=bps, owner=me, mtu=mtu, ready=False)
    with _cleanup_on_failure(cluster):  # claims the name first
        _ip("link", "add", cluster.bridge, "mtu", str(mtu), "type", "bridge")
        _no_address(cluster.bridge)
        _ip("link", "set", cluster.bridge, "up")
        took_all, capped_all = True, True
        ceiling = host_send_buffer(bps, mtu) if bps is not None else None
        with progress() if progress else contextlib.nullcontext(_no_progress) as update:
            update(0, hosts)
            for i in range(hosts):
                host = Host(i, f"{name}-h{i}", host_addr(cluster.subnet, i), "eth0")
                took, capped = _add_host(cluster, host, hosts, bps, ceiling)
                took_all, capped_all = took_all and took, capped_all and capped
                cluster.tcp = CONGESTION_CONTROL if took_all else None
                cluster.sndbuf = ceiling if capped_all else None
                cluster.hosts.append(host)
                save_cluster(cluster)
                update(i + 1, hosts)
        write_hosts_files(cluster)
        cluster.ready = True
        cluster.owner = me if owned else None  # `cluster up`'s stays until `cluster down`
        save_cluster(cluster)
    return cluster


def _no_progress(done: int, total: int) -> None:
    pass


def _add_host(cluster: Cluster, host: Host, hosts: int, bps: float | None,
              ceiling: int | None) -> tuple[bool, bool]:
    """Make ``host``, one of ``hosts``; whether it took CONGESTION_CONTROL, and (shaped links)
    the send buffer ``ceiling``.

    The host knows every other's MAC from the start (permanent neighbour entries): the
    kernel keeps one neighbour table for all namespaces, of at most gc_thresh3 entries that
    it may evict (1024 by default), and a gloo world connects every pair of ranks, N(N - 1)
    entries. Without them, past about 32 hosts connections fail (``No route to host``, and
    ``neighbor table overflow!`` in the kernel's log): gloo's ranks print pages of ``failed
    to connect`` and live on its retries (it gives up after three). Permanent entries are
    not counted."""
    ns, outer, inner = host.netns, f"{cluster.name}-v{host.rank}", f"{cluster.name}-i{host.rank}"
    assert ns is not None
    mtu, subnet, dev = cluster.mtu, cluster.subnet, host.ifname
    # apart from the batch: an older iproute2 may stay in the namespace it adds, and run
    # the batch's next lines there
    _sh(["ip", "netns", "add", ns])
    _ip_batch([f"link add {outer} mtu {mtu} type veth peer name {inner} "
               f"address {host_mac(subnet, host.rank)} mtu {mtu}",
               f"link set {inner} netns {ns}"])
    _no_address(outer)  # before it is up
    _ip_batch([f"link set {inner} name {dev}", f"addr add {host.addr}/24 dev {dev}",
               f"link set {dev} up", "link set lo up",
               *(f"neigh replace {host_addr(subnet, j)} lladdr {host_mac(subnet, j)} dev {dev} "
                 "nud permanent" for j in range(hosts) if j != host.rank)], netns=ns)
    took = set_congestion_control(ns)
    _ip_batch([f"link set {outer} master {cluster.bridge}", f"link set {outer} up"])
    capped = False
    if bps is not None:
        capped = ceiling is not None and cap_send_buffer(ns, ceiling)
        _tbf(host.ifname, bps, ns)  # upload: host -> switch
        _tbf(outer, bps, None)  # download: switch -> host
    return took, capped


@contextlib.contextmanager
def _cleanup_on_failure(cluster: Cluster) -> Iterator[None]:
    """Claim ``cluster``'s name (:func:`_claim`), then remove the half-built cluster on an
    error, Ctrl-C or SIGTERM while it is being built, one that comes during the claim
    included (a name found taken is another's: left alone)."""
    with _signals_raise():
        try:
            _claim(cluster)
        except BaseException:
            if cluster.subnet:  # the name was free and ours: its state file may be written
                _teardown(cluster.name)
            raise
        try:
            yield
        except BaseException:
            _teardown(cluster.name)
            raise


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM, SIGHUP and SIGQUIT into :class:`~gradwire.interrupts.Interrupted` (SIGINT is
    KeyboardInterrupt already) so that `finally` blocks run and the CLI can say which. A signal
    set to be ignored stays ignored (``nohup``'s SIGHUP), as :func:`on_signals` keeps it."""

    def handler(signum: int) -> None:
        raise Interrupted(signum)

    with on_signals(handler, tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)):
        yield


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold the stop signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT) until the block ends (a
    teardown that a second Ctrl-C would leave half done), then deliver the first that came,
    unless the block runs on the way out of a stop signal already (a teardown in a ``finally``
    that an :class:`Interrupted` or KeyboardInterrupt passes through): a second signal then
    waits and is done with. Delivered, it had replaced the first's Interrupted with its own:
    "stopped 2 ranks" lost from the line, and a Ctrl-C then SIGTERM exited 143, not 130."""
    came: list[int] = []
    with on_signals(came.append):
        yield
    if came and not isinstance(sys.exc_info()[1], (Interrupted, KeyboardInterrupt)):
        signal.raise_signal(came[0])


def _kill_netns_pids(ns: str) -> None:
    p = _run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    for pid in p.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _teardown(name: str) -> None:
    """Remove every namespace, veth and bridge of ``name``, whatever state it is in; a signal
    that comes meanwhile is delivered once it is done."""
    with _signals_deferred():
        _remove(name)


def _remove(name: str) -> None:
    netns = _run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in netns.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(f"{name}-h"):
            _kill_netns_pids(ns)
            # Deleting the namespace destroys its veth end, and with it the bridge-side peer.
            _run(["ip", "netns", "del", ns], capture_output=True)
    links = _run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for m in re.finditer(rf"^\d+: ({re.escape(name)}-[a-z0-9]+)[@:]", links, re.M):
        _run(["ip", "link", "del", m.group(1)], capture_output=True)
    remove_hosts_files(name)
    folder = config.state_dir()
    # the temporary of a write killed before its rename (jsonfile.written_beside's name)
    for tmp in folder.glob(f".{name}.json.*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()
    # Last: once the state file is gone the name may be claimed again, and nothing of a new
    # cluster of that name may be removed here.
    with contextlib.suppress(FileNotFoundError):
        (folder / f"{name}.json").unlink()


def _made_here(name: str) -> bool:
    """Whether cluster ``name``'s state file says that this process made it (a name found
    taken by another cluster is not this process's to remove)."""
    try:
        owner = load_cluster(name).owner
    except GradwireError:
        return False
    return owner == _this_process()


def _this_process() -> list[int]:
    """This process as a state file names its owner: [pid, start time in clock ticks]."""
    return [os.getpid(), process_start_ticks(os.getpid()) or 0]


def _orphans(out: str) -> set[str]:
    """Names of clusters whose namespaces (in ``out``, what `ip netns list` printed), links or
    hosts files exist, state file or not."""
    names = {m.group(1) for m in re.finditer(r"^(gw[0-9a-f]{6})-h\d+", out, re.M)}
    links = _run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names |= {m.group(1) for m in re.finditer(r"^\d+: (gw[0-9a-f]{6})-", links, re.M)}
    return names | clusters_with_hosts_files()


def orphan_clusters() -> list[str]:
    """The clusters whose namespaces, links or hosts files are on this machine but whose
    state file is not in this state folder: left by a process killed before it could remove
    them (SIGKILL, a power cut of a container), or another GRADWIRE_STATE_DIR's. `cluster
    down NAME` or `--all` removes them. None where `ip` cannot be run."""
    # the state files read before the listing too: a cluster another process removes (its
    # state file last) or builds (its state file first) meanwhile is in one of the two
    known = {f.stem for f in state_files()}
    try:
        listed = _run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        found = _orphans(listed)
    except OSError:
        return []
    return sorted(found - known - {f.stem for f in state_files()})


def cluster_down(name: str | None = None, all_: bool = False) -> list[str]:
    """Tear down one cluster (or all of them, including orphans); returns the names removed.
    A stop signal that comes meanwhile is delivered once every one of them is removed."""
    if all_ and name is not None:
        raise GradwireError(f"give a cluster's name or --all, not both (got {name} and --all)")
    # state files that do not parse name clusters too: those can still be removed
    listed = _run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found = _orphans(listed) | {f.stem for f in state_files() if NAME_RE.match(f.stem)}
    if all_:
        names = found
        # a probe namespace that an older gradwire left when a signal came between its add and
        # its del
        for probe in re.findall(rf"^({PROBE_PREFIX}[0-9a-f]{{6}})\b", listed, re.M):
            _run(["ip", "netns", "del", probe], capture_output=True)
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
    # A signal waits until every cluster is removed, not only the one under way: delivered
    # after the first, it stopped `down --all` there and the rest stayed up. So does an
    # OSError of one (a state folder made read-only): the others are removed first.
    failed: list[tuple[str, OSError]] = []
    with _signals_deferred():
        for n in sorted(names):
            try:
                _teardown(n)
            except OSError as e:
                failed.append((n, e))
    if failed:
        n, e = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise GradwireError(f"could not remove cluster {n}{more}: {e.strerror or e}; the "
                            f"{len(names) - len(failed)} other(s) were removed")
    return sorted(names)


@contextlib.contextmanager
def ephemeral_cluster(hosts: int, bandwidth: str, loopback: bool = False,
                      mtu: int = MTU, progress: Progress | None = None) -> Iterator[Cluster]:
    """A cluster that lives for one ``with`` block and is removed on any exit, signals included.

    ``loopback=True`` gives the unshaped loopback fallback instead (``mtu`` checked, then not
    used: loopback's own MTU is 64 KiB); without namespace support ``cluster_up`` refuses, and
    callers choose loopback themselves (the CLI's ``use_loopback``). ``progress``: as
    :func:`cluster_up`'s.
    """
    if loopback:
        parse_bandwidth(bandwidth)
        check_mtu(mtu)
        yield loopback_cluster(hosts)
        return
    # Named here, so that a signal that comes as cluster_up returns (its own clean-up over,
    # the cluster not yet in hand here) cannot leave the cluster up until the next one reaps
    # it: what this process made is known by its state file's owner.
    name = f"gw{secrets.token_hex(3)}"
    cluster = None
    with _signals_raise():
        try:
            cluster = cluster_up(hosts, bandwidth, name=name, owned=True, mtu=mtu,
                                 progress=progress)
            yield cluster
        finally:
            if cluster is not None or _made_here(name):
                _teardown(name)
