"""One replica's tensor-parallel process group: NCCL (GPU) or gloo (CPU) for the model's
collectives. Step plans travel separately, through shared memory (cluster/shm_channel.py)."""
from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from ..distributed import set_tp_group

# Multi-GPU machines here must keep NVLink multicast off (it can wedge shared GPUs).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def create_tp_store(master_addr: str, world_size: int, timeout_s: float = 60.0) -> dist.TCPStore:
    """Rank 0's rendezvous store on a port the OS picks while it listens: no window in which
    another replica could take the same port (a free-then-bind port can be handed out twice,
    and two replicas' ranks then meet in one store)."""
    return dist.TCPStore(master_addr, 0, world_size, is_master=True,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def init_tp_group(rank: int, world_size: int, master_addr: str, master_port: int, device: str,
                  timeout_s: float = 60.0, store: dist.TCPStore | None = None) -> None:
    """Join the replica's group (every rank at once) and make it this process's TP context.
    Rank 0 passes its store (create_tp_store); the others connect to master_addr:master_port."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if dist.is_initialized():
        dist.destroy_process_group()
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    set_tp_group(rank, world_size, dist.group.WORLD)


def leave_tp_group() -> None:
    set_tp_group(0, 1, None)
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a peer died: the group is gone either way
            pass
