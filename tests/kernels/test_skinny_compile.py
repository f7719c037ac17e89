"""The skinny linear as a card compiles it, on the CPU: the launches `skinny_linear` makes
(recorded, not run) compiled for sm_90 with Triton's own ptxas (benchmarks/skinny_compile_check.py).
The interpreter runs the kernel's arithmetic but not its compiled schedule: only this shows that
the first K tile's weight loads are issued before the PDL wait (`pdl_enter`: they stream while
the kernel before finishes), that nothing spills and that the K loop stays a plain loop (no
cp.async). Slow-ish (a few compiles, ~20 s)."""
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
from hybrid_serve.kernels.linear import AddNormInput, triton_linear
from skinny_compile_check import compile_launch, record_launch

triton_linear.check_launch_device = lambda name, t: None  # CPU tensors: the launch is recorded, not run
bf = torch.bfloat16
x, w = torch.zeros(1, 4096, dtype=bf), torch.zeros(2048, 4096, dtype=bf)  # an out projection
z, nw = torch.zeros(1, 32, 128, dtype=bf), torch.ones(128, dtype=bf)  # its gated norm's gate and weight
h, wx, res = torch.zeros(1, 2048, dtype=bf), torch.zeros(1537, 2048, dtype=bf), torch.zeros(1, 2048, dtype=bf)
sums = torch.zeros(1, 2048, dtype=bf), torch.zeros(1, 2048, dtype=bf)
launches = {"out_proj+gated_norm": record_launch((x, w), {"x_gated_norm": (z, nw, 1e-6)}),
            "moe_x_proj+add_norm": record_launch((h, wx), {"x_add_norm": AddNormInput(res, torch.ones(2048, dtype=bf),
                                                                                  1e-6, True, False, *sums)})}
print("RESULT " + json.dumps({name: compile_launch(rec, 90) for name, rec in launches.items()}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not all(os.path.exists(os.path.join(BIN, tool)) for tool in ("ptxas", "cuobjdump")),
                    reason="this Triton wheel carries no ptxas / cuobjdump")
def test_skinny_launches_compile_for_sm90_with_the_first_tile_before_the_wait():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled kernels, not interpreted
    proc = subprocess.run([sys.executable, "-c", SCRIPT, BENCHMARKS], capture_output=True, text=True, env=env,
                          timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-3000:]
    got = json.loads(line[len("RESULT "):])
    assert set(got) == {"out_proj+gated_norm", "moe_x_proj+add_norm"}
    for name, result in got.items():
        assert "error" not in result, (name, result)
        assert result["spill_bytes"] == 0, (name, result)
        assert result["loads_before_wait"] > 0, (name, result)  # the first weight tile streams before the wait
        assert result["cp_async"] == 0, (name, result)  # a plain K loop
        assert result["programs_per_sm"] >= 3, (name, result)  # session 46: 4 (out_proj) and 6 an SM
