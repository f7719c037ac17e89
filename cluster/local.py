"""A multi-node Ray cluster on this machine's loopback, for tests and demos."""
from __future__ import annotations

from ray.cluster_utils import Cluster


def start_local_cluster(num_nodes: int = 2, cpus_per_node: int = 4, gpus_per_node: int = 0) -> Cluster:
    """Start `num_nodes` Ray nodes (a head and workers) on 127.0.0.1; connect with
    `ray.init(address=cluster.address)`; stop with `cluster.shutdown()`."""
    node_args = {"num_cpus": cpus_per_node, "num_gpus": gpus_per_node, "dashboard_host": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    for _ in range(num_nodes - 1):
        cluster.add_node(**{k: v for k, v in node_args.items() if k != "dashboard_host"})
    cluster.wait_for_nodes()
    return cluster
