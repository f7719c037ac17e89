"""ShardWorker: TP rank r > 0 of a replica, as a Ray actor. It loads only its shard of the
checkpoint, owns its pools, and executes the step plans rank 0 broadcasts."""
from __future__ import annotations

import ray
import torch

from ..cluster.process_group import init_tp_group, leave_tp_group
from ..cluster.shm_channel import ShmChannel
from ..engine.config import EngineConfig
from ..engine.runner import Shard, StepPlan
from ..mem_cache import PoolSetup

STOP = "stop"


class ShardWorker:
    def __init__(self, config: EngineConfig, rank: int, tp_size: int) -> None:
        self.config = config
        self.rank = rank
        self.tp_size = tp_size
        self.shard: Shard | None = None
        self.channel: ShmChannel | None = None
        if config.device == "cpu":
            torch.set_num_threads(1)

    def setup(self, master_addr: str, master_port: int, channel_name: str) -> int:
        """Join the process group (rank 0 joins at the same time), open the plan channel,
        then load this shard."""
        init_tp_group(self.rank, self.tp_size, master_addr, master_port, self.config.device)
        self.channel = ShmChannel(channel_name, self.tp_size - 1, reader_index=self.rank - 1)
        self.shard = Shard(self.config)
        return self.rank

    def serve(self) -> int:
        """Execute what rank 0 sends until it says stop. Returns the number of steps run."""
        steps = 0
        while True:
            message = self.channel.recv()
            if isinstance(message, StepPlan):
                self.shard.execute(message)
                steps += 1
            elif isinstance(message, PoolSetup):
                self.shard.build_pools(message)
            elif message == STOP:
                self.channel.close()
                leave_tp_group()
                return steps
            else:
                raise ValueError(f"unexpected message for shard {self.rank}: {type(message).__name__}")

    def ping(self) -> int:
        return self.rank


ShardWorkerActor = ray.remote(max_concurrency=2)(ShardWorker)
