"""OpenAI response bodies and stream chunks, built from engine deltas (plain dicts).

`Choice` accumulates one choice's deltas (for non-streaming responses and usage counts);
the `*_chunk` functions shape one SSE event.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..engine.async_engine import SeqDelta
from ..engine.outputs import Logprob

DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def add(self, delta: SeqDelta) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs or []
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _token_str(entry: dict[int, Logprob], token_id: int) -> str:
    lp = entry.get(token_id)
    return lp.decoded_token if lp is not None and lp.decoded_token is not None else f"token_id:{token_id}"


def _top(entry: dict[int, Logprob], top_n: int) -> list[tuple[int, Logprob]]:
    return sorted(((t, lp) for t, lp in entry.items() if lp.rank <= top_n), key=lambda x: x[1].rank)


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], top_n: int,
                        text_offset: int = 0) -> dict:
    """The legacy completions shape; `text_offset` is where this delta's text starts."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries):
        token = _token_str(entry, token_id)
        tokens.append(token)
        token_logprobs.append(entry[token_id].logprob if token_id in entry else None)
        top = {_token_str(entry, t): lp.logprob for t, lp in _top(entry, top_n)}
        top.setdefault(token, token_logprobs[-1])
        tops.append(top)
        offsets.append(text_offset)
        text_offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], top_n: int) -> dict:
    content = []
    for token_id, entry in zip(token_ids, entries):
        token = _token_str(entry, token_id)
        lp = entry.get(token_id)
        top = [{"token": _token_str(entry, t), "logprob": x.logprob, "bytes": _bytes(_token_str(entry, t))}
               for t, x in _top(entry, top_n)]
        content.append({"token": token, "logprob": lp.logprob if lp is not None else -9999.0,
                        "bytes": _bytes(token), "top_logprobs": top})
    return {"content": content}


# ----- whole responses ---------------------------------------------------------------------
def completion_response(rid: str, created: int, model: str, choices: list[Choice], top_n: int | None,
                        use: dict) -> dict:
    out = []
    for c in choices:
        lps = completion_logprobs(c.token_ids, c.logprobs, top_n) if top_n is not None else None
        out.append({"index": c.index, "text": c.text, "logprobs": lps, "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason})
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": out,
            "usage": use}


def chat_response(rid: str, created: int, model: str, choices: list[Choice], top_n: int | None,
                  use: dict) -> dict:
    out = []
    for c in choices:
        lps = chat_logprobs(c.token_ids, c.logprobs, top_n) if top_n is not None else None
        out.append({"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": lps,
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": out,
            "usage": use}


# ----- stream chunks -----------------------------------------------------------------------
def completion_chunk(rid: str, created: int, model: str, index: int, delta: SeqDelta, top_n: int | None,
                     text_offset: int) -> dict:
    lps = None
    if top_n is not None and delta.logprobs:
        lps = completion_logprobs(delta.token_ids, delta.logprobs, top_n, text_offset)
    choice = {"index": index, "text": delta.text, "logprobs": lps, "finish_reason": delta.finish_reason,
              "stop_reason": delta.stop_reason}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def chat_chunk(rid: str, created: int, model: str, index: int, delta: SeqDelta | None, top_n: int | None) -> dict:
    """delta None: the opening chunk of a choice (its role)."""
    if delta is None:
        choice = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}
    else:
        lps = chat_logprobs(delta.token_ids, delta.logprobs, top_n) if top_n is not None and delta.logprobs else None
        choice = {"index": index, "delta": {"content": delta.text} if delta.text else {}, "logprobs": lps,
                  "finish_reason": delta.finish_reason, "stop_reason": delta.stop_reason}
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def usage_chunk(rid: str, created: int, model: str, obj: str, use: dict) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}
