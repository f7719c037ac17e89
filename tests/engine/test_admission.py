"""Admission: one view of the load, admit / queue / reject with a reason, and the scheduler
and the server asking it."""
import pytest

from hybrid_serve.engine.admission import Admission, LoadView


def _view(running=0, waiting=0, rows=4, max_num_seqs=4) -> LoadView:
    return LoadView(num_running=running, num_waiting=waiting, num_waiting_tokens=10 * waiting,
                    num_free_req_rows=rows, num_free_state_slots=8, num_free_kv_pages=32, max_num_seqs=max_num_seqs)


def test_can_start_until_max_num_seqs_or_rows_run_out():
    admission = Admission(max_num_seqs=4)
    assert admission.can_start(_view(running=3)).admitted
    full = admission.can_start(_view(running=4))
    assert full.decision == "queue" and "max_num_seqs=4" in full.reason
    assert admission.can_start(_view(running=1, rows=0)).reason == "no free request row"


def test_on_arrival_queues_then_rejects_past_the_bounds():
    from hybrid_serve.engine.admission import FirstTokenQueue

    admission = Admission(max_num_seqs=4, max_waiting=3, max_waiting_tokens=100)
    queue = FirstTokenQueue()
    assert admission.on_arrival(_view(), queue, 10, num_answered=0).admitted
    assert admission.on_arrival(_view(running=4), queue, 10, num_answered=4).decision == "queue"
    assert admission.on_arrival(_view(), queue, 10_000, num_answered=0).admitted  # an empty queue takes any prompt
    for _ in range(2):
        queue.enter(30)
    assert admission.on_arrival(_view(running=4), queue, 40, num_answered=4).decision == "queue"
    too_long = admission.on_arrival(_view(running=4), queue, 41, num_answered=4)
    assert too_long.decision == "reject" and "60 prompt tokens are waiting" in too_long.reason
    queue.enter(1)
    # every row held by a request past its first token: max_waiting requests may wait, no more
    rejected = admission.on_arrival(_view(running=4), queue, 1, num_answered=4)
    assert rejected.decision == "reject" and rejected.reason == (
        "3 requests are waiting for their first token (limit 3: max_waiting_requests=3 + 0 rows of "
        "max_num_seqs=4 not held by answered requests)")
    unbounded = Admission(max_num_seqs=4)
    assert unbounded.on_arrival(_view(running=4, waiting=10**6), queue, 10**6, num_answered=4).decision == "queue"


def test_on_arrival_counts_rows_left_free_by_answered_requests_as_room():
    """Requests without a first token include those already prefilling in a batch row: only
    the rows not held by answered requests are theirs, beyond max_waiting. (The old bound,
    max_waiting requests without a first token whatever ran, refused the second and third
    arrival here.)"""
    from hybrid_serve.engine.admission import FirstTokenQueue

    admission = Admission(max_num_seqs=4, max_waiting=3)
    queue = FirstTokenQueue()
    for _ in range(3):
        queue.enter(10)
    assert admission.on_arrival(_view(running=4), queue, 1, num_answered=1).decision == "queue"  # 3 + 3 free
    for _ in range(3):
        queue.enter(10)
    full = admission.on_arrival(_view(running=4, waiting=2), queue, 1, num_answered=1)
    assert full.decision == "reject" and "(limit 6: max_waiting_requests=3 + 3 rows" in full.reason
    assert admission.on_arrival(_view(running=4, waiting=2), queue, 1, num_answered=0).decision == "queue"
    # more answered requests than rows (preempted after their first token): no negative room
    over = admission.on_arrival(_view(running=4), FirstTokenQueue(3, 30), 1, num_answered=9)
    assert over.decision == "reject" and "limit 3:" in over.reason


@pytest.mark.parametrize("max_num_seqs, max_waiting", [(1, 1), (4, 3), (16, 16), (8, 32)])
def test_a_call_within_serves_cap_is_never_refused_for_the_request_count(max_num_seqs, max_waiting):
    """Serve gives a replica at most max_num_seqs + max_waiting calls (`queue_bounds`'s default
    max_ongoing_requests): every call in flight is either without a first token (the queue)
    or answered, so one arriving below the cap is always taken."""
    from hybrid_serve.engine.admission import FirstTokenQueue

    admission = Admission(max_num_seqs=max_num_seqs, max_waiting=max_waiting)
    cap = max_num_seqs + max_waiting
    for unanswered in range(cap):
        for answered in range(cap - unanswered):
            verdict = admission.on_arrival(_view(running=min(max_num_seqs, unanswered + answered)),
                                           FirstTokenQueue(unanswered, unanswered), 1, num_answered=answered)
            assert verdict.decision != "reject", (unanswered, answered, verdict.reason)
    assert admission.on_arrival(_view(), FirstTokenQueue(cap, cap), 1, num_answered=0).decision == "reject"


@pytest.mark.parametrize("kwargs", [{"max_num_seqs": 0}, {"max_num_seqs": 2, "max_waiting": 0},
                                    {"max_num_seqs": 2, "max_waiting_tokens": 0}])
def test_bad_bounds(kwargs):
    with pytest.raises(ValueError, match="max_"):
        Admission(**kwargs)


def test_the_engine_reports_its_view_and_the_scheduler_obeys_it():
    from hybrid_serve import LLM, SamplingParams

    engine = LLM(max_num_seqs=2, cache_memory_bytes=16 * 1024**2, max_model_len=128).engine
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", [5 + i] * (4 + i), params)
    view = engine.load_view()
    assert (view.num_running, view.num_waiting, view.num_waiting_tokens, view.max_num_seqs) == (0, 3, 15, 2)
    engine.step()
    view = engine.load_view()
    assert (view.num_running, view.num_waiting) == (2, 1)  # max_num_seqs=2: the third waits
    assert engine.admission.can_start(view).decision == "queue"
    while engine.has_unfinished():
        engine.step()
    assert engine.load_view().num_running == 0 and engine.load_view().num_free_req_rows == 2


def test_the_view_counts_the_prompt_tokens_a_running_chunked_prefill_still_has():
    """A running request part-way through its prompt (chunks of 16) reports the rest of it
    (routers weigh it as load: the replica is busy although nothing waits), none once decoding."""
    from hybrid_serve import LLM, SamplingParams

    engine = LLM(max_num_seqs=2, cache_memory_bytes=16 * 1024**2, max_model_len=128, chunked_prefill_size=16,
                 max_num_batched_tokens=16, enable_prefix_caching=False).engine
    engine.add_request("long", list(range(5, 55)), SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    engine.step()
    view = engine.load_view()
    assert (view.num_running, view.num_waiting, view.num_running_prefill_tokens) == (1, 0, 50 - 16)
    engine.step()
    assert engine.load_view().num_running_prefill_tokens == 50 - 32
    while engine.load_view().num_running_prefill_tokens:
        engine.step()
    assert engine.load_view().num_running == 1  # decoding now
