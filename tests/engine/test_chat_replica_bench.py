"""benchmarks/chat_replica_bench.py drives an engine through chat conversations in real time:
every turn finishes, and a later turn computes only its new message and the reply's tokens
past the reply's last page boundary (the reply checkpoint), under both CPU schedules."""
import pytest

from hybrid_serve import LLM
from hybrid_serve.benchmarks.chat_replica_bench import run_conversations


@pytest.mark.parametrize("overlap", [False, True])
def test_every_turn_finishes_and_resumes_after_its_reply(reference_models, overlap):
    model_dir = reference_models("qwen3_5")[0]
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=4, page_size=16, async_scheduling=overlap)
    user, reply = 20, 40
    out = run_conversations(llm, seed=0, conversations=3, turns=3, system_tokens=48, user_tokens=user,
                            reply_tokens=reply, think_s=(0.0, 0.01), arrivals_s=0.01)
    assert out["turns"] == 9
    # without the reply's checkpoint a later turn would compute the reply too (>= user + reply)
    assert user < out["later_turn_computed_tokens_mean"] <= user + 16
    assert out["later_turn_ttft_p50_s"] > 0 and out["tpot_p50_ms"] > 0
    llm.engine.cache.check_empty()


def test_unseen_histories_are_computed_whole_past_the_system_prompt(reference_models):
    """`unseen_history_fraction=1`: every later turn brings a history this replica never saw
    (round-robin's later turns elsewhere), so it computes all but the cached system prompt."""
    model_dir = reference_models("qwen3_5")[0]
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=4, page_size=16, state_checkpoint_interval=48)
    system, user, reply = 48, 20, 40  # (a checkpoint at the system prompt's end: the interval's first)
    out = run_conversations(llm, seed=0, conversations=2, turns=3, system_tokens=system, user_tokens=user,
                            reply_tokens=reply, think_s=(0.0, 0.01), arrivals_s=0.01, unseen_history_fraction=1.0)
    assert out["turns"] == 6
    # turns 1 and 2 bring 1 and 2 (user + reply) of history and a new message; only the system prompt hits
    assert out["later_turn_computed_tokens_mean"] == 1.5 * (user + reply) + user
    llm.engine.cache.check_empty()
