"""Host-side id allocator for 1..N (id 0 is reserved everywhere: dummy KV page, padding
state slot, padding request row). Pure bookkeeping: no tensors."""
from __future__ import annotations


class IdAllocator:
    def __init__(self, num_ids: int, what: str) -> None:
        if num_ids < 1:
            raise ValueError(f"need >= 1 {what}, got {num_ids}")
        self.num_ids = num_ids
        self.what = what
        self._free: list[int] = list(range(num_ids, 0, -1))  # lowest id handed out first
        self._is_free = [False] + [True] * num_ids

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_ids - len(self._free)

    def alloc(self, count: int = 1) -> list[int]:
        if count > len(self._free):
            raise MemoryError(f"asked for {count} {self.what}, {len(self._free)} free")
        ids = [self._free.pop() for _ in range(count)]
        for i in ids:
            self._is_free[i] = False
        return ids

    def free(self, ids: list[int]) -> None:
        for i in ids:
            if not 0 < i <= self.num_ids or self._is_free[i]:
                raise ValueError(f"freeing {self.what[:-1] if self.what.endswith('s') else self.what} {i} "
                                 f"that is reserved, out of range or already free")
            self._is_free[i] = True
            self._free.append(i)

    def used_ids(self) -> set[int]:
        return {i for i in range(1, self.num_ids + 1) if not self._is_free[i]}

    def check_integrity(self, held: list[int] | None = None) -> None:
        """Free list and flags agree; with `held`, the used ids are exactly `held` (no id twice)."""
        assert not self._is_free[0], f"{self.what}: id 0 is reserved and must never be free"
        assert len(set(self._free)) == len(self._free), f"{self.what}: an id is free twice"
        assert all(self._is_free[i] for i in self._free), f"{self.what}: free list and flags disagree"
        assert sum(self._is_free) == len(self._free), f"{self.what}: free flags and free list disagree"
        if held is not None:
            assert len(held) == len(set(held)), f"{self.what}: an id is held twice: {sorted(held)}"
            used = self.used_ids()
            assert used == set(held), f"{self.what}: used {sorted(used)} != held {sorted(held)}"
