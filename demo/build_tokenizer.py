"""Build the demo tokenizer: a 4096-entry byte-level BPE trained offline.

The demo model (``demo/config.json``) has random weights, but its tokenizer is
real so that text goes in and out of the engine exactly as with a production
model. This script trains it from a corpus every Python install carries: the
source files of the standard library (``sysconfig.get_paths()["stdlib"]``),
read in sorted path order and capped at ``MAX_CORPUS_BYTES``. No network is
needed, and training takes a few seconds.

Properties of the result:

* byte-level pre-tokenizer and decoder with the full 256-byte initial alphabet,
  so any UTF-8 string encodes without unknown tokens and decodes back exactly;
* special tokens ``<|endoftext|>`` (id 0, also the pad token), ``<|im_start|>``
  (id 1) and ``<|im_end|>`` (id 2, the end-of-turn / eos token);
* a ChatML ``chat_template`` in ``tokenizer_config.json``.

Run it from anywhere (it writes next to itself)::

    python demo/build_tokenizer.py

Output is deterministic for a given Python version (the corpus is that
version's stdlib); the committed ``tokenizer.json`` / ``tokenizer_config.json``
are what the demo uses, so rebuilding is only needed to change the tokenizer.
If you change the special tokens, update ``eos_token_id`` / ``pad_token_id`` in
``config.json`` and ``generation_config.json`` to match.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

DEMO_DIR = Path(__file__).resolve().parent
VOCAB_SIZE = 4096
MAX_CORPUS_BYTES = 4 * 1024 * 1024
MODEL_MAX_LENGTH = 4096

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]  # ids 0, 1, 2

# ChatML, as used by Qwen models: each message is
# "<|im_start|>{role}\n{content}<|im_end|>\n"; with add_generation_prompt the
# prompt ends with an open assistant turn "<|im_start|>assistant\n".
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# Directories of the stdlib left out of the corpus: third-party packages and
# the (huge, repetitive) test suites.
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "__pycache__", "idle_test"}


def corpus_files(stdlib: Path) -> list[Path]:
    """The stdlib ``.py`` files used for training, in sorted (deterministic) order."""
    files = [
        p for p in stdlib.rglob("*.py")
        if not _SKIP_DIRS.intersection(p.relative_to(stdlib).parts[:-1])
    ]
    return sorted(files, key=lambda p: p.relative_to(stdlib).as_posix())


def corpus(max_bytes: int = MAX_CORPUS_BYTES) -> list[str]:
    """Texts of the stdlib source files, in order, until ``max_bytes`` of UTF-8 is collected."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in corpus_files(stdlib):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        size = len(text.encode("utf-8"))
        if total + size > max_bytes:
            break
        texts.append(text)
        total += size
    if not texts:
        raise RuntimeError(f"no training text found under {stdlib}")
    return texts


def train(texts: list[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE whose first ids are ``SPECIAL_TOKENS``."""
    tok = Tokenizer(models.BPE())  # no unk token: byte fallback comes from the byte-level alphabet
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # Keep byte offsets right; add no BOS/EOS (trim_offsets off so offsets are raw).
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def tokenizer_config(tok: Tokenizer) -> dict:
    """``tokenizer_config.json`` for ``transformers.AutoTokenizer``."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MODEL_MAX_LENGTH,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {
                "content": t, "lstrip": False, "rstrip": False, "normalized": False,
                "single_word": False, "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "chat_template": CHAT_TEMPLATE,
    }


def main() -> None:
    texts = corpus()
    tok = train(texts)
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    assert ids == list(range(len(SPECIAL_TOKENS))), ids
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()

    tok.save(str(DEMO_DIR / "tokenizer.json"), pretty=False)
    with open(DEMO_DIR / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tok), f, indent=2, ensure_ascii=False)
        f.write("\n")
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"trained on {len(texts)} files ({n_bytes / 2**20:.1f} MiB); "
          f"vocab {tok.get_vocab_size()}; wrote {DEMO_DIR / 'tokenizer.json'}")


if __name__ == "__main__":
    main()
