"""SpeculativeConfig: how a replica speculates, with vLLM's keys (pure Python: the ingress
and the CLI import it without torch)::

    LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    hybrid-serve serve --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'

Methods: "ngram" (prompt lookup on the request's own tokens), "mtp" (the checkpoint's
multi-token-prediction layers, `mtp.*` of Qwen3-Next / Qwen3.5: engine/spec/mtp.py), "suffix"
(the router's cluster-wide suffix index, fed by every replica's finished requests and read
from a local copy: engine/spec/suffix.py; a replica of the Serve app attaches the source),
"remote" (proposals supplied
from outside the engine, e.g. the router's suffix drafter, through `RemoteDrafter.supply`),
"synthetic" (benchmarks and tests: proposes a known continuation, each token right with
probability `acceptance_rate`), "draft_model" (a small model of any supported family with the
target's tokenizer, its own engine and pools: `{"method": "draft_model", "model": DIR}`, as
vLLM's key; engine/spec/draft_model.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

METHODS = ("ngram", "mtp", "suffix", "remote", "synthetic", "draft_model")
PLANNED_METHODS = ("eagle", "medusa")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int = 4  # K: most drafts per request per step (adaptive depth picks 0..K)
    prompt_lookup_min: int = 1  # ngram: shortest suffix n-gram looked up
    prompt_lookup_max: int = 4  # ngram: longest suffix n-gram looked up (tried first)
    adaptive: bool = True  # pick K per request per step from measured acceptance (down to 0: off)
    disable_by_batch_size: int | None = None  # no speculation while more requests than this run
    # verify rows per step (the state scratch is sized for them); default the engine's
    # max_num_seqs (every decoding request may verify; verify graphs stop at these rows), fewer
    # if their scratch would take more than 1/8 of the cache budget
    max_num_seqs: int | None = None
    acceptance_rate: float = 0.8  # synthetic: probability that each drafted token is the true one
    continuations: dict = field(default_factory=dict, compare=False)  # synthetic: prompt ids tuple -> true tokens
    seed: int = 0  # synthetic: its random choices
    vary_length: bool = False  # synthetic: each proposal a random length 0..K (tests: every draft shape)
    model: str | None = None  # draft_model: the draft model (a directory or a Hub id)

    def __post_init__(self) -> None:
        if self.method in PLANNED_METHODS:
            raise ValueError(f"speculative method {self.method!r} is not implemented yet; "
                             f"available: {', '.join(METHODS)}")
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative_config {name} must be an integer >= 1, got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} > prompt_lookup_max={self.prompt_lookup_max}")
        for name in ("disable_by_batch_size", "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"speculative_config {name} must be an integer >= 1, got {value!r}")
        if (self.method == "draft_model") != (self.model is not None):
            raise ValueError("speculative_config 'model' (the draft model's directory) goes with method "
                             f"'draft_model' and only with it; got method {self.method!r}, model {self.model!r}")
        if not 0.0 <= self.acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be in [0, 1], got {self.acceptance_rate}")

    @classmethod
    def from_value(cls, value) -> "SpeculativeConfig | None":
        """None, a SpeculativeConfig, or a dict of its keys (unknown keys: ValueError naming them)."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown speculative_config keys {unknown}; known: {sorted(known)}")
        if "method" not in value:
            raise ValueError(f"speculative_config needs a 'method' ({', '.join(METHODS)})")
        return cls(**value)

    def verify_rows(self, max_num_seqs: int) -> int:
        """Rows of speculative scratch: verify rows one step may carry."""
        return min(self.max_num_seqs or max_num_seqs, max_num_seqs)
