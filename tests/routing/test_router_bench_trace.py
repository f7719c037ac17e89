"""router_bench's trace accounting (benchmarks/router_bench_trace.py `affinity`): a later turn
that moved off its previous replica is counted with what the load reports said of the two
(no free state slot there, more waiting tokens), the figures that tell which cost term moved it."""
import json

from hybrid_serve.benchmarks.router_bench_trace import affinity, conversation_key


def test_moved_turns_name_the_load_that_moved_them(tmp_path):
    system = list(range(1000, 1064))
    conversations = [[system + [u] * 32, system + [u] * 32 + [7] * 48] for u in range(2)]
    trace = tmp_path / "trace.jsonl"
    lines = []
    for u, conv in enumerate(conversations):
        for t, prompt in enumerate(conv):
            key = conversation_key(prompt, len(system))
            moved = u == 0 and t == 1
            chosen = "b" if moved else "a"
            replicas = {"a": {"saved": 80 if t else 64, "running": 3, "waiting": 1, "waiting_tokens": 900,
                              "free_slots": 0},
                        "b": {"saved": 64, "running": 1, "waiting": 0, "waiting_tokens": 100, "free_slots": 2}}
            lines.append({"kind": "place", "key": key, "len": len(prompt), "reason": "prefix", "chosen": chosen,
                          "predicted": 0, "replicas": replicas})
            lines.append({"kind": "routed", "key": key, "len": len(prompt), "replica": chosen})
    trace.write_text("".join(json.dumps(e) + "\n" for e in lines))
    results = [{"user": u, "turn": t, "status": 200, "cached_tokens": 64 if (u, t) == (0, 1) else 80 * t}
               for u in range(2) for t in range(2)]
    out = affinity(str(trace), results, conversations, system_tokens=len(system))
    moved = out["later_turns"]["moved:prefix:previous predicted more"]
    assert moved["requests"] == 1
    assert moved["previous_no_free_slot_chosen_had_one"] == 1 and moved["previous_more_waiting_tokens"] == 1
    assert moved["waiting_tokens_previous_minus_chosen"] == 800 and moved["previous_more_running"] == 1
    assert out["later_turns"]["stayed"]["requests"] == 1 and "previous_more_running" not in out["later_turns"]["stayed"]
