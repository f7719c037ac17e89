"""A tokenizer that covers a dummy model's whole vocabulary, for serving benchmarks.

A dummy-weight model of a real architecture (Qwen3-Next-80B: 151,936 ids) served with the demo
tokenizer (4,096 ids) generates mostly ids the tokenizer cannot decode: they stream no text,
the HTTP API sends no chunk for them, and a client sees bursts of ~37 tokens and a first chunk
that comes late (TTFT inflated by the wait for a decodable token). Here every id decodes to
its own non-empty word (`w<id> `), so each generated token reaches the client as a chunk, as a
real model's tokenizer would let it.

    python benchmarks/synthetic_tokenizer.py OUT_DIR VOCAB_SIZE
"""
from __future__ import annotations

import json
import os
import sys


def write_tokenizer(out_dir: str, vocab_size: int) -> str:
    """tokenizer.json (word-level, whitespace split) + tokenizer_config.json in `out_dir`."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel

    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "w0", "model_max_length": 1 << 20}, f)
    return out_dir


if __name__ == "__main__":
    print(write_tokenizer(sys.argv[1], int(sys.argv[2])))
