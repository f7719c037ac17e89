"""router_bench.py serve's simulated users: each conversation's turns as streamed
`/v1/completions` requests over HTTP, one user at a time, with think time between turns.
Each turn records its TTFT (first text chunk) and the replica's reported cached tokens.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import time

import aiohttp  # (Ray Serve's own dependency: on every machine that runs this)


async def _user(client, url: str, user: int, prompts: list[list[int]], rng: random.Random, out: list,
                max_tokens: int = 4, think_s: tuple[float, float] = (0.2, 1.0), reply_tokens: int = 0) -> None:
    """One user's turns. `reply_tokens` > 0: each turn generates its reply (that many tokens,
    EOS ignored), and the next turn sends it back in place of the workload's stand-in (the
    prompts keep their lengths; ids are read from the synthetic tokenizer's "w<id>" words)."""
    await asyncio.sleep(rng.uniform(0, 2.0))  # arrivals spread over 2 s
    history: list[int] = []
    for turn, prompt in enumerate(prompts):
        if reply_tokens:
            user_turn = prompt[len(prompts[turn - 1]) + reply_tokens:] if turn else prompt
            prompt = history + user_turn
        body = {"prompt": prompt, "max_tokens": reply_tokens or max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, **({"ignore_eos": True} if reply_tokens else {})}
        start, ttft, usage, text = time.perf_counter(), None, None, []
        async with client.post(url, json=body, timeout=aiohttp.ClientTimeout(total=300)) as resp:
            if resp.status != 200:
                out.append({"user": user, "turn": turn, "start_s": start, "status": resp.status, "ttft_s": None,
                            "prompt_tokens": len(prompt), "cached_tokens": 0, "error": (await resp.read())[:300]})
                continue
            async for raw in resp.content:  # one server-sent-event line at a time
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if ttft is None and '"text"' in line:
                    ttft = time.perf_counter() - start
                if reply_tokens and '"text"' in line:
                    text += [c.get("text", "") for c in json.loads(line[6:]).get("choices", [])]
                if '"usage"' in line and '"prompt_tokens"' in line:
                    usage = json.loads(line[6:]).get("usage") or usage
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        if reply_tokens:
            reply = [int(w) for w in re.findall(r"w(\d+)", "".join(text))]
            if len(reply) != reply_tokens:
                raise RuntimeError(f"user {user} turn {turn}: {len(reply)} reply ids read back, not {reply_tokens} "
                                   f"(generated replies need the synthetic tokenizer: --model NAME)")
            history = prompt + reply
        out.append({"user": user, "turn": turn, "start_s": start, "status": 200, "ttft_s": ttft, "prompt_tokens": len(prompt),
                    "cached_tokens": cached})
        if turn + 1 < len(prompts):
            await asyncio.sleep(rng.uniform(*think_s))  # think time: reading the reply, typing the next turn


async def drive(url: str, conversations, seed: int, max_tokens: int = 4,
                 think_s: tuple[float, float] = (0.2, 1.0), reply_tokens: int = 0) -> list[dict]:
    out: list[dict] = []
    rng = random.Random(seed)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=len(conversations) + 8)) as client:
        await asyncio.gather(*(_user(client, url, u, c, random.Random(rng.random()), out, max_tokens,
                                     think_s, reply_tokens)
                               for u, c in enumerate(conversations)))
    return out
