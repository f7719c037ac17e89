"""A leaner host path for launching the kernels (on by default; HYBRID_SERVE_TRITON_FAST_LAUNCH=0 turns it off).

`kernel[grid](...)` costs about 28 us of host time on an H100 host (benchmarks/host_overhead.py),
of which the launch itself (the compiled kernel's launcher) is about 10. The rest is bookkeeping
that a serving loop repeats with the same answer: the launch options turned into a string for
the cache key, the key's lookup, the check of global values, the launch metadata built for
profiling hooks, the device and stream queried through the driver layer. `FastLaunch` keeps
Triton's own binder (so a launch specializes exactly as Triton would: argument types, 16-byte
alignment of pointers, integers equal to 1 or multiples of 16, constexprs), keys its own
cache on that specialization, the launch options and the device, and on a hit calls the
compiled kernel's launcher directly. A miss (or launch hooks set, as profilers do) goes
through Triton's path, which compiles and launches; its compiled kernel is kept.

`install_fast_launch(module_name)` wraps a module's launched kernels (`*_kernel` JIT functions),
rebinding the names its call sites look up.

Programmatic dependent launch (PDL; on by default on NVIDIA Hopper and later,
HYBRID_SERVE_PDL=0 turns it off). A kernel that declares a `PDL: tl.constexpr = False`
parameter and starts with `pdl_enter(PDL)` (kernels/_triton_common.py) is launched with
`PDL=True` and Triton's `launch_pdl`: the GPU may start its programs while the kernel before
it finishes, and they wait in `pdl_enter` until that kernel's writes are visible, so a chain
of short decode kernels (a CUDA graph of ~190 of them at batch 1) stops paying each launch's
ramp in full. A kernel may read its weights before `pdl_enter` (the skinny linear prefetches
its first tile). Rides on this wrapper: with the fast launch off, PDL is off.

On by default since 2026-11-28: the GPU suite passed
with it (session 13), and one prompt's TTFT on an H200 fell from 14.6 to 12.3 ms at 1k tokens
(83.4 to 80.1 ms at 8k) on the 2.3B model (benchmarks/RESULTS.md). Never under Triton's
interpreter (TRITON_INTERPRET=1), whose kernels have no compiled launcher.
"""
from __future__ import annotations

import os
import sys

FAST_LAUNCH_ENV = "HYBRID_SERVE_TRITON_FAST_LAUNCH"
PDL_ENV = "HYBRID_SERVE_PDL"
PDL_DEFAULT = "1"  # on since 2026-11-29 (benchmarks/RESULTS.md, session 26)
_PDL_DEVICES: dict[int, bool] = {}  # device index -> compute capability >= 9.0


def fast_launch_enabled() -> bool:
    return os.environ.get(FAST_LAUNCH_ENV, "1") != "0" and os.environ.get("TRITON_INTERPRET", "0") != "1"


def pdl_enabled(device: int) -> bool:
    """Whether kernels that declare PDL launch with it on `device`: HYBRID_SERVE_PDL (0 or 1,
    default PDL_DEFAULT), read at every launch so one process can A/B it, and an NVIDIA Hopper
    or later GPU (programmatic launch needs compute capability 9.0)."""
    value = os.environ.get(PDL_ENV, PDL_DEFAULT)
    if value not in ("0", "1"):
        raise ValueError(f"{PDL_ENV} must be 0 or 1, got {value!r}")
    if value == "0":
        return False
    capable = _PDL_DEVICES.get(device)
    if capable is None:
        import torch

        # an NVIDIA GPU (ROCm's torch.cuda reports gfx9 parts as capability 9.x: no PDL there)
        capable = _PDL_DEVICES[device] = torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9
    return capable


class FastLaunch:
    """Wraps a JITFunction: `wrapped[grid](*args, **kwargs)` as `fn[grid](...)`; other
    attributes pass through."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.cache: dict = {}
        self.declares_pdl = "PDL" in getattr(fn, "arg_names", ())

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict):
        import torch
        from triton import knobs

        device = torch.cuda.current_device()
        if self.declares_pdl and "PDL" not in kwargs and pdl_enabled(device):
            kwargs = {**kwargs, "PDL": True, "launch_pdl": True}
        if _active(knobs.runtime.launch_enter_hook) or _active(knobs.runtime.launch_exit_hook):
            return self.fn[grid](*args, **kwargs)
        caches = self.fn.device_caches.get(device)
        if caches is None:  # first launch on this device: Triton builds its binder
            return self._miss(None, grid, args, kwargs)
        binder = caches[4]
        bound_args, specialization, options = binder(*args, **kwargs)
        key = (device, tuple(specialization), tuple(options.items()))
        kernel = self.cache.get(key)
        if kernel is None:
            return self._miss(key, grid, args, kwargs)
        if callable(grid):
            grid = grid(bound_args)
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        kernel.run(grid[0], g1, g2, torch._C._cuda_getCurrentRawStream(device), kernel.function,
                   kernel.packed_metadata, None, None, None, *bound_args.values())
        return kernel

    def _miss(self, key, grid, args, kwargs):
        kernel = self.fn[grid](*args, **kwargs)
        if key is not None and kernel is not None and not hasattr(kernel, "result"):
            self.cache[key] = kernel
        return kernel


def _active(hook) -> bool:
    """A launch hook that would do something (Triton 3.6 keeps an empty HookChain by default)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def install_fast_launch(module_name: str) -> None:
    """Wrap the module's launched kernels (module-level `*_kernel` JIT functions) when the
    fast launch is enabled; each kernel module calls it on its last line."""
    if not fast_launch_enabled():
        return
    from triton.runtime.jit import JITFunction

    module = sys.modules[module_name]
    for name, value in list(vars(module).items()):
        if name.endswith("_kernel") and isinstance(value, JITFunction):
            setattr(module, name, FastLaunch(value))
