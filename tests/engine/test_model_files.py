"""Hugging Face Hub ids resolve through a local HF cache with the network off: the resolver,
AppConfig, the tokenizer loader and `LLM(model="org/name")`; a local directory wins; an
unknown id or a missing path is a ValueError that says where it looked."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from hybrid_serve.demo import DEMO_DIR
from hybrid_serve.engine.model_files import is_hub_id, resolve_model_path

REPO_ID, COMMIT = "org/name", "0123456789abcdef0123456789abcdef01234567"


def build_hub_cache(hf_home) -> str:
    """The hub cache layout `snapshot_download` reads: models--org--name/{refs/main, snapshots/<sha>/},
    the demo model's files as the snapshot. Returns the snapshot directory."""
    repo = hf_home / "hub" / "models--org--name"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for name in os.listdir(DEMO_DIR):
        if name.endswith((".json", ".jinja")):
            shutil.copy(os.path.join(DEMO_DIR, name), snapshot / name)
    return str(snapshot)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A local HF cache in tmp and the Hub unreachable: offline mode, and an endpoint nothing
    listens on (huggingface_hub reads its env at import, so its constants are patched too)."""
    from huggingface_hub import constants

    snapshot = build_hub_cache(tmp_path)
    for name, value in (("HF_HOME", str(tmp_path)), ("HF_HUB_CACHE", str(tmp_path / "hub"))):
        monkeypatch.setenv(name, value)
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    return snapshot


def test_hub_id_resolves_from_the_cache_offline(hub_cache):
    assert resolve_model_path(REPO_ID) == hub_cache
    assert resolve_model_path(REPO_ID, weights=False) == hub_cache
    assert resolve_model_path(REPO_ID, revision=COMMIT) == hub_cache


def test_hub_unreachable_falls_back_to_the_cache(hub_cache, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online, but nothing answers at ENDPOINT
    assert resolve_model_path(REPO_ID) == hub_cache


def test_unknown_id_and_missing_path_are_value_errors(hub_cache, tmp_path):
    with pytest.raises(ValueError, match=r"'org/other' is not a local directory and not found on the Hub or in "
                                         r"the local cache \(HF_HOME="):
        resolve_model_path("org/other")
    with pytest.raises(ValueError, match="revision 'v9'"):
        resolve_model_path(REPO_ID, revision="v9")
    with pytest.raises(ValueError, match="model directory '/no/such/dir' does not exist"):
        resolve_model_path("/no/such/dir")


def test_local_directory_wins(hub_cache, tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path(REPO_ID) == REPO_ID
    assert is_hub_id("Qwen/Qwen3.5-0.8B") and not is_hub_id("./model") and not is_hub_id("a/b/c")


def test_app_config_and_tokenizer_take_hub_ids(hub_cache):
    from hybrid_serve.deploy.config import AppConfig
    from hybrid_serve.engine.tokenizer import load_tokenizer

    app = AppConfig(model=REPO_ID, load_format="dummy")
    assert app.model_name == REPO_ID and app.tokenizer_path() == hub_cache
    assert app.engine_config().model == hub_cache
    assert load_tokenizer(REPO_ID).encode("hi") == load_tokenizer(DEMO_DIR).encode("hi")
    with pytest.raises(ValueError, match="not found on the Hub"):
        AppConfig(model="org/other")


def test_llm_generates_from_a_hub_id_with_a_chat_template(hub_cache):
    from hybrid_serve import LLM, SamplingParams

    llm = LLM(model=REPO_ID, load_format="dummy", chat_template="{% for m in messages %}<{{ m.content }}>{% endfor %}")
    assert llm.config.model == hub_cache
    out = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=3, temperature=0.0))
    assert out.prompt == "<hi>" and len(out.outputs[0].token_ids) == 3


def test_env_of_a_fresh_process_is_honoured(tmp_path):
    """HF_HOME and HF_HUB_OFFLINE as a user sets them (read by huggingface_hub at import)."""
    snapshot = build_hub_cache(tmp_path)
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    code = ("from hybrid_serve.engine.model_files import resolve_model_path as r; print(r('org/name'))\n"
            "try:\n    r('org/other')\nexcept ValueError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == snapshot and f"HF_HOME={tmp_path}" in lines[1], out
