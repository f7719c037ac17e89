"""The Triton path of every family equals its reference path (fp32): the same steps run once
through the torch references and once with HYBRID_SERVE_KERNELS=triton (on CPU: Triton's
interpreter, so the shapes are tiny). Logits and the pools after the steps must agree. On a
machine with CUDA (and no TRITON_INTERPRET) the Triton run happens on the GPU instead, against
the same CPU reference.

Steps exercise what the engine sends: a prompt prefilled in two chunks (state and KV carried
from chunk to chunk), a varlen prefill of three requests, then one decode step of the three
with different prefix lengths. Request rows map to state slots out of order, so a mixed-up
namespace shows.
"""
import os

import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve.models.forward_batch import ForwardBatch
from hybrid_serve.mem_cache import KVPool, RequestRowTable, StatePool, StateSpec
from hybrid_serve.models import load_model
from hybrid_serve.kernels.switch import FUSE_ADD_NORM_ENV, KERNELS_ENV

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # the interpreter runs every kernel in numpy: ~40 s for the file

TRITON_DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
MAX_CONTEXT = 80  # > one 64-key block, so paged attention splits the keys and merges
ROW_STATE_SLOTS = {1: 3, 2: 1, 3: 2}  # request row -> state slot


def _pools(model, device, dtype=torch.float32):
    kv = model.kv_spec()
    spec = model.state_spec(dtype) or StateSpec(1, 1, None, dtype)
    kv_pool = None
    if kv is not None and model.layer_ids.num_attn_layers:
        kv_pool = KVPool(16, 16, model.layer_ids.num_attn_layers, kv.num_kv_heads, kv.head_dim, kv.v_head_dim,
                         dtype, device)
    state_pool = StatePool(4, max(model.layer_ids.num_state_layers, 1), spec, device)
    table = RequestRowTable(3, MAX_CONTEXT, device)
    kv_perm = torch.randperm(15 * 16, generator=torch.Generator().manual_seed(0)) + 16  # page 0 is reserved
    for row, slot in ROW_STATE_SLOTS.items():
        table.set_state_slot(row, slot)
        table.set_kv_slots(row, 0, kv_perm[(row - 1) * MAX_CONTEXT: row * MAX_CONTEXT])
    return kv_pool, state_pool, table


def _run(model, steps, token_ids, force_triton, monkeypatch, device="cpu", dtype=torch.float32):
    """steps: [(req_rows, prefix_lens, extend_lens)]; token_ids: row -> prompt tokens.
    Returns (logits of every step's last tokens [sum B, V], the pools' tensors), on the CPU."""
    monkeypatch.setenv(KERNELS_ENV, "triton" if force_triton else "auto")
    kv_pool, state_pool, table = _pools(model, device, dtype)
    logits = []
    with torch.no_grad():
        for rows, prefix_lens, extend_lens in steps:
            fb = ForwardBatch.from_plan(rows, prefix_lens, extend_lens, table, kv_pool, state_pool)
            ids = torch.cat([token_ids[r][p:p + n] for r, p, n in zip(rows, prefix_lens, extend_lens)]).to(device)
            hidden = model(ids, fb.positions, fb)  # [T, H]
            logits.append(model.compute_logits(hidden[fb.logits_indices]))
    pools = [state_pool.conv_states] + ([state_pool.ssm_states] if state_pool.ssm_states is not None else [])
    pools += (kv_pool.k_buffers + kv_pool.v_buffers) if kv_pool is not None else []
    return torch.cat(logits).cpu(), [p.cpu() for p in pools]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert not torch.isnan(a).any()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.fixture(scope="module")
def models(reference_models):
    cache = {}

    def get(family, device, dtype="float32"):
        if (family, device, dtype) not in cache:
            model_dir = reference_models(family)[0]
            cache[family, device, dtype] = load_model(model_dir, dtype=dtype, device=device, progress=False)[0]
        return cache[family, device, dtype]

    return get


STEPS = {
    "prefill-2-chunks": [([1], [0], [5]), ([1], [5], [7])],
    "varlen-then-decode": [([2, 1, 3], [0, 0, 0], [4, 7, 2]), ([2, 1, 3], [4, 7, 2], [1, 1, 1])],
    # chunked state kernels, extend attention for the long row beside the paged kernel for the others
    "long-mixed-then-decode": [([2, 1, 3], [0, 0, 0], [40, 1, 12]), ([2, 1, 3], [40, 1, 12], [1, 33, 1])],
    # decode rows first (as the scheduler orders a mixed step): they take the recurrent state
    # kernels and the prompt row the chunked ones (ForwardBatch.row_split), then all decode
    "decode-first-mixed": [([2, 3], [0, 0], [4, 6]), ([2, 3, 1], [4, 6, 0], [1, 2, 20]),
                           ([2, 3, 1], [5, 8, 20], [1, 1, 1])],
}


# Under the interpreter (CPU, CI) these cases run for some families only: the row split is the
# same code for every family (one per state-mixer kind: GDN, Mamba2, short conv), and the
# long mixed step's MoE families cost ~25 s each in numpy (their dense siblings cover the
# mixers, the other cases their wiring). On a GPU every family runs every case.
CPU_FAMILIES = {"decode-first-mixed": ("qwen3_5", "bamba", "lfm2"),
                "long-mixed-then-decode": ("qwen3_5", "nemotron_h", "lfm2", "bamba", "falcon_h1")}


@pytest.mark.parametrize("steps", list(STEPS), ids=list(STEPS))
@pytest.mark.parametrize("family", FAMILIES)
def test_triton_path_matches_reference(family, steps, models, monkeypatch):
    if TRITON_DEVICE == "cpu" and steps in CPU_FAMILIES and family not in CPU_FAMILIES[steps]:
        pytest.skip("under the interpreter, one family per state-mixer kind for this case (CI time; all on a GPU)")
    model = models(family, "cpu")
    gen = torch.Generator().manual_seed(1)
    token_ids = {row: torch.randint(0, model.hf_config.vocab_size, (48,), generator=gen) for row in ROW_STATE_SLOTS}
    ref_logits, ref_pools = _run(model, STEPS[steps], token_ids, False, monkeypatch)
    tri_logits, tri_pools = _run(models(family, TRITON_DEVICE), STEPS[steps], token_ids, True, monkeypatch,
                                 TRITON_DEVICE)
    assert _rel(tri_logits, ref_logits) < 1e-4, f"{family}: logits differ"
    for i, (got, want) in enumerate(zip(tri_pools, ref_pools)):
        assert _rel(got, want) < 1e-4, f"{family}: pool tensor {i} differs"


@pytest.mark.parametrize("family", ["qwen3_5", "bamba"])  # attention, GDN, conv / Mamba2
def test_varlen_ops_write_their_out_buffer(family, models, monkeypatch):
    """Piecewise graphs hand every varlen op (varlen.varlen_op) an `out` buffer its kernel path
    must write and return: the same steps with such a hook give the same logits and pools."""
    from hybrid_serve.models.layers import varlen

    model = models(family, TRITON_DEVICE)
    gen = torch.Generator().manual_seed(2)
    token_ids = {row: torch.randint(0, model.hf_config.vocab_size, (48,), generator=gen) for row in ROW_STATE_SLOTS}
    steps = STEPS["decode-first-mixed"][:2]  # a prefill, then decode rows beside a prompt chunk
    want_logits, want_pools = _run(model, steps, token_ids, True, monkeypatch, TRITON_DEVICE)
    calls = []

    def hand_out(fn, bound, out_spec):
        shape, dtype = out_spec(bound.arguments)
        out = torch.full(shape, float("nan"), dtype=dtype, device=TRITON_DEVICE)
        varlen.VARLEN_HOOK[0] = None
        try:
            result = fn(*bound.args, **bound.kwargs, out=out)
        finally:
            varlen.VARLEN_HOOK[0] = hand_out
        assert result.data_ptr() == out.data_ptr(), f"{fn.__name__} did not write its out buffer"
        calls.append(fn.__name__)
        return result

    monkeypatch.setattr(varlen, "VARLEN_HOOK", [hand_out])
    got_logits, got_pools = _run(model, steps, token_ids, True, monkeypatch, TRITON_DEVICE)
    assert calls
    assert _rel(got_logits, want_logits) < 1e-6
    for got, want in zip(got_pools, want_pools):
        assert _rel(got, want) < 1e-6


# Qwen3-Next takes every fused input at a decode row (its dense sibling, Qwen3.5, adds only the
# plain SwiGLU MLP's, covered by the kernel tests and tests/gpu/test_decode_fusions.py): CI time
@pytest.mark.parametrize("family", ["qwen3_next"])
def test_decode_row_fusions_in_bf16(family, models, monkeypatch):
    """In bf16 a decode row takes the skinny kernel with its fused inputs and epilogues (the
    attention output gate and the GDN output norm inside the out projections, the GDN causal
    conv inside the in-projection, the SwiGLU
    activation inside the down projection, the MoE shared expert and experts' sum in one
    launch). One row decoding after its prompt: the fused launches ran, the logits are those of
    the same kernel path with every fusion sent back to its separate launch (the GDN norm's and the
    residual add and norm's sums of squares may round differently on a GPU: 5e-3; the add and norm
    run inside the next projection, `ops.PendingAddNorm`), and the reference path's at bf16 precision
    (the kernel path's own distance from the reference in bf16 is ~2.4e-2 for these models)."""
    from hybrid_serve.kernels import linear as klinear
    from hybrid_serve.models.layers import ops

    model = models(family, TRITON_DEVICE, "bfloat16")
    gen = torch.Generator().manual_seed(3)
    token_ids = {row: torch.randint(0, model.hf_config.vocab_size, (48,), generator=gen) for row in ROW_STATE_SLOTS}
    steps = [([2], [0], [6]), ([2], [6], [1]), ([2], [7], [1])]
    want, _ = _run(models(family, "cpu", "bfloat16"), steps, token_ids, False, monkeypatch, dtype=torch.bfloat16)
    fused = set()
    real = klinear.skinny_linear

    def spy(*args, **kwargs):
        fused.update(k for k, v in kwargs.items() if k.startswith(("x_", "topk", "decode")) and v is not None
                     and v is not False)
        return real(*args, **kwargs)

    monkeypatch.setattr(klinear, "skinny_linear", spy)
    monkeypatch.setenv(FUSE_ADD_NORM_ENV, "1")  # every consumer kind, the GDN in-projection's too
    got, got_pools = _run(model, steps, token_ids, True, monkeypatch, TRITON_DEVICE, torch.bfloat16)
    assert {"x_sigmoid_gate", "x_gated_norm", "x_silu_and_mul", "decode_conv", "x_add_norm"} <= fused, fused
    assert ("topk_rows" in fused) == (family == "qwen3_next")
    # the residual adds and norms stay inside the projections (their own rounding, compared below)
    monkeypatch.setattr(ops, "skinny_row", lambda x, weight: False)
    monkeypatch.setattr(ops, "gated_norm_row", lambda x, weight, gate: False)
    unfused, unfused_pools = _run(model, steps, token_ids, True, monkeypatch, TRITON_DEVICE, torch.bfloat16)
    assert _rel(got.float(), unfused.float()) < 5e-3
    assert torch.equal(got_pools[0], unfused_pools[0])  # the conv windows: the fused conv's bits
    assert _rel(got.float(), want.float()) < 4e-2
    # and in their own launches (kernels/norm's add_rms_norm: its sums of squares may add in
    # another order, so a normed value may round the other way)
    monkeypatch.setenv(FUSE_ADD_NORM_ENV, "0")
    separate, _ = _run(model, steps, token_ids, True, monkeypatch, TRITON_DEVICE, torch.bfloat16)
    assert _rel(separate.float(), unfused.float()) < 5e-3
