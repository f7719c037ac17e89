"""Kernel tests: Triton kernels vs their ref.py, on CPU through Triton's interpreter.

TRITON_INTERPRET must be set before any @triton.jit runs (decoration time), so it is set
here, before the kernel modules are imported, unless a CUDA device is present: then the
tests run the compiled kernels on the GPU (tiny shapes and the `gpu`-marked serving shapes).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# index-range checks sync on CUDA, so launchers run them only on request: the tests ask
os.environ.setdefault("HYBRID_SERVE_KERNEL_CHECKS", "1")


def pytest_configure(config):
    # the interpreter evaluates masked-off lanes too (e.g. 0 / 0 where a mask discards the result)
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
