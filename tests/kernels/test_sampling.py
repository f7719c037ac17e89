"""sample_tokens / masked_logits (device path) vs the per-row reference."""
import numpy as np
import pytest
import torch
from kernel_utils import DEVICE, gpu, require_triton

require_triton()
from hybrid_serve.kernels.sampling import (  # noqa: E402
    greedy_argmax, greedy_argmax_ref, masked_logits, masked_logits_ref, sample_tokens)


def _params(rows, device=DEVICE):
    """rows: list of (temperature, top_k, top_p, min_p)."""
    t, k, p, m = zip(*rows)
    return (torch.tensor(t, device=device), torch.tensor(k, dtype=torch.int32, device=device),
            torch.tensor(p, device=device), torch.tensor(m, device=device))


ROWS = [(1.0, -1, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 0.6, 0.0), (1.0, -1, 1.0, 0.2), (0.5, 8, 0.9, 0.05),
        (0.0, 3, 0.5, 0.1), (2.0, 1, 1.0, 0.0)]


def test_masked_logits_match_engine_rule():
    logits = torch.randn(len(ROWS), 50, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    params = _params(ROWS)
    got = masked_logits(logits, *params).cpu()
    want = masked_logits_ref(logits.cpu(), *(t.cpu() for t in params))
    assert torch.equal(got.isinf(), want.isinf())
    assert torch.allclose(got[~got.isinf()], want[~want.isinf()], rtol=1e-6, atol=1e-6)


def test_engine_host_sampler_draws_inside_the_ref_mask():
    """The engine's host path (CPU) masks with masked_logits_row_ref: every draw of a row
    lies where the reference keeps the logit finite, and a greedy row takes the argmax."""
    from types import SimpleNamespace

    from hybrid_serve.engine.sampler import sample
    from hybrid_serve.kernels.sampling import masked_logits_row_ref

    logits = torch.randn(len(ROWS[:6]), 64, generator=torch.Generator().manual_seed(1))
    reqs = [SimpleNamespace(params=SimpleNamespace(temperature=t, top_k=k, top_p=p, min_p=m, greedy=t == 0.0),
                            generator=torch.Generator().manual_seed(i)) for i, (t, k, p, m) in enumerate(ROWS[:6])]
    kept = [masked_logits_row_ref(logits[b], t, k, p, m).isfinite() if t > 0 else None
            for b, (t, k, p, m) in enumerate(ROWS[:6])]
    for _ in range(50):
        tokens = sample(logits, reqs).tolist()
        for b, token in enumerate(tokens):
            assert token == int(logits[b].argmax()) if kept[b] is None else bool(kept[b][token])


def test_greedy_rows_take_argmax_and_reproducible_draws():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 300, generator=g).to(DEVICE)  # V=300 > one block only if BLOCK_V < 300
    logits[0, 17] = logits[0, 250] = 50.0  # a tie: the first index wins
    rows = [(0.0, -1, 1.0, 0.0)] * 3 + [(1.0, -1, 1.0, 0.0)] * 3
    params = _params(rows)
    seeds = torch.tensor([1, 2, 3, 7, 7, 8], device=DEVICE)
    offsets = torch.tensor([0, 0, 0, 5, 5, 5], device=DEVICE)
    logits[4] = logits[3]
    tokens = sample_tokens(logits, *params, seeds, offsets, use_top_k_top_p=False, use_min_p=False).cpu()
    assert tokens[0] == 17 and torch.equal(tokens[1:3], logits[1:3].argmax(-1).cpu())
    assert tokens[3] == tokens[4]  # same logits, seed and offset -> same token
    again = sample_tokens(logits, *params, seeds, offsets).cpu()  # masking path, nothing masked
    assert torch.equal(tokens, again)


def _philox_uniform(seed: int, c0: np.ndarray, offset: int) -> np.ndarray:
    """Philox4x32-10 (the counter-based generator tl.philox implements), first output word,
    mapped to [0, 1) as uint_to_uniform_float does. Counter (c0, offset lo, offset hi, 0)."""
    m32 = np.uint64(0xFFFFFFFF)
    c0 = c0.astype(np.uint64)
    c1 = np.full_like(c0, offset & 0xFFFFFFFF)
    c2 = np.full_like(c0, (offset >> 32) & 0xFFFFFFFF)
    c3 = np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    A, B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        p0, p2 = A * c0, B * c2  # < 2**64: exact in uint64
        c0, c1, c2, c3 = ((p2 >> np.uint64(32)) ^ c1 ^ k0) & m32, p2 & m32, ((p0 >> np.uint64(32)) ^ c3 ^ k1) & m32, \
            p0 & m32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m32, (k1 + np.uint64(0xBB67AE85)) & m32
    x = c0.astype(np.uint32).view(np.int32).astype(np.int64)
    x = np.where(x < 0, -x - 1, x).astype(np.float32)
    return x * np.float32(4.6566127342e-10)


def test_tokens_equal_gumbel_max_with_the_same_noise():
    """Rebuild each row's Philox noise on the host: the kernel's token is argmax(l/T + G)."""
    g = torch.Generator().manual_seed(4)
    n, vocab = 24, 40
    logits = torch.randn(n, vocab, generator=g) * 2
    rows = [ROWS[i % len(ROWS)] for i in range(n)]
    params = _params(rows)
    seeds = torch.randint(0, 2**40, (n,), generator=g)
    offsets = torch.randint(0, 2**34, (n,), generator=g)
    for use_masks in (True, False):
        tokens = sample_tokens(logits.to(DEVICE), *params, seeds.to(DEVICE), offsets.to(DEVICE),
                               use_top_k_top_p=use_masks, use_min_p=use_masks).cpu()
        masked = masked_logits_ref(logits, *(t.cpu() for t in params)) if use_masks else logits
        for b, (temp, *_ ) in enumerate(rows):
            if temp == 0:
                assert tokens[b] == logits[b].argmax()
                continue
            scale = 1.0 if use_masks else 1.0 / np.float32(temp)
            u = _philox_uniform(int(seeds[b]), np.arange(vocab), int(offsets[b]))
            gumbel = -np.log(-np.log(np.maximum(u, np.float32(1e-30))))
            score = masked[b].numpy().astype(np.float32) * np.float32(scale) + gumbel
            assert tokens[b] == int(np.argmax(score)), (b, use_masks)


def test_sampling_rejects_bad_inputs():
    logits = torch.randn(2, 10, device=DEVICE)
    params = _params([(1.0, -1, 1.0, 0.0)] * 3)
    with pytest.raises(ValueError, match="temperature"):
        sample_tokens(logits, *params, torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))


@gpu
def test_sampling_serving_shapes_gpu():
    """Vocab 248k (Qwen3.5), batch 64, mixed params: masks equal the ref, greedy rows exact."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 248320, generator=g).cuda()
    rows = [ROWS[i % len(ROWS)] for i in range(64)]
    params = _params(rows, "cuda")
    got = masked_logits(logits, *params)
    want = masked_logits_ref(logits, *params)
    assert torch.equal(got.isinf(), want.isinf())
    tokens = sample_tokens(logits, *params, torch.arange(64, device="cuda"), torch.zeros(64, dtype=torch.long,
                                                                                        device="cuda"))
    greedy = params[0] == 0
    assert torch.equal(tokens[greedy], logits[greedy].argmax(-1))
    assert not torch.isinf(want.gather(1, tokens[:, None])).any()


@gpu
def test_draws_follow_the_masked_distribution_gpu():
    """8192 rows of the same logits, each its own (seed, offset): frequencies ~ softmax(masked)."""
    n = 8192
    base = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    for temp, top_k, top_p, min_p in [(1.0, -1, 1.0, 0.0), (0.8, 4, 1.0, 0.0), (1.0, -1, 0.7, 0.0),
                                      (1.0, -1, 1.0, 0.15)]:
        params = _params([(temp, top_k, top_p, min_p)] * n, "cuda")
        tokens = sample_tokens(base.repeat(n, 1).cuda(), *params, torch.full((n,), 1234, device="cuda"),
                               torch.arange(n, device="cuda")).cpu()
        want = torch.softmax(masked_logits_ref(base[None], *(t[:1].cpu() for t in params))[0], -1)
        freq = torch.bincount(tokens, minlength=8).float() / n
        assert (freq[want == 0] == 0).all(), "a masked token was drawn"
        assert (freq - want).abs().max() < 0.02, (temp, top_k, top_p, min_p, freq, want)


@pytest.mark.parametrize("vocab,block_v", [(50, 16), (200, 64), (1000, 256), (37, 4096)])
def test_greedy_argmax_is_torch_argmax(vocab, block_v):
    """Two launches over blocks of the vocabulary give torch.argmax's token on every row: the first
    index of a maximum repeated in several blocks, -0.0 equal to +0.0, a NaN the largest (its
    first index), rows of -inf (index 0), strided rows, and bf16 logits."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(9, vocab + 3, generator=gen)[:, :vocab]  # rows strided
    logits[1, [vocab - 1, 3, vocab // 2]] = 7.0  # a tie across blocks: the first index wins
    logits[2] = float("-inf")
    logits[3, :] = -1.0
    logits[3, 5], logits[3, vocab - 2] = -0.0, 0.0  # +-0 equal: index 5
    logits[4, [vocab // 3, vocab - 1]] = float("nan")
    logits[5] = -torch.arange(vocab, dtype=torch.float32)  # the max at index 0
    logits[6] = torch.arange(vocab, dtype=torch.float32)  # at the last index
    logits[7, vocab - 1] = float("inf")
    logits[8, :] = 0.0
    got = greedy_argmax(logits.to(DEVICE), block_v=block_v).cpu()
    assert got.dtype == torch.int64
    assert torch.equal(got, greedy_argmax_ref(logits))
    half = logits[[0, 1, 5, 6]].bfloat16()
    assert torch.equal(greedy_argmax(half.to(DEVICE), block_v=block_v).cpu(), greedy_argmax_ref(half))
    assert greedy_argmax(logits[:0].to(DEVICE)).shape == (0,)
    with pytest.raises(ValueError, match="block_v"):
        greedy_argmax(logits.to(DEVICE), block_v=48)
    with pytest.raises(ValueError, match="V = 0"):
        greedy_argmax(logits[:, :0].to(DEVICE))


def test_greedy_argmax_has_one_final_variant_for_every_vocabulary():
    """The engine's warm-up compiles greedy_argmax on a [1, 16] probe; serving must meet that
    variant at any real vocabulary (a final tile that followed V compiled after ready at 152k ids)."""
    from hybrid_serve.kernels.sampling.triton_sampling import ARGMAX_BLOCK_V, ARGMAX_MAX_PARTS, argmax_final_config

    vocabs = (16, 32_000, 65_536, 151_936, 262_144, ARGMAX_MAX_PARTS * ARGMAX_BLOCK_V)
    configs = {tuple(sorted(argmax_final_config(-(-v // ARGMAX_BLOCK_V)).items())) for v in vocabs}
    assert len(configs) == 1
    with pytest.raises(ValueError, match=f"{ARGMAX_MAX_PARTS + 1} partial keys a row, at most {ARGMAX_MAX_PARTS}"):
        greedy_argmax(torch.zeros(1, 16 * (ARGMAX_MAX_PARTS + 1), device=DEVICE), block_v=16)


def test_engine_warm_up_runs_every_sampling_launch_at_the_logits_width(monkeypatch):
    """engine/sampler.warm_up_sampling (the engine's warm-up, before ready) runs the greedy argmax
    and the Gumbel kernel with and without masking at the width it is given: the variants a
    greedy and a sampled (temperature, top-k/top-p/min-p) request meet at that vocabulary."""
    from hybrid_serve.engine import sampler

    monkeypatch.setenv("HYBRID_SERVE_KERNELS", "triton")  # the kernel path on this device too
    calls = []

    def record(name, fn):
        def wrapped(logits, *args, **kwargs):
            calls.append((name, tuple(logits.shape), logits.stride(0), logits.dtype, kwargs.get("use_top_k_top_p")))
            return fn(logits, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(sampler, "greedy_argmax", record("argmax", sampler.greedy_argmax))
    monkeypatch.setattr(sampler, "sample_tokens", record("sample", sampler.sample_tokens))
    sampler.warm_up_sampling(37, torch.device(DEVICE))
    assert calls == [("argmax", (2, 37), 37, torch.float32, None), ("sample", (2, 37), 37, torch.float32, False),
                     ("sample", (2, 37), 37, torch.float32, True)]
    calls.clear()
    monkeypatch.setenv("HYBRID_SERVE_KERNELS", "ref")  # off the kernel path: nothing
    sampler.warm_up_sampling(37, torch.device(DEVICE))
    assert calls == []
