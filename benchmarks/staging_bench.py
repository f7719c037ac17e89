"""Host time of one host-list -> device transfer (device_io) against a fresh page-locked tensor,
for list lengths a step uses (a verify step's commit rows: 256 values), with the device idle.
The "busy" rows queue a long sleep kernel first: ~2,000 queued copies then fill the driver's
queue and every path blocks until it drains, so they only show that nothing returns early.

    python benchmarks/staging_bench.py
"""
from __future__ import annotations

import json
import time

import torch

from hybrid_serve import device_io


def per_call_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    dev = torch.device("cuda")
    rows = {}
    for length in (8, 64, 256, 1024):
        values = list(range(length))
        dest = torch.zeros(length, dtype=torch.int64, device=dev)
        cases = {
            "fresh_pinned_copy": lambda: dest.copy_(torch.tensor(values, dtype=torch.int64, pin_memory=True),
                                                    non_blocking=True),
            "copy_to_device": lambda: device_io.copy_to_device(dest, values),
            "to_device": lambda: device_io.to_device(values, torch.int64, dev),
            "torch_tensor_only": lambda: torch.tensor(values, dtype=torch.int64),
        }
        for busy in (False, True):
            for name, fn in cases.items():
                if busy:
                    torch.cuda._sleep(2_000_000_000)
                us = per_call_us(fn)
                torch.cuda.synchronize()
                rows[f"{length} {name} {'busy' if busy else 'idle'}"] = round(us, 2)
    rows["staged view is pinned"] = device_io._TO_DEVICE.stage([1, 2], torch.int64).is_pinned()
    for k, v in rows.items():
        print(f"{k:40s} {v}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
