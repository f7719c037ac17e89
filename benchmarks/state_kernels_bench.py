"""Prefill state kernels on one GPU: our chunked Gated DeltaNet and Mamba2 SSD against the
token-by-token recurrent kernels and, where importable, fla's chunk_gated_delta_rule, at the
benchmark models' shapes, bf16 inputs, fp32 state. Each row: median GPU time (CUDA events),
and the relative RMS error against the recurrent kernel (the reference on the GPU).

    python benchmarks/state_kernels_bench.py [--tokens 8192] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from hybrid_serve.kernels._chunks import build_chunk_table  # noqa: E402
from hybrid_serve.kernels.gated_delta import (  # noqa: E402
    gated_delta_rule_chunked, gated_delta_rule_recurrent, gdn_gating,
)
from hybrid_serve.kernels.mamba_ssm import selective_state_update_varlen, ssd_chunked  # noqa: E402


def cuda_ms(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30))


def matmul_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = cuda_ms(lambda: a @ b, reps=10)
    return 2 * 8192**3 / ms / 1e9


def gdn_rows(lens: list[int], H=16, HV=32, D=128, checkpoint_every=256) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    T, dev, bf = sum(lens), "cuda", torch.bfloat16
    q = torch.randn(T, H, D, device=dev, dtype=bf, generator=g)
    k = torch.randn(T, H, D, device=dev, dtype=bf, generator=g)
    v = torch.randn(T, HV, D, device=dev, dtype=bf, generator=g)
    a = torch.randn(T, HV, device=dev, dtype=bf, generator=g)
    b = torch.randn(T, HV, device=dev, dtype=bf, generator=g)
    A_log = torch.rand(HV, device=dev) * 2
    dt_bias = torch.randn(HV, device=dev)
    gate, beta = gdn_gating(a, b, A_log, dt_bias)
    B = len(lens)
    slots = torch.arange(1, B + 1, device=dev, dtype=torch.int32)
    cu_list = [0]
    for n in lens:
        cu_list.append(cu_list[-1] + n)
    cu = torch.tensor(cu_list, device=dev, dtype=torch.int32)
    ckpts = [(0, o, B + 1 + i) for i, o in enumerate(range(checkpoint_every, lens[0], checkpoint_every))]
    pool0 = torch.randn(B + 2 + len(ckpts), HV, D, D, device=dev) * 0.01
    chunks = build_chunk_table(cu_list, [0] * B, ckpts, dev, 64)
    chunks_plain = build_chunk_table(cu_list, [0] * B, [], dev, 64)
    pools = {name: pool0.clone() for name in ("rec", "chunk", "fla")}
    o_rec = gated_delta_rule_recurrent(q, k, v, gate, beta, pools["rec"], slots, cu)
    o_chunk = gated_delta_rule_chunked(q, k, v, gate, beta, pools["chunk"], slots, chunks)
    rows = [{"kernel": "gdn recurrent (token by token)", "tokens": T, "rows": B,
             "ms": cuda_ms(lambda: gated_delta_rule_recurrent(q, k, v, gate, beta, pool0.clone(), slots, cu)),
             "rel_err_vs_recurrent": 0.0},
            {"kernel": f"gdn chunked (ours, {len(ckpts)} checkpoints)", "tokens": T, "rows": B,
             "ms": cuda_ms(lambda: gated_delta_rule_chunked(q, k, v, gate, beta, pool0.clone(), slots, chunks)),
             "rel_err_vs_recurrent": rel(o_chunk, o_rec),
             "state_rel_err": rel(pools["chunk"][1:B + 1], pools["rec"][1:B + 1])},
            {"kernel": "gdn chunked (ours, no checkpoints)", "tokens": T, "rows": B,
             "ms": cuda_ms(lambda: gated_delta_rule_chunked(q, k, v, gate, beta, pool0.clone(), slots, chunks_plain)),
             "rel_err_vs_recurrent": None}]
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as exc:
        print(f"fla not importable ({exc}): no fla row")
        return rows
    init = pool0[1:B + 1].clone()

    def fla_call():
        return chunk_gated_delta_rule(q[None], k[None], v[None], gate[None], beta[None], scale=D ** -0.5,
                                      initial_state=init, output_final_state=True, cu_seqlens=cu.long(),
                                      use_qk_l2norm_in_kernel=True)

    o_fla, final = fla_call()
    rows.append({"kernel": "gdn chunked (fla chunk_gated_delta_rule)", "tokens": T, "rows": B,
                 "ms": cuda_ms(fla_call), "rel_err_vs_recurrent": rel(o_fla[0], o_rec),
                 "state_rel_err": rel(final, pools["rec"][1:B + 1])})
    return rows


def ssd_rows(lens: list[int], H=48, G=8, P=64, N=128) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(1)
    T, dev, bf = sum(lens), "cuda", torch.bfloat16
    x = torch.randn(T, H, P, device=dev, dtype=bf, generator=g)
    dt = torch.randn(T, H, device=dev, dtype=bf, generator=g) - 2
    A = -torch.rand(H, device=dev) - 0.5
    xbc = torch.randn(T, 2 * G * N, device=dev, dtype=bf, generator=g)
    Bm, Cm = xbc[:, : G * N].view(T, G, N), xbc[:, G * N:].view(T, G, N)
    D, dt_bias = torch.randn(H, device=dev), torch.randn(H, device=dev)
    B = len(lens)
    slots = torch.arange(1, B + 1, device=dev, dtype=torch.int32)
    cu_list = [0]
    for n in lens:
        cu_list.append(cu_list[-1] + n)
    cu = torch.tensor(cu_list, device=dev, dtype=torch.int32)
    pool0 = torch.randn(B + 1, H, P, N, device=dev) * 0.01
    chunks = build_chunk_table(cu_list, [0] * B, [], dev, 64)
    kw = dict(dt_limit=(0.0, float("inf")), out_dtype=torch.float32)
    p_rec, p_chunk = pool0.clone(), pool0.clone()
    y_rec = selective_state_update_varlen(x, dt, A, Bm, Cm, D, dt_bias, p_rec, slots, cu, **kw)
    y_chunk = ssd_chunked(x, dt, A, Bm, Cm, D, dt_bias, p_chunk, slots, chunks, **kw)
    return [{"kernel": "mamba2 recurrent (token by token)", "tokens": T, "rows": B,
             "ms": cuda_ms(lambda: selective_state_update_varlen(x, dt, A, Bm, Cm, D, dt_bias, pool0.clone(), slots,
                                                                 cu, **kw)), "rel_err_vs_recurrent": 0.0},
            {"kernel": "mamba2 ssd chunked (ours)", "tokens": T, "rows": B,
             "ms": cuda_ms(lambda: ssd_chunked(x, dt, A, Bm, Cm, D, dt_bias, pool0.clone(), slots, chunks, **kw)),
             "rel_err_vs_recurrent": rel(y_chunk, y_rec), "state_rel_err": rel(p_chunk[1:], p_rec[1:])}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name(0)}: bf16 matmul {matmul_tflops():.0f} TFLOP/s", flush=True)
    rows = gdn_rows([args.tokens]) + gdn_rows([args.tokens // 4] * 4) + ssd_rows([args.tokens])
    print(f"{'kernel':48s} {'tokens':>6s} {'rows':>4s} {'ms':>8s} {'rel err':>9s} {'state err':>9s}")
    for r in rows:
        err = "-" if r["rel_err_vs_recurrent"] is None else f"{r['rel_err_vs_recurrent']:.2e}"
        st = f"{r['state_rel_err']:.2e}" if "state_rel_err" in r else "-"
        print(f"{r['kernel']:48s} {r['tokens']:6d} {r['rows']:4d} {r['ms']:8.3f} {err:>9s} {st:>9s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
