"""moe_topk_softmax / fused_moe (Triton) vs the per-expert reference, and the refs vs models/layers/moe.py."""
import pytest
import torch
from kernel_utils import DEVICE, gpu, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.moe import fused_moe, fused_moe_ref, moe_topk_softmax, moe_topk_softmax_ref  # noqa: E402


def _experts(E, H, I, dtype, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dtype).to(device)
    down = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype).to(device)
    return gate_up, down


@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
@pytest.mark.parametrize("num_experts,top_k", [(8, 2), (6, 3), (5, 1)], ids=["e8k2", "e6k3", "e5k1"])
def test_topk_softmax(renormalize, num_experts, top_k):
    logits = torch.randn(9, num_experts, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    w, ids = moe_topk_softmax(logits, top_k, renormalize)
    want_w, want_ids = moe_topk_softmax_ref(logits.cpu(), top_k, renormalize)
    assert torch.equal(ids.cpu(), want_ids)
    assert rel_err(w.cpu(), want_w) < 1e-6


def _topk_lowest_id_first(logits: torch.Tensor, top_k: int, renormalize: bool):
    """The kernel's contract: ref.py's softmax / renormalisation, ties broken towards the lower
    expert id (torch.topk leaves that order open: on CPU it need not be the lower id)."""
    probs = torch.softmax(logits.float().cpu(), dim=-1)
    weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :top_k], ids[:, :top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), ids


def _check_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> None:
    w, ids = moe_topk_softmax(logits, top_k, renormalize)
    assert w.dtype == logits.dtype and ids.dtype == torch.int64
    assert w.shape == ids.shape == (logits.shape[0], top_k)
    want_w, want_ids = _topk_lowest_id_first(logits, top_k, renormalize)
    assert torch.equal(ids.cpu(), want_ids)
    # the reference's weights (its id order may differ on ties, its values may not)
    ref_w, _ = moe_topk_softmax_ref(logits.cpu(), top_k, renormalize)
    assert torch.equal(ref_w, want_w) or logits.device.type == "cuda"
    if logits.dtype == torch.float32:
        assert rel_err(w.cpu(), ref_w) < 1e-6
    else:  # one rounding of (nearly) the same fp32 value: at most one ulp apart
        assert ((w.cpu().float() - ref_w.float()).abs() <= 2.0 ** -7 * ref_w.float().abs()).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens", [1, 7, pytest.param(300, marks=pytest.mark.slow)], ids=["t1", "t7", "t300"])
@pytest.mark.parametrize("num_experts,top_k", [(512, 10), (128, 8), (64, 4)], ids=["e512k10", "e128k8", "e64k4"])
def test_topk_softmax_model_shapes(num_experts, top_k, tokens, dtype):
    """Qwen3-Next (512 / 10), Qwen3-MoE (128 / 8) and small (64 / 4) routers at decode and prefill
    row counts; bf16 logits tie often (8-bit mantissa), so the lower-id rule is exercised.
    300 rows take ~10 s a call under the interpreter: there, one case with one renormalise setting."""
    if tokens >= 100 and DEVICE != "cuda" and (num_experts, dtype) != (512, torch.float32):
        pytest.skip("300 rows under the interpreter: the 512-expert fp32 case only (CI time); all on a GPU")
    logits = (2 * torch.randn(tokens, num_experts, generator=torch.Generator().manual_seed(tokens))).to(dtype)
    both = tokens < 100 or DEVICE == "cuda"
    for renormalize in (True, False) if both else (dtype == torch.float32,):
        _check_topk(logits.to(DEVICE), top_k, renormalize)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_topk_softmax_ties(dtype):
    """Exact ties everywhere (integer logits in [-2, 2]), an all-equal row (ids 0..k-1, weights
    1/E or 1/k), a row whose top values tie across the k boundary, -inf logits, and a row with
    a stride (a view into a wider tensor)."""
    g = torch.Generator().manual_seed(7)
    E, K = 512, 10
    logits = torch.randint(-2, 3, (6, E), generator=g).float()
    logits[1] = 0.0
    logits[2] = -1.0
    logits[2, [500, 3, 77, 400, 9, 11, 300, 2, 256, 128, 64, 511]] = 1.0  # 12 tied for 10 slots
    logits[3, :E - 3] = float("-inf")  # only 3 finite: the rest are zero probabilities
    wide = torch.zeros(6, E + 64)
    wide[:, :E] = logits
    logits = wide[:, :E]  # row stride E + 64
    for renormalize in (True, False):
        _check_topk(logits.to(dtype).to(DEVICE), K, renormalize)
    w, ids = moe_topk_softmax(logits.to(dtype).to(DEVICE), K, True)
    assert ids[1].tolist() == list(range(K)) and ids[2].tolist() == [2, 3, 9, 11, 64, 77, 128, 256, 300, 400]
    assert ids[3, :3].tolist() == [E - 3, E - 2, E - 1] and ids[3, 3:].tolist() == list(range(K - 3))
    assert torch.all(w[1].float() == 0.1) if dtype == torch.float32 else torch.allclose(w[1].float(), w[1, :1].float())


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens", [1, 7], ids=["decode1", "batch7"])
def test_fused_moe_matches_ref(dtype, tol, tokens):
    E, K, H, I = 5, 2, 24, 40  # H, I not multiples of the tiles; some experts get no token
    g = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, H, generator=g).to(dtype).to(DEVICE)
    gate_up, down = _experts(E, H, I, dtype)
    weights, ids = moe_topk_softmax_ref(torch.randn(tokens, E, generator=g), K, True)
    weights, ids = weights.to(dtype).to(DEVICE), ids.to(DEVICE)
    got = fused_moe(x, gate_up, down, weights, ids)
    want = fused_moe_ref(x.cpu().float(), gate_up.cpu().float(), down.cpu().float(), weights.cpu().float(), ids.cpu())
    assert got.dtype == dtype
    assert rel_err(got.float().cpu(), want) < tol



@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_fused_moe_relu2_matches_ref(dtype, tol):
    """Nemotron-H's experts: relu(x up^T)^2 down^T, not gated; fp32 routing weights."""
    E, K, H, I, T = 5, 2, 24, 40, 7
    g = torch.Generator().manual_seed(6)
    x = torch.randn(T, H, generator=g).to(dtype).to(DEVICE)
    up = (torch.randn(E, I, H, generator=g) / H ** 0.5).to(dtype).to(DEVICE)
    down = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype).to(DEVICE)
    weights, ids = torch.rand(T, K, generator=g).to(DEVICE), torch.randint(0, E, (T, K), generator=g).to(DEVICE)
    got = fused_moe(x, up, down, weights, ids, activation="relu2")
    want = fused_moe_ref(x.cpu().float(), up.cpu().float(), down.cpu().float(), weights.cpu(), ids.cpu(),
                         activation="relu2")
    assert got.dtype == dtype
    assert rel_err(got.float().cpu(), want) < tol

def test_fused_moe_more_experts_than_assignments():
    """Decode-like: 2 tokens x top-4 over 32 experts (8 assignments, so at most 8 tiles are
    launched, not cdiv(8, BLOCK_M) + 32); every assignment still lands in its expert's tile."""
    E, K, H, I, T = 32, 4, 24, 40, 2
    g = torch.Generator().manual_seed(9)
    x = torch.randn(T, H, generator=g).to(DEVICE)
    gate_up, down = _experts(E, H, I, torch.float32, seed=3)
    weights, ids = moe_topk_softmax_ref(torch.randn(T, E, generator=g), K, True)
    got = fused_moe(x, gate_up, down, weights.to(DEVICE), ids.to(DEVICE))
    want = fused_moe_ref(x.cpu(), gate_up.cpu(), down.cpu(), weights, ids)
    assert rel_err(got.cpu(), want) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_moe_one_row_tiles_equal_grouped_tiles(dtype, monkeypatch):
    """Decode over many experts (4A <= E) skips the grouping pass, a tile per assignment: the
    same bits as the grouped layout (a row's values do not depend on its tile's other rows,
    nor, on the GPU, on the tiles' widths: each output adds its K products in the same order
    whatever BLOCK_N and BLOCK_K are), and the reference's values. Under the interpreter a
    tl.dot is NumPy's matmul, whose sums do depend on the block's shape: there the one-row
    GEMMs take the grouped ones' tiles."""
    from hybrid_serve.kernels.moe import triton_moe

    monkeypatch.setenv("HYBRID_SERVE_MOE_ONE_ROW_TILES", "1")
    if DEVICE != "cuda":
        for first in (True, False):
            monkeypatch.setitem(triton_moe.GEMM_TILES, (True, first), triton_moe.GEMM_TILES[(False, first)])
    E, K, H, I, T = 64, 4, 24, 40, 3
    g = torch.Generator().manual_seed(11)
    x = torch.randn(T, H, generator=g).to(dtype).to(DEVICE)
    gate_up, down = _experts(E, H, I, dtype, seed=4)
    weights, ids = moe_topk_softmax_ref(torch.randn(T, E, generator=g), K, True)
    weights, ids = weights.to(dtype).to(DEVICE), ids.to(DEVICE)
    assert triton_moe.one_row_tiles(T * K, E)
    one_row = fused_moe(x, gate_up, down, weights, ids, out_dtype=torch.float32)
    monkeypatch.setattr(triton_moe, "one_row_tiles", lambda *_: False)
    grouped = fused_moe(x, gate_up, down, weights, ids, out_dtype=torch.float32)
    assert torch.equal(one_row, grouped)
    want = fused_moe_ref(x.cpu().float(), gate_up.cpu().float(), down.cpu().float(), weights.cpu().float(), ids.cpu())
    assert rel_err(one_row.cpu(), want) < (1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_fused_moe_adds_the_shared_term(dtype, tol, gated):
    """`shared` (times sigmoid(shared_gate), the logit a strided column of the router's output)
    joins the experts' fp32 sum: equal to the reference, and to the model's arithmetic before
    the term moved into the kernel (sigmoid of the gate linear in x's dtype, times the fp32
    shared partial, added to the fp32 routed partial, rounded once)."""
    E, K, H, I, T = 6, 2, 24, 40, 5
    g = torch.Generator().manual_seed(12)
    x = torch.randn(T, H, generator=g).to(dtype).to(DEVICE)
    gate_up, down = _experts(E, H, I, dtype, seed=5)
    logits = torch.randn(T, E + 1, generator=g).to(DEVICE)  # router | shared gate, fp32
    weights, ids = moe_topk_softmax(logits[:, :E], K, True, out_dtype=dtype)
    shared = torch.randn(T, H, generator=g).to(DEVICE)
    gate = logits[:, E:] if gated else None
    got = fused_moe(x, gate_up, down, weights, ids, shared=shared, shared_gate=gate)
    assert got.dtype == dtype
    routed = fused_moe(x, gate_up, down, weights, ids, out_dtype=torch.float32)
    scale = torch.sigmoid(gate.to(dtype)) if gated else 1.0
    before = (routed + scale * shared).to(dtype)  # the model's old arithmetic on the same routed sum
    assert rel_err(got.float().cpu(), before.float().cpu()) < (1e-6 if dtype == torch.float32 else 8e-3)
    want = fused_moe_ref(x.cpu().float(), gate_up.cpu().float(), down.cpu().float(), weights.cpu().float(),
                         ids.cpu(), shared=shared.cpu(), shared_gate=None if gate is None else gate.cpu().to(dtype))
    assert rel_err(got.float().cpu(), want) < tol
    with pytest.raises(ValueError, match="shared_gate needs shared"):
        fused_moe(x, gate_up, down, weights, ids, shared_gate=logits[:, E:])


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16_out", "fp32_out"])
def test_shared_expert_combine_in_the_skinny_launch(gated, out_dtype):
    """A decode row's MoE tail in one launch: fused_moe(combine=False) gives the weighted expert
    rows (the reference's, in slot order), and the skinny kernel's down projection of the shared
    expert's [gate | up] (fp32 sums of the router's GEMM), gated and added to their sum, gives
    the bits of the two-launch path (the shared term as its own fp32 product, then
    fused_moe(shared=, shared_gate=))."""
    from hybrid_serve.kernels.linear import skinny_linear

    E, K, H, I, I_shared = 8, 3, 48, 40, 24
    g = torch.Generator().manual_seed(21)
    x = torch.randn(1, H, generator=g).to(torch.bfloat16).to(DEVICE)
    gate_up, down = _experts(E, H, I, torch.bfloat16, seed=6)
    projections = torch.randn(1, E + 1 + 2 * I_shared, generator=g).to(DEVICE)  # router | gate | shared gate_up
    shared_down = (torch.randn(H, I_shared, generator=g) / I_shared ** 0.5).to(torch.bfloat16).to(DEVICE)
    weights, ids = moe_topk_softmax(projections[:, :E], K, True, out_dtype=torch.bfloat16)
    gate = projections[:, E:E + 1] if gated else None
    shared_gate_up = projections[:, E + 1:].contiguous()
    rows = fused_moe(x, gate_up, down, weights, ids, combine=False)
    assert rows.shape == (K, H) and rows.dtype == torch.float32
    want_rows = fused_moe_ref(x.cpu(), gate_up.cpu(), down.cpu(), weights.cpu(), ids.cpu(), combine=False)
    assert rel_err(rows.cpu(), want_rows) < 1e-5
    got = skinny_linear(shared_gate_up, shared_down, out_dtype=out_dtype, x_silu_and_mul=True, topk_rows=rows,
                        shared_gate=gate)
    shared = skinny_linear(shared_gate_up, shared_down, out_dtype=torch.float32, x_silu_and_mul=True)
    two_launches = fused_moe(x, gate_up, down, weights, ids, out_dtype=out_dtype, shared=shared, shared_gate=gate)
    assert got.dtype == out_dtype and torch.equal(got, two_launches)
    with pytest.raises(ValueError, match="combine=False returns the expert rows alone"):
        fused_moe(x, gate_up, down, weights, ids, shared=shared, combine=False)
    with pytest.raises(ValueError, match="topk_rows must be"):
        skinny_linear(shared_gate_up, shared_down, x_silu_and_mul=True, topk_rows=rows[:, 1:])
    with pytest.raises(ValueError, match="shared_gate needs topk_rows"):
        skinny_linear(shared_gate_up, shared_down, x_silu_and_mul=True, shared_gate=projections[:, E:E + 1])


def test_topk_softmax_out_dtype_and_strided_logits():
    """Weights written in the asked dtype (no cast launch after), logits a column slice."""
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(13)).to(DEVICE)
    w, ids = moe_topk_softmax(logits[:, :8], 2, True, out_dtype=torch.bfloat16)
    want_w, want_ids = moe_topk_softmax(logits[:, :8].contiguous(), 2, True)
    assert w.dtype == torch.bfloat16 and torch.equal(ids, want_ids)
    assert torch.equal(w, want_w.to(torch.bfloat16))
    ref_w, _ = moe_topk_softmax_ref(logits[:, :8].cpu(), 2, True, out_dtype=torch.bfloat16)
    assert ref_w.dtype == torch.bfloat16


def test_fused_moe_many_tokens_one_expert():
    """All assignments on one expert: several tiles of one expert, the others idle."""
    E, K, H, I, T = 4, 1, 16, 16, 37
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    gate_up, down = _experts(E, H, I, torch.float32)
    ids = torch.full((T, K), 2, dtype=torch.int64, device=DEVICE)
    weights = torch.rand(T, K, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    assert rel_err(fused_moe(x, gate_up, down, weights, ids).cpu(),
                   fused_moe_ref(x.cpu(), gate_up.cpu(), down.cpu(), weights.cpu(), ids.cpu())) < 1e-5


def test_refs_match_model_moe():
    from hybrid_serve.models.layers.moe import FusedExperts, softmax_topk

    logits = torch.randn(6, 8, generator=torch.Generator().manual_seed(5))
    for renorm in (True, False):
        a, b = softmax_topk(logits, 2, renorm), moe_topk_softmax_ref(logits, 2, renorm)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    experts = FusedExperts(8, 16, 24)
    experts.gate_up_proj.data.normal_()
    experts.down_proj.data.normal_()
    x = torch.randn(6, 16)
    w, ids = softmax_topk(logits, 2, True)
    assert torch.equal(experts(x, ids, w), fused_moe_ref(x, experts.gate_up_proj.data, experts.down_proj.data, w, ids))


def test_moe_rejects_bad_inputs():
    gate_up, down = _experts(4, 16, 8, torch.float32)
    x = torch.randn(2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe(x, gate_up, down, torch.ones(2, 1, device=DEVICE), torch.full((2, 1), 4, device=DEVICE))
    with pytest.raises(ValueError, match="top_k"):
        moe_topk_softmax(torch.randn(2, 4, device=DEVICE), 5, True)


@gpu
@pytest.mark.parametrize("tokens", [1, 64, 2048], ids=["decode1", "decode64", "prefill2k"])
def test_fused_moe_serving_shapes_gpu(tokens):
    """Qwen3-Next-like: 512 experts, top 10, hidden 2048, expert intermediate 512, bf16."""
    E, K, H, I = 512, 10, 2048, 512
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    gate_up, down = _experts(E, H, I, torch.bfloat16, device="cuda")
    router_logits = torch.randn(tokens, E, device="cuda")
    w, ids = moe_topk_softmax(router_logits, K, True)
    want_w, want_ids = moe_topk_softmax_ref(router_logits, K, True)
    assert torch.equal(ids, want_ids) and rel_err(w, want_w) < 1e-5
    got = fused_moe(x, gate_up, down, w, ids)
    want = fused_moe_ref(x.float(), gate_up.float(), down.float(), w.float(), ids)
    assert rel_err(got.float(), want) < 2e-2


@gpu
@pytest.mark.parametrize("tokens", [1, 4], ids=["decode1", "decode4"])
def test_fused_moe_one_row_tiles_equal_grouped_tiles_serving_shapes_gpu(tokens, monkeypatch):
    """At Qwen3-Next's shapes (several K tiles in both GEMMs) the one-row tiles' own widths
    (GEMM_TILES) give the grouped tiles' bits: a decode step's tokens do not depend on which
    layout its row count picks (an eager step vs a graph padded past the one-row bound)."""
    from hybrid_serve.kernels.moe import triton_moe

    monkeypatch.setenv("HYBRID_SERVE_MOE_ONE_ROW_TILES", "1")
    E, K, H, I = 512, 10, 2048, 512
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    gate_up, down = _experts(E, H, I, torch.bfloat16, device="cuda")
    w, ids = moe_topk_softmax(torch.randn(tokens, E, device="cuda"), K, True, out_dtype=torch.bfloat16)
    assert triton_moe.one_row_tiles(tokens * K, E)
    one_row = fused_moe(x, gate_up, down, w, ids, out_dtype=torch.float32)
    monkeypatch.setattr(triton_moe, "one_row_tiles", lambda *_: False)
    assert torch.equal(one_row, fused_moe(x, gate_up, down, w, ids, out_dtype=torch.float32))


def test_fused_moe_rows_do_not_depend_on_the_row_count():
    """A token's output is bit-identical whether the call carries 5 rows or those 5 plus 3
    more (an eager decode step vs the CUDA graph padded to 8): routing tiles, the expert
    GEMMs and the top-k combine are all row-independent."""
    gen = torch.Generator().manual_seed(3)
    experts, hidden, inter, top_k = 8, 64, 32, 4
    x = torch.randn(8, hidden, generator=gen).to(DEVICE, torch.bfloat16)
    gate_up = (0.1 * torch.randn(experts, 2 * inter, hidden, generator=gen)).to(DEVICE, torch.bfloat16)
    down = (0.1 * torch.randn(experts, hidden, inter, generator=gen)).to(DEVICE, torch.bfloat16)
    weights, ids = moe_topk_softmax(torch.randn(8, experts, generator=gen).to(DEVICE), top_k, True)
    five = fused_moe(x[:5], gate_up, down, weights[:5], ids[:5])
    eight = fused_moe(x, gate_up, down, weights, ids)
    assert torch.equal(five, eight[:5])
