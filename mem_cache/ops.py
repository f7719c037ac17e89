"""Cache operations: what the host bookkeeping (`CacheManager`) asks every shard to do to
its device tables and pools. Applied in issue order, so a slot freed and re-used within one
step sees its old contents copied out before it is reset (consecutive state copies that touch
no slot another of them writes go out together: `StatePool.copy_many`).

    ("row", req_row, state_slot)          row -> state-slot map (state_slot 0 clears it)
    ("kv", req_row, start_pos, kv_slots)  req_to_token[req_row, start_pos:...] = kv_slots
    ("kv_pages", req_row, first_page, pages, page_size)
                                          the same for whole pages: positions from
                                          first_page * page_size on get each page's slots
                                          (p * page_size + 0 .. page_size - 1), expanded on
                                          the device (what the cache manager issues)
    ("reset", state_slot)                 zero a state slot (fresh request)
    ("copy", src_state_slot, dst_state_slot)  state and layout tag, every layer
    ("commit", state_slots, accepted_steps, kept_tokens, checkpoint_masks)
                                          after a verify step: state_slots[v] <- speculative
                                          scratch[v, accepted_steps[v]], or (a verify step the
                                          shard ran deferred) its kept tokens replayed
                                          (StatePool.commit_verified)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .req_table import RequestRowTable, page_slots
from .state_pool import StatePool


@dataclass
class CacheOps:
    ops: list[tuple] = field(default_factory=list)

    def set_row(self, req_row: int, state_slot: int) -> None:
        self.ops.append(("row", req_row, state_slot))

    def set_kv(self, req_row: int, start_pos: int, kv_slots: list[int]) -> None:
        self.ops.append(("kv", req_row, start_pos, kv_slots))

    def set_kv_pages(self, req_row: int, first_page: int, pages: list[int], page_size: int) -> None:
        self.ops.append(("kv_pages", req_row, first_page, pages, page_size))

    def reset(self, state_slot: int) -> None:
        self.ops.append(("reset", state_slot))

    def copy(self, src_state_slot: int, dst_state_slot: int) -> None:
        self.ops.append(("copy", src_state_slot, dst_state_slot))

    def commit_verified(self, *, state_slots: list[int], accepted_steps: list[int], kept_tokens: list[int],
                        checkpoint_masks: list[int]) -> None:
        """Verify rows v = 0.. in scratch order; state_slots[v] = -1 skips a row (finished or
        aborted), accepted_steps[v] outside the scratch skips its copy (all drafts accepted);
        kept_tokens[v] (its own token + the accepted drafts) and checkpoint_masks[v] (bit s: a
        checkpoint copies the state after token s from the scratch) serve a deferred commit."""
        if not len(state_slots) == len(accepted_steps) == len(kept_tokens) == len(checkpoint_masks):
            raise ValueError(f"{len(state_slots)} state slots for {len(accepted_steps)} accepted steps, "
                             f"{len(kept_tokens)} kept token counts and {len(checkpoint_masks)} checkpoint masks")
        self.ops.append(("commit", list(state_slots), list(accepted_steps), list(kept_tokens), list(checkpoint_masks)))

    def __bool__(self) -> bool:
        return bool(self.ops)


def apply_cache_ops(ops: CacheOps, table: RequestRowTable, state_pool: StatePool | None,
                    deferred_verify: bool = False) -> None:
    """Apply `ops` in order. `deferred_verify`: the shard's last forward was a verify step that
    deferred its GDN state updates (a commit then replays them). The KV-table writes ("kv")
    are gathered and applied together at the end (`RequestRowTable.set_kv_slots_many`: one
    copy and one scatter for the step), and so are the page writes ("kv_pages",
    `set_kv_pages_many`): no other op reads the KV table, and writes to the same positions
    keep their order (a step with both kinds has its page writes expanded to slot writes on
    the host, in order; the cache manager issues page writes only)."""
    kv_writes, page_writes = [], []
    copies: list[tuple[int, int]] = []  # a run of state copies not applied yet (applied at once)
    read, written = set(), set()  # the run's src and dst state slots

    def flush_copies() -> None:
        if copies and state_pool is not None:
            state_pool.copy_many([src for src, _ in copies], [dst for _, dst in copies])
        copies.clear()
        read.clear()
        written.clear()

    for op in ops.ops:
        kind = op[0]
        if kind == "copy":
            # in one launch with the copies before it, unless it reads or writes a slot one of
            # them writes, or writes one they read: then those go first, as issued
            if op[1] in written or op[2] in written or op[2] in read:
                flush_copies()
            copies.append((op[1], op[2]))
            read.add(op[1])
            written.add(op[2])
            continue
        if kind in ("reset", "commit"):
            flush_copies()
        if kind == "row":
            table.set_state_slot(op[1], op[2])
        elif kind == "kv":
            kv_writes.append((op[1], op[2], op[3]))
        elif kind == "kv_pages":
            page_writes.append(op[1:])
        elif kind == "reset":
            if state_pool is not None:
                state_pool.reset(op[1])
        elif kind == "commit":
            if state_pool is not None and op[1]:
                state_pool.commit_verified(state_slots=op[1], accepted_steps=op[2], kept_tokens=op[3],
                                           checkpoint_masks=op[4], deferred=deferred_verify)
        else:
            raise ValueError(f"unknown cache op {op!r}")
    flush_copies()
    if kv_writes and page_writes:  # never from the cache manager: keep the order, as slots
        kv_writes = [(row, start, slots) for row, start, slots in _in_issue_order(ops)]
        page_writes = []
    if kv_writes:
        table.set_kv_slots_many(kv_writes)
    for page_size in sorted({w[3] for w in page_writes}):
        table.set_kv_pages_many([w[:3] for w in page_writes if w[3] == page_size], page_size)


def _in_issue_order(ops: CacheOps):
    """Every KV-table write of `ops` as (req_row, start_pos, kv_slots), in issue order."""
    for op in ops.ops:
        if op[0] == "kv":
            yield op[1], op[2], op[3]
        elif op[0] == "kv_pages":
            _, req_row, first_page, pages, page_size = op
            yield req_row, first_page * page_size, page_slots(pages, page_size)
