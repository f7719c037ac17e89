"""One replica's tensor-parallel process group, and the channel that carries each step's
plan from rank 0 to the other ranks (a broadcast on a CPU/gloo group: one collective per
step, no Ray RPC per rank).

NCCL (GPU) or gloo (CPU) for the model's collectives; always a gloo group for the plan.
"""
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
                  timeout_s: float = 60.0):
    """Join the replica's group; returns the gloo group that carries step plans."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    group = dist.group.WORLD
    cpu_group = group if backend == "gloo" else dist.new_group(backend="gloo")
    set_tp_group(rank, world_size, group)
    return cpu_group


def leave_tp_group() -> None:
    set_tp_group(0, 1, None)
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a peer died: the group is gone either way
            pass


class PlanChannel:
    """Rank 0 `send`s any picklable message; every other rank `recv`s it, in order."""

    def __init__(self, cpu_group, rank: int) -> None:
        self.group = cpu_group
        self.rank = rank

    def send(self, message) -> None:
        if self.rank != 0:
            raise RuntimeError("only rank 0 sends step plans")
        dist.broadcast_object_list([message], src=0, group=self.group)

    def recv(self):
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
