"""A model directory's tokenizer and end-of-sequence ids, without torch.

    tokenizer = load_tokenizer("path/to/model")      # None when the directory has no tokenizer
    tokenizer = load_tokenizer("org/name", chat_template="my_template.jinja")   # a Hub id, another template
    ids = tokenizer.encode("text", add_special_tokens=False)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

`Tokenizer` reads `tokenizer.json` with the `tokenizers` library and renders chat templates
with transformers' own renderer (`transformers.utils.chat_template_utils`, which imports no
torch), special tokens and the template from `tokenizer_config.json` / `chat_template.jinja`:
what transformers' `AutoTokenizer` does for a fast tokenizer (tests/engine/test_tokenizer.py
compares them), so the HTTP ingress, which owns no GPU, tokenizes without loading torch. A
directory with only a slow tokenizer (e.g. `tokenizer.model`) falls back to AutoTokenizer.
"""
from __future__ import annotations

import json
import os
from typing import Any

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_content(value) -> str | None:
    """A special token as tokenizer_config.json holds it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization` (WordPiece-era spacing before punctuation)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class Tokenizer:
    """A fast tokenizer (tokenizer.json) with its special tokens and chat template."""

    def __init__(self, model_dir: str) -> None:
        from tokenizers import Tokenizer as BackendTokenizer

        self.model_dir = model_dir
        self.backend = BackendTokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        config = _read_json(os.path.join(model_dir, "tokenizer_config.json"))
        self.special_tokens_map = {name: content for name in SPECIAL_TOKEN_NAMES
                                   if (content := _token_content(config.get(name))) is not None}
        self.model_max_length = int(config.get("model_max_length", 1 << 30))
        self.chat_template = self._chat_template(model_dir, config)
        self._clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False)) and \
            type(self.backend.model).__name__ != "BPE"  # as transformers: never for BPE

    @staticmethod
    def _chat_template(model_dir: str, config: dict) -> str | dict[str, str] | None:
        path = os.path.join(model_dir, "chat_template.jinja")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            return {t["name"]: t["template"] for t in template}
        return template

    # ----- special tokens ------------------------------------------------------------
    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def _id_of(self, name: str) -> int | None:
        token = self.special_tokens_map.get(name)
        return None if token is None else self.backend.token_to_id(token)

    bos_token = property(lambda self: self.special_tokens_map.get("bos_token"))
    eos_token = property(lambda self: self.special_tokens_map.get("eos_token"))
    pad_token = property(lambda self: self.special_tokens_map.get("pad_token"))
    unk_token = property(lambda self: self.special_tokens_map.get("unk_token"))
    bos_token_id = property(lambda self: self._id_of("bos_token"))
    eos_token_id = property(lambda self: self._id_of("eos_token"))
    pad_token_id = property(lambda self: self._id_of("pad_token"))
    unk_token_id = property(lambda self: self._id_of("unk_token"))

    # ----- text <-> ids --------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor
        (BOS/EOS templates) as transformers does."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._clean_up_spaces else text

    # ----- chat ----------------------------------------------------------------------
    def get_chat_template(self, chat_template: str | None = None, tools: list | None = None) -> str:
        """The template to render: a named one, the default, or the one given (as transformers chooses)."""
        templates = self.chat_template
        if isinstance(templates, dict):
            if chat_template in templates:
                return templates[chat_template]
            if chat_template is not None:
                return chat_template
            if tools is not None and "tool_use" in templates:
                return templates["tool_use"]
            if "default" in templates:
                return templates["default"]
            raise ValueError(f"this model has several chat templates and none is the default: {sorted(templates)}")
        if chat_template is not None:
            return chat_template
        if templates is None:
            raise ValueError(f"the tokenizer of {self.model_dir!r} has no chat template")
        return templates

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list | None = None,
                            documents: list | None = None, chat_template: str | None = None,
                            add_generation_prompt: bool = False, continue_final_message: bool = False,
                            tokenize: bool = True, **kwargs) -> str | list[int]:
        """Render one conversation with transformers' renderer (special tokens as template
        variables, kwargs overriding them); token ids unless `tokenize=False`."""
        from transformers.utils.chat_template_utils import render_jinja_template

        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        messages = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
        rendered, _ = render_jinja_template(
            conversations=[messages], tools=tools, documents=documents,
            chat_template=self.get_chat_template(chat_template, tools),
            continue_final_message=continue_final_message, add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs})
        return self.encode(rendered[0], add_special_tokens=False) if tokenize else rendered[0]


def load_chat_template(template: str | None) -> str | None:
    """A chat template given as a file path or as inline Jinja, as its text (None stays None)."""
    if template is None:
        return None
    if not isinstance(template, str) or not template:
        raise ValueError(f"chat_template must be a file path or a Jinja template, got {template!r}")
    if os.path.isfile(template):
        with open(template, encoding="utf-8") as f:
            return f.read()
    if "{{" in template or "{%" in template:
        return template
    raise ValueError(f"chat_template {template!r} is neither a file nor a Jinja template (no '{{{{' or '{{%')")


def load_tokenizer(path: str | None, chat_template: str | None = None):
    """The tokenizer of a model directory or Hub id (`model_files.resolve_model_path`, config
    and tokenizer files only), or None when it has none. `Tokenizer` (no torch) for a fast
    tokenizer; transformers' AutoTokenizer for a slow-only one. `chat_template` (a file or
    inline Jinja) replaces the model's template for every conversation this tokenizer renders."""
    if path is not None and not os.path.isdir(path):
        from .model_files import resolve_model_path

        path = resolve_model_path(path, weights=False)
    if path is None or not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        return None
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        tokenizer = Tokenizer(path)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    if chat_template is not None:
        tokenizer.chat_template = load_chat_template(chat_template)
    return tokenizer


def eos_token_ids(model_dir: str, hf_config, tokenizer) -> set[int]:
    """End-of-sequence ids: generation_config.json's, the model config's, else the tokenizer's."""
    ids: set[int] = set()
    for eos in (_read_json(os.path.join(model_dir, "generation_config.json")).get("eos_token_id"),
                getattr(hf_config, "eos_token_id", None)):
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
