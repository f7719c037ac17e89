"""The skinny linear's experiment variants as a card would compile them, on the CPU: the launches
`skinny_linear` makes (recorded, not run) compiled for sm_90 with Triton's own ptxas
(benchmarks/skinny_compile_check.py). The interpreter runs the kernel's arithmetic but not its
compiled schedule: only this shows the prefetched tiles' weight loads issued before the PDL wait
(HYBRID_SERVE_SKINNY_PREFETCH) and the pipelined K loop going through cp.async
(HYBRID_SERVE_SKINNY_PIPELINE), neither spilling. Slow-ish (a few compiles, ~30 s)."""
import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
from hybrid_serve.kernels.linear import triton_linear
from skinny_compile_check import compile_launch, record_launch

triton_linear.check_launch_device = lambda name, t: None  # CPU tensors: the launch is recorded, not run
bf = torch.bfloat16
x, w = torch.zeros(1, 4096, dtype=bf), torch.zeros(2048, 4096, dtype=bf)  # an out projection
z, nw = torch.zeros(1, 32, 128, dtype=bf), torch.ones(128, dtype=bf)  # its gated norm's gate and weight
out = {}
for name, env in (("default", {}), ("prefetch4", {"HYBRID_SERVE_SKINNY_PREFETCH": "4"}),
                  ("pipeline3", {"HYBRID_SERVE_SKINNY_PIPELINE": "3"})):
    for key in ("HYBRID_SERVE_SKINNY_PREFETCH", "HYBRID_SERVE_SKINNY_PIPELINE"):
        os.environ.pop(key, None)
    os.environ.update(env)
    rec = record_launch((x, w), {"x_gated_norm": (z, nw, 1e-6)})
    out[name] = dict(compile_launch(rec, 90), pre_tiles=rec["kwargs"]["PRE_TILES"][1],
                     stages=rec["kwargs"]["LOOP_STAGES"][1])
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(not all(os.path.exists(os.path.join(BIN, tool)) for tool in ("ptxas", "cuobjdump")),
                    reason="this Triton wheel carries no ptxas / cuobjdump")
def test_skinny_variants_compile_for_sm90_with_their_loads_where_intended():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled kernels, not interpreted
    proc = subprocess.run([sys.executable, "-c", SCRIPT, BENCHMARKS], capture_output=True, text=True, env=env,
                          timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-3000:]
    got = json.loads(line[len("RESULT "):])
    for name, result in got.items():
        assert "error" not in result, (name, result)
        assert result["spill_bytes"] == 0, (name, result)
    default, prefetch, pipeline = got["default"], got["prefetch4"], got["pipeline3"]
    assert (default["pre_tiles"], prefetch["pre_tiles"], pipeline["stages"]) == (1, 4, 3)
    # the first tile's weight loads before the wait by default, all four tiles' with T = 4
    assert default["loads_before_wait"] > 0
    assert prefetch["loads_before_wait"] == 4 * default["loads_before_wait"]
    assert default["cp_async"] == 0 and pipeline["cp_async"] > 0  # the pipelined loop: cp.async into shared memory
