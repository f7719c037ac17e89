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
    assert admission.on_arrival(_view(), queue, 10).admitted
    assert admission.on_arrival(_view(running=4), queue, 10).decision == "queue"
    assert admission.on_arrival(_view(), queue, 10_000).admitted  # an empty queue takes any prompt
    for _ in range(2):
        queue.enter(30)
    assert admission.on_arrival(_view(running=4), queue, 40).decision == "queue"
    too_long = admission.on_arrival(_view(running=4), queue, 41)
    assert too_long.decision == "reject" and "60 prompt tokens are waiting" in too_long.reason
    queue.enter(1)
    rejected = admission.on_arrival(_view(running=4), queue, 1)
    assert rejected.decision == "reject" and rejected.reason == "3 requests are waiting for their first token (limit 3)"
    assert Admission(max_num_seqs=4).on_arrival(_view(running=4, waiting=10**6), queue, 10**6).decision == "queue"


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
