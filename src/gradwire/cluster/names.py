"""Host names in an emulated cluster: every host resolves its own name and every other's.

c10d looks up the name of each peer that connects to its store (``getnameinfo`` on the
peer's address). Inside a namespace that lookup went past ``/etc/hosts`` to the machine's DNS,
which no namespace can reach, and every rank printed ``[c10d] The hostname of the client
socket cannot be retrieved. err=-3`` (EAI_AGAIN). ``ip netns exec``, which starts every rank,
bind-mounts each file of ``/etc/netns/<namespace>/`` over its namesake in ``/etc`` (see
``man ip-netns``), so each host gets its own ``hosts`` file there: every host of the cluster
by its namespace's name, unique to the cluster (``10.213.S.(i+1)  gwXXXXXX-h{i}``), then this
machine's ``/etc/hosts`` as it is, so that a name the machine resolves (its own hostname,
``localhost``) resolves on the hosts too. The files go with the cluster.

Each host is listed twice, as IPv4 and as IPv4-mapped IPv6 (``::ffff:10.213.S.(i+1)``): the
store listens on an IPv6 socket that takes IPv4 too, so it sees its peers in the mapped form,
and glibc's ``files`` source finds no IPv4 line for a mapped address. The IPv4 line comes
first, so that a lookup of a name for any family gets the IPv4 address first.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from gradwire.cluster.state import Cluster

NETNS_ETC = Path("/etc/netns")  # iproute2's NETNS_ETC_DIR, read by `ip netns exec`
MACHINE_HOSTS = Path("/etc/hosts")


def hosts_text(cluster: Cluster) -> bytes:
    """The ``hosts`` file of every host of ``cluster``: its hosts first (a reverse lookup takes
    the first line with the address), IPv4 then IPv4-mapped, then the machine's own file,
    byte for byte (one that is not UTF-8, a comment in Latin-1, had failed every cluster up
    with a UnicodeDecodeError traceback)."""
    ours = "".join(f"{h.addr}\t{h.netns}\n" for h in cluster.hosts)
    ours += "".join(f"::ffff:{h.addr}\t{h.netns}\n" for h in cluster.hosts)
    machine = MACHINE_HOSTS.read_bytes() if MACHINE_HOSTS.is_file() else b""
    return (f"# gradwire cluster {cluster.name}: its hosts, then this machine's /etc/hosts\n"
            f"{ours}").encode() + machine


def write_hosts_files(cluster: Cluster) -> None:
    """Give every host of ``cluster`` its ``/etc/netns/<namespace>/hosts``."""
    text = hosts_text(cluster)
    for host in cluster.hosts:
        folder = NETNS_ETC / str(host.netns)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_bytes(text)


def remove_hosts_files(name: str) -> None:
    """Remove the ``/etc/netns`` folders of every host of cluster ``name``, if any."""
    for folder in NETNS_ETC.glob(f"{name}-h*"):
        shutil.rmtree(folder, ignore_errors=True)


def clusters_with_hosts_files() -> set[str]:
    """Names of the clusters that still have a folder in ``/etc/netns``."""
    if not NETNS_ETC.is_dir():
        return set()
    found = (re.fullmatch(r"(gw[0-9a-f]{6})-h\d+", p.name) for p in NETNS_ETC.iterdir())
    return {m.group(1) for m in found if m}
