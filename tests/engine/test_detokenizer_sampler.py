"""Incremental detokenization (stop strings across tokens, partial UTF-8) and the sampler."""
import pytest
import torch

from hybrid_serve.engine.detokenizer import IncrementalDetokenizer
from hybrid_serve.engine.request import Request
from hybrid_serve.engine.sampler import adjust_logits, record_logprobs, sample
from hybrid_serve.kernels.sampling import masked_logits_row_ref
from hybrid_serve.engine.sampling_params import SamplingParams


class ByteTokenizer:
    """Token i = byte i; decoding replaces broken UTF-8 with U+FFFD, like real tokenizers."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def _push_all(detok, text):
    for b in text.encode():
        stop = detok.push(b)
        if stop is not None:
            return stop
    return None


def test_stop_string_spanning_tokens_is_cut():
    detok = IncrementalDetokenizer(ByteTokenizer(), ["END"])
    assert _push_all(detok, "hello ENDING") == "END"
    assert detok.text == "hello "
    detok = IncrementalDetokenizer(ByteTokenizer(), ["END"], include_stop_str_in_output=True)
    _push_all(detok, "hello ENDING")
    assert detok.text == "hello END"


def test_earliest_stop_string_wins():
    detok = IncrementalDetokenizer(ByteTokenizer(), ["bc", "abcd"])
    _push_all(detok, "xabcd")
    assert detok.text == "xa"


def test_partial_utf8_is_held_back():
    detok = IncrementalDetokenizer(ByteTokenizer(), [])
    euro = "€".encode()
    for b in euro[:2]:
        detok.push(b)
    assert detok.text == ""
    detok.push(euro[2])
    assert detok.text == "€"


def _req(**kw):
    params = SamplingParams(**kw)
    return Request("r", [1], params, IncrementalDetokenizer(None, []), {0}, seed=params.seed)


def test_top_k_top_p_min_p_masks():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    def kept(**kw):  # the rule the engine samples with (engine/sampler.py uses the kernels' reference)
        p = _req(**kw).params
        masked = masked_logits_row_ref(logits, p.temperature, p.top_k, p.top_p, p.min_p)
        return (masked > float("-inf")).nonzero().flatten().tolist()
    assert kept(top_k=2) == [0, 1]
    assert kept(top_p=0.8) == [0, 1]
    assert kept(top_p=0.81) == [0, 1, 2]
    assert kept(min_p=0.5) == [0, 1]


def test_greedy_min_tokens_and_logprobs():
    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0]])
    req = _req(temperature=0.0, min_tokens=1, logprobs=2)  # eos is token 0
    masked = adjust_logits(logits, [req])
    tokens = sample(masked, [req]).tolist()
    assert tokens == [1]  # eos banned before min_tokens
    record_logprobs(masked, tokens, [req])
    entry = req.logprobs[0]
    assert set(entry) == {1, 2} and entry[1].rank == 1
    req2 = _req(temperature=0.0, logprobs=0)
    tokens = sample(logits, [req2]).tolist()
    assert tokens == [0]
    record_logprobs(logits, tokens, [req2])
    assert abs(req2.logprobs[0][0].logprob - float(torch.log_softmax(logits[0], -1)[0])) < 1e-6


def test_logit_bias_is_added_per_request_before_sampling():
    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0], [5.0, 1.0, 0.0, -1.0], [5.0, 1.0, 0.0, -1.0]])
    reqs = [_req(temperature=0.0, logit_bias={3: 100.0}), _req(temperature=0.0),
            _req(temperature=0.0, logit_bias={0: -100, 2: 4.5})]
    biased = adjust_logits(logits, reqs)
    assert biased[0].tolist() == [5.0, 1.0, 0.0, 99.0] and biased[1].tolist() == logits[1].tolist()
    assert biased[2].tolist() == [-95.0, 1.0, 4.5, -1.0]
    assert sample(biased, reqs).tolist() == [3, 0, 2]
    assert adjust_logits(logits, [_req(temperature=0.0)] * 3) is logits  # nothing asked: no copy


@pytest.mark.parametrize("bias", [{-1: 1.0}, {"7": 1.0}, {1: 101.0}, {1: float("nan")}, {True: 1.0}, [1, 2]])
def test_bad_logit_bias_is_a_value_error(bias):
    from hybrid_serve.engine.sampling_params import SamplingParams

    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


def test_batched_gpu_sampler_is_seeded_per_request(monkeypatch):
    """The kernel path (forced here, interpreter on CPU): the same seeded request samples the
    same tokens alone or in a batch; top_k=1 is greedy."""
    import pytest

    pytest.importorskip("triton")
    monkeypatch.setenv("HYBRID_SERVE_KERNELS", "triton")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=gen).to("cuda" if torch.cuda.is_available() else "cpu")
    seeded = lambda: _req(temperature=1.0, seed=7)
    alone = sample(logits[:1], [seeded()]).tolist()
    batch = sample(logits, [seeded(), _req(temperature=0.0), _req(temperature=1.0, top_k=1, seed=3)]).tolist()
    assert batch[0] == alone[0]
    assert batch[1] == int(logits[1].argmax()) and batch[2] == int(logits[2].argmax())  # greedy, top_k=1
    draws = {tuple(sample(logits[:1], [_req(temperature=5.0, seed=s)]).tolist()) for s in range(20)}
    assert len(draws) > 1  # different seeds, different tokens
