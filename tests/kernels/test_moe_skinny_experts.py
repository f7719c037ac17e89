"""fused_moe's one-token experts without tensor cores (HYBRID_SERVE_MOE_ONE_ROW_TILES=skinny,
kernels/moe/skinny_experts.py) vs the reference and the tensor-core one-row tiles."""
import pytest
import torch
from kernel_utils import DEVICE, gpu, moe_experts, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.moe import fused_moe, fused_moe_ref, moe_topk_softmax, moe_topk_softmax_ref  # noqa: E402


class _LaunchSpy:
    """Stands in for a kernel: counts its launches and runs it."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


@pytest.mark.parametrize("activation", ["silu", "relu2"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hidden,inter,tile_k", [(64, 32, 16), (42, 22, 16), (40, 24, None)],
                         ids=["even", "ragged", "one_tile"])
def test_fused_moe_skinny_experts(activation, dtype, tol, hidden, inter, tile_k, monkeypatch):
    """HYBRID_SERVE_MOE_ONE_ROW_TILES=skinny: a one-token call streams its experts through
    `_moe_skinny_kernel` (K in several tiles or one, K and N multiples of the tile or not): the
    reference's values, and the tensor-core one-row tiles' values to fp32 rounding (the same
    sums in another order). Two tokens keep the tensor-core tiles: their bits."""
    from hybrid_serve.kernels.moe import skinny_experts

    if tile_k is not None:  # small K tiles: several a product under the interpreter too
        monkeypatch.setattr(skinny_experts, "moe_skinny_tiles", lambda k_in, gated: (4, tile_k, 4))
    E, K = 64, 4
    g = torch.Generator().manual_seed(21)
    x = torch.randn(2, hidden, generator=g).to(dtype).to(DEVICE)
    rows = (2 if activation == "silu" else 1) * inter
    gate_up = (torch.randn(E, rows, hidden, generator=g) / hidden ** 0.5).to(dtype).to(DEVICE)
    down = (torch.randn(E, hidden, inter, generator=g) / inter ** 0.5).to(dtype).to(DEVICE)
    weights, ids = moe_topk_softmax_ref(torch.randn(2, E, generator=g), K, True)
    weights, ids = weights.to(dtype).to(DEVICE), ids.to(DEVICE)
    monkeypatch.setenv("HYBRID_SERVE_MOE_ONE_ROW_TILES", "1")
    tiles = fused_moe(x, gate_up, down, weights, ids, activation=activation, out_dtype=torch.float32)
    spy = _LaunchSpy(skinny_experts._moe_skinny_kernel)
    monkeypatch.setattr(skinny_experts, "_moe_skinny_kernel", spy)
    monkeypatch.setenv("HYBRID_SERVE_MOE_ONE_ROW_TILES", "skinny")
    assert torch.equal(fused_moe(x, gate_up, down, weights, ids, activation=activation, out_dtype=torch.float32),
                       tiles)  # two tokens: the tensor-core tiles
    assert spy.launches == 0
    one = fused_moe(x[:1], gate_up, down, weights[:1], ids[:1], activation=activation, out_dtype=torch.float32)
    assert spy.launches == 2  # both expert products
    want = fused_moe_ref(x[:1].cpu().float(), gate_up.cpu().float(), down.cpu().float(), weights[:1].cpu().float(),
                         ids[:1].cpu(), activation=activation)
    assert rel_err(one.cpu(), want) < tol
    assert rel_err(one.cpu(), tiles[:1].cpu()) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_moe_one_row_setting_names_its_values(monkeypatch):
    from hybrid_serve.kernels.switch import moe_one_row_mode, moe_one_row_tiles_allowed

    monkeypatch.setenv("HYBRID_SERVE_MOE_ONE_ROW_TILES", "skinny")
    assert moe_one_row_mode() == "skinny" and moe_one_row_tiles_allowed()
    monkeypatch.setenv("HYBRID_SERVE_MOE_ONE_ROW_TILES", "0")
    assert not moe_one_row_tiles_allowed()
    monkeypatch.setenv("HYBRID_SERVE_MOE_ONE_ROW_TILES", "yes")
    with pytest.raises(ValueError, match="HYBRID_SERVE_MOE_ONE_ROW_TILES must be 0, 1 or skinny, got 'yes'"):
        moe_one_row_tiles_allowed()


@gpu
@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_fused_moe_skinny_experts_serving_shapes_gpu(activation, monkeypatch):
    """Qwen3-Next's expert shapes (512 experts, top-10, 2048 / 512; relu2: Nemotron-H's kind),
    one token in bf16: the skinny experts give the reference's values and the tensor-core
    tiles' to rounding."""
    monkeypatch.setenv("HYBRID_SERVE_MOE_ONE_ROW_TILES", "1")
    E, K, H, I = 512, 10, 2048, 512
    x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
    gate_up, down = moe_experts(E, H, I, torch.bfloat16, device="cuda")
    if activation == "relu2":
        gate_up = gate_up[:, :I].contiguous()
    w, ids = moe_topk_softmax(torch.randn(1, E, device="cuda"), K, True, out_dtype=torch.bfloat16)
    tiles = fused_moe(x, gate_up, down, w, ids, activation=activation, out_dtype=torch.float32)
    monkeypatch.setenv("HYBRID_SERVE_MOE_ONE_ROW_TILES", "skinny")
    got = fused_moe(x, gate_up, down, w, ids, activation=activation, out_dtype=torch.float32)
    want = fused_moe_ref(x.float(), gate_up.float(), down.float(), w.float(), ids, activation=activation)
    assert rel_err(got, want) < 2e-2
    assert rel_err(got, tiles) < 1e-2
