"""benchmarks/bf16_consistency_finetune.py over demo/model.load (the checkpoint's MTP layer
loaded, the LM head tied): its consistency term is the bf16 noise KL at amp 1, zero at amp 0,
and has a gradient."""
import pytest
import torch
from safetensors import safe_open

transformers = pytest.importorskip("transformers")


def test_the_consistency_term_is_the_noise_kl_and_trains():
    from hybrid_serve.benchmarks.bf16_consistency_finetune import ALL_SITES, consistency_kl
    from hybrid_serve.benchmarks.bf16_noise_sites import mean_kl
    from hybrid_serve.demo import DEMO_DIR
    from hybrid_serve.demo.model import load
    from hybrid_serve.engine.tokenizer import load_tokenizer

    torch.manual_seed(0)
    model, mtp = load(DEMO_DIR, "cpu")  # demo/model.load: the main model through transformers, and the MTP layer
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: one tensor trains
    with safe_open(f"{DEMO_DIR}/model.safetensors", framework="pt") as f:
        for name, p in mtp.state_dict().items():
            torch.testing.assert_close(p, f.get_tensor(f"mtp.{name}").float(), rtol=0, atol=0)
    ids = torch.tensor([load_tokenizer(DEMO_DIR).encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)])
    model.eval()
    with torch.no_grad():
        ref = [model(ids).logits.float().log_softmax(-1)]
    assert float(consistency_kl(model, ids, 0.0).detach()) == 0.0
    kl1 = consistency_kl(model, ids, 1.0).detach()
    torch.testing.assert_close(float(kl1), mean_kl(model, [ids], ref, ALL_SITES), rtol=1e-3, atol=1e-9)
    kl4 = consistency_kl(model, ids, 4.0)
    assert float(kl4.detach()) > 4 * float(kl1) > 0  # about quadratic in the perturbation
    kl4.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert not any(h for m in model.modules() for h in (m._forward_hooks, m._forward_pre_hooks))  # hooks removed
