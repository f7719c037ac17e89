"""The engine replica's own CPU per engine step, without Ray or a model: `AsyncLLMEngine`'s
report handling (the wire decode, the metrics, the hand-over to the caller loop) and
`LLMServerImpl.generate` for every stream (the stream message budget), as a served replica
runs them. A reader thread posts one report a step, a delta for each of `--streams` running
requests (as `EngineProcess._read` does), and the requests' consumers drain the replica's
streams as Serve would. Prints the process's CPU ms per step (its share of a step is what the
replica has left for Serve and Ray), the messages the streams sent, and how long the last
message took after the last report.

    python benchmarks/replica_stream_cost.py --streams 256 --steps 128 --step-ms 9.5 [--repeat 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time


class ReportBackend:
    """The engine-client back end without an engine: reports come from `post`."""

    def __init__(self, on_report, on_exit) -> None:
        from hybrid_serve.engine.admission import LoadView
        from hybrid_serve.engine.engine_core import StepReport
        from hybrid_serve.engine.validation import ModelLimits

        self.on_report, self.limits = on_report, ModelLimits(1 << 16, 1 << 16)
        self.first_report = StepReport(time.monotonic(), view=LoadView(0, 0, 0, 1024, 1024, 1 << 16, 1024))
        self.adds: list[str] = []

    def send(self, command: tuple) -> bool:
        if command[0] == "add":
            self.adds.append(command[1])
        return True

    def alive(self) -> bool:
        return True

    def stop(self, timeout_s: float) -> None:
        pass


def run_once(streams: int, steps: int, step_s: float, budget: float) -> dict:
    from hybrid_serve.deploy.config import AppConfig
    from hybrid_serve.deploy.server import GenerateRequest, LLMServerImpl
    from hybrid_serve.engine.admission import LoadView
    from hybrid_serve.engine.async_engine import AsyncLLMEngine
    from hybrid_serve.engine.engine_core import RequestDelta, SeqDelta, StepReport
    from hybrid_serve.engine.sampling_params import SamplingParams

    engine = AsyncLLMEngine(model_name="bench", replica="r0", backend_factory=ReportBackend)
    config = AppConfig(stream_max_messages_per_s=budget, max_waiting_requests=streams,
                       max_waiting_tokens=streams * 64, engine_args={"max_num_seqs": streams})
    server = LLMServerImpl(config, "r0", engine_factory=lambda c, r: engine)
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    view = LoadView(streams, 0, 0, 0, 1024, 1 << 16, streams)
    ids = [f"req-{i}" for i in range(streams)]
    timing: dict = {}

    def reader() -> None:  # the engine process's reports, decoded on the replica's reader thread
        while len(engine.backend.adds) < streams:
            time.sleep(0.001)
        t0, cpu0 = time.monotonic(), time.process_time()
        for step in range(steps):
            last = step == steps - 1
            deltas = [RequestDelta(rid, [SeqDelta(0, [100 + step], " t", None, "length" if last else None)], 8, 0,
                                   last) for rid in ids]
            wire = StepReport(time.monotonic(), deltas, view=view, num_adds=streams if step == 0 else 0).to_wire()
            if last:  # (before the hand-over: the consumers may finish before this thread runs again)
                timing["last_report"] = time.monotonic()
            engine._on_report(StepReport.from_wire(wire))
            if not last:
                time.sleep(max(0.0, t0 + (step + 1) * step_s - time.monotonic()))
        timing["cpu0"], timing["t0"] = cpu0, t0

    async def consume(rid: str, counts: list) -> None:
        async for item in server.generate(GenerateRequest(rid, [1] * 8, params)):
            counts[0] += 1
        timing["end"] = time.monotonic()

    async def main() -> int:
        counts = [0]
        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        await asyncio.gather(*(consume(rid, counts) for rid in ids))
        thread.join()
        return counts[0]

    messages = asyncio.run(main())
    cpu = time.process_time() - timing["cpu0"]
    return {"cpu_ms_per_step": cpu / steps * 1e3, "messages": messages - streams,  # (less the Started items)
            "last_message_after_last_report_ms": (timing["end"] - timing["last_report"]) * 1e3,
            "wall_over_steps": (timing["end"] - timing["t0"]) / (steps * step_s)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--step-ms", type=float, default=9.5)
    ap.add_argument("--budget", type=float, default=1000.0, help="stream_max_messages_per_s")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    runs = [run_once(args.streams, args.steps, args.step_ms / 1e3, args.budget) for _ in range(args.repeat)]
    for r in runs:
        print(", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
