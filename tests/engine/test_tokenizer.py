"""engine/tokenizer.py's torch-free Tokenizer equals transformers' AutoTokenizer on what the
engine and the ingress use: encode, decode, special tokens and chat templates (one template,
named templates, a chat_template.jinja file, a BOS post-processor)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import processors

from hybrid_serve.demo import DEMO_DIR
from hybrid_serve.engine.tokenizer import Tokenizer, eos_token_ids, load_tokenizer

TEXTS = ["", "hello world", "def f(x):\n    return x ** 2  # é 中文 🙂", "a<|im_start|>b<|im_end|>c",
         "  leading and trailing  ", "tabs\tand\r\nnewlines\n\n", "<|endoftext|>"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Go on", "name": None}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]
RICH_TEMPLATE = ("{{ bos_token }}{% if tools %}[tools]{{ tools | tojson }}\n{% endif %}"
                 "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
                 "{{ raise_exception('bad role') }}{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _variant(tmp_path, name: str, config_update: dict, jinja: str | None = None, bos_processor: bool = False):
    out = tmp_path / name
    shutil.copytree(DEMO_DIR, out)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(config_update)
    path.write_text(json.dumps(config))
    if jinja is not None:
        (out / "chat_template.jinja").write_text(jinja)
    if bos_processor:
        backend = BackendTokenizer.from_file(str(out / "tokenizer.json"))
        backend.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", pair="<|im_start|> $A $B", special_tokens=[("<|im_start|>", 1)])
        backend.save(str(out / "tokenizer.json"))
    return str(out)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tokenizers")
    demo_template = json.load(open(os.path.join(DEMO_DIR, "tokenizer_config.json")))["chat_template"]
    return {
        "demo": DEMO_DIR,
        "named": _variant(tmp, "named", {"chat_template": [{"name": "default", "template": demo_template},
                                                           {"name": "tool_use", "template": RICH_TEMPLATE}]}),
        "jinja_bos": _variant(tmp, "jinja_bos", {"bos_token": "<|im_start|>", "chat_template": None},
                              jinja=RICH_TEMPLATE, bos_processor=True),
    }


@pytest.mark.parametrize("variant", ["demo", "named", "jinja_bos"])
def test_matches_transformers(model_dirs, variant):
    from transformers import AutoTokenizer

    path = model_dirs[variant]
    ours, theirs = load_tokenizer(path), AutoTokenizer.from_pretrained(path)
    assert isinstance(ours, Tokenizer)
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "bos_token_id", "eos_token_id",
                 "pad_token_id", "unk_token_id", "model_max_length"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert len(ours) == len(theirs)
    for text in TEXTS:
        for special in (False, True):
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(text, add_special_tokens=special)
        ids = theirs.encode(text, add_special_tokens=True)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    for kwargs in ({"add_generation_prompt": True}, {"add_generation_prompt": False},
                   {"continue_final_message": True}, {"tools": TOOLS, "add_generation_prompt": True}):
        for tokenize in (False, True):
            want = theirs.apply_chat_template(MESSAGES, tokenize=tokenize, **kwargs)
            want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
            assert ours.apply_chat_template(MESSAGES, tokenize=tokenize, **kwargs) == want, kwargs


def test_template_errors_raise(model_dirs):
    ours = load_tokenizer(model_dirs["jinja_bos"])
    with pytest.raises(Exception, match="bad role"):
        ours.apply_chat_template([{"role": "wizard", "content": "x"}], tokenize=False)
    with pytest.raises(ValueError, match="not compatible"):
        ours.apply_chat_template(MESSAGES, add_generation_prompt=True, continue_final_message=True)


def test_no_tokenizer_and_eos_ids(tmp_path):
    assert load_tokenizer(str(tmp_path)) is None and load_tokenizer(None) is None
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert eos_token_ids(str(tmp_path), None, None) == {7, 9}
    demo = load_tokenizer(DEMO_DIR)
    assert eos_token_ids(str(tmp_path / "missing"), None, demo) == {demo.eos_token_id}
