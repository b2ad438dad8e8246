"""What an emulated cluster is, and its record: the :class:`Host` and :class:`Cluster` types,
the state file ``/run/gradwire/<name>.json`` each live cluster keeps (so that ``cluster down``
works from another process), and the loopback fallback that needs no namespaces.
"""

from __future__ import annotations

import contextlib
import json
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gradwire import config
from gradwire.bandwidth import format_bandwidth
from gradwire.check import is_int, is_real
from gradwire.cluster.shaping import CC_NAME_RE, tbf_burst
from gradwire.errors import GradwireError
from gradwire.jsonfile import written_beside

NAME_RE = re.compile(r"^gw[0-9a-f]{6}\Z")  # \Z: "$" would take a name ending in a line break
MAX_HOSTS = 250
MAX_SUBNET = 254  # 10.213.S.0/24, S from 1 (0: not claimed yet)
MTU = 1500  # Ethernet's default
MTU_RANGE = (576, 65535)  # IPv4's smallest datagram every host must take; veth's largest
LOOPBACK = "loopback"
LOOPBACK_LABEL = "loopback, links not shaped"
NETNS_DIR = Path("/run/netns")  # where `ip netns add` keeps a namespace, by its name


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
    # [pid, start time in clock ticks] of the run that made it for itself (ephemeral_cluster),
    # and of any cluster's builder while it is not ready, or of the run removing it once stale
    # (netns.reap_stale); None for `gradwire cluster up`'s once ready, which stays until
    # `cluster down`.
    owner: list[int] | None = None
    # The hosts' TCP congestion control (CONGESTION_CONTROL when every host took it); None:
    # the machine's default.
    tcp: str | None = None
    mtu: int = MTU
    # The ceiling on every host's TCP send buffer (bytes) when every host took it; None: the
    # machine's own (unshaped, or a kernel that keeps tcp_wmem for the whole machine).
    sndbuf: int | None = None
    # False while cluster up is still making its hosts (a state file written before then, with
    # the hosts made so far, is what cleans up after a crash); runs refuse such a cluster
    ready: bool = True

    @property
    def stale(self) -> bool:
        """Whether nothing can use this cluster any more (:attr:`why_stale`)."""
        return self.why_stale is not None

    @property
    def why_stale(self) -> str | None:
        """Why nothing can use this cluster any more, None while it can: a run's cluster whose
        run exited without removing it (SIGKILL, a crash of the machine's session), a cluster
        whose build or removal was killed half way (its builder owns it until it is ready, the
        run removing a stale one until it is gone), or a built cluster whose namespaces are
        gone (a reboot, under a state folder that outlived it)."""
        if self.owner is not None and process_start_ticks(self.owner[0]) != self.owner[1]:
            how = ("without removing it" if self.ready
                   else "half way through building or removing it")
            return f"run {self.owner[0]} exited {how}"
        first = self.hosts[0].netns if self.hosts else None
        if self.ready and first is not None and not (NETNS_DIR / first).exists():
            return f"its namespace {first} is gone"
        return None

    @property
    def shaped(self) -> bool:
        return self.name != LOOPBACK and self.bandwidth_bps is not None

    @property
    def burst_bytes(self) -> int:
        """The token bucket of each shaped link (:func:`tbf_burst`), 0 when not shaped."""
        return tbf_burst(self.bandwidth_bps) if self.shaped else 0  # type: ignore[arg-type]

    @property
    def send_buffer_bytes(self) -> int | None:
        """The hosts' ceiling on a TCP send buffer as cluster up set it
        (:func:`~gradwire.cluster.netns.host_send_buffer`);
        None where they keep the machine's own (not shaped, or the setting failed)."""
        return self.sndbuf if self.shaped else None

    @property
    def label(self) -> str:
        """How every report names the network this ran on."""
        if self.name == LOOPBACK:
            return LOOPBACK_LABEL
        tcp = f", TCP {self.tcp}" if self.tcp else ""
        mtu = f", MTU {self.mtu}" if self.mtu != MTU else ""
        n = len(self.hosts)
        links = format_bandwidth(self.bandwidth_bps) if self.shaped else "unshaped"
        return f"emulated {n} host{'s' * (n != 1)}, {links} links{tcp}{mtu}"

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
        try:
            d = json.loads(text)
        except RecursionError:  # a file of nested brackets: a traceback at every cluster up
            raise ValueError("it is nested too deeply to be a cluster's state") from None
        d["hosts"] = [Host(**h) for h in d["hosts"]]
        c = Cluster(**d)
        ns = re.compile(rf"{re.escape(c.name)}-h\d+")
        if c.owner is not None and not (isinstance(c.owner, list) and len(c.owner) == 2 and all(
                isinstance(x, int) for x in c.owner)):
            raise ValueError(f"cluster state {c.name!r} has an owner that is not [pid, start]")
        if c.tcp is not None and not (isinstance(c.tcp, str) and CC_NAME_RE.fullmatch(c.tcp)):
            raise ValueError(f"cluster state {c.name!r} names no TCP congestion control")
        if c.bandwidth_bps is not None and not is_real(c.bandwidth_bps, 0, above=True):
            raise ValueError(f"cluster state {c.name!r} has a bandwidth that is not bit/s > 0, "
                             f"got {c.bandwidth_bps!r:.40}")
        if c.sndbuf is not None and not (type(c.sndbuf) is int and c.sndbuf > 0):
            raise ValueError(f"cluster state {c.name!r} has a send buffer that is not bytes > 0")
        if not isinstance(c.ready, bool):
            raise ValueError(f"cluster state {c.name!r} has a ready flag that is not a bool")
        if not _mtu_ok(c.mtu):
            raise ValueError(f"cluster state {c.name!r} has an MTU outside {MTU_RANGE}")
        # a subnet that is no number (a list) failed every later cluster up with a traceback;
        # ranks out of place started two rank 0s, or none
        if not is_int(c.subnet, 0, MAX_SUBNET):
            raise ValueError(f"cluster state {c.name!r} has a subnet that is not an integer "
                             f"from 0 to {MAX_SUBNET}")
        # ranks that only compare equal (false, true; 0.0) went to the ranks as RANK=True
        if [h.rank for h in c.hosts] != list(range(len(c.hosts))) or any(
                type(h.rank) is not int for h in c.hosts):
            raise ValueError(f"cluster state {c.name!r} has hosts whose ranks are not 0, 1, .. "
                             "in order")
        if len(c.hosts) > MAX_HOSTS:
            raise ValueError(f"cluster state {c.name!r} has {len(c.hosts)} hosts: expected at "
                             f"most {MAX_HOSTS}")
        if not NAME_RE.match(c.name) or any(
                h.netns is None or not ns.fullmatch(h.netns)
                or not re.fullmatch(r"[\w.]+", h.addr) or not re.fullmatch(r"\w+", h.ifname)
                for h in c.hosts):
            raise ValueError(f"cluster state {c.name!r} holds names gradwire does not make")
        return c


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None if there is no such
    process: a pid with the same start time is the same process, not a reuse of its number."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


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


def save_cluster(cluster: Cluster) -> None:
    with written_beside(config.state_dir() / f"{cluster.name}.json") as tmp:
        tmp.write_text(cluster.to_json())


def check_name(name: str) -> None:
    """A one-line error where ``name`` is not a name gradwire gives a cluster (a name that is
    no string among them: not a TypeError traceback)."""
    if not (isinstance(name, str) and NAME_RE.match(name)):
        raise GradwireError(f"cluster name {name!r} is not valid: expected 'gw' + 6 lowercase "
                            "hex digits")


def load_cluster(name: str) -> Cluster:
    """The live cluster called ``name``."""
    check_name(name)
    path = config.state_dir() / f"{name}.json"
    try:
        return _read(path)
    # none (or no state folder); or another process's `cluster down` removed it after it was
    # listed or looked for, which had stopped `cluster status` with a FileNotFoundError
    except (FileNotFoundError, NotADirectoryError):
        known = ", ".join(c.name for c in list_clusters()) or "none"
        raise GradwireError(f"no cluster named {name} (live clusters: {known})") from None
    except (ValueError, TypeError, KeyError) as e:
        raise GradwireError(f"cluster state file {path} is unreadable ({e}): remove the "
                            f"cluster with `gradwire cluster down {name}`") from None


def _read(path: Path) -> Cluster:
    """The cluster of state file ``path``; ValueError where it names another cluster than its
    file does (a copied file: its stale run's cleanup removed the live cluster it named, and
    left the file to do so again at every cluster up), or where it is no regular file (a
    folder raised IsADirectoryError at every `cluster status`; a FIFO hung it)."""
    if not stat.S_ISREG(path.stat().st_mode):
        raise ValueError("it is not a regular file")
    c = Cluster.from_json(path.read_text())
    if c.name != path.stem:
        raise ValueError(f"it holds cluster {c.name!r}")
    return c


def state_files() -> list[Path]:
    """Every cluster state file, readable or not."""
    folder = config.state_dir()
    return sorted(folder.glob("gw*.json")) if folder.is_dir() else []


def list_clusters() -> list[Cluster]:
    """Every cluster with a state file that reads, oldest first."""
    dated = []
    for p in state_files():
        with contextlib.suppress(FileNotFoundError):  # another run removed it just now
            dated.append((p.stat().st_mtime, p))
    out = []
    for _, p in sorted(dated):
        with contextlib.suppress(ValueError, TypeError, KeyError, FileNotFoundError):
            out.append(_read(p))
    return out


def check_hosts(hosts: int) -> int:
    """``hosts`` if a cluster may have that many, else the one-line error: a count that is no
    whole number (2.5, "4", True) had passed the range check, then failed with a traceback
    once the name and the bridge were made (or made one host)."""
    if not is_int(hosts, 1, MAX_HOSTS):
        raise GradwireError(f"--hosts must be between 1 and {MAX_HOSTS}, got {hosts!r}")
    return hosts


def loopback_cluster(hosts: int) -> Cluster:
    """The fallback without namespaces: every rank on 127.0.0.1, links not shaped."""
    check_hosts(hosts)
    return Cluster(LOOPBACK, None, [Host(i, None, "127.0.0.1", "lo") for i in range(hosts)])
