"""How the engine thread hands a step's deltas to the replica's event loop (engine/async_engine.py):
one `call_soon_threadsafe` per request per step (before) against one per loop per step
(`request_stream.deliver`'s way, here into plain queues), with N streams consuming on an asyncio loop in another thread and a
sleep standing for the engine step. Reports the posting thread's time per step beyond the
step, and the process CPU per step. CPU only; no model. (The replica's whole path, streams
paced as served: benchmarks/replica_stream_cost.py.)

    python benchmarks/async_handover_bench.py [--streams 256] [--steps 200] [--step-ms 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time



def _hand_over(items: list[tuple[asyncio.Queue, int]]) -> None:
    """On the loop: a step's items into their queues, in one callback."""
    for queue, item in items:
        queue.put_nowait(item)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    loop = asyncio.new_event_loop()
    queues: list[asyncio.Queue] = []
    ready = threading.Event()

    def run_loop() -> None:
        asyncio.set_event_loop(loop)
        queues.extend(asyncio.Queue() for _ in range(args.streams))
        ready.set()
        loop.run_forever()

    threading.Thread(target=run_loop, daemon=True).start()
    ready.wait()

    async def consume(q: asyncio.Queue) -> None:
        while True:
            await q.get()

    for q in queues:
        asyncio.run_coroutine_threadsafe(consume(q), loop)
    time.sleep(0.2)
    result = {"streams": args.streams, "steps": args.steps, "step_ms": args.step_ms}
    for mode in ("per_request", "per_step"):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for step in range(args.steps):
            if mode == "per_request":
                for q in queues:
                    loop.call_soon_threadsafe(q.put_nowait, step)
            else:
                loop.call_soon_threadsafe(_hand_over, [(q, step) for q in queues])
            time.sleep(args.step_ms / 1e3)
        posting = (time.perf_counter() - wall0) / args.steps * 1e3 - args.step_ms
        time.sleep(0.3)  # let the loop drain
        cpu = (time.process_time() - cpu0) / args.steps * 1e3
        result[mode] = {"posting_ms_per_step": round(posting, 3), "process_cpu_ms_per_step": round(cpu, 3)}
        print(f"{mode:12s} posting thread {posting:.2f} ms a step beyond the step, process CPU {cpu:.2f} ms a step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
