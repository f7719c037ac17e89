"""Prefill logits of our model equal transformers' forward (fp32, perturbed weights),
computed in three chunks through the pools, so state is carried chunk to chunk."""
import pytest
import torch

from hf_reference import FAMILIES, build_reference
from hybrid_serve.models.forward_batch import ForwardBatch
from hybrid_serve.mem_cache import KVPool, RequestRowTable, StatePool, StateSpec
from hybrid_serve.models import load_model


def _pools(model, dtype=torch.float32):
    kv = model.kv_spec()
    spec = model.state_spec(dtype) or StateSpec(conv_dim=1, conv_width=1, ssm_shape=None, conv_dtype=dtype)
    num_attn = model.layer_ids.num_attn_layers
    kv_pool = None
    if kv is not None and num_attn:
        kv_pool = KVPool(12, 16, num_attn, kv.num_kv_heads, kv.head_dim, kv.v_head_dim, dtype, "cpu")
    state_pool = StatePool(4, max(model.layer_ids.num_state_layers, 1), spec, "cpu")
    return kv_pool, state_pool, RequestRowTable(2, 160, "cpu")


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(family, tmp_path):
    torch.manual_seed(0)
    ref = build_reference(family, str(tmp_path))
    model, cfg, _ = load_model(str(tmp_path), dtype="float32", progress=False)
    ids = torch.randint(0, cfg.vocab_size, (1, 45))
    with torch.no_grad():
        ref_logits = ref(ids, use_cache=False).logits[0]
    kv_pool, state_pool, table = _pools(model)
    slot, row = 1, 1
    table.set_state_slot(row, slot)
    table.set_kv_slots(row, 0, torch.arange(16, 16 + 160))
    chunks, logits = [(0, 7), (7, 30), (37, 8)], []
    with torch.no_grad():
        for prefix, n in chunks:
            fb = ForwardBatch.from_plan([row], [prefix], [n], table, kv_pool, state_pool)
            logits.append(model.compute_logits(model(ids[0, prefix:prefix + n], fb.positions, fb)))
    ours = torch.cat(logits)
    rel = ((ours - ref_logits).norm() / ref_logits.norm()).item()
    assert rel <= 1e-4, f"{family}: relative error {rel:.2e}"
