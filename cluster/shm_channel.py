"""A one-writer, many-reader message channel in shared memory, for the step plans of one
replica (its ranks share a node: STRICT_PACK). Replaces a gloo broadcast: one pickle and a
memcpy on rank 0, a poll and an unpickle on the others (about 10x less per-step overhead).

Layout of the segment (little-endian uint64 words, then the payload)::

    [0]        seq: number of messages written
    [1]        length of the current payload in bytes
    [2 .. 2+R) ack of reader r: the last seq it has taken
    [8*(2+R) ..) payload (pickled message)

The writer waits until every reader acked the previous message before overwriting it, and
publishes `seq` last. Readers poll `seq` (spin briefly, then sleep with back-off).

Both sides wait for one exact value (the reader for seq = last + 1, the writer for each ack =
seq), never for "changed": a word being stored may be seen half-written, and while 255 -> 256
is being stored a reader that took any change as news could see 0, take the message, ack 0,
and then take the same message again (rank 1 then ran one plan twice, desynchronising the
ranks' collectives). A half-written value of a counter that steps by one is always below the
new value, so it never equals the awaited one. The words are also stored as single aligned
8-byte stores (a memoryview cast to native uint64) rather than byte by byte.
"""
from __future__ import annotations

import pickle
import sys
import time
from multiprocessing import shared_memory


class ShmChannel:
    def __init__(self, name: str | None, num_readers: int, capacity: int = 64 * 1024**2,
                 reader_index: int | None = None, timeout_s: float = 60.0) -> None:
        """Writer: name=None creates the segment (see `.name`). Reader: pass the writer's
        name and this reader's index (rank - 1)."""
        self.num_readers = num_readers
        self.header = 8 * (2 + num_readers)
        self.reader_index = reader_index
        self.timeout_s = timeout_s
        create = name is None
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=self.header + capacity if create else 0)
        if not create:  # the writer unlinks; readers must not let Python's tracker do it too
            try:
                from multiprocessing import resource_tracker

                resource_tracker.unregister(self.shm._name, "shared_memory")  # noqa: SLF001
            except Exception:  # noqa: BLE001 - best effort
                pass
        self.buf = self.shm.buf
        if sys.byteorder != "little":
            raise RuntimeError("the plan channel's header words are little-endian uint64")
        self.words = self.buf[: self.header].cast("Q")  # aligned native uint64: one store per word
        if create:
            self.buf[: self.header] = bytes(self.header)
        self.capacity = len(self.buf) - self.header
        self._seq = self._word(0) if not create else 0

    @property
    def name(self) -> str:
        return self.shm.name

    def _word(self, i: int) -> int:
        return self.words[i]

    def _set_word(self, i: int, value: int) -> None:
        self.words[i] = value

    def send(self, message) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) > self.capacity:
            raise ValueError(f"message of {len(payload)} B exceeds the plan channel's {self.capacity} B")
        deadline = None
        for r in range(self.num_readers):  # every reader has taken the previous message
            while self._word(2 + r) != self._seq:
                deadline = deadline or time.monotonic() + self.timeout_s
                if time.monotonic() > deadline:
                    raise RuntimeError(f"shard rank {r + 1} did not take plan {self._seq} within {self.timeout_s} s")
                time.sleep(0)
        self.buf[self.header : self.header + len(payload)] = payload
        self._set_word(1, len(payload))
        self._seq += 1
        self._set_word(0, self._seq)  # publish last

    def recv(self):
        spins, pause = 0, 0.0
        expected = self._seq + 1  # the writer never runs more than one message ahead
        while self._word(0) != expected:
            spins += 1
            if spins > 2000:  # spin ~tens of microseconds, then back off up to 1 ms
                pause = min(1e-3, pause * 2 or 1e-5)
                time.sleep(pause)
        self._seq = expected
        length = self._word(1)
        message = pickle.loads(bytes(self.buf[self.header : self.header + length]))
        self._set_word(2 + self.reader_index, self._seq)
        return message

    def close(self, unlink: bool = False) -> None:
        if self.words is not None:
            self.words.release()
            self.words = None
        self.buf = None
        try:
            self.shm.close()
            if unlink:
                self.shm.unlink()
        except (FileNotFoundError, BufferError):
            pass
