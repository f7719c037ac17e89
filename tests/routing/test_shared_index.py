"""routing/shared_index.py without Ray: the shared index applies replica reports in order,
rebuilds a replica from its live checkpoints when it missed events (predicting less, never
more), and local copies fed by its ops log (or a snapshot) equal it."""
from hybrid_serve.mem_cache import CacheEvent
from hybrid_serve.deploy.request_router import CacheEventRing
from hybrid_serve.routing import BlockPrefixIndex
from hybrid_serve.routing.shared_index import SharedPrefixIndex, apply_ops

PS, INTERVAL = 4, 16


def _copy(shared: SharedPrefixIndex, version: int = -1, local: BlockPrefixIndex | None = None) -> BlockPrefixIndex:
    local = local or BlockPrefixIndex(PS, INTERVAL)
    ops = shared.changes_since(version) if version >= 0 else None
    if ops is None:
        local.load(shared.snapshot())
    else:
        apply_ops(local, ops)
    return local


def test_reports_apply_events_once_and_in_order():
    shared = SharedPrefixIndex(PS, INTERVAL)
    ring = CacheEventRing(PS)
    prompt = list(range(40))
    shared.report("r0", ring.snapshot())  # first sight: nothing held
    shared.record_sent("r0", shared.index.sent_hashes(prompt))
    assert shared.index.match(prompt) == {"r0": 36}
    ring.extend([CacheEvent("checkpoint_evicted", tuple(prompt[:36]))])
    shared.report("r0", ring.snapshot())
    shared.report("r0", ring.snapshot())  # the same report from a second router: skipped
    assert shared.index.match(prompt) == {"r0": 32} and shared.num_rebuilds == 1
    ring.extend([CacheEvent("kv_evicted", tuple(prompt[:36]), 20)])
    shared.report("r0", ring.snapshot())
    assert shared.index.match(prompt) == {"r0": 16}


def test_missed_events_rebuild_from_live_checkpoints_never_over_promise():
    shared = SharedPrefixIndex(PS, INTERVAL)
    ring = CacheEventRing(PS, capacity=2)
    a, b = list(range(40)), list(range(100, 140))
    shared.report("r0", ring.snapshot())
    for prompt in (a, b):
        shared.record_sent("r0", shared.index.sent_hashes(prompt))
    # the replica took a checkpoint at 16 of a, then evicted all of b and a's KV past 16;
    # the ring (2 events) moved past the first two events before anyone reported them
    ring.extend([CacheEvent("checkpoint_taken", tuple(a[:16])), CacheEvent("kv_evicted", tuple(b[:36]), 0),
                 CacheEvent("kv_evicted", tuple(a[:36]), 16), CacheEvent("checkpoint_evicted", tuple(a[:36]))])
    shared.report("r0", ring.snapshot())
    assert shared.num_rebuilds == 2
    assert shared.index.match(a) == {"r0": 16} and shared.index.match(b) == {}
    # a restarted replica numbers events from 1 again: rebuilt, not applied on top
    fresh = CacheEventRing(PS)
    fresh.extend([CacheEvent("checkpoint_taken", tuple(b[:32]))])
    shared.report("r0", fresh.snapshot())
    assert shared.index.match(a) == {} and shared.index.match(b) == {"r0": 32}


def test_local_copies_follow_the_log_or_a_snapshot():
    shared = SharedPrefixIndex(PS, INTERVAL, log_capacity=4)
    prompts = [[p] * 4 + list(range(p, p + 36)) for p in range(6)]
    shared.report("r0", {"seq": 0})
    shared.report("r1", {"seq": 0})
    local = _copy(shared)
    version = shared.version
    for i, prompt in enumerate(prompts[:3]):
        shared.record_sent(f"r{i % 2}", shared.index.sent_hashes(prompt))
    assert shared.changes_since(version) is not None
    _copy(shared, version, local)
    version = shared.version
    for prompt in prompts:
        assert local.match(prompt) == shared.index.match(prompt)
    for i, prompt in enumerate(prompts):  # 6 ops: more than the log keeps
        shared.record_sent(f"r{i % 2}", shared.index.sent_hashes(prompt))
    shared.forget("r1")
    assert shared.changes_since(version) is None
    local = _copy(shared, version, local)
    for prompt in prompts:
        assert local.match(prompt) == shared.index.match(prompt) and set(local.match(prompt)) <= {"r0"}
    ended = []
    for prompt in prompts[0::2]:  # those sent to r0: a later turn continues the prompt, and the copy knows it
        later_turn = prompt + [99] * 8
        tokens = shared.index.match(later_turn)["r0"]
        ended.append(local.ends_a_prompt("r0", later_turn, tokens))
        assert ended[-1] == shared.index.ends_a_prompt("r0", later_turn, tokens)
    assert all(ended)


def test_silent_replicas_are_forgotten():
    shared = SharedPrefixIndex(PS, INTERVAL)
    shared.report("r0", {"seq": 0}, now=0.0)
    shared.record_sent("r0", shared.index.sent_hashes(list(range(40))), now=0.0)
    shared.report("r1", {"seq": 0}, now=50.0)
    assert shared.forget_silent(now=100.0, ttl_s=60.0) == ["r0"]
    assert shared.index.match(list(range(40))) == {} and "r0" not in shared.last_seq
