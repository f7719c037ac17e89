"""Host cost of evicting one prefix-cache checkpoint (`RadixCache.evict_state(1)`, one call per
admission or checkpoint while the state pool is full) against how many checkpoints the tree
holds: conversations over a shared 1,024-token system prompt, each turn leaving interval
checkpoints along its path and one at its end (pages of 16 tokens).

    python benchmarks/evict_bench.py [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import random
import time

from hybrid_serve.mem_cache.radix_cache import RadixCache


def build(conversations: int, turns: int, interval_pages: int = 16, page: int = 16, seed: int = 0) -> RadixCache:
    rng = random.Random(seed)
    tree = RadixCache(page, True)
    slot = first_page = 1
    system = [rng.randrange(1000) for _ in range(page * 64)]
    for _ in range(conversations):
        tokens = list(system)
        for _ in range(turns):
            tokens = tokens + [rng.randrange(1000) for _ in range(page * 8)]
            n = len(tokens) // page
            for q in list(range(interval_pages, n + 1, interval_pages)) + [n]:
                tree.insert(tokens[: q * page], list(range(first_page, first_page + q)), slot)
                slot, first_page = slot + 1, first_page + q
    return tree


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for conversations, turns in ((64, 8), (256, 8), (1024, 4)):
        tree = build(conversations, turns)
        held = tree.num_state_slots
        calls = 50
        t = time.perf_counter()
        for _ in range(calls):
            tree.evict_state(1)
        ms = (time.perf_counter() - t) / calls * 1e3
        rows.append(dict(conversations=conversations, turns=turns, checkpoints=held, evict_one_ms=round(ms, 3)))
        print(f"{conversations} conversations x {turns} turns: {held} checkpoints, evict_state(1) {ms:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
