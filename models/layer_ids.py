"""Global layer id -> attention-local id and -> state-local id.

Attention layers index the KV pool; state layers (GDN, Mamba2, short conv) index the state
pool. Asking for the wrong kind of id raises, so a state layer can never read a KV buffer.
"""
from __future__ import annotations

ATTENTION = "attention"
STATE = "state"
NONE = "none"  # layers with neither (e.g. Nemotron-H MLP/MoE-only layers)


class LayerIdMap:
    def __init__(self, layer_kinds: list[str]) -> None:
        bad = [k for k in layer_kinds if k not in (ATTENTION, STATE, NONE)]
        if bad:
            raise ValueError(f"unknown layer kinds {bad}")
        self.layer_kinds = list(layer_kinds)
        self._attn_local: dict[int, int] = {}
        self._state_local: dict[int, int] = {}
        for global_id, kind in enumerate(layer_kinds):
            if kind == ATTENTION:
                self._attn_local[global_id] = len(self._attn_local)
            elif kind == STATE:
                self._state_local[global_id] = len(self._state_local)

    @property
    def num_attn_layers(self) -> int:
        return len(self._attn_local)

    @property
    def num_state_layers(self) -> int:
        return len(self._state_local)

    def attn_local(self, global_layer_id: int) -> int:
        if global_layer_id not in self._attn_local:
            raise ValueError(f"layer {global_layer_id} is {self.layer_kinds[global_layer_id]!r}, not attention")
        return self._attn_local[global_layer_id]

    def state_local(self, global_layer_id: int) -> int:
        if global_layer_id not in self._state_local:
            raise ValueError(f"layer {global_layer_id} is {self.layer_kinds[global_layer_id]!r}, not a state layer")
        return self._state_local[global_layer_id]
