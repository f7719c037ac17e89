"""One replica's tensor-parallel process group: NCCL (GPU) or gloo (CPU) for the model's
collectives. Step plans travel separately, through shared memory (cluster/shm_channel.py)."""
from __future__ import annotations

import datetime
import os
import socket

import torch.distributed as dist

from ..models.layers.parallel import set_tp_group

# Multi-GPU machines here must keep NVLink multicast off (it can wedge shared GPUs).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_tp_group(rank: int, world_size: int, master_addr: str, master_port: int, device: str,
                  timeout_s: float = 60.0) -> None:
    """Join the replica's group (every rank at once) and make it this process's TP context."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    set_tp_group(rank, world_size, dist.group.WORLD)


def leave_tp_group() -> None:
    set_tp_group(0, 1, None)
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a peer died: the group is gone either way
            pass
