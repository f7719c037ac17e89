"""The scheduler's in-batch prefix check (`Scheduler._prefix_in_flight`): a waiting request
waits for a running one that is computing a prefix it shares, to reuse its checkpoints. The
requests are filed by their first checkpoint interval of prompt tokens, so that admitting many
requests compares each with those sharing its start only; the answers must be those of
comparing it with every prefilling request."""
import random
from types import SimpleNamespace

import pytest

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.engine import scheduler as scheduler_module
from hybrid_serve.engine.scheduler import Scheduler, _common_prefix_len, _PrefillingByPrefix

INTERVAL, PAGE = 32, 16


def _brute_force(req, prefilling, interval, page_size, cached_len) -> bool:
    """The rule of `_prefix_in_flight`'s docstring, checked against every prefilling request."""
    limit = len(req.token_ids) - 1
    for other in prefilling:
        common = min(_common_prefix_len(req.token_ids, other.token_ids[: other.prompt_len]), limit)
        ckpt = common // interval * interval
        prompt_end = (other.prompt_len - 1) // page_size * page_size
        if prompt_end <= common:
            ckpt = max(ckpt, prompt_end)
        if ckpt > other.num_computed_tokens and ckpt >= interval and ckpt - cached_len >= interval:
            return True
    return False


def _request(tokens, prompt_len=None, computed=0):
    prompt_len = len(tokens) if prompt_len is None else prompt_len
    return SimpleNamespace(token_ids=list(tokens), prompt_len=prompt_len, num_computed_tokens=computed)


@pytest.mark.parametrize("seed", range(4))
def test_filed_by_first_interval_answers_as_comparing_with_all(seed):
    rng = random.Random(seed)
    systems = [[rng.randrange(50) for _ in range(rng.choice((20, 40, 70, 130)))] for _ in range(4)]

    def prompt():
        head = rng.choice(systems + [[]])
        cut = rng.randrange(len(head) + 1) if rng.random() < 0.3 else len(head)
        return head[:cut] + [rng.randrange(50) for _ in range(rng.randrange(1, 60))]

    cached_len = rng.choice((0, 32))
    sched = Scheduler.__new__(Scheduler)
    sched.interval, sched.page_size = INTERVAL, PAGE
    sched.cache = SimpleNamespace(usable_prefix_len=lambda tokens, n: cached_len)
    prefilling, index = [], _PrefillingByPrefix(INTERVAL)
    for _ in range(40):
        p = prompt()
        other = _request(p + [1, 2, 3], prompt_len=len(p), computed=rng.randrange(len(p)))  # with output tokens
        prefilling.append(other)
        index.add(other)
    answers = []
    for _ in range(200):
        req = _request(prompt())
        want = _brute_force(req, prefilling, INTERVAL, PAGE, cached_len)
        assert sched._prefix_in_flight(req, index) == want
        answers.append(want)
    assert any(answers) and not all(answers)  # both outcomes exercised


def test_many_distinct_prompts_admitted_at_once_compare_no_prefixes(monkeypatch):
    """64 unrelated prompts admitted in one step: none shares a first interval with another,
    so no pair is compared (pairwise, 2,016 comparisons: 17 ms of one step's scheduling)."""
    calls = [0]
    real = scheduler_module._common_prefix_len

    def counting(a, b):
        calls[0] += 1
        return real(a, b)

    monkeypatch.setattr(scheduler_module, "_common_prefix_len", counting)
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def engine():
        return LLM(dtype="float32", max_num_seqs=64, max_num_batched_tokens=64 * 40, chunked_prefill_size=64 * 40,
                   state_checkpoint_interval=INTERVAL).engine

    distinct = engine()
    for i in range(64):
        distinct.add_request(f"r{i}", [rng.randrange(4096) for _ in range(40)], params)
    assert len(distinct.scheduler.schedule()) == 64 and calls[0] == 0
    # prompts sharing their first interval are compared, and the later ones wait for the first
    shared = engine()
    for i in range(4):
        shared.add_request(f"s{i}", [7] * INTERVAL + [rng.randrange(4096) for _ in range(40)], params)
    assert [c.request.request_id for c in shared.scheduler.schedule()] == ["s0"] and calls[0] == 3
