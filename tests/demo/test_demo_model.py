"""The shipped demo checkpoint: transformers and hybrid-serve load it to the same logits, greedy
decoding writes Python-looking code, the MTP layer's weights are in Qwen3-Next's names and
predict two tokens ahead, and demo/train.py writes a directory both loaders read."""
import copy
import importlib.util

import pytest
import torch
from safetensors import safe_open

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.demo import DEMO_DIR
from hybrid_serve.demo.quality import fibonacci_problems

transformers = pytest.importorskip("transformers")

PROMPT = "def fibonacci(n):"
SNIPPET = '''import os


class Cache:
    """A small cache of file contents, keyed by path."""

    def __init__(self, root):
        self.root = root
        self.entries = {}

    def get(self, name, default=None):
        path = os.path.join(self.root, name)
        if path not in self.entries:
            try:
                with open(path) as f:
                    self.entries[path] = f.read()
            except OSError:
                return default
        return self.entries[path]
'''


@pytest.fixture(scope="module")
def hf_model():
    if importlib.util.find_spec("fla") is not None:
        pytest.skip("transformers would run fla's kernels: the reference here is its torch path")
    return transformers.AutoModelForCausalLM.from_pretrained(DEMO_DIR, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def demo_llm():
    return LLM(dtype="float32", max_model_len=256)


def test_both_loaders_give_the_same_logits(hf_model, demo_llm):
    captured = []
    demo_llm.engine.logits_hook = lambda reqs, logits: captured.append(logits.float().clone())
    try:
        out = demo_llm.generate([SNIPPET[:200]], SamplingParams(max_tokens=12, temperature=0.0))[0].outputs[0]
    finally:
        demo_llm.engine.logits_hook = None
    prompt_ids = demo_llm.tokenizer.encode(SNIPPET[:200], add_special_tokens=False)
    ids = torch.tensor([prompt_ids + list(out.token_ids)])
    with torch.no_grad():
        ref = hf_model(ids).logits[0, len(prompt_ids) - 1:-1]  # the logits each generated token came from
    ours = torch.cat(captured)
    assert ours.shape == ref.shape
    rel = ((ours - ref).norm() / ref.norm()).item()
    assert rel <= 1e-4, f"relative error {rel:.2e}"
    assert ref.argmax(-1).tolist() == list(out.token_ids)


def test_greedy_fibonacci_is_deterministic_python(demo_llm):
    params = SamplingParams(max_tokens=32, temperature=0.0)
    first = demo_llm.generate([PROMPT], params)[0].outputs[0]
    batched = demo_llm.generate(["import sys\n", PROMPT], params)[1].outputs[0]
    assert first.token_ids == batched.token_ids and first.finish_reason == "length"
    # an indented body, complete lines that parse, at least three of them, no degenerate loop
    assert fibonacci_problems(first.text, PROMPT) == [], repr(first.text)


def test_the_demo_text_rule_refuses_what_a_new_user_should_not_see():
    assert fibonacci_problems('\n    """Find the fib."""\n    if n == 0:\n        return 0\n    else:\n        return 1\n    ret') == []
    assert fibonacci_problems(" pass\n        self.assertEqual(f.f.f.f") != []  # no indented body
    assert fibonacci_problems('\n    """\n    A fibonaccicial fibonaccicial\n        f') != []  # does not parse
    assert fibonacci_problems("\n    x = 1\n    x = 1\n    x = 1\n    x = 1\n    x = 1\n    x") != []  # a loop


def test_mtp_weights_in_qwen3_next_names_predict_two_ahead(hf_model):
    from hybrid_serve.demo.model import MTPHead

    with safe_open(f"{DEMO_DIR}/model.safetensors", framework="pt") as f:
        names = list(f.keys())
        mtp = {n[len("mtp."):]: f.get_tensor(n).float() for n in names if n.startswith("mtp.")}
    assert "lm_head.weight" not in names  # tied to model.embed_tokens.weight
    layer = {n[len("layers.0."):] for n in mtp if n.startswith("layers.0.")}
    attention_layer = {n[len("model.layers.3."):] for n in names if n.startswith("model.layers.3.")}
    assert layer == attention_layer  # a full decoder layer, named as the main model's attention layers
    assert set(mtp) - {f"layers.0.{n}" for n in layer} == {
        "fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"}
    h = hf_model.config.hidden_size
    assert mtp["fc.weight"].shape == (h, 2 * h)
    head = MTPHead(hf_model.config).eval()
    head.load_state_dict(mtp, strict=True)
    ids = torch.tensor([hf_model.config.pad_token_id] + _encode(SNIPPET)).unsqueeze(0)  # [1, T]
    with torch.no_grad():
        hidden = hf_model.model(input_ids=ids[:, :-1]).last_hidden_state  # h_t, t = 0..T-2
        t = hidden.shape[1]
        positions = torch.arange(t).view(1, 1, t).expand(3, 1, t)
        out = head(hf_model.model.embed_tokens(ids[:, 1:]), hidden, hf_model.model.rotary_emb(hidden, positions))
        predicted = hf_model.lm_head(out)[0, :-1].argmax(-1)  # token t+2 from h_t and token t+1
    accuracy = (predicted == ids[0, 2:]).float().mean().item()
    assert accuracy > 0.4, f"MTP top-1 accuracy on the snippet {accuracy:.1%}"


def _encode(text: str) -> list[int]:
    from hybrid_serve.engine.tokenizer import load_tokenizer

    return load_tokenizer(DEMO_DIR).encode(text, add_special_tokens=False)


def test_train_script_writes_a_directory_both_loaders_read(tmp_path):
    from hybrid_serve.demo import train

    summary = train.main(["--out", str(tmp_path), "--tiny", "--max-files", "6", "--steps", "2"])
    assert summary["heldout"]["tokens"] > 0 and summary["python_version"]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training_manifest.json", "train_log.json"):
        assert (tmp_path / name).is_file(), name
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    llm = LLM(model=str(tmp_path), dtype="float32", max_model_len=64)
    prompt = [5, 6, 7, 8, 9, 10]
    out = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0].outputs[0]
    with torch.no_grad():  # greedy: each generated token is transformers' argmax after the ones before it
        ref = hf(torch.tensor([prompt + list(out.token_ids)])).logits[0, len(prompt) - 1:-1].argmax(-1)
    assert ref.tolist() == list(out.token_ids)


def test_train_losses_report_the_main_heads_entropy_and_the_option_adds_it_to_the_loss():
    from hybrid_serve.demo import model as demo_model
    from hybrid_serve.demo import train

    torch.manual_seed(0)
    model, mtp = demo_model.build({**demo_model.MODEL_CONFIG, **demo_model.TINY_OVERRIDES}, "cpu")
    window = torch.randint(0, 4096, (2, 18))
    out = train.forward_losses(model, mtp, window)
    with torch.no_grad():
        logp = torch.log_softmax(model(window[:, :-2]).logits.float(), -1)
    assert torch.allclose(out["main_entropy"], -(logp.exp() * logp).sum(), rtol=1e-4)
    assert not out["main_entropy"].requires_grad  # reported only, unless it is in the loss
    assert train.forward_losses(model, mtp, window, entropy_grad=True)["main_entropy"].requires_grad
    after = {}
    for weight in (0.0, 0.5):  # one optimizer step from the same weights, with and without the term
        m, h = copy.deepcopy(model), copy.deepcopy(mtp)
        params = list(m.parameters()) + list(h.parameters())
        args = train.parse_args(["--out", "x", "--entropy-weight", str(weight)])
        train.train_step(m, h, train.optimizer(m, h, 1e-3, 0.0, fused=False), params, window, 1e-3, args)
        after[weight] = torch.cat([p.detach().flatten() for p in m.parameters()])
    assert not torch.equal(after[0.0], after[0.5])  # the entropy term reaches the weights


def test_train_is_deterministic_by_default_repeats_its_bytes_and_restores_the_callers_setting(tmp_path, monkeypatch):
    """Training runs with deterministic kernels unless told otherwise (every op of a step has one
    here: one without raises under torch.use_deterministic_algorithms), two runs give the same
    file, and the caller's setting is back afterwards. On a GPU, where the option matters, the
    same claim is tests/gpu/test_train_deterministic.py."""
    from hybrid_serve.demo import train

    assert train.parse_args(["--out", "x"]).deterministic
    assert not train.parse_args(["--out", "x", "--no-deterministic"]).deterministic
    seen, real_run = [], train._run

    def recording_run(args):  # the setting while the training runs
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real_run(args)

    monkeypatch.setattr(train, "_run", recording_run)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    files = []
    try:
        # the caller's setting, restored after each run: its own (a), then a warn-only mode (b)
        for name, caller in (("a", before), ("b", (True, True))):
            torch.use_deterministic_algorithms(caller[0], warn_only=caller[1])
            train.main(["--out", str(tmp_path / name), "--tiny", "--max-files", "6", "--steps", "2"])
            assert (torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled()) == caller
            files.append((tmp_path / name / "model.safetensors").read_bytes())
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    assert seen == [True, True]
    assert files[0] == files[1]
