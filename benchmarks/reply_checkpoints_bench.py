"""A chat's second turn with and without reply checkpoints (EngineConfig.reply_checkpoints):
turn 1 is a 1,024-token prompt and a generated reply of R tokens (greedy, EOS ignored); turn 2
sends prompt + reply + a 64-token user message back. Reported: turn 2's time to its first
token through `LLM.generate` and its prefix-cache hit, three conversations per setting, on the
CPU (one thread) with the 30M model of `model_configs.qwen3_5_30m_cpu` (fp32 dummy weights).

    python -m hybrid_serve.benchmarks.reply_checkpoints_bench [--replies 64 256 512]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import tempfile
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replies", type=int, nargs="+", default=[64, 256, 512])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "reply_checkpoints_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    from hybrid_serve import LLM, SamplingParams

    from .model_configs import write_model_dir
    from .synthetic_tokenizer import write_tokenizer

    tmp = tempfile.mkdtemp()
    model_dir, tokenizer = write_model_dir("qwen3_5_30m_cpu", tmp), write_tokenizer(os.path.join(tmp, "tok"), 4096)
    rows = {}
    for reply_len in args.replies:
        for on in (True, False):
            llm = LLM(model=model_dir, load_format="dummy", dtype="float32", tokenizer=tokenizer, max_model_len=4096,
                      max_num_seqs=8, reply_checkpoints=on)
            rng = random.Random(reply_len)  # the same conversations with the option on and off
            ttft, cached = [], []
            for _ in range(3):
                first = [rng.randrange(10, 4000) for _ in range(1024)]
                reply = llm.generate([{"prompt_token_ids": first}],
                                     SamplingParams(max_tokens=reply_len, temperature=0, ignore_eos=True))[0]
                second = first + list(reply.outputs[0].token_ids) + [rng.randrange(10, 4000) for _ in range(64)]
                start = time.perf_counter()
                out = llm.generate([{"prompt_token_ids": second}], SamplingParams(max_tokens=1, temperature=0))[0]
                ttft.append(round(1e3 * (time.perf_counter() - start), 1))
                cached.append(out.num_cached_tokens)
            name = f"reply{reply_len}_{'on' if on else 'off'}"
            rows[name] = {"turn2_ttft_ms": ttft, "turn2_cached_tokens": cached, "turn2_prompt_tokens": len(second)}
            print(name, rows[name], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__)).stdout.strip()
    result = {"metric": "turn-2 TTFT and prefix hit with reply checkpoints on and off",
              "date": time.strftime("%Y-%m-%d"), "commit": commit,
              "device": f"cpu ({os.cpu_count()} cores, 1 torch thread), {platform.processor() or platform.machine()}",
              "workload": "1,024-token prompt, R-token generated reply, 64-token next message; 3 conversations each; "
                          "qwen3_5_30m_cpu fp32 dummy weights, LLM.generate",
              "baseline": "the same conversations with reply_checkpoints=False (same process)", "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
