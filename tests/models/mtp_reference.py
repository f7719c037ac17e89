"""A tiny Qwen3.5 with a perturbed MTP layer (`mtp.*`) and a plain torch reference of
chained multi-step MTP drafting (tests/engine/test_spec_mtp.py, tests/cluster/test_spec_tp.py).

The reference recomputes everything from scratch for each proposal: the target's final
hidden states h_0..h_{n-1} over the request's computed tokens, then K chained MTP steps,
each over the whole sequence with causal attention (no cache): step k appends (the previous
draft, the previous step's MTP output).
"""
import copy
import os

import torch
from safetensors.torch import load_file, save_file

from hf_reference import build_reference, perturb_


class RefMTP(torch.nn.Module):
    """The reference MTP layer, transformers' own Qwen3.5 modules (names as in checkpoints)."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        layer_config = copy.deepcopy(config)
        layer_config.layer_types = ["full_attention"]
        layer_config._attn_implementation = "eager"
        h, eps = config.hidden_size, config.rms_norm_eps
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
        self.layers = torch.nn.ModuleList([Qwen3_5DecoderLayer(layer_config, 0)])
        self.norm = Qwen3_5RMSNorm(h, eps=eps)

    def forward(self, next_embeds, hidden, position_embeddings):
        """next_embeds, hidden: [1, T, H] -> [1, T, H], causal over the T positions."""
        t = hidden.shape[1]
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        out = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=mask)
        return self.norm(out[0] if isinstance(out, tuple) else out)


def build_mtp_reference(out: str):
    """(transformers target, reference MTP): the tiny Qwen3.5 saved in `out` by save_pretrained,
    the perturbed MTP layer's tensors added to the same safetensors file under `mtp.`."""
    target = build_reference("qwen3_5", out, mtp_num_hidden_layers=1).eval()
    torch.manual_seed(7)
    ref = RefMTP(target.config).eval()
    perturb_(ref, seed=3, scale=0.3)
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    tensors.update({f"mtp.{k}": v.contiguous() for k, v in ref.state_dict().items()})
    save_file(tensors, path, metadata={"format": "pt"})
    return target, ref


@torch.no_grad()
def reference_drafts(target, ref, tokens: list[int], k: int) -> list[int]:
    """Drafts for a request whose tokens are `tokens` (the last one not computed yet)."""
    n = len(tokens) - 1
    hidden = target.model(input_ids=torch.tensor([tokens[:n]])).last_hidden_state  # h_0..h_{n-1} [1, n, H]
    embed = target.model.embed_tokens
    seq_embeds, seq_hidden, drafts = embed(torch.tensor([tokens[1:]])), hidden, []
    for _ in range(k):
        t = seq_hidden.shape[1]
        positions = torch.arange(t).view(1, 1, t).expand(3, 1, t)  # text rope: one axis, repeated
        g = ref(seq_embeds, seq_hidden, target.model.rotary_emb(seq_hidden, positions))[:, -1:]  # [1, 1, H]
        draft = int(target.lm_head(g)[0, -1].argmax())
        drafts.append(draft)
        seq_embeds = torch.cat([seq_embeds, embed(torch.tensor([[draft]]))], dim=1)
        seq_hidden = torch.cat([seq_hidden, g], dim=1)  # chained: the MTP output, not h_{n-1}
    return drafts


def record_supplies(engine) -> list[tuple[list[int], list[int]]]:
    """Wrap the engine's MTP drafter so that every proposal the MTP pass hands it is kept as
    (the request's tokens then, drafts); returns that list (filled as the engine runs)."""
    seen = []
    supply = engine.spec.drafter.supply

    def recording(request_id, num_tokens, draft_tokens):
        seen.append((list(engine.requests[request_id].token_ids[:num_tokens]), list(draft_tokens)))
        supply(request_id, num_tokens, draft_tokens)

    engine.spec.drafter.supply = recording
    return seen
