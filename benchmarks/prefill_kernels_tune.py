"""Variants of the prefill kernels whose speed the 8k / 32k TTFT depends on, timed on one GPU
at the 2.3B model's shapes (bf16): extend attention (one q head per program vs GQA-packed
rows, tile sizes) against the paged kernel and torch's SDPA, and the causal conv's tiling.
Each row checks its output against the first variant of its table first.

    python benchmarks/prefill_kernels_tune.py [attention] [conv] [variants] [--json OUT]

`state_rows`: the GDN state kernel's choices at 9 x 512 and 18 x 256 (a loaded step's prompts).
`prepare_variants`: the GDN prepare kernel's PREPARE_* choices at an 8k row and at 9 x 512.
`variants`: the choices the kernels keep as module-level switches, at each family's 8k shapes:
the conv's tiled kernel against its scan kernel (`conv_variants`), and the chunked state
kernel's value block and pipelining stages, GDN and Mamba2 SSD, and SSD's state split in two
kernels with their tiles (`state_variants`); each against the copy floor / the first variant
in the same run.
"""
from __future__ import annotations

import json
import statistics
import sys

import torch
import torch.nn.functional as F

from hybrid_serve.kernels.attention import extend_attention, paged_attention, store_kv
from hybrid_serve.kernels.causal_conv1d import causal_conv1d_varlen
from hybrid_serve.kernels.causal_conv1d import triton_conv
from hybrid_serve.kernels._chunks import build_chunk_table
from hybrid_serve.kernels.gated_delta import gated_delta_rule_chunked, gdn_gating
from hybrid_serve.kernels.gated_delta import triton_chunk, triton_wy
from hybrid_serve.kernels.mamba_ssm import ssd_chunked


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
        # SDPA's default pick: cuDNN on Hopper (kernels/attention/cudnn_extend.py), not the flash kernel
        print(f"  {'torch sdpa default (dense, no pages)':34s} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  "
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
    saved = triton_conv.PREFILL_SCAN[0]
    triton_conv.PREFILL_SCAN[0] = None  # the tiled kernel's tilings (the scan kernel: conv_variants)
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
    triton_conv.PREFILL_SCAN[0], triton_conv.TOKEN_TILE = saved, 64


def conv_variants(T=8192) -> list[dict]:
    """The conv at each family's prompt shape: the tiled kernel (the default before the scan)
    and the scan kernel, each at several tilings."""
    dev, bf = "cuda", torch.bfloat16
    shapes = {  # name: (channels, taps, width of the tensor x is a column slice of, its offset)
        "qwen3_5_2p3b": (8192, 4, 8192 + 4096 + 64, 0),
        "nemotron_h_1b": (5120, 4, 8240, 3072),
        "lfm2_1b": (2048, 3, 2048, 0),
    }
    tiled = [(64, 32, 128, None), (64, 16, 256, 4), (64, 32, 64, 4), (128, 32, 128, 4)]
    scans = [(64, 256, 2, 1), (64, 256, 2, 2), (64, 128, 1, 1), (64, 128, 1, 2), (128, 256, 2, 1), (128, 256, 2, 3),
             (32, 256, 2, 1), (64, 512, 4, 1), (64, 512, 4, 2), (128, 128, 1, 2), (256, 256, 2, 2), (64, 256, 1, 2)]
    rows = []
    saved = (triton_conv.TOKEN_TILE, triton_conv.PREFILL_SCAN[0])
    for name, (D, K, width, offset) in shapes.items():
        x = torch.randn(T, width, device=dev, dtype=bf)[:, offset:offset + D]
        w = torch.randn(D, K, device=dev, dtype=bf) * 0.3
        pool0 = torch.randn(4, D, K - 1, device=dev, dtype=bf)
        slots = torch.tensor([1], device=dev, dtype=torch.int32)
        cu = torch.tensor([0, T], device=dev, dtype=torch.int32)
        floor_ms = 2 * T * D * 2 / 4.0e9  # read x, write y at 4 TB/s
        want = None
        variants = [("tiled", v) for v in tiled] + [("scan", v) for v in scans]
        for kind, v in variants:
            if kind == "tiled":
                tile, bt, bd, warps = v
                triton_conv.TOKEN_TILE, triton_conv.PREFILL_SCAN[0] = tile, None
                label = f"tiled tile {tile:3d} bt {bt:2d} bd {bd:3d} warps {warps}"
            else:
                triton_conv.PREFILL_SCAN[0] = v
                bt = bd = warps = None
                label = "scan tile {:3d} bd {:3d} warps {} stages {}".format(*v)
            pool = pool0.clone()
            fn = lambda bd=bd, bt=bt, warps=warps: causal_conv1d_varlen(  # noqa: E731
                x, w, None, pool, slots, cu, "silu", max_seqlen=T, block_d=bd, block_t=bt, num_warps=warps)
            out = fn()
            want = (out, pool.clone()) if want is None else want
            err = max(rel(out, want[0]), rel(pool, want[1]))
            pool.copy_(pool0)
            ms = cuda_ms(fn, reps=20)
            rows.append({"table": "conv", "shape": name, "kind": kind, "variant": list(v), "ms": ms,
                         "floor_4tbs_ms": floor_ms, "err": err})
            print(f"  conv {name:14s} D {D} K {K} {label:52s} {ms:7.3f} ms (floor {floor_ms:.3f})  err {err:.1e}",
                  flush=True)
    triton_conv.TOKEN_TILE, triton_conv.PREFILL_SCAN[0] = saved
    return rows


def state_variants(T=8192) -> list[dict]:
    """The chunked recurrences (GDN at the 2.3B shape, Mamba2 SSD at Nemotron-H 1B's) with the
    state kernel's value block and pipelining stages varied; one 8k row, checkpoints every 256."""
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    cu_list = [0, T]
    ckpts = [(0, o, 2 + i) for i, o in enumerate(range(256, T, 256))]
    chunks = build_chunk_table(cu_list, [0], ckpts, dev, 64)
    slots = torch.tensor([1], device=dev, dtype=torch.int32)
    rows = []
    # GDN: H=16 key heads, HV=32 value heads, 128 x 128 states
    q, k = (torch.randn(T, 16, 128, device=dev, dtype=bf, generator=g) for _ in range(2))
    v = torch.randn(T, 32, 128, device=dev, dtype=bf, generator=g)
    gate, beta = gdn_gating(torch.randn(T, 32, device=dev, dtype=bf, generator=g),
                            torch.randn(T, 32, device=dev, dtype=bf, generator=g),
                            torch.rand(32, device=dev) * 2, torch.randn(32, device=dev))
    gdn_pool = torch.randn(2 + len(ckpts), 32, 128, 128, device=dev) * 0.01
    # SSD: 48 heads of 64, 8 groups of state 128
    x = torch.randn(T, 48, 64, device=dev, dtype=bf, generator=g)
    dt = torch.randn(T, 48, device=dev, dtype=bf, generator=g) - 2
    A = -torch.rand(48, device=dev) - 0.5
    bc = torch.randn(T, 2 * 8 * 128, device=dev, dtype=bf, generator=g)
    Bm, Cm = bc[:, :1024].view(T, 8, 128), bc[:, 1024:].view(T, 8, 128)
    D, dt_bias = torch.randn(48, device=dev), torch.randn(48, device=dev)
    ssd_pool = torch.randn(2 + len(ckpts), 48, 64, 128, device=dev) * 0.01
    calls = {
        "gdn": (0, lambda pool: gated_delta_rule_chunked(q, k, v, gate, beta, pool, slots, chunks), gdn_pool),
        "ssd": (1, lambda pool: ssd_chunked(x, dt, A, Bm, Cm, D, dt_bias, pool, slots, chunks,
                                            out_dtype=torch.float32), ssd_pool),
    }
    defaults = (list(triton_chunk.STATE_BLOCK_V), list(triton_chunk.STATE_STAGES))
    split = triton_chunk.SSD_SPLIT_STATE
    triton_chunk.SSD_SPLIT_STATE = False  # these rows: the one sequential state kernel
    for name, (i, call, pool0) in calls.items():
        want = None
        for bv in (32, 16, 64):
            for stages in (1, 2, 3):
                triton_chunk.STATE_BLOCK_V[i], triton_chunk.STATE_STAGES[i] = bv, stages
                pool = pool0.clone()
                out = call(pool)
                if want is None:
                    want = (out, pool)
                ms = cuda_ms(lambda: call(pool), reps=20)
                err = max(rel(out, want[0]), rel(pool, want[1]))
                rows.append({"table": "state", "kernel": name, "block_v": bv, "stages": stages, "ms": ms, "err": err})
                print(f"  {name} state block_v {bv:2d} stages {stages}  {ms:7.3f} ms  err {err:.1e}", flush=True)
        triton_chunk.STATE_BLOCK_V[:], triton_chunk.STATE_STAGES[:] = defaults
    # SSD with its state split in two kernels (local states in parallel, then the scan):
    # the scan's tile and stages, the local-state kernel's value block; errors against the
    # one state kernel at its defaults (still switched on here)
    saved = (triton_chunk.PASS_BLOCK_K, triton_chunk.PASS_BLOCK_V, triton_chunk.PASS_STAGES,
             triton_chunk.LOCAL_BLOCK_V)
    _, call, pool0 = calls["ssd"]
    ref_pool = pool0.clone()
    want = (call(ref_pool), ref_pool)
    triton_chunk.SSD_SPLIT_STATE = True
    configs = [(64, bk, bv, st) for bk, bv in ((32, 64), (16, 64), (64, 64), (32, 32), (128, 32))
               for st in (1, 2, 3)] + [(32, 32, 64, 2)]
    for local_v, block_k, block_v, stages in configs:
        triton_chunk.LOCAL_BLOCK_V = local_v
        triton_chunk.PASS_BLOCK_K, triton_chunk.PASS_BLOCK_V, triton_chunk.PASS_STAGES = block_k, block_v, stages
        pool = pool0.clone()
        out = call(pool)
        ms = cuda_ms(lambda: call(pool), reps=20)
        err = max(rel(out, want[0]), rel(pool, want[1]))
        rows.append({"table": "state", "kernel": "ssd_split", "local_block_v": local_v, "pass_block_k": block_k,
                     "pass_block_v": block_v, "stages": stages, "ms": ms, "err": err})
        print(f"  ssd split local_v {local_v:2d} pass {block_k:3d}x{block_v:2d} stages {stages}  {ms:7.3f} ms  "
              f"err {err:.1e}", flush=True)
    (triton_chunk.PASS_BLOCK_K, triton_chunk.PASS_BLOCK_V, triton_chunk.PASS_STAGES, triton_chunk.LOCAL_BLOCK_V) = saved
    triton_chunk.SSD_SPLIT_STATE = split
    return rows


def _gdn_rows(lens: list[int], g: torch.Generator):
    """GDN inputs at the 2.3B shapes (16 key heads, 32 value heads of 128; bf16, q and k unit
    rows) for rows of `lens` tokens, each checkpointed every 256 tokens: (tokens, chunk table,
    state slots, q, k, v, gate, beta, a state pool)."""
    dev, bf = "cuda", torch.bfloat16
    T = sum(lens)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    ckpts = [(b, o) for b, n in enumerate(lens) for o in range(256, n, 256)]
    ckpts = [(b, o, 2 + len(lens) + i) for i, (b, o) in enumerate(ckpts)]
    chunks = build_chunk_table(cu, [0] * len(lens), ckpts, dev, 64)
    slots = torch.arange(1, len(lens) + 1, device=dev, dtype=torch.int32)
    q, k = (torch.nn.functional.normalize(torch.randn(T, 16, 128, device=dev, generator=g), dim=-1).to(bf)
            for _ in range(2))
    v = torch.randn(T, 32, 128, device=dev, dtype=bf, generator=g)
    gate, beta = gdn_gating(torch.randn(T, 32, device=dev, dtype=bf, generator=g),
                            torch.randn(T, 32, device=dev, dtype=bf, generator=g),
                            torch.rand(32, device=dev) * 2, torch.randn(32, device=dev))
    pool = torch.randn(2 + len(lens) + len(ckpts) + 8, 32, 128, 128, device=dev) * 0.01
    return T, chunks, slots, q, k, v, gate.float().contiguous(), beta.contiguous(), pool


def prepare_variants() -> list[dict]:
    """The GDN prepare kernel (w, u) at the 2.3B shapes, each PREPARE_* choice: one 8k row and
    nine rows of 512 (a loaded step's prompts); the kernel alone, then the whole chunked
    recurrence, errors against the first variant."""
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    saved = (triton_wy.PREPARE_INVERSE, triton_wy.PREPARE_WARPS)
    rows = []
    for lens in ([8192], [512] * 9):
        T, chunks, slots, q, k, v, gate, beta, pool0 = _gdn_rows(lens, g)
        w, u = torch.empty(T, 32, 128, device=dev, dtype=bf), torch.empty(T, 32, 128, device=dev, dtype=bf)
        common = dict(HEADS_PER_K=2, K=128, V=128, BT=64, DOT_PRECISION="tf32")
        want = None
        for inverse in ("substitution", "powers"):
            for warps in (4, 8, 2):
                triton_wy.PREPARE_INVERSE, triton_wy.PREPARE_WARPS = inverse, warps
                triton_wy.chunk_prepare(k, v, gate, beta, w, u, chunks, 128, 128, common)
                ms = cuda_ms(lambda: triton_wy.chunk_prepare(k, v, gate, beta, w, u, chunks, 128, 128, common),
                             reps=20)
                pool = pool0.clone()
                out = gated_delta_rule_chunked(q, k, v, gate, beta, pool, slots, chunks, use_qk_l2norm=False)
                full_ms = cuda_ms(lambda: gated_delta_rule_chunked(q, k, v, gate, beta, pool, slots, chunks,
                                                                   use_qk_l2norm=False), reps=10)
                if want is None:
                    want = (w.clone(), u.clone(), out)
                err = max(rel(w, want[0]), rel(u, want[1]), rel(out, want[2]))
                rows.append({"table": "prepare", "rows": len(lens), "tokens": T, "inverse": inverse, "warps": warps,
                             "prepare_ms": ms, "recurrence_ms": full_ms, "err": err})
                print(f"  prepare {len(lens)}x{lens[0]:5d} {inverse:12s} warps {warps}  {ms:7.3f} ms  "
                      f"(whole recurrence {full_ms:7.3f} ms)  err {err:.1e}", flush=True)
        triton_wy.PREPARE_INVERSE, triton_wy.PREPARE_WARPS = saved
        # the state and output kernels (GDN's entries of their lists), whole recurrence timed
        for kernel, knobs in (("state", ((32, 4), (32, 2), (16, 2), (16, 4), (64, 4), (32, 8))),
                              ("output", ((64, 4), (64, 2), (32, 2), (32, 4), (128, 4), (128, 8), (64, 8)))):
            lists = ((triton_chunk.STATE_BLOCK_V, triton_chunk.STATE_WARPS) if kernel == "state"
                     else (triton_chunk.OUTPUT_BLOCK_V, triton_chunk.OUTPUT_WARPS))
            defaults = (lists[0][0], lists[1][0])
            for block_v, warps in knobs:
                lists[0][0], lists[1][0] = block_v, warps
                pool = pool0.clone()
                out = gated_delta_rule_chunked(q, k, v, gate, beta, pool, slots, chunks, use_qk_l2norm=False)
                full_ms = cuda_ms(lambda: gated_delta_rule_chunked(q, k, v, gate, beta, pool, slots, chunks,
                                                                   use_qk_l2norm=False), reps=10)
                err = rel(out, want[2])
                rows.append({"table": kernel, "rows": len(lens), "tokens": T, "block_v": block_v, "warps": warps,
                             "recurrence_ms": full_ms, "err": err})
                print(f"  {kernel:6s} {len(lens)}x{lens[0]:5d} block_v {block_v:3d} warps {warps}  whole recurrence "
                      f"{full_ms:7.3f} ms  err {err:.1e}", flush=True)
            lists[0][0], lists[1][0] = defaults
    return rows


def gdn_state_many_rows() -> list[dict]:
    """The GDN state kernel where a loaded step's prompts put it: many short rows (9 x 512,
    18 x 256) fill the grid, where one 8k row (state_variants) leaves it a single wave. Value
    block x pipelining stages x warps, the kernel alone (u restored before each call); errors
    against the first variant."""
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    saved = (list(triton_chunk.STATE_BLOCK_V), list(triton_chunk.STATE_STAGES), list(triton_chunk.STATE_WARPS),
             triton_chunk.STATE_MANY_ROWS_PROGRAMS_PER_SM)
    triton_chunk.STATE_MANY_ROWS_PROGRAMS_PER_SM = 1 << 30  # these rows: the lists' choice, always
    rows = []
    for lens in ([512] * 9, [256] * 18):
        T, chunks, slots, _, k, v, gate, beta, pool0 = _gdn_rows(lens, g)
        w, u = torch.empty(T, 32, 128, device=dev, dtype=bf), torch.empty(T, 32, 128, device=dev, dtype=bf)
        common = dict(HEADS_PER_K=2, K=128, V=128, BT=64, DOT_PRECISION="tf32")
        triton_wy.chunk_prepare(k, v, gate, beta, w, u, chunks, 128, 128, common)
        h = torch.empty(chunks.num_chunks, 32, 128, 128, device=dev, dtype=bf)
        vnew, pool = torch.empty_like(u), pool0.clone()
        state_kv = (pool.stride(2), pool.stride(3))

        def call():
            vnew.copy_(u)
            triton_chunk._chunk_states(k, v, gate, w, vnew, h, pool, slots, chunks, state_kv, 128, 128, True, common)

        copy_ms = cuda_ms(lambda: vnew.copy_(u), reps=20)
        want = None
        for block_v in (32, 64, 16):
            for stages in (2, 1, 3):
                for warps in (4, 2, 8):
                    triton_chunk.STATE_BLOCK_V[0], triton_chunk.STATE_STAGES[0], triton_chunk.STATE_WARPS[0] = \
                        block_v, stages, warps
                    pool.copy_(pool0)
                    call()
                    out = (vnew.clone(), pool.clone())
                    want = want or out
                    ms = min(cuda_ms(call, reps=20) for _ in range(2)) - copy_ms
                    err = max(rel(out[0], want[0]), rel(out[1].nan_to_num(), want[1].nan_to_num()))
                    rows.append({"table": "gdn_state_rows", "rows": len(lens), "tokens": T, "block_v": block_v,
                                 "stages": stages, "warps": warps, "state_ms": ms, "err": err})
                    print(f"  gdn state {len(lens):2d}x{lens[0]} block_v {block_v:2d} stages {stages} warps {warps}  "
                          f"{ms:7.3f} ms  err {err:.1e}", flush=True)
    (triton_chunk.STATE_BLOCK_V[:], triton_chunk.STATE_STAGES[:], triton_chunk.STATE_WARPS[:],
     triton_chunk.STATE_MANY_ROWS_PROGRAMS_PER_SM) = saved
    return rows


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0))
    parts = [a for a in sys.argv[1:] if not a.startswith("--") and not a.endswith(".json")] or ["attention", "conv"]
    result = {"device": torch.cuda.get_device_name(0)}
    if "attention" in parts:
        attention_table(0, 8192)
        attention_table(24576, 8192)
    if "conv" in parts:
        conv_table()
    if "variants" in parts or "conv_variants" in parts:
        result["conv"] = conv_variants()
    if "variants" in parts or "state_variants" in parts:
        result["state"] = state_variants()
    if "state_rows" in parts:
        result["state_rows"] = gdn_state_many_rows()
    if "prepare_variants" in parts:
        result["prepare"] = prepare_variants()
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(result, f, indent=1)
