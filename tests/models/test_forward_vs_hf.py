"""Prefill logits of our model equal transformers' forward (fp32, perturbed weights),
computed in three chunks through the pools, so state is carried chunk to chunk. Every family,
the branches of a family that its test config does not take (`VARIANTS`: other norms, biases,
dense or MoE, ...), and the text part of the Qwen3.5 vision-language wrappers."""
import pytest
import torch

from hf_reference import FAMILIES, build_reference, family_config, perturb_
from hybrid_serve.models.forward_batch import ForwardBatch
from hybrid_serve.mem_cache import KVPool, RequestRowTable, StatePool, StateSpec
from hybrid_serve.models import load_model

CHUNKS = [(0, 7), (7, 30), (37, 8)]  # (prefix, new tokens): 45 tokens in three steps


def _pools(model, dtype=torch.float32):
    kv = model.kv_spec()
    spec = model.state_spec(dtype) or StateSpec(conv_dim=1, conv_width=1, ssm_shape=None, conv_dtype=dtype)
    num_attn = model.layer_ids.num_attn_layers
    kv_pool = None
    if kv is not None and num_attn:
        kv_pool = KVPool(12, 16, num_attn, kv.num_kv_heads, kv.head_dim, kv.v_head_dim, dtype, "cpu")
    state_pool = StatePool(4, max(model.layer_ids.num_state_layers, 1), spec, "cpu")
    return kv_pool, state_pool, RequestRowTable(2, 160, "cpu")


def _assert_prefill_matches(model_dir: str, ref_logits: torch.Tensor, ids: torch.Tensor, what: str) -> None:
    """ids: [1, 45]; ref_logits: [45, V] from transformers."""
    model, _, _ = load_model(model_dir, dtype="float32", progress=False)
    kv_pool, state_pool, table = _pools(model)
    slot, row = 1, 1
    table.set_state_slot(row, slot)
    table.set_kv_slots(row, 0, torch.arange(16, 16 + 160))
    logits = []
    with torch.no_grad():
        for prefix, n in CHUNKS:
            fb = ForwardBatch.from_plan([row], [prefix], [n], table, kv_pool, state_pool)
            hidden = model(ids[0, prefix:prefix + n], fb.positions, fb)
            logits.append(model.compute_logits(hidden))
            # the decode graphs' form, into a static buffer: the same logits (each family's scaling too)
            buf = torch.full_like(logits[-1], float("nan"))
            assert model.compute_logits(hidden, out=buf) is buf and torch.equal(buf, logits[-1])
    ours = torch.cat(logits)
    rel = ((ours - ref_logits).norm() / ref_logits.norm()).item()
    assert rel <= 1e-4, f"{what}: relative error {rel:.2e}"


def _check_family(family: str, out_dir: str, **overrides) -> None:
    torch.manual_seed(0)
    ref = build_reference(family, out_dir, **overrides)
    ids = torch.randint(0, ref.config.vocab_size, (1, 45))
    with torch.no_grad():
        ref_logits = ref(ids, use_cache=False).logits[0]
    _assert_prefill_matches(out_dir, ref_logits, ids, f"{family} {overrides or ''}")


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(family, tmp_path):
    _check_family(family, str(tmp_path))


VARIANTS = [
    pytest.param("qwen3_5_moe", {"tie_word_embeddings": True, "attention_bias": True}, id="qwen3_5_moe-tied-bias"),
    pytest.param("granite_moe_hybrid", {"num_local_experts": 0}, id="granite-dense"),
    pytest.param("granite_moe_hybrid", {"position_embedding_type": "rope", "attention_bias": True},
                 id="granite-rope-bias"),
    pytest.param("falcon_h1", {"mamba_rms_norm": True, "mamba_norm_before_gate": True, "mamba_proj_bias": True},
                 id="falcon-norm-then-gate"),
    pytest.param("falcon_h1", {"mamba_rms_norm": True, "mamba_norm_before_gate": False, "projectors_bias": True,
                               "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
                 id="falcon-gate-then-norm-biases"),
    pytest.param("lfm2_moe", {"use_expert_bias": False, "norm_topk_prob": False, "num_dense_layers": 0},
                 id="lfm2_moe-plain-router"),
    pytest.param("bamba", {"mamba_proj_bias": True, "attention_bias": True, "mlp_bias": True,
                           "tie_word_embeddings": True}, id="bamba-biases-tied"),
]


@pytest.mark.parametrize("family, overrides", VARIANTS)
def test_variant_prefill_logits_match_transformers(family, overrides, tmp_path):
    _check_family(family, str(tmp_path), **overrides)


VL_WRAPPERS = [("qwen3_5", "Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
               ("qwen3_5_moe", "Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration")]


@pytest.mark.parametrize("family, config_class, wrapper_class", VL_WRAPPERS)
def test_vision_language_wrapper_serves_its_text_model(family, config_class, wrapper_class, tmp_path):
    """A checkpoint of the multimodal wrapper (text weights under `model.language_model.`, a
    vision tower beside them) loads as the text model and gives transformers' text logits."""
    import transformers

    torch.manual_seed(0)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=1, spatial_merge_size=1, num_position_embeddings=16)
    config = getattr(transformers, config_class)(text_config=family_config(family).to_dict(), vision_config=vision)
    ref = getattr(transformers, wrapper_class)(config).eval()
    perturb_(ref)
    ref.save_pretrained(str(tmp_path))
    ids = torch.randint(0, config.text_config.vocab_size, (1, 45))
    with torch.no_grad():
        ref_logits = ref(input_ids=ids, use_cache=False).logits[0]
    _assert_prefill_matches(str(tmp_path), ref_logits, ids, wrapper_class)
