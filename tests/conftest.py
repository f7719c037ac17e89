import os
import sys

import torch

if not torch.cuda.is_available():  # kernels read it when first imported: set it before any test module
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(2)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def reference_models(tmp_path_factory):
    """family -> (model_dir, transformers model), built once per session."""
    from hf_reference import build_reference

    cache = {}

    def get(family: str):
        if family not in cache:
            out_dir = str(tmp_path_factory.mktemp(f"ref_{family}"))
            cache[family] = (out_dir, build_reference(family, out_dir))
        return cache[family]

    return get
