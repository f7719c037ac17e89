"""Built-in demo model: a small trained hybrid, a real BPE tokenizer with a chat template.

The folder is a Hugging Face model directory that hybrid-serve and transformers'
``AutoModelForCausalLM`` both load:

* ``config.json`` / ``generation_config.json``: an 8-layer Qwen3.5-layout hybrid (Gated
  DeltaNet and gated full attention 3:1, hidden size 320, embeddings tied to the LM head,
  one MTP layer);
* ``model.safetensors``: 11.1M parameters in bf16 (22 MB), trained by ``train.py`` on the
  source of Python's standard library (``corpus.py``; which files, the Python version and
  the held-out split are in ``training_manifest.json``), the MTP layer under ``mtp.*``;
* ``tokenizer.json`` / ``tokenizer_config.json``: a 4096-token byte-level BPE with a
  ChatML chat template, built by ``build_tokenizer.py``.

It computes in fp32 unless a dtype is asked for. With ``load_format="dummy"`` the same
config gets random weights drawn from ``DEMO_SEED`` (``LLM(load_format="dummy")``): the
random-weight twin, for tests that want weights no training has shaped.
"""

import os

DEMO_DIR: str = os.path.dirname(os.path.abspath(__file__))
"""Absolute path of the demo model directory (pass it wherever a model path goes)."""

DEMO_SEED: int = 1234
"""The demo's default engine seed, and the seed of its random weights under load_format="dummy"."""

__all__ = ["DEMO_DIR", "DEMO_SEED"]
