"""Data parallelism for the offline API: several ReplicaActors (each one TP group in its
own placement group); each batch goes to replicas by least assigned load."""
from __future__ import annotations

import os

import ray

from ..cluster.placement import check_feasible, create_replica_group, in_bundle
from ..engine.config import EngineConfig
from ..models import check_tp_size
from .replica import ReplicaActorRemote


def ensure_ray(num_cpus: int | None = None) -> None:
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)


class ReplicaSet:
    def __init__(self, config: EngineConfig, tp_size: int, num_replicas: int) -> None:
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be an integer >= 1, got {num_replicas!r}")
        check_tp_size(config.model, tp_size)  # fails in seconds, before any actor starts
        use_gpu = config.device.startswith("cuda")
        ensure_ray(num_cpus=max(os.cpu_count() or 1, tp_size * num_replicas))
        check_feasible(tp_size, num_replicas, use_gpu)
        self.groups = [create_replica_group(tp_size, use_gpu) for _ in range(num_replicas)]
        self.replicas = [
            ReplicaActorRemote.options(num_cpus=1, num_gpus=1 if use_gpu else 0,
                                       scheduling_strategy=in_bundle(pg, 0)).remote(config, tp_size, i, pg)
            for i, pg in enumerate(self.groups)
        ]
        self.limits = ray.get(self.replicas[0].limits.remote())

    def generate(self, items: list[tuple[str, list[int], object]]) -> dict[str, dict]:
        """Spread requests over replicas (least assigned tokens first) and gather results."""
        load = [0] * len(self.replicas)
        batches: list[list] = [[] for _ in self.replicas]
        for item in items:
            target = min(range(len(load)), key=load.__getitem__)
            batches[target].append(item)
            load[target] += len(item[1]) + item[2].max_tokens * item[2].n
        refs = [r.generate.remote(b) for r, b in zip(self.replicas, batches) if b]
        results: dict[str, dict] = {}
        for part in ray.get(refs):
            results.update(part)
        return results

    def shutdown(self) -> None:
        for r in self.replicas:
            try:
                ray.get(r.shutdown.remote(), timeout=30)
            except Exception:
                pass
            ray.kill(r)
        from ray.util.placement_group import remove_placement_group

        for pg in self.groups:
            remove_placement_group(pg)
