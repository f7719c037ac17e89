"""GDN recurrent decode kernel at the 2.3B layout's shapes (H=16, HV=32, D=128, fp32 state in a
pool): time and state bandwidth per (block_v, num_warps), batch 1 and 64.

    python benchmarks/gdn_sweep.py
"""
from __future__ import annotations

import torch
import triton.testing

from hybrid_serve.kernels.gated_delta import gated_delta_rule_recurrent


def main() -> None:
    torch.manual_seed(0)
    H, HV, D = 16, 32, 128
    for batch in (1, 64):
        pool = torch.randn(batch + 9, HV, D, D, device="cuda") * 0.01
        slots = torch.randperm(batch + 8, device="cuda")[:batch].int() + 1
        cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
        q = torch.randn(batch, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, H, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(batch, HV, D, device="cuda", dtype=torch.bfloat16)
        g = -torch.rand(batch, HV, device="cuda")
        beta = torch.rand(batch, HV, device="cuda")
        state_bytes = batch * HV * D * D * 4 * 2
        ref = gated_delta_rule_recurrent(q, k, v, g, beta, pool.clone(), slots, cu)
        for bv in (16, 32, 64, 128):
            for warps in (1, 2, 4, 8):
                work = pool.clone()
                out = gated_delta_rule_recurrent(q, k, v, g, beta, work, slots, cu, block_v=bv, num_warps=warps)
                err = float((out.float() - ref.float()).abs().max())
                us = triton.testing.do_bench_cudagraph(
                    lambda: gated_delta_rule_recurrent(q, k, v, g, beta, work, slots, cu, block_v=bv,
                                                       num_warps=warps), rep=30) * 1e3
                print(f"batch {batch:3d} block_v {bv:4d} warps {warps}: {us:7.1f} us, "
                      f"{state_bytes / us / 1e3:6.0f} GB/s, max diff vs default {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
