"""A placement group per replica: its tensor-parallel ranks packed on one node (STRICT_PACK).
Infeasible requests fail within seconds with the numbers, never a group pending forever."""
from __future__ import annotations

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


def replica_bundles(tp_size: int, use_gpu: bool) -> list[dict]:
    return [{"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1} for _ in range(tp_size)]


def check_feasible(tp_size: int, num_replicas: int, use_gpu: bool) -> None:
    """Raise ValueError if the live cluster cannot hold `num_replicas` groups of `tp_size`."""
    kind = "GPU" if use_gpu else "CPU"
    per_node = [int(n["Resources"].get(kind, 0)) for n in ray.nodes() if n.get("Alive")]
    total, largest = sum(per_node), max(per_node, default=0)
    if largest < tp_size:
        raise ValueError(f"tp_size={tp_size} needs {tp_size} {kind}s on one node, but the largest node has "
                         f"{largest} (cluster: {len(per_node)} nodes, {total} {kind}s)")
    if total < tp_size * num_replicas:
        raise ValueError(f"{num_replicas} replicas x tp_size={tp_size} need {tp_size * num_replicas} {kind}s, "
                         f"the cluster has {total}")


def create_replica_group(tp_size: int, use_gpu: bool, timeout_s: float = 30.0):
    pg = placement_group(replica_bundles(tp_size, use_gpu), strategy="STRICT_PACK")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        kind = "GPU" if use_gpu else "CPU"
        raise ValueError(f"could not place a replica of tp_size={tp_size} ({tp_size} {kind}s on one node) within "
                         f"{timeout_s:.0f} s; free resources: {ray.available_resources()}") from None
    return pg


def in_bundle(pg, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index,
                                            placement_group_capture_child_tasks=True)
