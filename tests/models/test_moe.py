"""SparseMoeBlock vs a naive per-token loop; per-expert and fused weight loading; TP slicing of
experts (partials of tp ranks sum to the unsharded output, no process group needed)."""
import pytest
import torch
import torch.nn.functional as F

from hybrid_serve.models.layers.moe import FusedExperts, PerExpertWeightLoader, SparseMoeBlock
from hybrid_serve.distributed import set_tp_group
from hybrid_serve.models.layers.mlp import GatedMLP

H, E, K, I, S = 24, 6, 2, 16, 20  # hidden, experts, top-k, expert intermediate, shared intermediate


def _checkpoint(seed=0):
    """Per-expert tensors in the Hub layout, plus router / shared-expert weights."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen) * 0.3  # noqa: E731
    ckpt = {"gate.weight": r(E, H), "shared_expert_gate.weight": r(1, H)}
    for name, shape in (("gate_proj", (S, H)), ("up_proj", (S, H)), ("down_proj", (H, S))):
        ckpt[f"shared_expert.{name}.weight"] = r(*shape)
    for e in range(E):
        ckpt[f"experts.{e}.gate_proj.weight"] = r(I, H)
        ckpt[f"experts.{e}.up_proj.weight"] = r(I, H)
        ckpt[f"experts.{e}.down_proj.weight"] = r(H, I)
    return ckpt


def _naive(x, ckpt, norm_topk_prob):
    """Token by token, expert by expert, straight from the checkpoint tensors."""
    mlp = lambda v, p: ckpt[f"{p}.down_proj.weight"] @ (  # noqa: E731
        F.silu(ckpt[f"{p}.gate_proj.weight"] @ v) * (ckpt[f"{p}.up_proj.weight"] @ v))
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        probs = torch.softmax(ckpt["gate.weight"] @ x[t], dim=-1)
        top = sorted(range(E), key=lambda e: -probs[e].item())[:K]
        total = sum(probs[e] for e in top) if norm_topk_prob else 1.0
        for e in top:
            out[t] += probs[e] / total * mlp(x[t], f"experts.{e}")
        out[t] += torch.sigmoid(ckpt["shared_expert_gate.weight"][0] @ x[t]) * mlp(x[t], "shared_expert")
    return out


def _block(norm_topk_prob):
    return SparseMoeBlock(H, E, K, I, norm_topk_prob, shared_expert=GatedMLP(H, S), shared_expert_gate=True)


def _load(block, ckpt):
    """Load through the same path as a model: parameter loaders, per-expert keys via the helper."""
    params, loaded = dict(block.named_parameters()), set()
    per_expert = PerExpertWeightLoader(block)
    for name, tensor in ckpt.items():
        if per_expert(name, tensor, loaded):
            continue
        loader = getattr(params[name], "weight_loader", None)
        if loader is None:
            params[name].data.copy_(tensor)
        else:
            loader(params[name], tensor, name)
        loaded.add(name)
    return loaded


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_block_matches_naive_loop(norm_topk_prob):
    torch.manual_seed(0)
    ckpt = _checkpoint()
    block = _block(norm_topk_prob)
    assert _load(block, ckpt) == set(dict(block.named_parameters()))
    x = torch.randn(13, H)
    with torch.no_grad():
        torch.testing.assert_close(block(x), _naive(x, ckpt, norm_topk_prob), rtol=1e-5, atol=1e-5)
        for module in block.modules():  # as the loader does: x's GEMMs (router, shared gate, shared
            if hasattr(module, "post_load"):  # gate/up) become one
                module.post_load()
        assert block.router.weight.shape == (E + 1 + 2 * S, H)
        assert block.gate.weight.data_ptr() == block.router.weight.data_ptr()
        gate_up = block.shared_expert.gate_up.weight
        assert gate_up.shape == (2 * S, H) and gate_up.data_ptr() == block.router.weight[E + 1:].data_ptr()
        torch.testing.assert_close(block(x), _naive(x, ckpt, norm_topk_prob), rtol=1e-5, atol=1e-5)
        from hybrid_serve.models.layers import ops

        for few in (True, False):  # decode rows: the one GEMM; prompt rows: router and shared expert apart
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(ops, "few_rows", lambda _x, few=few: few)
                torch.testing.assert_close(block(x), _naive(x, ckpt, norm_topk_prob), rtol=1e-5, atol=1e-5)


def test_fused_checkpoint_form_loads_the_same():
    ckpt = _checkpoint()
    fused = {k: v for k, v in ckpt.items() if not k.startswith("experts.")}
    fused["experts.gate_up_proj"] = torch.stack(
        [torch.cat([ckpt[f"experts.{e}.gate_proj.weight"], ckpt[f"experts.{e}.up_proj.weight"]]) for e in range(E)]
    )  # [E, 2I, H]
    fused["experts.down_proj"] = torch.stack([ckpt[f"experts.{e}.down_proj.weight"] for e in range(E)])  # [E, H, I]
    a, b = _block(True), _block(True)
    _load(a, ckpt)
    _load(b, fused)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name


def test_missing_expert_part_is_not_reported_loaded():
    ckpt = _checkpoint()
    del ckpt["experts.3.up_proj.weight"]
    loaded = _load(_block(True), ckpt)
    assert "experts.gate_up_proj" not in loaded and "experts.down_proj" in loaded


def test_bad_expert_id_and_shape_raise():
    block = _block(True)
    with pytest.raises(ValueError, match="expert 6"):
        PerExpertWeightLoader(block)("experts.6.up_proj.weight", torch.zeros(I, H), set())
    with pytest.raises(ValueError, match="shape mismatch"):
        PerExpertWeightLoader(block)("experts.0.down_proj.weight", torch.zeros(I, H), set())


def test_tp_shards_sum_to_unsharded_experts():
    ckpt = _checkpoint()
    x = torch.randn(9, H)
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(9)])  # [T, K]
    weights = torch.rand(9, K)
    experts_ckpt = {k: v for k, v in ckpt.items() if k.startswith("experts.")}
    full = torch.nn.Module()
    full.experts = FusedExperts(E, H, I)
    _load(full, experts_ckpt)
    partial_sum = torch.zeros(9, H)
    try:
        for rank in range(2):
            set_tp_group(rank, 2, None)
            shard = torch.nn.Module()
            shard.experts = FusedExperts(E, H, I)  # [E, 2 * I/2, H] and [E, H, I/2]
            assert tuple(shard.experts.gate_up_proj.shape) == (E, I, H)
            assert tuple(shard.experts.down_proj.shape) == (E, H, I // 2)
            _load(shard, experts_ckpt)
            with torch.no_grad():
                partial_sum += shard.experts(x, ids, weights)
    finally:
        set_tp_group(0, 1, None)
    with torch.no_grad():
        torch.testing.assert_close(partial_sum, full.experts(x, ids, weights), rtol=1e-5, atol=1e-5)
