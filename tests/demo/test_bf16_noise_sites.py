"""benchmarks/bf16_noise_sites.py: rounding at a site moves the logits by a KL that is positive,
small on the trained demo, and zero where nothing is rounded."""
import pytest
import torch

transformers = pytest.importorskip("transformers")


def test_noise_sites_measure_what_each_rounding_does_to_the_demo():
    from hybrid_serve.benchmarks.bf16_noise_sites import SITES, mean_kl
    from hybrid_serve.demo import DEMO_DIR
    from hybrid_serve.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(DEMO_DIR)
    model = transformers.AutoModelForCausalLM.from_pretrained(DEMO_DIR, dtype=torch.float32).eval()
    prompts = [torch.tensor([tok.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)])]
    with torch.no_grad():
        ref = [model(ids).logits.float().log_softmax(-1) for ids in prompts]
    assert mean_kl(model, prompts, ref, []) == 0.0  # no site: the fp32 forward again
    logits_kl = mean_kl(model, prompts, ref, SITES["LM head outputs (logits in bf16)"])
    everything = mean_kl(model, prompts, ref, SITES["all of the above but the logits"])
    assert 0 < logits_kl < 1e-2 and 0 < everything < 1e-2
    assert not any(h for m in model.modules() for h in (m._forward_hooks, m._forward_pre_hooks))  # hooks removed
