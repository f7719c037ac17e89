"""kernels/_launch.py's FastLaunch with a stand-in for Triton's JIT function (the real launches
run in the GPU kernel tests with HYBRID_SERVE_TRITON_FAST_LAUNCH=1): a miss goes through the
JIT path and keeps its compiled kernel, a hit launches that kernel directly with the grid and
the bound arguments in signature order, a new specialization or launch option misses again,
and profiler hooks send every launch through the JIT path."""
import pytest
import torch

pytest.importorskip("triton")
from triton import knobs  # noqa: E402

from hybrid_serve.kernels import _launch  # noqa: E402


class _Compiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, log):
        self.log = log

    def run(self, *launch):
        self.log.append(("run", launch))


class _Jit:
    """Binds (x, n, BLOCK): specialization from n's value class, as Triton's binder would."""

    def __init__(self):
        self.log, self.compiled = [], {}
        self.device_caches = {}

    def _binder(self, x, n, BLOCK, **options):
        return {"x": x, "n": n, "BLOCK": BLOCK}, [("*fp32", "D"), ("i32", "D" if n % 16 == 0 else ""),
                                                  ("constexpr", BLOCK)], options

    def __getitem__(self, grid):
        def jit_launch(*args, **kwargs):
            self.device_caches.setdefault(0, (None, None, None, None, self._binder))
            bound, spec, options = self._binder(*args, **kwargs)
            key = (tuple(spec), tuple(options.items()))
            kernel = self.compiled.setdefault(key, _Compiled(self.log))
            self.log.append(("jit", grid, tuple(bound.values())))
            return kernel
        return jit_launch


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)


def test_hits_launch_the_kept_kernel(fake_cuda):
    jit = _Jit()
    fast = _launch.FastLaunch(jit)
    fast[(4,)]("x0", 32, BLOCK=64)  # first launch on the device: the JIT path builds its binder
    fast[(4,)]("x0", 48, BLOCK=64)  # same specialization, not yet kept: JIT path, kept now
    fast[(5, 2)]("x1", 64, BLOCK=64)  # hit
    assert [e[0] for e in jit.log] == ["jit", "jit", "run"]
    assert jit.log[-1] == ("run", (5, 2, 1, 77, "fn", "meta", None, None, None, "x1", 64, 64))
    fast[lambda meta: (meta["n"] // 8,)]("x2", 80, BLOCK=64)  # a grid function gets the bound args
    assert jit.log[-1] == ("run", (10, 1, 1, 77, "fn", "meta", None, None, None, "x2", 80, 64))
    fast[(1,)]("x3", 7, BLOCK=64)  # n % 16 != 0: another specialization, a miss
    fast[(1,)]("x3", 7, BLOCK=64, num_warps=8)  # another launch option: a miss
    fast[(1,)]("x4", 9, BLOCK=64, num_warps=8)
    assert [e[0] for e in jit.log[-3:]] == ["jit", "jit", "run"]
    assert len(fast.cache) == 3


def test_hooks_take_the_jit_path(fake_cuda, monkeypatch):
    jit = _Jit()
    fast = _launch.FastLaunch(jit)
    for _ in range(3):  # binder built, kernel kept, hit
        fast[(1,)]("x", 16, BLOCK=32)
    assert jit.log[-1][0] == "run"  # Triton's default hooks: empty chains
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    fast[(1,)]("x", 16, BLOCK=32)
    assert jit.log[-1][0] == "jit"


def test_install_only_when_enabled(monkeypatch):
    """On by default, off with HYBRID_SERVE_TRITON_FAST_LAUNCH=0 and under the interpreter;
    only JIT functions named *_kernel are wrapped."""
    import sys
    import types
    monkeypatch.delenv(_launch.FAST_LAUNCH_ENV, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert _launch.fast_launch_enabled()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _launch.fast_launch_enabled()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv(_launch.FAST_LAUNCH_ENV, "0")
    assert not _launch.fast_launch_enabled()
    module = types.ModuleType("fast_launch_test_module")
    module.marker_kernel = object()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    _launch.install_fast_launch(module.__name__)
    assert not isinstance(module.marker_kernel, _launch.FastLaunch)
    monkeypatch.delenv(_launch.FAST_LAUNCH_ENV)
    _launch.install_fast_launch(module.__name__)  # enabled, but not a JIT function
    assert not isinstance(module.marker_kernel, _launch.FastLaunch)


class _PdlJit(_Jit):
    """A kernel declaring `PDL: tl.constexpr = False`: the binder records PDL and the options."""
    arg_names = ["x", "n", "BLOCK", "PDL"]

    def _binder(self, x, n, BLOCK, PDL=False, **options):
        bound, spec, options = super()._binder(x, n, BLOCK, **options)
        return {**bound, "PDL": PDL}, spec + [("constexpr", PDL)], options


def last_pdl(jit: _Jit) -> bool:
    """The PDL argument of the last launch, through the JIT path or a kept kernel."""
    kind, *launch = jit.log[-1]
    return launch[1][-1] if kind == "jit" else launch[0][-1]


def test_pdl_launches_kernels_that_declare_it(fake_cuda, monkeypatch):
    """HYBRID_SERVE_PDL=1 on a Hopper-class device: a kernel with a PDL parameter launches with
    PDL=True and Triton's launch_pdl option (a kernel of its own in the cache); off by the
    variable, on an older GPU, for a kernel without the parameter, or where the caller passes PDL."""
    capability = {"major": 9}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (capability["major"], 0))
    monkeypatch.setattr(_launch, "_PDL_DEVICES", {})
    jit, plain = _PdlJit(), _Jit()
    fast, fast_plain = _launch.FastLaunch(jit), _launch.FastLaunch(plain)
    assert fast.declares_pdl and not fast_plain.declares_pdl
    monkeypatch.delenv(_launch.PDL_ENV, raising=False)  # on by default
    for _ in range(3):
        fast[(2,)]("x", 16, BLOCK=32)
        fast_plain[(2,)]("x", 16, BLOCK=32)
    assert jit.log[-1] == ("run", (2, 1, 1, 77, "fn", "meta", None, None, None, "x", 16, 32, True))
    assert list(jit.compiled) == [((("*fp32", "D"), ("i32", "D"), ("constexpr", 32), ("constexpr", True)),
                                   (("launch_pdl", True),))]
    assert plain.log[-1] == ("run", (2, 1, 1, 77, "fn", "meta", None, None, None, "x", 16, 32))
    fast[(2,)]("x", 16, BLOCK=32, PDL=False)  # the caller's choice stands
    assert last_pdl(jit) is False
    monkeypatch.setenv(_launch.PDL_ENV, "0")
    fast[(2,)]("x", 16, BLOCK=32)
    assert last_pdl(jit) is False
    monkeypatch.setenv(_launch.PDL_ENV, "1")
    monkeypatch.setattr(_launch, "_PDL_DEVICES", {})
    capability["major"] = 8  # an A100: no programmatic launch
    fast[(2,)]("x", 16, BLOCK=32)
    assert last_pdl(jit) is False
    monkeypatch.setattr(_launch, "_PDL_DEVICES", {})
    capability["major"] = 9
    monkeypatch.setattr(torch.version, "hip", "6.2")  # ROCm reports an MI300 as 9.4: no PDL
    fast[(2,)]("x", 16, BLOCK=32)
    assert last_pdl(jit) is False
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv(_launch.PDL_ENV, "yes")
    with pytest.raises(ValueError, match="HYBRID_SERVE_PDL must be 0 or 1, got 'yes'"):
        fast[(2,)]("x", 16, BLOCK=32)
