"""device_io: host lists to the device and results back through reused page-locked buffers.
On CPU the plain paths; on a GPU (marker `gpu`) the staging ring under a busy stream: a buffer
is never rewritten before the copy that reads it has run, and read-backs stay correct when the
ring wraps."""
import os

import pytest
import torch

from hybrid_serve import device_io
from hybrid_serve.device_io import PendingHostCopy, copy_to_device, to_device


def test_cpu_paths():
    t = to_device([3, 1, 2], torch.int64, torch.device("cpu"))
    assert t.tolist() == [3, 1, 2] and t.dtype == torch.int64
    dest = torch.zeros(5, dtype=torch.int32)
    copy_to_device(dest, [7, 8])
    assert dest.tolist() == [7, 8, 0, 0, 0]
    x = torch.arange(4)
    assert PendingHostCopy(x).wait() is x


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1", reason="needs a CUDA GPU")
def test_staging_ring_under_a_busy_stream(monkeypatch):
    """The device is kept busy (a sleep kernel) while a small ring wraps several times: every
    copy still delivers its own values, whatever was written to its buffer later; lists longer
    than a segment and dtypes without a numpy view take fresh page-locked tensors."""
    dev = torch.device("cuda")
    ring = device_io._Staging(8 * 1024)  # segments of 1 KiB: 16 transfers of <= 64 bytes each
    monkeypatch.setattr(device_io, "_TO_DEVICE", ring)
    torch.cuda._sleep(50_000_000)  # ~tens of ms of device work queued before the copies
    outs, want = [], []
    for i in range(3 * 8 * 16 + 5):
        values = list(range(i, i + 1 + i % 7))
        want.append(values)
        if i % 2:
            outs.append(to_device(values, torch.int64, dev))
        else:
            d = torch.full((16,), -1, dtype=torch.int64, device=dev)
            copy_to_device(d, values)
            outs.append(d)
    long = list(range(300))  # 2,400 bytes: more than a segment
    outs.append(to_device(long, torch.int64, dev))
    want.append(long)
    outs.append(to_device([1.5, 2.5], torch.float16, dev))
    want.append([1.5, 2.5])
    torch.cuda.synchronize()  # 389 transfers of 64 bytes went round the 8 KiB ring three times
    for i, (out, values) in enumerate(zip(outs, want)):
        assert out[: len(values)].tolist() == values, i
    # read-backs: more than the ring's slots, each read after its own wait
    for i in range(3 * len(device_io._TO_HOST.buffers)):
        torch.cuda._sleep(1_000_000)
        src = torch.arange(i, i + 5, device=dev)
        assert PendingHostCopy(src).wait().tolist() == list(range(i, i + 5))
    # two in flight at once, read in order (the engine's overlap)
    a = PendingHostCopy(torch.arange(3, device=dev) + 100)
    b = PendingHostCopy(torch.arange(3, device=dev) + 200)
    assert a.wait().tolist() == [100, 101, 102] and b.wait().tolist() == [200, 201, 202]
