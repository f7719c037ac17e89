"""Kernels: one folder per op family.

Each folder has `ref.py` (plain torch: the executable spec and the CPU path) and, where
a GPU kernel exists, the Triton kernel behind one public function. This package imports
nothing from the rest of hybrid_serve.

    causal_conv1d   causal_conv1d_varlen            conv window in the state pool (+ verify scratch;
                                                    prompt rows through a scan kernel)
    gated_delta     gated_delta_rule_recurrent      GDN state in the pool (+ verify scratch);
                    gated_delta_rule_chunked        prefill in chunks on tensor cores (SSD too)
    mamba_ssm       selective_state_update_varlen   Mamba2 state in the pool (+ verify scratch)
    attention       store_kv, paged_attention       mixed decode / prefill batch, GQA, split-KV
    norm            rms_norm, add_rms_norm, gated_rms_norm, grouped_gated_rms_norm
    activation      silu_and_mul, sigmoid_gate_mul, relu2   SwiGLU; attention output gate; relu^2 MLPs
    linear          skinny_linear                   batch-1 linears streaming the weight once
    rotary          rotary_neox
    state_ops       commit_verified_state, copy_state_slots
    sampling        sample_tokens, masked_logits    per-row params and seeds, no host sync
    moe             moe_topk_softmax, fused_moe     gated-SiLU or relu2 experts (+ a gated shared
                                                    expert's term in the same sum)
    batch_meta      decode_batch_fields             a decode graph's batch fields in one launch

Index data goes in as device tensors (`state_slots`, `cu_seqlens`, ...): launchers never
sync with the host, except for the index-range checks, which run on CPU tensors or with
HYBRID_SERVE_KERNEL_CHECKS=1 (see _common.py). Triton kernels run on CUDA tensors, or on
CPU tensors when TRITON_INTERPRET=1 is set before these modules are imported.

No compiling while serving: Triton compiles a variant per value class of every integer
argument (== 1, a multiple of 16, other) and per 16-byte alignment of every pointer, so a
kernel taking a row count and a `cu_seqlens` view would meet new variants with each new
batch. Arguments that change from step to step (row and token counts, per-row index
tensors) are listed in each kernel's `do_not_specialize`: those kernels compile once per
compile-time configuration, which the engine's warm-up runs before it reports ready.
Strides and model sizes stay specialized (fixed per model).
"""
from ._common import HAS_TRITON

__all__ = ["HAS_TRITON"]
