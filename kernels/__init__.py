"""Kernels: one folder per op family.

Each folder has `ref.py` (plain torch: the executable spec and the CPU path) and, where
a GPU kernel exists, the Triton kernel behind one public function. This package imports
nothing from the rest of hybrid_serve.
"""
