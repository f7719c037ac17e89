"""Fixtures of the deploy tests."""
import pytest

from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.engine.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(AppConfig().tokenizer_path())
