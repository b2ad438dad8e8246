"""The emulated cluster: hosts as network namespaces on one bridge, links shaped with tc tbf.

- :mod:`~gradwire.cluster.netns`: build and tear down a cluster with iproute2;
- :mod:`~gradwire.cluster.names`: the ``/etc/netns`` hosts files by which hosts know each other;
- :mod:`~gradwire.cluster.shaping`: what each link and host is set to, and the measurements why;
- :mod:`~gradwire.cluster.state`: the Host and Cluster record, its state file, the loopback
  fallback.
"""

from gradwire.cluster.netns import (
    cluster_down,
    cluster_up,
    ephemeral_cluster,
    netns_available,
)
from gradwire.cluster.state import (
    Cluster,
    Host,
    list_clusters,
    load_cluster,
    loopback_cluster,
)

__all__ = [
    "Cluster",
    "Host",
    "cluster_down",
    "cluster_up",
    "ephemeral_cluster",
    "list_clusters",
    "load_cluster",
    "loopback_cluster",
    "netns_available",
]
