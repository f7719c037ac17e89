"""benchmarks/bf16_consistency_finetune.py: its loader gives transformers' model, and its
consistency term is the bf16 noise KL at amp 1, zero at amp 0, and has a gradient."""
import pytest
import torch

transformers = pytest.importorskip("transformers")


def test_the_consistency_term_is_the_noise_kl_and_trains():
    from hybrid_serve.benchmarks.bf16_consistency_finetune import ALL_SITES, consistency_kl, load_checkpoint
    from hybrid_serve.benchmarks.bf16_noise_sites import mean_kl
    from hybrid_serve.demo import DEMO_DIR
    from hybrid_serve.engine.tokenizer import load_tokenizer

    torch.manual_seed(0)
    model, mtp, _ = load_checkpoint(DEMO_DIR, "cpu")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.tensor([load_tokenizer(DEMO_DIR).encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)])
    reference = transformers.AutoModelForCausalLM.from_pretrained(DEMO_DIR, dtype=torch.float32).eval()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)
        ref = [reference(ids).logits.float().log_softmax(-1)]
    assert float(consistency_kl(model, ids, 0.0).detach()) == 0.0
    kl1 = consistency_kl(model, ids, 1.0).detach()
    torch.testing.assert_close(float(kl1), mean_kl(reference, [ids], ref, ALL_SITES), rtol=1e-3, atol=1e-9)
    kl4 = consistency_kl(model, ids, 4.0)
    assert float(kl4.detach()) > 4 * float(kl1) > 0  # about quadratic in the perturbation
    kl4.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert not any(h for m in model.modules() for h in (m._forward_hooks, m._forward_pre_hooks))  # hooks removed
