"""Where a model's files are: a local directory, or a Hugging Face Hub id resolved to a local
snapshot (pure Python: the ingress and the CLI call it without torch).

    resolve_model_path("/models/Qwen3.5-0.8B")              # a directory: returned as given
    resolve_model_path("Qwen/Qwen3.5-0.8B")                 # .../hub/models--Qwen--Qwen3.5-0.8B/snapshots/<sha>
    resolve_model_path("Qwen/Qwen3.5-0.8B", weights=False)  # config, tokenizer, template files only

A local directory wins over a Hub id of the same name. Otherwise `huggingface_hub.snapshot_download`
fetches what is missing from the Hub; offline (HF_HUB_OFFLINE=1) or when the Hub cannot be reached,
the snapshot is looked up in the local cache only (HF_HOME / HF_HUB_CACHE). Anything else is a
ValueError naming the model and the cache it looked in.
"""
from __future__ import annotations

import os

# What a serving engine reads from a repository: configs, tokenizer files, chat templates
# (remote code only runs with trust_remote_code), and the safetensors weights.
CONFIG_PATTERNS = ("*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken", "*.py")
WEIGHT_PATTERNS = ("*.safetensors",)


def is_hub_id(name: str) -> bool:
    """`org/name` or `name` as the Hub spells repository ids (not a path)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.startswith(("/", ".", "~")) or "\\" in name:  # a path that does not exist
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def _cache_note() -> str:
    from huggingface_hub import constants

    return f"HF_HOME={constants.HF_HOME}, hub cache {constants.HF_HUB_CACHE}"


def resolve_model_path(model: str, revision: str | None = None, *, weights: bool = True) -> str:
    """The local directory holding `model`'s files.

    model: a local directory (returned unchanged), or a Hub id such as `Qwen/Qwen3.5-0.8B`.
    revision: a branch, tag or commit of the Hub repository (default: main); unused for a directory.
    weights: also fetch the `*.safetensors` files (False: configs, tokenizer and templates only,
        e.g. for the tokenizer or for dummy weights).
    Raises ValueError when it is neither a directory nor found on the Hub or in the local cache.
    """
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a directory or a Hugging Face Hub id, got {model!r}")
    if os.path.isdir(model):
        return model
    if not is_hub_id(model):
        raise ValueError(f"model directory {model!r} does not exist (and it is not a Hugging Face Hub id)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    patterns = list(CONFIG_PATTERNS + (WEIGHT_PATTERNS if weights else ()))
    where = f"{model!r}" + (f" at revision {revision!r}" if revision else "")
    missing = (f"{where} is not a local directory and not found on the Hub or in the local cache "
               f"({_cache_note()})")
    hub_error = "the Hub was not asked: HF_HUB_OFFLINE is set"
    if not _offline():
        try:
            return snapshot_download(model, revision=revision, allow_patterns=patterns)
        except GatedRepoError as exc:  # (a RepositoryNotFoundError) raised after the cache was looked in
            raise ValueError(f"{where} is a gated Hub repository and not in the local cache ({_cache_note()}): "
                             f"accept its terms on huggingface.co and log in (`hf auth login` or HF_TOKEN)") from exc
        except RepositoryNotFoundError as exc:
            raise ValueError(f"{missing}; a private repository needs a login (`hf auth login` or HF_TOKEN)") from exc
        except RevisionNotFoundError as exc:
            raise ValueError(f"{where}: no such revision on the Hub") from exc
        except Exception as exc:  # noqa: BLE001 - the network or the Hub failed: the local cache may have it
            hub_error = f"the Hub could not be used: {type(exc).__name__}: {_first_line(exc)}"
    try:
        return snapshot_download(model, revision=revision, allow_patterns=patterns, local_files_only=True)
    except LocalEntryNotFoundError as exc:
        raise ValueError(f"{missing} ({hub_error}; no snapshot of it in the cache)") from exc
    except Exception as exc:  # noqa: BLE001 - e.g. an incomplete snapshot
        raise ValueError(f"{missing} ({hub_error}; the cache: {type(exc).__name__}: {_first_line(exc)})") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
