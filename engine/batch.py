"""Run a batch of requests to completion on an in-process engine (the offline `LLM` and
the Ray replica actor share this)::

    outputs = run_batch(engine, [BatchItem("0", prompt_token_ids, SamplingParams(max_tokens=8))])
    outputs["0"].outputs[0].token_ids                  # RequestOutput per request id
"""
from __future__ import annotations

from dataclasses import dataclass

from tqdm.auto import tqdm

from .engine import LLMEngine
from .outputs import CompletionOutput, RequestMetrics, RequestOutput
from .request import Request, sequence_ids
from .sampling_params import SamplingParams


@dataclass(frozen=True)
class BatchItem:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


def run_batch(engine: LLMEngine, items: list[BatchItem], finished: dict[str, Request] | None = None,
              validated: bool = False, progress: bool = False) -> dict[str, RequestOutput]:
    """Run the items to completion; returns request_id -> RequestOutput (prompt text unset).
    `finished` (sequence id -> Request) fills as sequences end, so a caller can tell what
    completed if a step raises. `validated`: the caller has validated every item.
    `progress`: a progress bar over finished sequences."""
    finished = {} if finished is None else finished
    seqs = {item.request_id: engine.add_request(item.request_id, item.prompt_token_ids, item.params, validated)
            for item in items}
    bar = tqdm(total=sum(len(s) for s in seqs.values()), desc="Generating", unit="seq", disable=not progress)
    while engine.has_unfinished():
        for req in engine.step():
            if req.finished:
                finished[req.request_id] = req
                bar.update(1)
    bar.close()
    return {item.request_id: request_output(item, [finished[s] for s in seqs[item.request_id]], engine.tokenizer)
            for item in items}


def finished_outputs(item: BatchItem, finished: dict[str, Request], tokenizer) -> RequestOutput | None:
    """The item's output if all its sequences are in `finished`, else None."""
    seqs = sequence_ids(item.request_id, item.params.n)
    if not all(s in finished for s in seqs):
        return None
    return request_output(item, [finished[s] for s in seqs], tokenizer)


def error_output(item: BatchItem, cause: str) -> RequestOutput:
    """A request that failed (e.g. its replica lost a shard)."""
    return RequestOutput(request_id=item.request_id, prompt=None, prompt_token_ids=list(item.prompt_token_ids),
                         outputs=[CompletionOutput(index=0, text="", token_ids=[], finish_reason="error")],
                         finished=True, error=cause)


def request_output(item: BatchItem, seqs: list[Request], tokenizer) -> RequestOutput:
    outputs = [completion_of(req, index) for index, req in enumerate(seqs)]
    if tokenizer is not None:
        for out in outputs:
            for entry in out.logprobs or []:
                for token_id, lp in entry.items():
                    if lp.decoded_token is None:
                        lp.decoded_token = tokenizer.decode([token_id])
    first = seqs[0]
    metrics = RequestMetrics(first.arrival_time, first.first_scheduled_time, first.first_token_time,
                             max((s.finished_time or 0.0) for s in seqs) or None)
    return RequestOutput(request_id=item.request_id, prompt=None, prompt_token_ids=list(item.prompt_token_ids),
                         outputs=outputs, finished=True, num_cached_tokens=first.num_cached_tokens or 0,
                         metrics=metrics)


def completion_of(req: Request, index: int) -> CompletionOutput:
    return CompletionOutput(
        index=index, text=req.detokenizer.text, token_ids=list(req.output_token_ids),
        cumulative_logprob=req.cumulative_logprob if req.logprobs is not None else None,
        logprobs=req.logprobs, finish_reason=req.finish_reason, stop_reason=req.stop_reason,
    )
