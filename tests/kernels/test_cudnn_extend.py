"""Long rows on cuDNN at padded shapes (kernels/attention/cudnn_extend.py): the row's cut
(prefix blocks unmasked, the prefix tail and own tokens as a padded top-left causal square
with dummy front rows), the merge of the parts by log-sum-exp (Triton vs reference), and the
whole split against plain causal attention over prefix + new keys. On CPU the parts run
through `math_part` (cudnn_part's contract in torch) at small constants; the `gpu` test runs
cuDNN itself at the serving shapes."""
import pytest
import torch
from kernel_utils import DEVICE, gpu, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.attention import cudnn_extend as ce  # noqa: E402
from hybrid_serve.kernels.attention import merge_attention_parts, merge_attention_parts_ref  # noqa: E402


def causal_attention(q, keys, values, scale):
    """q: [n, Hq, D] the last n positions of keys/values [S, Hkv, *]: bottom-right causal, fp32."""
    n, hq, s = q.shape[0], q.shape[1], keys.shape[0]
    rep = hq // keys.shape[1]
    scores = torch.einsum("nhd,shd->hns", q.double(), keys.double().repeat_interleave(rep, 1)) * scale
    mask = torch.arange(s)[None, :] > torch.arange(n)[:, None] + (s - n)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("hns,shd->nhd", torch.softmax(scores, -1), values.double().repeat_interleave(rep, 1))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("write_lse", [False, True])
def test_merge_kernel_matches_ref(out_dtype, write_lse):
    g = torch.Generator().manual_seed(0)
    T, H, Dv = 7, 3, 40  # Dv not a power of two: masked lanes
    big_a = torch.randn(T + 2, H, Dv, generator=g).to(torch.bfloat16)
    o_a = big_a[2:]  # a row slice (offset start), as part B's rows are
    o_b = torch.randn(T, H + 1, Dv, generator=g)[:, 1:]  # strided heads, fp32 (an accumulator)
    lse_a = (torch.randn(H, T + 3, generator=g) * 4)[:, 3:].t()  # [T, H] transposed view, as cuDNN's
    lse_b = torch.randn(T, H, generator=g) * 4 + 10  # far apart: the max shift matters
    to = lambda t: t.to(DEVICE)  # noqa: E731
    want = torch.empty(T, H, Dv, dtype=out_dtype)
    want_lse = torch.empty(T, H)
    merge_attention_parts_ref(o_a, lse_a, o_b, lse_b, want, want_lse)
    got = torch.full((T, H, Dv), float("nan"), dtype=out_dtype, device=DEVICE)
    got_lse = torch.full((T, H), float("nan"), device=DEVICE) if write_lse else None
    merge_attention_parts(to(o_a), to(lse_a), to(o_b), to(lse_b), got, got_lse)
    assert rel_err(got.cpu(), want) < (1e-6 if out_dtype == torch.float32 else 4e-3)
    if write_lse:
        assert torch.allclose(got_lse.cpu(), want_lse, atol=1e-5)
    # the merge of two halves of one key set is attention over the whole set
    q, keys, vals = torch.randn(T, H, 8, generator=g), torch.randn(10, H, 8, generator=g), torch.randn(10, H, Dv, generator=g)
    full, _ = ce.math_part(torch.cat([torch.zeros(3, H, 8), q]), keys, vals, False, 0.3)
    a, la = ce.math_part(q, keys[:4], vals[:4], False, 0.3)
    b, lb = ce.math_part(q, keys[4:], vals[4:], False, 0.3)
    merged = torch.empty(T, H, Dv)
    merge_attention_parts_ref(a, la, b, lb, merged)
    assert rel_err(merged, full[3:]) < 1e-5


def test_merge_rejects_bad_shapes():
    o = torch.zeros(4, 2, 8, device=DEVICE)
    lse = torch.zeros(4, 2, device=DEVICE)
    with pytest.raises(ValueError, match="o_b"):
        merge_attention_parts(o, lse, torch.zeros(4, 3, 8, device=DEVICE), lse, o)
    with pytest.raises(ValueError, match="lse_a"):
        merge_attention_parts(o, lse.double(), o, lse, o)
    with pytest.raises(ValueError, match="out"):  # a clear error, not a failed unpacking
        merge_attention_parts(o, lse, o, lse, o[:, 0])


def test_split_row_at_serving_constants():
    # a 32k prompt in 8,192-token chunks: chunk i has i full prefix blocks, no tail
    for i in range(4):
        split = ce.split_row(i * 8192, 8192)
        assert split == ce.RowSplit(prefix_blocks=i, tail=0, q_rows=8192, square=8192)
    assert ce.split_row(0, 2047) is None  # short rows keep flash
    assert ce.split_row(0, 3000) == ce.RowSplit(0, 0, 3072, 3072)
    # a cached prefix ending mid-block: its tail joins the square
    assert ce.split_row(10000, 6000) == ce.RowSplit(1, 1808, 6144, 8192)
    # a long tail with few new tokens: the square's dummy rows cost more than cuDNN saves
    assert ce.split_row(8191, 2048) is None


@pytest.fixture
def small_constants(monkeypatch):
    monkeypatch.setattr(ce, "CUDNN_MIN_TOKENS", 4)
    monkeypatch.setattr(ce, "LEN_GRANULE", 8)
    monkeypatch.setattr(ce, "PREFIX_BLOCK", 16)
    monkeypatch.setattr(ce, "CUDNN_COST_MARGIN", 1e9)  # every row takes the split


CASES = [(0, 5), (0, 16), (7, 9), (16, 5), (37, 11), (48, 20)]


@pytest.mark.parametrize("prefix,new", CASES, ids=[f"p{p}n{n}" for p, n in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_matches_causal_attention(small_constants, prefix, new, dtype):
    g = torch.Generator().manual_seed(prefix * 100 + new)
    hq, hkv, d, dv = 4, 2, 8, 6
    q = torch.randn(new, hq, d, generator=g).to(dtype)
    keys = torch.randn(prefix + new, hkv, d, generator=g).to(dtype)
    vals = torch.randn(prefix + new, hkv, dv, generator=g).to(dtype)
    split = ce.split_row(prefix, new)
    assert split.prefix_blocks == prefix // 16 and split.tail == prefix % 16
    want = causal_attention(q, keys, vals, 0.35)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for merge in (merge_attention_parts_ref, None):  # the reference merge, then the Triton one
        to = (lambda t: t) if merge is not None else (lambda t: t.to(DEVICE))  # noqa: E731
        out = torch.full((new, hq, dv), float("nan"), dtype=dtype, device="cpu" if merge else DEVICE)
        ce.attend_row_split(to(q), to(keys[prefix:]), to(vals[prefix:]), to(keys[:prefix]), to(vals[:prefix]),
                            split, 0.35, out, part=ce.math_part, merge=merge)
        assert rel_err(out.cpu(), want) < tol, (prefix, new, merge)


@gpu
@pytest.mark.parametrize("prefix,new", [(0, 8192), (8192, 8192), (24576, 8192), (10000, 6000), (0, 3000)])
def test_cudnn_split_matches_flash_at_serving_shapes(prefix, new):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    if not ce.cudnn_usable(torch.empty(0, 16, 256, device="cuda", dtype=torch.bfloat16), 2, 256):
        pytest.skip("cuDNN attention path is off on this GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    hq, hkv, d = 16, 2, 256
    q = torch.randn(new, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    keys = torch.randn(prefix + new, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    vals = torch.randn(prefix + new, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    split = ce.split_row(prefix, new)
    assert split is not None
    out = torch.full((new, hq, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    ce.attend_row_split(q, keys[prefix:], vals[prefix:], keys[:prefix], vals[:prefix], split, d ** -0.5, out)
    mask = causal_lower_right(new, prefix + new) if prefix else None
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        want = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys.transpose(0, 1)[None], vals.transpose(0, 1)[None], attn_mask=mask,
            is_causal=not prefix, enable_gqa=True)[0].transpose(0, 1)
    assert rel_err(out, want) < 1e-2


@pytest.mark.parametrize("max_tokens,max_context", [(8192, 32784), (8192, 8192), (16384, 131072), (2048, 4096)])
def test_warm_up_builds_every_shape_a_row_can_ask_for(monkeypatch, max_tokens, max_context):
    """No plan is built after ready: every cuDNN call `split_row` can lead to, for rows of up to
    max_tokens new tokens in contexts up to max_context, has the shape of a warm-up call."""
    calls = []

    def record(q, k, v, causal, scale):
        calls.append((q.shape[0], k.shape[0], causal))
        return q, torch.zeros(q.shape[0], q.shape[1])

    monkeypatch.setattr(ce, "cudnn_part", record)
    monkeypatch.setattr(ce, "_cudnn_ready", lambda device: True)
    monkeypatch.setattr(ce, "cudnn_usable", lambda q, kv_heads, v_dim: True)
    built = ce.warm_up_cudnn_extend(16, 2, 8, 8, 0.1, torch.bfloat16, torch.device("cpu"), max_tokens, max_context)
    warmed = set(calls)
    assert built == len(warmed) > 0
    needed = set()
    step = 256  # prefixes and rows at page-ish granularity, plus the edges
    for new in sorted({*range(ce.CUDNN_MIN_TOKENS, max_tokens + 1, step), ce.CUDNN_MIN_TOKENS, max_tokens}):
        for prefix in sorted({*range(0, max_context - new + 1, step * 4), max_context - new, 8191, 8192, 8193}):
            if prefix < 0 or prefix + new > max_context:
                continue
            split = ce.split_row(prefix, new)
            if split is None:
                continue
            needed.add((split.square, split.square, True))
            if split.prefix_blocks:
                needed.add((split.q_rows, ce.PREFIX_BLOCK, False))
    assert needed <= warmed, sorted(needed - warmed)[:5]


def test_head_dims_and_a_refused_layout_keep_flash(monkeypatch):
    assert ce.head_dims_supported(256, 256) and ce.head_dims_supported(64, 128)
    assert not ce.head_dims_supported(512, 512) and not ce.head_dims_supported(100, 128)

    def refuse(q, k, v, causal, scale):
        raise RuntimeError("cuDNN Frontend error: no valid execution plan")

    monkeypatch.setattr(ce, "cudnn_part", refuse)
    monkeypatch.setattr(ce, "_cudnn_ready", lambda device: True)
    monkeypatch.setattr(ce, "_REFUSED", set())
    probe = torch.empty(0, 16, 256, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the checks up to the device
    assert ce.cudnn_usable(probe, 2, 256)
    assert ce.warm_up_cudnn_extend(16, 2, 256, 256, 0.1, torch.bfloat16, torch.device("cpu"), 8192, 32768) == 0
    assert not ce.cudnn_usable(probe, 2, 256)  # that layout's rows go to flash from now on
    assert ce.cudnn_usable(torch.empty(0, 8, 128, dtype=torch.bfloat16), 2, 128)  # others are unaffected
    assert not ce.cudnn_usable(torch.empty(0, 8, 512, dtype=torch.bfloat16), 2, 512)  # head dim 512: flash
