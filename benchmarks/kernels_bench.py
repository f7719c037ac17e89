"""Kernel benchmarks at serving shapes: check each Triton kernel against its ref, time it,
and report achieved GB/s against the device's measured copy bandwidth (and, for the
matmul-bound fused MoE, TFLOP/s against its measured bf16 matmul rate).

Shapes: the 2.3B Qwen3.5 layout (hidden 2048; GDN 16 key / 32 value heads of 128, conv 4,
conv dim 8192; attention 16 q / 2 kv heads of 256, partial rotary 64; vocab 248320;
18 GDN layers assumed for the all-layer state copies) and a Nemotron-H-like Mamba2 mixer
(128 heads of 64, 8 groups, d_state 128). Decode batches 1 / 16 / 64 by default.

    python benchmarks/kernels_bench.py                  # GPU: do_bench median, JSON to $OUT or ./bench_out
    python benchmarks/kernels_bench.py --batches 64 --ctx 8192
    TRITON_INTERPRET=1 python benchmarks/kernels_bench.py --smoke   # CPU: tiny shapes, checks the script only

Each JSON record: kernel, batch, shape, time_us, bytes, gbps, pct_of_copy_bw, rel_err, ok.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

from hybrid_serve.kernels.activation import sigmoid_gate_mul, sigmoid_gate_mul_ref, silu_and_mul, silu_and_mul_ref
from hybrid_serve.kernels.linear import skinny_linear, skinny_linear_ref
from hybrid_serve.kernels.attention import paged_attention, paged_attention_ref, store_kv
from hybrid_serve.kernels.causal_conv1d import causal_conv1d_varlen, causal_conv1d_varlen_ref
from hybrid_serve.kernels.gated_delta import gated_delta_rule_recurrent, gated_delta_rule_varlen_ref
from hybrid_serve.kernels.mamba_ssm import selective_state_update_varlen, selective_state_update_varlen_ref
from hybrid_serve.kernels.moe import fused_moe, fused_moe_ref, moe_topk_softmax
from hybrid_serve.kernels.norm import (
    add_rms_norm, add_rms_norm_ref, gated_rms_norm, gated_rms_norm_ref, rms_norm, rms_norm_ref,
)
from hybrid_serve.kernels.rotary import rotary_neox, rotary_neox_ref
from hybrid_serve.kernels.sampling import masked_logits, masked_logits_ref, sample_tokens
from hybrid_serve.kernels.state_ops import commit_verified_state, commit_verified_state_ref, copy_state_slots

BF16 = torch.bfloat16


@dataclass
class Case:
    kernel: str
    batch: int
    shape: str
    run: Callable[[], object]  # the timed call
    check: Callable[[], float]  # relative error vs the ref (fresh state copies)
    nbytes: int  # minimum bytes the op must move
    tol: float = 2e-2
    flops: int = 0  # for matmul-bound kernels: FLOPs per call (reported against the matmul rate)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if torch.isnan(got).any():
        return float("nan")
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


class Bench:
    def __init__(self, device: str, smoke: bool) -> None:
        self.device, self.smoke = device, smoke
        # smoke mode: everything 1/16 to 1/64 of the serving sizes
        s = (lambda n, d=16: max(1, n // d)) if smoke else (lambda n, d=16: n)
        self.hidden, self.conv_dim, self.hk, self.hv, self.dk = s(2048), s(8192), s(16), s(32), s(128, 8)
        self.hq, self.hkv, self.head_dim, self.rot = s(16), s(2, 2), s(256, 16), s(64, 4)
        self.m_heads, self.m_dim, self.m_groups, self.m_state = s(128), s(64, 8), s(8, 8), s(128, 8)
        self.vocab, self.gdn_layers, self.inter = s(248320, 1024), s(18, 9), s(6144)

    def randn(self, *shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, device=self.device) * scale).to(dtype)

    def idx(self, values, dtype=torch.int32):
        return torch.as_tensor(values, dtype=dtype, device=self.device)

    def conv(self, batch: int, steps: int = 1) -> Case:
        d, k = self.conv_dim, 4
        x, w = self.randn(batch * steps, d, dtype=BF16), self.randn(d, k, dtype=BF16, scale=0.5)
        pool = self.randn(batch + 1, d, k - 1, dtype=BF16)
        slots, cu = self.idx(range(1, batch + 1)), self.idx([i * steps for i in range(batch + 1)])
        scratch = torch.empty(batch, steps, d, k - 1, dtype=BF16, device=self.device) if steps > 1 else None
        run = lambda: causal_conv1d_varlen(x, w, None, pool, slots, cu, "silu", scratch)  # noqa: E731

        def check():
            p1, p2 = pool.clone(), pool.clone()
            got = causal_conv1d_varlen(x, w, None, p1, slots, cu, "silu")
            want = causal_conv1d_varlen_ref(x, w, None, p2, slots.tolist(), cu.tolist(), "silu")
            return max(rel(got, want), rel(p1, p2))

        moved = 2 * batch * steps * d * 2 + batch * d * (k - 1) * 2 * (1 + (steps if scratch is not None else 1))
        name = "causal_conv1d" + ("_verify" if steps > 1 else "")
        return Case(name, batch, f"T={batch * steps} D={d} K={k} bf16", run, check, moved)

    def gdn(self, batch: int, steps: int = 1) -> Case:
        t, hk, hv, dk = batch * steps, self.hk, self.hv, self.dk
        q, k = self.randn(t, hk, dk, dtype=BF16), self.randn(t, hk, dk, dtype=BF16)
        v, beta = self.randn(t, hv, dk, dtype=BF16), torch.rand(t, hv, device=self.device).to(BF16)
        g = -torch.rand(t, hv, device=self.device) * 0.1
        pool = self.randn(batch + 1, hv, dk, dk, scale=0.05)
        slots, cu = self.idx(range(1, batch + 1)), self.idx([i * steps for i in range(batch + 1)])
        scratch = torch.empty(batch, steps, hv, dk, dk, device=self.device) if steps > 1 else None
        run = lambda: gated_delta_rule_recurrent(q, k, v, g, beta, pool, slots, cu, intermediate_states=scratch)  # noqa

        def check():
            p1, p2 = pool.clone(), pool.clone()
            got = gated_delta_rule_recurrent(q, k, v, g, beta, p1, slots, cu)
            want = gated_delta_rule_varlen_ref(q, k, v, g, beta, p2, slots.tolist(), cu.tolist())
            return max(rel(got, want), rel(p1, p2))

        state = hv * dk * dk * 4
        moved = batch * state * (1 + (steps if scratch is not None else 1)) + t * (2 * hk + 2 * hv) * dk * 2
        name = "gated_delta" + ("_verify" if steps > 1 else "")
        return Case(name, batch, f"T={t} H={hk} HV={hv} D={dk} fp32 state", run, check, moved)

    def mamba(self, batch: int) -> Case:
        h, p, g, n = self.m_heads, self.m_dim, self.m_groups, self.m_state
        x, dt = self.randn(batch, h, p, dtype=BF16), self.randn(batch, h, dtype=BF16)
        B, C = self.randn(batch, g, n, dtype=BF16), self.randn(batch, g, n, dtype=BF16)
        A, D, dt_bias = -torch.rand(h, device=self.device) - 0.1, self.randn(h), self.randn(h)
        pool = self.randn(batch + 1, h, p, n, scale=0.1)
        slots, cu = self.idx(range(1, batch + 1)), self.idx(range(batch + 1))
        args = (x, dt, A, B, C, D, dt_bias)
        run = lambda: selective_state_update_varlen(*args, pool, slots, cu, out_dtype=torch.float32)  # noqa: E731

        def check():
            p1, p2 = pool.clone(), pool.clone()
            got = selective_state_update_varlen(*args, p1, slots, cu, out_dtype=torch.float32)
            want = selective_state_update_varlen_ref(*args, p2, slots.tolist(), cu.tolist(), out_dtype=torch.float32)
            return max(rel(got, want), rel(p1, p2))

        return Case("mamba_ssm", batch, f"H={h} P={p} G={g} N={n} fp32 state", run, check,
                    2 * batch * h * p * n * 4 + batch * h * p * 6)

    def attention(self, batch: int, ctx: int, extend: int = 1) -> Case:
        hq, hkv, d = self.hq, self.hkv, self.head_dim
        prefix = ctx - extend
        k_cache = self.randn(batch * ctx + 1, hkv, d, dtype=BF16)
        v_cache = self.randn(batch * ctx + 1, hkv, d, dtype=BF16)
        req_to_token = (torch.randperm(batch * ctx, device=self.device) + 1).int().view(batch, ctx)
        req_to_token = torch.cat([torch.zeros(1, ctx, dtype=torch.int32, device=self.device), req_to_token])
        q = self.randn(batch * extend, hq, d, dtype=BF16)
        rows, prefix_t = self.idx(range(1, batch + 1)), self.idx([prefix] * batch)
        cu = self.idx([i * extend for i in range(batch + 1)])
        scale = d ** -0.5
        run = lambda: paged_attention(q, k_cache, v_cache, req_to_token, rows, prefix_t, cu, scale)  # noqa: E731

        def check():
            want = paged_attention_ref(q, k_cache, v_cache, req_to_token, rows.tolist(), [prefix] * batch,
                                       [extend] * batch, scale)
            return rel(run(), want)

        moved = batch * ctx * (hkv * 2 * d * 2 + 4) + 2 * batch * extend * hq * d * 2
        return Case("paged_attention" + ("" if extend == 1 else "_prefill"), batch,
                    f"ctx={ctx} ext={extend} Hq={hq} Hkv={hkv} D={d} bf16", run, check, moved)

    def store_kv(self, batch: int) -> Case:
        k_cache = torch.zeros(4 * batch + 1, self.hkv, self.head_dim, dtype=BF16, device=self.device)
        v_cache = torch.zeros_like(k_cache)
        k = self.randn(batch, self.hkv, self.head_dim, dtype=BF16)
        v = self.randn(batch, self.hkv, self.head_dim, dtype=BF16)
        slots = self.idx(range(1, 4 * batch + 1, 4), torch.int64)
        run = lambda: store_kv(k_cache, v_cache, slots, k, v)  # noqa: E731

        def check():
            run()
            return max(rel(k_cache[slots], k), rel(v_cache[slots], v))

        return Case("store_kv", batch, f"Hkv={self.hkv} D={self.head_dim} bf16", run, check,
                    4 * batch * self.hkv * self.head_dim * 2)

    def norms(self, batch: int) -> list[Case]:
        x, w = self.randn(batch, self.hidden, dtype=BF16), self.randn(self.hidden, dtype=BF16, scale=0.1)
        qh, wq = self.randn(batch, self.hq, self.head_dim, dtype=BF16), self.randn(self.head_dim, dtype=BF16)
        core, z = self.randn(batch, self.hv, self.dk, dtype=BF16), self.randn(batch, self.hv, self.dk, dtype=BF16)
        wg = self.randn(self.dk, dtype=BF16)
        return [
            Case("rms_norm_zc", batch, f"[{batch}, {self.hidden}] bf16", lambda: rms_norm(x, w, 1e-6, True),
                 lambda: rel(rms_norm(x, w, 1e-6, True), rms_norm_ref(x, w, 1e-6, True)), 2 * x.numel() * 2),
            Case("rms_norm_qk_heads", batch, f"[{batch}, {self.hq}, {self.head_dim}] bf16",
                 lambda: rms_norm(qh, wq, 1e-6, True),
                 lambda: rel(rms_norm(qh, wq, 1e-6, True), rms_norm_ref(qh, wq, 1e-6, True)), 2 * qh.numel() * 2),
            Case("gated_rms_norm", batch, f"[{batch}, {self.hv}, {self.dk}] bf16",
                 lambda: gated_rms_norm(core, z, wg, 1e-6),
                 lambda: rel(gated_rms_norm(core, z, wg, 1e-6), gated_rms_norm_ref(core, z, wg, 1e-6)),
                 3 * core.numel() * 2),
        ]

    def mlp_act(self, batch: int) -> list[Case]:
        """silu-and-mul of the MLP (intermediate 6144) and the residual add + RMSNorm."""
        gu = self.randn(batch, 2 * self.inter, dtype=BF16)
        x, res = self.randn(batch, self.hidden, dtype=BF16), self.randn(batch, self.hidden, dtype=BF16)
        w = self.randn(self.hidden, dtype=BF16, scale=0.1)

        def check_add():
            got, got_sum = add_rms_norm(x, res.clone(), w, 1e-6, True)
            want, want_sum = add_rms_norm_ref(x, res.clone(), w, 1e-6, True)
            return max(rel(got, want), rel(got_sum, want_sum))

        return [
            Case("silu_and_mul", batch, f"[{batch}, 2x{self.inter}] bf16", lambda: silu_and_mul(gu),
                 lambda: rel(silu_and_mul(gu), silu_and_mul_ref(gu)), 3 * gu.numel()),
            Case("add_rms_norm_zc", batch, f"[{batch}, {self.hidden}] bf16",
                 lambda: add_rms_norm(x, res, w, 1e-6, True), check_add, 4 * x.numel() * 2),
        ]

    def attn_gate(self, batch: int) -> Case:
        """The attention output gate: out * sigmoid(gate), gate read from the q projection."""
        q_gate = self.randn(batch, self.hq, 2 * self.head_dim, dtype=BF16)
        gate, out = q_gate[..., self.head_dim:], self.randn(batch, self.hq, self.head_dim, dtype=BF16)
        return Case("sigmoid_gate_mul", batch, f"[{batch}, {self.hq}, {self.head_dim}] bf16",
                    lambda: sigmoid_gate_mul(out, gate),
                    lambda: rel(sigmoid_gate_mul(out, gate), sigmoid_gate_mul_ref(out, gate)), 3 * out.numel() * 2)

    def linears(self) -> list[Case]:
        """Batch-1 decode linears (kernels/linear) at the 2.3B layout's K-heavy and wide shapes.
        Each call reads the next of several weights (>= 400 MB together), so the weight comes
        from HBM as in a decode step, not from L2."""
        cases = []
        for label, n, k in (("down_proj", self.hidden, self.inter), ("gate_up", 2 * self.inter, self.hidden)):
            count = 2 if self.smoke else max(4, (400 << 20) // (n * k * 2))
            ws = [self.randn(n, k, dtype=BF16, scale=0.02) for _ in range(count)]
            x = self.randn(1, k, dtype=BF16)
            turn = itertools.cycle(range(count))
            cases.append(Case(f"skinny_linear ({label})", 1, f"{n}x{k} bf16, {count} weights in turn",
                              lambda ws=ws, x=x, turn=turn: skinny_linear(x, ws[next(turn)]),
                              lambda ws=ws, x=x: rel(skinny_linear(x, ws[0]), skinny_linear_ref(x, ws[0])),
                              n * k * 2, tol=1e-2))
        return cases

    def moe(self, tokens: int) -> Case:
        """Qwen3-Next's routed experts: 512 experts of intermediate 512 at hidden 2048, top-10,
        gated SiLU. Bytes = the weights of the experts the batch touches; FLOPs = 2 * T * K * 3 I H."""
        E, inter, hidden, k = 512, 512, 2048, 10
        if self.smoke:
            E, inter, hidden = 16, 32, 64
        x = self.randn(tokens, hidden, dtype=BF16)
        w13 = self.randn(E, 2 * inter, hidden, dtype=BF16, scale=0.02)
        w2 = self.randn(E, hidden, inter, dtype=BF16, scale=0.02)
        weights, ids = moe_topk_softmax(self.randn(tokens, E), k, True)
        touched = int(torch.unique(ids).numel())
        nbytes = touched * 3 * inter * hidden * 2 + 2 * x.numel() * 2
        flops = 2 * tokens * k * 3 * inter * hidden

        def check():
            rows = slice(0, min(tokens, 64))
            return rel(fused_moe(x[rows], w13, w2, weights[rows], ids[rows]),
                       fused_moe_ref(x[rows].float(), w13.float(), w2.float(), weights[rows], ids[rows]))

        return Case("fused_moe", tokens, f"E={E} I={inter} H={hidden} top-{k} bf16, {touched} experts hit",
                    lambda: fused_moe(x, w13, w2, weights, ids), check, nbytes, flops=flops)

    def rotary(self, batch: int) -> Case:
        q = self.randn(batch, self.hq, self.head_dim, dtype=BF16)
        k = self.randn(batch, self.hkv, self.head_dim, dtype=BF16)
        pos = torch.randint(0, 8192, (batch,), device=self.device)
        inv_freq = 1.0 / (1e7 ** (torch.arange(0, self.rot, 2, device=self.device, dtype=torch.float) / self.rot))
        run = lambda: rotary_neox(q, k, pos, inv_freq, inplace=True)  # noqa: E731

        def check():
            want_q, _ = rotary_neox_ref(q, k, pos, inv_freq)
            return rel(rotary_neox(q, k, pos, inv_freq, inplace=False)[0], want_q)

        return Case("rotary_neox", batch, f"Hq={self.hq} Hk={self.hkv} D={self.head_dim} rot={self.rot} bf16", run,
                    check, 2 * batch * (self.hq + self.hkv) * self.rot * 2 + batch * 8)

    def state_ops(self, batch: int, steps: int = 4) -> list[Case]:
        L, shape = self.gdn_layers, (self.hv, self.dk, self.dk)
        pool = torch.zeros(L, 2 * batch + 1, *shape, device=self.device)
        scratch = self.randn(L, batch, steps, *shape)
        slots = self.idx(range(1, batch + 1))
        steps_t = torch.randint(0, steps, (batch,), dtype=torch.int32, device=self.device)
        src, dst = slots, slots + batch
        feat = L * shape[0] * shape[1] * shape[2] * 4

        def check_commit():
            p1, p2 = pool.clone(), pool.clone()
            commit_verified_state(p1, scratch, slots, steps_t)
            commit_verified_state_ref(p2, scratch, slots, steps_t)
            return float(not torch.equal(p1, p2))

        def check_copy():
            copy_state_slots(pool, src, dst)
            return float(not torch.equal(pool[:, dst.long()], pool[:, src.long()]))

        return [
            Case("commit_verified_state", batch, f"L={L} [{', '.join(map(str, shape))}] fp32",
                 lambda: commit_verified_state(pool, scratch, slots, steps_t), check_commit, 2 * batch * feat, 0.0),
            Case("copy_state_slots", batch, f"L={L} [{', '.join(map(str, shape))}] fp32",
                 lambda: copy_state_slots(pool, src, dst), check_copy, 2 * batch * feat, 0.0),
        ]

    def sampling(self, batch: int) -> list[Case]:
        logits = self.randn(batch, self.vocab, scale=3.0)
        temp = torch.full((batch,), 0.8, device=self.device)
        top_k, top_p = self.idx([50] * batch), torch.full((batch,), 0.9, device=self.device)
        min_p = torch.full((batch,), 0.05, device=self.device)
        seeds, offsets = self.idx(range(batch), torch.int64), self.idx([7] * batch, torch.int64)
        params = (temp, top_k, top_p, min_p)

        def check():
            got, want = masked_logits(logits, *params), masked_logits_ref(logits, *params)
            return float(not torch.equal(got.isinf(), want.isinf()))

        def check_plain():
            tokens = sample_tokens(logits, torch.zeros_like(temp), *params[1:], seeds, offsets, False, False)
            return float(not torch.equal(tokens, logits.argmax(-1)))

        return [
            Case("sample_tokens_masked", batch, f"V={self.vocab} top-k/p/min-p fp32",
                 lambda: sample_tokens(logits, *params, seeds, offsets), check, batch * self.vocab * 4, 0.0),
            Case("sample_tokens_plain", batch, f"V={self.vocab} temperature only fp32",
                 lambda: sample_tokens(logits, *params, seeds, offsets, False, False), check_plain,
                 batch * self.vocab * 4, 0.0),
        ]

    def cases(self, batches: list[int], ctx: int) -> list[Case]:
        out = []
        for b in batches:
            out += [self.conv(b), self.gdn(b), self.mamba(b), self.attention(b, ctx), self.store_kv(b), self.rotary(b)]
            out += self.norms(b) + self.mlp_act(b) + self.state_ops(b) + self.sampling(b) + [self.moe(b)]
            out.append(self.attn_gate(b))
            if b == 1:
                out += self.linears()
            if b >= 16:
                out += [self.conv(b, 4), self.gdn(b, 4)]
        out.append(self.attention(1, ctx // 2 if not self.smoke else 64, ctx // 2 if not self.smoke else 32))
        out.append(self.moe(4096 if not self.smoke else 64))  # a prefill chunk: matmul-bound
        return out


def time_ms(fn: Callable[[], object], smoke: bool) -> float:
    if smoke:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def matmul_tflops(device: str, smoke: bool) -> float:
    """bf16 [8192 x 8192] @ [8192 x 8192] through torch (cuBLAS): the card's matmul rate."""
    n = 256 if smoke else 8192
    a = torch.randn(n, n, device=device, dtype=BF16)
    b = torch.randn(n, n, device=device, dtype=BF16)
    return 2 * n**3 / (time_ms(lambda: a @ b, smoke) * 1e-3) / 1e12


def copy_bandwidth_gbps(device: str, smoke: bool) -> float:
    """Device-to-device copy of a 1 GiB buffer (read + write counted)."""
    n = (1 << 20) if smoke else (1 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * n / (time_ms(lambda: dst.copy_(src), smoke) * 1e-3) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--ctx", type=int, default=4096, help="context length of the decode attention cases")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (TRITON_INTERPRET=1)")
    parser.add_argument("--only", default="", help="comma-separated kernel name prefixes to run")
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("kernels_bench needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1)")
    torch.manual_seed(0)
    bench = Bench(device, args.smoke)
    copy_bw = copy_bandwidth_gbps(device, args.smoke)
    mm_rate = matmul_tflops(device, args.smoke)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    print(f"device: {name}; measured copy bandwidth {copy_bw:.0f} GB/s, bf16 matmul rate {mm_rate:.0f} TFLOP/s")
    print(f"{'kernel':<24}{'B':>4}  {'time_us':>10}{'GB/s':>9}{'%copy':>7}{'rel_err':>10}  shape")
    records = []
    only = [p for p in args.only.split(",") if p]
    for case in bench.cases(args.batches, args.ctx if not args.smoke else 48):
        if only and not any(case.kernel.startswith(p) for p in only):
            continue
        err = case.check()
        ok = err <= case.tol
        ms = time_ms(case.run, args.smoke)
        gbps = case.nbytes / (ms * 1e-3) / 1e9
        rec = dict(kernel=case.kernel, batch=case.batch, shape=case.shape, time_us=round(ms * 1e3, 2),
                   bytes=case.nbytes, gbps=round(gbps, 1), pct_of_copy_bw=round(100 * gbps / copy_bw, 1),
                   rel_err=err, ok=ok, device=name, copy_gbps=round(copy_bw, 1), matmul_tflops=round(mm_rate, 1))
        if case.flops:
            rec["tflops"] = round(case.flops / (ms * 1e-3) / 1e12, 1)
            rec["pct_of_matmul_rate"] = round(100 * rec["tflops"] / mm_rate, 1)
        records.append(rec)
        flag = "" if ok else "  <-- MISMATCH"
        mm = f"  {rec['tflops']:.0f} TFLOP/s = {rec['pct_of_matmul_rate']:.0f}% of matmul" if case.flops else ""
        print(f"{case.kernel:<24}{case.batch:>4}  {rec['time_us']:>10.1f}{gbps:>9.0f}{rec['pct_of_copy_bw']:>7.1f}"
              f"{err:>10.1e}  {case.shape}{mm}{flag}")
        if device == "cuda":
            torch.cuda.empty_cache()
    out_dir = os.environ.get("OUT") or "bench_out"
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "kernels_bench.json")
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {len(records)} records to {path}; mismatches: {sum(not r['ok'] for r in records)}")


if __name__ == "__main__":
    main()
