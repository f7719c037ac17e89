"""The skinny linear as a card compiles it, on the CPU: the launches `skinny_linear` makes
(recorded, not run) compiled for sm_90 with Triton's own ptxas (benchmarks/skinny_compile_check.py).
The interpreter runs the kernel's arithmetic but not its compiled schedule: only this shows that
the first K tile's weight loads are issued before the PDL wait (`pdl_enter`: they stream while
the kernel before finishes), that nothing spills and that the K loop stays a plain loop (no
cp.async); and the one-token experts' kernel of HYBRID_SERVE_MOE_ONE_ROW_TILES=skinny, no spills
either. Slow-ish (a few compiles, ~20 s)."""
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
out = {name: compile_launch(rec, 90) for name, rec in launches.items()}

# the experts of a one-token fused_moe under HYBRID_SERVE_MOE_ONE_ROW_TILES=skinny (Qwen3-Next's shapes)
from hybrid_serve.kernels.moe import skinny_experts, triton_moe
from skinny_compile_check import record_launches
triton_moe.check_launch_device = lambda *a, **k: None
triton_moe.check_index_range = lambda *a, **k: None
os.environ["HYBRID_SERVE_MOE_ONE_ROW_TILES"] = "skinny"
E, I = 512, 512
moe = record_launches(skinny_experts, "_moe_skinny_kernel", lambda: triton_moe.fused_moe(
    h, torch.zeros(E, 2 * I, 2048, dtype=bf), torch.zeros(E, 2048, I, dtype=bf), torch.zeros(1, 10, dtype=bf),
    torch.arange(10).view(1, 10), combine=False))
for name, rec in zip(("moe_skinny_gate_up", "moe_skinny_down"), moe):
    out[name] = compile_launch(rec, 90, skinny_experts._moe_skinny_kernel)
print("RESULT " + json.dumps(out))
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
    assert set(got) == {"out_proj+gated_norm", "moe_x_proj+add_norm", "moe_skinny_gate_up", "moe_skinny_down"}
    for name, result in got.items():
        assert "error" not in result, (name, result)
        assert result["spill_bytes"] == 0, (name, result)
        if not name.startswith("moe_skinny"):  # the experts wait first: their ids come from the kernel before
            assert result["loads_before_wait"] > 0, (name, result)  # the first weight tile streams before the wait
        assert result["cp_async"] == 0, (name, result)  # a plain K loop
        assert result["programs_per_sm"] >= 3, (name, result)  # session 46: 4 (out_proj) and 6 an SM
