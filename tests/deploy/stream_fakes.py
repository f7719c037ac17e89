"""Fakes that the streaming tests share (test_stream_coalescing.py, the ingress's side;
test_stream_pacing.py, the replica's; test_delta_channel.py): a token stream (token 100 + k with
word k of WORDS), an engine client that yields it (StepEngine) and AsyncLLMEngine over a back end
that reports it from a thread as the engine process's reader does (paced_engine)."""
from __future__ import annotations

import asyncio
import threading
import time

from hybrid_serve.engine.admission import LoadView
from hybrid_serve.engine.async_engine import AsyncLLMEngine, ModelInfo, RequestDelta, SeqDelta
from hybrid_serve.engine.engine_core import StepReport
from hybrid_serve.engine.validation import ModelLimits

WORDS = ["Once", " upon", " a", " time", " there", " was", " a", " model"]


def delta(rid: str, step: int, n: int = 1, last: bool = False) -> RequestDelta:
    """Request `rid`'s delta of step `step`: one token for each of its `n` sequences."""
    seqs = [SeqDelta(i, [100 + step], WORDS[step % len(WORDS)], None, "length" if last else None) for i in range(n)]
    return RequestDelta(rid, seqs, 3, 0, last)


class StepEngine:
    """An engine client: one token per `step_s` for each request, `tokens` in all."""

    def __init__(self, tokens: int, step_s: float) -> None:
        self.tokens, self.step_s = tokens, step_s

    def model_info(self):
        return ModelInfo("fake", 1024, 4096)

    async def generate(self, ids, params, request_id, validated=False):
        for k in range(self.tokens):
            await asyncio.sleep(self.step_s)
            yield delta(request_id, k, params.n, k == self.tokens - 1)

    async def abort(self, request_id):
        pass

    def load(self):
        return LoadView(num_running=0, num_waiting=0, num_waiting_tokens=0, num_free_req_rows=8,
                        num_free_state_slots=8, num_free_kv_pages=8, max_num_seqs=8)

    def check_health(self):
        pass

    def shutdown(self):
        pass


class StepBackend:
    """AsyncLLMEngine's back end without an engine: a thread reports, every `step_s`, a delta
    of one token for each request added, `tokens` in all, as the engine process's reader does."""

    def __init__(self, tokens: int, step_s: float, on_report, on_exit) -> None:
        self.tokens, self.step_s, self.on_report = tokens, step_s, on_report
        self.limits = ModelLimits(1024, 4096)
        self.first_report = StepReport(time.monotonic(), view=LoadView(0, 0, 0, 8, 8, 8, 8))
        self.requests: dict[str, int] = {}  # request id -> sequences
        self.aborted: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def send(self, command) -> bool:
        with self.lock:
            if command[0] == "add":
                self.requests[command[1]] = command[3].n
            elif command[0] == "abort":
                self.aborted.append(command[1])
                self.requests.pop(command[1], None)
        return True

    def _run(self) -> None:
        made: dict[str, int] = {}
        while not self.stopping.is_set():
            time.sleep(self.step_s)
            with self.lock:
                deltas = []
                for rid, n in list(self.requests.items()):
                    k = made.get(rid, 0)
                    made[rid] = k + 1
                    deltas.append(delta(rid, k, n, k == self.tokens - 1))
                    if k == self.tokens - 1:
                        del self.requests[rid]
            if deltas:
                self.on_report(StepReport(time.monotonic(), deltas))

    def alive(self) -> bool:
        return True

    def stop(self, timeout_s: float) -> None:
        self.stopping.set()


def paced_engine(tokens: int, step_s: float) -> AsyncLLMEngine:
    """The real front end (it paces its streams, `StreamPace`) over a StepBackend."""
    engine = AsyncLLMEngine(model_name="fake", replica="r0",
                            backend_factory=lambda on_report, on_exit: StepBackend(tokens, step_s, on_report, on_exit))
    assert engine.paces_streams
    return engine
