"""A replica: one tensor-parallel group. Rank 0 runs in the calling process (the engine:
scheduler, cache bookkeeping, sampling, shard 0); ranks 1.. are ShardWorker actors placed in
the replica's placement group (the current one under Ray Serve, or one made here).

    engine = ReplicaEngine(config, tokenizer, tp_size=2).engine    # an LLMEngine, TP behind it
    ReplicaActor.remote(config, tp_size) -> .generate(items) for the offline API
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

import ray
import torch
from ray.util import get_current_placement_group

from ..cluster.placement import in_bundle
from ..cluster.process_group import create_tp_store, init_tp_group, leave_tp_group
from ..cluster.shm_channel import ShmChannel
from ..engine.batch import BatchItem, error_output, finished_outputs, run_batch
from ..engine.benchmarking import start_decode_batch
from ..engine.config import EngineConfig
from ..engine.engine import LLMEngine
from ..engine.outputs import RequestOutput
from ..engine.tokenizer import load_tokenizer
from .shard_worker import STOP, ShardWorkerActor


class ReplicaEngine:
    """Owns the ShardWorkers of one replica and the rank-0 LLMEngine that drives them.

    `rank0_here=False`: rank 0 runs in an engine process (engine/core_process.py) instead of
    this one; this object starts the other ranks, holds the group's rendezvous store and
    plan channel, and hands the engine process a `Rank0Setup` (`rank0_setup`); the process
    calls back `start_workers` once its shard is loaded."""

    def __init__(self, config: EngineConfig, tokenizer=None, tp_size: int = 1, placement_group=None,
                 rank0_here: bool = True) -> None:
        self.config = config
        self.tp_size = tp_size
        self.channel: ShmChannel | None = None
        self.engine: LLMEngine | None = None
        self.rank0_setup: Rank0Setup | None = None
        self.workers = []
        self._serve_refs = []
        self._joined = []
        self._store = None
        if tp_size > 1:
            pg = placement_group or get_current_placement_group()
            use_gpu = config.device.startswith("cuda")
            options = {"num_cpus": 1 if pg else 0, "num_gpus": 1 if use_gpu else 0}
            self.workers = [
                ShardWorkerActor.options(**options, **({"scheduling_strategy": in_bundle(pg, r)} if pg else {}))
                .remote(config, r, tp_size)
                for r in range(1, tp_size)
            ]
            try:
                _wait_started(self.workers, WORKER_START_TIMEOUT_S)
            except Exception:
                self.shutdown()
                raise
            addr = ray.util.get_node_ip_address()
            self._store = create_tp_store(addr, tp_size)
            self.channel = ShmChannel(None, tp_size - 1)  # the ranks share a node (STRICT_PACK)
            self._joined = [w.setup.remote(addr, self._store.port, self.channel.name) for w in self.workers]
            self.rank0_setup = Rank0Setup(tp_size, addr, self._store.port, self.channel.name, config.device)
        if not rank0_here:
            return
        try:
            channel = None
            if tp_size > 1:
                init_tp_group(0, tp_size, self.rank0_setup.master_addr, self._store.port, config.device,
                              store=self._store)
                channel = self.channel
            self.engine = LLMEngine(config, tokenizer, channel, self.start_workers if tp_size > 1 else None)
        except Exception:
            self.shutdown()
            raise

    def start_workers(self) -> None:
        """Every rank loads its shard at the same time: rank 0 waits for the others only once
        its own is loaded (a worker's load error is raised here), then starts their serve loops."""
        ray.get(self._joined)
        self._serve_refs = [w.serve.remote() for w in self.workers]

    def shutdown(self) -> None:
        """Stop the workers (politely if the group still works) and leave the group. With rank 0
        in an engine process, that process has sent the stop already (`Rank0Setup.leave`)."""
        if self.workers:
            try:
                if self.engine is not None and self.engine.channel is not None:
                    self.engine.channel.timeout_s = 10.0  # a dead rank must not hold the shutdown
                    self.engine.channel.send(STOP)
                ray.get(self._serve_refs, timeout=30)
            except Exception:
                pass
            for w in self.workers:
                ray.kill(w)
            self.workers = []
        if self.channel is not None:
            self.channel.close(unlink=True)
            self.channel = None
        leave_tp_group()


@dataclass(frozen=True)
class Rank0Setup:
    """What an engine process needs to be rank 0 of a replica whose other ranks, rendezvous
    store and plan channel the replica process made (`ReplicaEngine(rank0_here=False)`);
    pickled to the engine process, whose `core_process` calls `join` and `leave`."""

    tp_size: int
    master_addr: str
    master_port: int
    channel_name: str
    device: str

    def join(self) -> ShmChannel:
        """Open the plan channel (as its writer) and join the group as rank 0."""
        channel = ShmChannel(self.channel_name, self.tp_size - 1)
        init_tp_group(0, self.tp_size, self.master_addr, self.master_port, self.device)
        return channel

    def leave(self, engine) -> None:
        """The other ranks leave their serve loops; the replica process then reaps their actors."""
        channel = getattr(engine, "channel", None)
        if channel is not None:
            try:
                channel.timeout_s = 10.0  # a dead rank must not hold the exit
                channel.send(STOP)
            except Exception:  # noqa: BLE001 - best effort: the replica kills the actors anyway
                pass
            channel.close()
        leave_tp_group()


class ReplicaActor:
    """One replica as an actor (rank 0 in bundle 0 of its placement group), for the offline
    API's data parallelism. A failed step ends the in-flight requests with an error that
    names the cause and marks the replica broken; the driver (actors/offline.py) then
    replaces the whole actor, its ShardWorkers with it, before the next batch: a process
    whose collective failed may keep broken communicator state."""

    def __init__(self, config: EngineConfig, tp_size: int, replica_index: int, placement_group=None) -> None:
        if config.device == "cpu":
            torch.set_num_threads(1)
        self.config, self.tp_size, self.index, self.pg = config, tp_size, replica_index, placement_group
        self.tokenizer = load_tokenizer(config.tokenizer or config.model)
        self.replica = ReplicaEngine(config, self.tokenizer, tp_size, placement_group)
        self.broken = False  # a step failed: this actor is to be replaced

    def limits(self):
        """The engine's ModelLimits: what the driver validates prompts against before queueing them."""
        return self.replica.engine.limits

    def num_steps(self) -> int:
        """Steps the current engine has run (callable while `generate` runs)."""
        return self.replica.engine.num_steps

    def stats(self) -> dict:
        """The engine's gauges and counters (LLMEngine.stats)."""
        return self.replica.engine.stats()

    def worker_handles(self) -> list:
        return list(self.replica.workers)

    def generate(self, items: list[BatchItem]) -> dict[str, RequestOutput]:
        """Run validated items to completion. Returns request_id -> RequestOutput (with
        `error` set for requests a failed step left unfinished)."""
        if self.broken:
            cause = f"replica {self.index} failed earlier and awaits replacement"
            return {item.request_id: error_output(item, cause) for item in items}
        finished: dict = {}
        try:
            return run_batch(self.replica.engine, items, finished, validated=True)
        except Exception as exc:  # a shard died or a collective failed
            cause = f"replica {self.index} failed: {type(exc).__name__}: {exc}".strip()
            dead = [r for r, w in zip(range(1, self.tp_size), self.replica.workers) if not _alive(w)]
            if dead:
                cause += f" (ShardWorker rank(s) {dead} died)"
            traceback.print_exc()
            self.broken = True
            return {item.request_id: finished_outputs(item, finished, self.tokenizer) or error_output(item, cause)
                    for item in items}

    def is_broken(self) -> bool:
        """A step failed: the driver replaces this actor before the next batch."""
        return self.broken

    def benchmark_decode(self, batch: int, prompt_len: int, steps: int) -> list[dict]:
        """Per decode step, steps run back to back: wall time between step returns, rank 0's GPU
        time of the step's execute (CUDA events), plan broadcast time (benchmarks/tp_overhead.py)."""
        engine = self.replica.engine
        ids = start_decode_batch(engine, batch, prompt_len, steps + 8, token_high=1000, seed=0)
        engine.step_timings, walls = [], []
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):  # back to back, as served (overlapped scheduling hides host work)
            engine.step()
            now = time.perf_counter()
            walls.append((now - t) * 1e3)
            t = now
        torch.cuda.synchronize()
        rows = []
        for entry, wall in zip(engine.step_timings[-steps:], walls):
            start, end = entry.pop("events")
            rows.append({**entry, "gpu_ms": start.elapsed_time(end), "step_ms": wall})
        engine.step_timings = None
        for seq_id in ids:
            engine.abort(seq_id)
        return rows

    def shutdown(self) -> None:
        self.replica.shutdown()


WORKER_START_TIMEOUT_S = 300.0


def _wait_started(workers, timeout_s: float) -> None:
    """Until every shard worker's process is up (its constructor has run): a new Ray worker
    on a busy node can take over a minute to start and import torch, which the rendezvous
    that follows (60 s, create_tp_store) must not have to cover; a worker whose constructor
    failed raises its error here at once, not a rendezvous timeout."""
    refs = [w.ping.remote() for w in workers]
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        ranks = [rank for rank, ref in enumerate(refs, start=1) if ref in pending]
        raise TimeoutError(f"shard workers of ranks {ranks} did not start within {timeout_s:.0f} s")
    ray.get(refs)


def _alive(worker) -> bool:
    try:
        ray.get(worker.ping.remote(), timeout=5)
        return True
    except Exception:
        return False


ReplicaActorRemote = ray.remote(max_concurrency=2)(ReplicaActor)
