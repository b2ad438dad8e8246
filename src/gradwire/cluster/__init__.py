"""The emulated cluster: hosts as network namespaces on one bridge, links shaped with tc tbf."""

from gradwire.cluster.netns import (
    Cluster,
    Host,
    cluster_down,
    cluster_up,
    ephemeral_cluster,
    list_clusters,
    load_cluster,
    loopback_cluster,
    netns_available,
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
