"""The built-in demo model directory: tokenizer, chat template and config load and agree."""

import json
import os

import pytest

from hybrid_serve.demo import DEMO_DIR, DEMO_SEED

transformers = pytest.importorskip("transformers")

SPECIALS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(DEMO_DIR)


@pytest.fixture(scope="module")
def config():
    return transformers.AutoConfig.from_pretrained(DEMO_DIR)


def test_package_constants():
    assert os.path.isabs(DEMO_DIR) and os.path.isdir(DEMO_DIR)
    assert DEMO_SEED == 1234
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "model.safetensors", "training_manifest.json"):
        assert os.path.isfile(os.path.join(DEMO_DIR, name)), name
    assert os.path.getsize(os.path.join(DEMO_DIR, "tokenizer.json")) < 1 << 20
    assert os.path.getsize(os.path.join(DEMO_DIR, "model.safetensors")) <= 25_000_000


def test_special_tokens(tokenizer):
    for token, token_id in SPECIALS.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
        assert tokenizer.encode(token, add_special_tokens=False) == [token_id]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 0
    assert tokenizer.bos_token is None
    assert tokenizer.unk_token_id is None
    assert tokenizer.model_max_length == 4096
    # specials embedded in text still encode to their single ids
    ids = tokenizer.encode("a<|im_start|>b<|im_end|>", add_special_tokens=False)
    assert 1 in ids and 2 in ids


@pytest.mark.parametrize("text", [
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "line one\nline two\r\n\ttabbed\n\n",
    "def f(x):\n    return x ** 2  # squares\n",
    "Ünïcödé: naïve café, 日本語のテキスト, русский, العربية",
    "emoji 🙂👍🏽 and ZWJ 👨‍👩‍👧‍👦, flags 🇫🇷",
    "\x00\x01\x7f control bytes \u200b zero-width",
])
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= i < len(tokenizer) for i in ids)
    assert tokenizer.decode(ids) == text


def test_round_trip_random_unicode(tokenizer):
    import random

    rng = random.Random(0)
    alphabet = [chr(c) for c in range(0x20, 0x3000)] + ["\n", "\t", " ", "😀", "🚀", "𝔘"]
    for _ in range(50):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80)))
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_bpe_compresses_python_and_english(tokenizer):
    text = "def main():\n    return self.value\n" + "The quick brown fox jumps over the lazy dog."
    assert len(tokenizer.encode(text, add_special_tokens=False)) < len(text.encode()) / 2


def test_chat_template(tokenizer):
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ]
    convo = (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
    )
    assert tokenizer.apply_chat_template(messages, tokenize=False) == convo
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == convo + "<|im_start|>assistant\n"
    assert tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    ) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert ids.count(1) == 5 and ids.count(2) == 4
    assert tokenizer.decode(ids) == prompt


def test_config(config, tokenizer):
    assert type(config).__name__ == "Qwen3_5TextConfig"
    assert config.architectures == ["Qwen3_5ForCausalLM"]
    assert config.vocab_size == len(tokenizer) == 4096
    assert config.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert config.num_hidden_layers == len(config.layer_types) == 8
    assert (config.hidden_size, config.intermediate_size, config.head_dim) == (320, 768, 64)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert (config.linear_num_key_heads, config.linear_num_value_heads) == (2, 4)
    assert (config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel_dim) == (64, 64, 4)
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    assert config.rope_parameters["rope_theta"] == 10000.0
    assert config.max_position_embeddings == tokenizer.model_max_length == 4096
    assert config.tie_word_embeddings is True
    assert config.mtp_num_hidden_layers == 1
    assert config.eos_token_id == tokenizer.eos_token_id
    assert config.pad_token_id == tokenizer.pad_token_id == 0
    assert config.bos_token_id is None


def test_generation_config(tokenizer):
    with open(os.path.join(DEMO_DIR, "generation_config.json")) as f:
        gen = json.load(f)
    assert gen["eos_token_id"] == tokenizer.eos_token_id
    assert gen["pad_token_id"] == tokenizer.pad_token_id
