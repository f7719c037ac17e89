"""Built-in demo model: a tiny hybrid config, a real BPE tokenizer with a chat template.

The folder is a Hugging Face model directory without weights:

* ``config.json`` / ``generation_config.json``: a 4-layer Qwen3.5-layout hybrid
  (3 Gated DeltaNet layers + 1 gated full-attention layer, hidden size 256);
* ``tokenizer.json`` / ``tokenizer_config.json``: a 4096-token byte-level BPE
  with a ChatML chat template, built by ``build_tokenizer.py``.

Weights are random, generated deterministically from ``DEMO_SEED`` by the
dummy loader (``load_format="dummy"``), so the demo runs with no download.
"""

import os

DEMO_DIR: str = os.path.dirname(os.path.abspath(__file__))
"""Absolute path of the demo model directory (pass it wherever a model path goes)."""

DEMO_SEED: int = 1234
"""Seed of the demo model's dummy (random) weights."""

__all__ = ["DEMO_DIR", "DEMO_SEED"]
