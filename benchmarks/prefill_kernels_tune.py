"""Variants of the prefill kernels whose speed the 8k / 32k TTFT depends on, timed on one GPU
at the 2.3B model's shapes (bf16): extend attention (one q head per program vs GQA-packed
rows, tile sizes) against the paged kernel and torch's SDPA, and the causal conv's tiling.
Each row checks its output against the first variant of its table first.

    python benchmarks/prefill_kernels_tune.py
"""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from hybrid_serve.kernels.attention import extend_attention, paged_attention, store_kv
from hybrid_serve.kernels.causal_conv1d import causal_conv1d_varlen
from hybrid_serve.kernels.causal_conv1d import triton_conv


def cuda_ms(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def attention_table(prefix: int, new: int, Hq=16, Hkv=2, D=256):
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    ctx = prefix + new
    k_cache = torch.randn(ctx + 16, Hkv, D, device=dev, dtype=bf, generator=g)
    v_cache = torch.randn(ctx + 16, Hkv, D, device=dev, dtype=bf, generator=g)
    req_to_token = torch.zeros(2, ctx + 16, dtype=torch.int32, device=dev)
    req_to_token[1, :ctx] = torch.randperm(ctx, device=dev).int() + 16  # scattered pages
    q = torch.randn(new, Hq, D, device=dev, dtype=bf, generator=g)
    k = torch.randn(new, Hkv, D, device=dev, dtype=bf, generator=g)
    v = torch.randn(new, Hkv, D, device=dev, dtype=bf, generator=g)
    store_kv(k_cache, v_cache, req_to_token[1, prefix:ctx].long(), k, v)
    rows, pre = torch.tensor([1], device=dev, dtype=torch.int32), torch.tensor([prefix], device=dev, dtype=torch.int32)
    cu = torch.tensor([0, new], device=dev, dtype=torch.int32)
    scale = D ** -0.5
    flops = 4.0 * Hq * D * (new * prefix + new * new / 2)
    variants = [("extend packed 128x64 w8 s2", dict(pack_group=True, block_m=128, block_n=64, num_warps=8)),
                ("extend packed 128x32 w8 s2", dict(pack_group=True, block_m=128, block_n=32, num_warps=8)),
                ("extend packed 64x64 w4 s2", dict(pack_group=True, block_m=64, block_n=64, num_warps=4)),
                ("extend packed 128x64 w8 s3", dict(pack_group=True, block_m=128, block_n=64, num_warps=8, num_stages=3)),
                ("extend per-head 64x64 w8 s2", dict(pack_group=False, block_m=64, block_n=64, num_warps=8)),
                ("extend per-head 128x64 w8 s2", dict(pack_group=False, block_m=128, block_n=64, num_warps=8)),
                ("extend per-head 64x32 w4 s2", dict(pack_group=False, block_m=64, block_n=32, num_warps=4))]
    want = None
    print(f"attention: prefix {prefix}, new {new}, Hq {Hq}, Hkv {Hkv}, D {D}")
    for name, kw in variants:
        fn = lambda kw=kw: extend_attention(q, k, v, k_cache, v_cache, req_to_token, rows, pre, cu, scale, **kw)
        try:
            out = fn()
            want = out if want is None else want
            ms = cuda_ms(fn)
            print(f"  {name:34s} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  err {rel(out, want):.1e}")
        except Exception as exc:  # noqa: BLE001 - a config that does not fit
            print(f"  {name:34s} failed: {type(exc).__name__}: {str(exc)[:100]}")
    fn = lambda: paged_attention(q, k_cache, v_cache, req_to_token, rows, pre, cu, scale)
    out = fn()
    ms = cuda_ms(fn)
    print(f"  {'paged kernel':34s} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  err {rel(out, want):.1e}")
    if prefix == 0:
        qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True, scale=scale)
        out = fn()[0].transpose(0, 1)
        ms = cuda_ms(fn)
        print(f"  {'torch sdpa (dense, no pages)':34s} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  "
              f"err {rel(out, want):.1e}")


def conv_table(T=8192, D=8192, K=4):
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(T, D + 512, device=dev, dtype=bf)[:, :D]  # a strided view, as the model's
    w = torch.randn(D, K, device=dev, dtype=bf) * 0.3
    pool = torch.randn(4, D, K - 1, device=dev, dtype=bf)
    slots = torch.tensor([1], device=dev, dtype=torch.int32)
    cu = torch.tensor([0, T], device=dev, dtype=torch.int32)
    bytes_moved = 2 * T * D * 2
    print(f"causal conv: T {T}, D {D}, K {K} (copy floor at 3 TB/s {bytes_moved / 3e9:.3f} ms)")
    want = None
    for tile in (64, 128, 256, 512):
        for bd in (64, 128, 256):
            for bt in (16, 32, 64):
                triton_conv.TOKEN_TILE = tile
                fn = lambda bd=bd, bt=bt: causal_conv1d_varlen(x, w, None, pool.clone(), slots, cu, "silu",
                                                               max_seqlen=T, block_d=bd, block_t=bt)
                out = fn()
                want = out if want is None else want
                ms = cuda_ms(fn)
                print(f"  tile {tile:4d} block_d {bd:4d} block_t {bt:3d} {ms:8.3f} ms  err {rel(out, want):.1e}")


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0))
    attention_table(0, 8192)
    attention_table(24576, 8192)
    conv_table()
