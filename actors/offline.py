"""Data parallelism for the offline API: several ReplicaActors (each one TP group in its
own placement group); each batch goes to replicas by least assigned load."""
from __future__ import annotations

import os

import ray

from ..cluster.placement import check_feasible, create_replica_group, in_bundle
from ..engine.batch import BatchItem, error_output
from ..engine.config import EngineConfig
from ..engine.outputs import RequestOutput
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
        self.config, self.tp_size, self.use_gpu = config, tp_size, use_gpu
        self.groups = [create_replica_group(tp_size, use_gpu) for _ in range(num_replicas)]
        self.replicas = [self._start(i) for i in range(num_replicas)]
        self.restarts = [0] * num_replicas  # rank-0 actors replaced here (after a failed step, or lost)
        self.limits = ray.get(self.replicas[0].limits.remote())

    def _start(self, index: int):
        pg = self.groups[index]
        return ReplicaActorRemote.options(num_cpus=1, num_gpus=1 if self.use_gpu else 0,
                                          scheduling_strategy=in_bundle(pg, 0)).remote(
            self.config, self.tp_size, index, pg)

    def num_restarts(self, index: int) -> int:
        """Times replica `index` was replaced (after a failed step, or when its rank-0 actor died)."""
        return self.restarts[index]

    def generate(self, items: list[BatchItem]) -> dict[str, RequestOutput]:
        """Spread requests over replicas (least assigned tokens first) and gather results.
        Replicas whose last batch failed are replaced first, before any replica runs: a new
        rank-0 process with new ShardWorkers, since a process whose collective failed may
        keep broken communicator state (gloo has aborted such a process while it rebuilt)."""
        for i, broken in enumerate(ray.get([r.is_broken.remote() for r in self.replicas])):
            if broken:
                self._replace(i)
        load = [0] * len(self.replicas)
        batches: list[list] = [[] for _ in self.replicas]
        for item in items:
            target = min(range(len(load)), key=load.__getitem__)
            batches[target].append(item)
            load[target] += len(item.prompt_token_ids) + item.params.max_tokens * item.params.n
        refs = {i: self.replicas[i].generate.remote(b) for i, b in enumerate(batches) if b}
        results: dict[str, RequestOutput] = {}
        for i, ref in refs.items():
            try:
                results.update(ray.get(ref))
            except ray.exceptions.RayActorError as exc:  # a lost shard can abort rank 0's collective too
                cause = (f"replica {i} failed: its rank-0 actor died mid-step ({type(exc).__name__}; a ShardWorker "
                         f"lost inside a collective takes rank 0 down with it)")
                results.update({item.request_id: error_output(item, cause) for item in batches[i]})
                self._replace(i)
        return results

    def _replace(self, index: int) -> None:
        """Start a new rank-0 actor in the replica's placement group (the old one's
        ShardWorkers die with it: actors share their owner's fate)."""
        ray.kill(self.replicas[index])
        self.replicas[index] = self._start(index)
        ray.get(self.replicas[index].limits.remote())  # up and serving
        self.restarts[index] += 1

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
