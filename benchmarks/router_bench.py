"""Issue 14's router figures: the prefix- and checkpoint-aware router against round-robin,
Serve's default (power of two choices) and Ray's PrefixCacheAffinityRouter, with seeds.

    python -m hybrid_serve.benchmarks.router_bench micro            # no Ray: decision time, cache simulation
    python -m hybrid_serve.benchmarks.router_bench serve --replicas 4  # local Ray Serve, demo model on CPU
    python -m hybrid_serve.benchmarks.router_bench serve --replicas 4 --device cuda --model qwen3_5_2p3b \
        --gpus-per-replica 1 --cache-mib 2048 --system-tokens 4096 ...   # GPUs, dummy weights

micro (no Ray, no model):
  - router_decision_p99_ms: HybridRequestRouter.place + on_request_routed (the whole decision in
    the ingress process) paced at 500 requests/s, multi-turn prompts of 1-2k tokens, 4 replicas;
  - router_predicted_hit_error_p95_pages: 4 replicas, each the engine's own CacheManager with few
    state slots (checkpoints evicted under pressure), their cache events reaching the router
    through CacheEventRing -> SharedPrefixIndex; |predicted - realized| reusable prefix per
    request, in pages; the same with an index that ignores checkpoints (hybrid=False) beside it;
  - router_load_max_over_min: uniform random prompts, requests staying a while.
serve (local Ray Serve, the built-in demo model on CPU, one thread per replica): the multi-turn
workload (`multi_turn`: users x turns over one shared system prompt, think time) streamed over
HTTP; TTFT at the client, realized cached tokens from the usage; one app per router, in turn,
in the same run: ours, round-robin, Serve's default, Ray's PrefixCacheAffinityRouter (on the
token ids), and one replica with the cache of all of them.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from types import SimpleNamespace

from .provenance import cpu_device, git_commit

HERE = os.path.dirname(os.path.abspath(__file__))


def multi_turn(users: int = 32, turns: int = 5, seed: int = 0, system_tokens: int = 1024, user_tokens: int = 64,
               output_tokens: int = 16, vocab: tuple[int, int] = (10, 250)) -> list[list[list[int]]]:
    """users x turns prompts (token ids): one shared system prompt, each turn the history + a
    new user message (the assistant's reply stands in as `output_tokens` fixed ids: the demo
    model's own output would make the history depend on the router; `serve --generate-replies`
    puts the generated replies in their place, lengths unchanged)."""
    rng = random.Random(seed)
    system = [rng.randrange(*vocab) for _ in range(system_tokens)]
    out = []
    for _ in range(users):
        history, prompts = list(system), []
        for _ in range(turns):
            history = history + [rng.randrange(*vocab) for _ in range(user_tokens)]
            prompts.append(list(history))
            history = history + [rng.randrange(*vocab) for _ in range(output_tokens)]
        out.append(prompts)
    return out


def _percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


# ----- micro: no Ray -------------------------------------------------------------------------------
def decision_time(seed: int, rate: float = 500.0, seconds: float = 4.0) -> dict:
    from ..deploy.request_router import HybridRequestRouter
    from ..routing import RoutingRequest

    router = object.__new__(HybridRequestRouter)
    router.initialize_state(page_size=16, checkpoint_interval=256, seed=seed, shared_index=False)
    prompts = [p for user in multi_turn(64, 5, seed, system_tokens=1024, user_tokens=128) for p in user]
    random.Random(seed).shuffle(prompts)
    replicas = [SimpleNamespace(replica_id=SimpleNamespace(unique_id=f"r{i}"),
                                routing_stats={"num_running": i, "num_free_state_slots": 8}) for i in range(4)]
    times, cpu_times, start = [], [], time.perf_counter()
    for i in range(int(rate * seconds)):
        wait = start + i / rate - time.perf_counter()
        if wait > 0:  # paced arrivals (sleeping: a spinning client would take the core from the router)
            time.sleep(wait)
        t0, c0 = time.perf_counter(), time.thread_time()
        ids = prompts[i % len(prompts)]
        placement = router.place(RoutingRequest(ids), [router._stats(r) for r in replicas])
        router.predicted[id(ids)] = (placement.replica_id, placement.predicted_hit_tokens,  # (as choose_replicas)
                                     placement.new_conversation)
        pending = SimpleNamespace(args=[SimpleNamespace(prompt_token_ids=ids, session_id=None)])
        router.on_request_routed(pending, SimpleNamespace(unique_id=placement.replica_id), None)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.thread_time() - c0)
    return {"decisions": len(times), "rate_per_s": rate, "achieved_rate_per_s": round(len(times) / (time.perf_counter() - start), 1),
            "p50_ms": round(1e3 * _percentile(times, 0.5), 4), "p99_ms": round(1e3 * _percentile(times, 0.99), 4),
            "max_ms": round(1e3 * max(times), 4), "cpu_p99_ms": round(1e3 * _percentile(cpu_times, 0.99), 4),
            "load_average_1m": os.getloadavg()[0]}


def predicted_hit_error(seed: int, hybrid_index: bool = True, page_size: int = 16, interval: int = 64,
                        num_state_slots: int = 8) -> dict:
    """Pages between predicted and realized reusable prefix per request, replicas evicting
    checkpoints under state-pool pressure: 8 slots a replica for its 6 conversations and 2
    running requests (with 10, the engine's eviction order, which drops dominated interval
    checkpoints first and lets interval checkpoints take no resume point, evicts none that a
    later turn would reach for, and an index ignoring checkpoints predicts as well)."""
    from ..deploy.request_router import CacheEventRing
    from ..mem_cache import CacheManager
    from ..routing import PrefixAwarePolicy, ReplicaStats, RoutingRequest
    from ..routing.shared_index import SharedPrefixIndex

    rng = random.Random(seed)
    names = [f"r{i}" for i in range(4)]
    caches = {n: CacheManager(num_pages=160, page_size=page_size, num_state_slots=num_state_slots, num_rows=2,
                           max_context=4096)
              for n in names}
    rings = {n: CacheEventRing(page_size) for n in names}
    for n in names:
        caches[n].take_events()  # recording starts here
    shared = SharedPrefixIndex(page_size, interval, hybrid=hybrid_index)
    policy = PrefixAwarePolicy(shared.index, seed=seed)
    conversations = multi_turn(24, 5, seed, system_tokens=256, user_tokens=48, output_tokens=16)
    order = [(u, t) for t in range(5) for u in rng.sample(range(24), 24)]
    errors, realized_total, predicted_total = [], 0, 0
    for u, t in order:
        prompt = conversations[u][t]
        for n in names:
            shared.report(n, rings[n].snapshot())
        stats = [ReplicaStats(n, num_free_state_slots=caches[n].state_slots.num_free) for n in names]
        placement = policy.choose(RoutingRequest(prompt), stats)
        cache = caches[placement.replica_id]
        alloc = cache.admit(prompt, len(prompt))
        realized = alloc.num_tree_pages * page_size
        errors.append(abs(placement.predicted_hit_tokens - realized) / page_size)
        realized_total += realized
        predicted_total += placement.predicted_hit_tokens
        cache.ensure_kv(alloc, len(prompt))
        positions = sorted(set(range(interval, len(prompt), interval)) | {(len(prompt) - 1) // page_size * page_size})
        cache.schedule_checkpoints(alloc, [p for p in positions if p > realized], len(prompt))
        cache.commit_checkpoints(alloc, prompt)
        cache.release(alloc)
        rings[placement.replica_id].extend(cache.take_events())
    return {"requests": len(errors), "p95_pages": _percentile(errors, 0.95), "mean_pages": round(statistics.mean(errors), 3),
            "realized_hit_tokens": realized_total, "predicted_hit_tokens": predicted_total,
            "evicted_checkpoints": sum(c.stats.evicted_checkpoints for c in caches.values())}


def load_balance(seed: int) -> dict:
    from ..routing import BlockPrefixIndex, PrefixAwarePolicy, ReplicaStats, RoutingRequest

    policy, rng = PrefixAwarePolicy(BlockPrefixIndex(16, 256), seed=seed), random.Random(seed)
    load = {f"r{i}": 0 for i in range(4)}
    placed, active = dict.fromkeys(load, 0), []
    for _ in range(2000):
        prompt = [rng.randrange(32000) for _ in range(rng.choice((64, 512, 2048)))]
        stats = [ReplicaStats(r, num_running=n, num_free_state_slots=8) for r, n in load.items()]
        chosen = policy.choose(RoutingRequest(prompt), stats).replica_id
        load[chosen] += 1
        placed[chosen] += 1
        active.append(chosen)
        if len(active) > 32:
            load[active.pop(0)] -= 1
    return {"placed": placed, "max_over_min": round(max(placed.values()) / min(placed.values()), 3)}


def micro(seeds: list[int]) -> list[dict]:
    out = []
    for seed in seeds:
        row = {"seed": seed, "decision": decision_time(seed), "hit_error_checkpoint_aware": predicted_hit_error(seed),
               "hit_error_ignoring_checkpoints": predicted_hit_error(seed, hybrid_index=False),
               "uniform_load": load_balance(seed)}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def _write(name: str, result: dict) -> None:
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", name), "w") as f:
        json.dump(result, f, indent=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("micro", "serve", "merge"),
                    help="merge: one result from serve results (--parts) that measured different routers at once")
    ap.add_argument("--parts", nargs="+", default=[], help="merge: the serve results' JSON files")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--user-tokens", type=int, default=64, help="serve: tokens of each user message")
    ap.add_argument("--reply-tokens", type=int, default=16,
                    help="serve: tokens of each stand-in assistant reply in the history (chat replies run to "
                         "hundreds; the history a router can save grows by user + reply tokens a turn)")
    ap.add_argument("--routers", nargs="+", default=["prefix", "round_robin", "serve_default", "ray_prefix_affinity",
                                                      "single_replica"])
    ap.add_argument("--out-name", default=None,
                    help="the results file's name (default router_micro.json / router_multi_turn.json)")
    ap.add_argument("--trace", action="store_true",
                    help="serve: our router writes its decisions down; rows get where the hit tokens went")
    ap.add_argument("--system-tokens", type=int, default=1024, help="serve: the shared system prompt's tokens")
    ap.add_argument("--max-tokens", type=int, default=4, help="serve: output tokens of each turn")
    ap.add_argument("--generate-replies", action="store_true",
                    help="serve: each turn generates its --reply-tokens reply (greedy, EOS ignored) and the next "
                         "turn sends it back, as a chat client does (needs --model NAME: ids read from the synthetic "
                         "tokenizer); default: stand-in replies, max_tokens --max-tokens")
    ap.add_argument("--think-s", type=float, nargs=2, default=[0.2, 1.0], metavar=("LOW", "HIGH"),
                    help="serve: a user's think time between a reply and the next turn, uniform in [LOW, HIGH] s")
    ap.add_argument("--model", default="demo",
                    help="serve: 'demo' (the built-in model, CPU) or a benchmarks/model_configs.py name (dummy weights)")
    ap.add_argument("--device", default="cpu", help="serve: cpu or cuda")
    ap.add_argument("--dtype", default="bfloat16", help="serve, with --model NAME: the weights' dtype")
    ap.add_argument("--gpus-per-replica", type=float, default=1.0,
                    help="serve, on cuda: GPU share of each replica (0.25: four replicas on one card)")
    ap.add_argument("--cache-mib", type=int, default=48, help="serve: KV + state cache of each replica, MiB")
    ap.add_argument("--max-model-len", type=int, default=2048, help="serve: the engines' max_model_len")
    ap.add_argument("--max-num-seqs", type=int, default=8, help="serve: the engines' max_num_seqs")
    ap.add_argument("--engine-args", default="{}", help="serve: JSON of further engine arguments")
    ap.add_argument("--ray-cpus", type=int, default=4, help="serve: CPUs of the local Ray")
    ap.add_argument("--allow-short-cache", action="store_true",
                    help="serve: measure even if a replica's cache cannot keep its share of the conversations "
                         "between turns (checked first on the CPU; the default refuses)")
    ap.add_argument("--deploy-first", action="store_true",
                    help="serve: start every router's app at once before the first is measured (each app "
                         "starts in ~55 s on 16 cores: five routers then fit one 600-s device call); the "
                         "apps not being measured sit idle")
    ap.add_argument("--kill-router-after-s", type=float, default=None,
                    help="serve: kill the Router actor (it restarts) this far into the prefix router's run")
    args = ap.parse_args()
    load_before = os.getloadavg()
    if args.mode == "micro":
        rows = micro(args.seeds)
        _write(args.out_name or "router_micro.json", {
            "metric": "router_decision_p99_ms, router_predicted_hit_error_p95_pages, router_load_max_over_min",
            "date": time.strftime("%Y-%m-%d"), "commit": git_commit(), "device": cpu_device(),
            "load_average_1_5_15_before": load_before, "load_average_1_5_15_after": os.getloadavg(),
            "workload": "decision: 64 users x 5 turns (1024-token system prompt, 128-token turns), 4 replicas, "
                        "paced 500/s for 4 s; hit error: 24 users x 5 turns on 4 CacheManagers (160 pages of 16, "
                        "10 state slots each, checkpoints every 64 tokens), events via CacheEventRing; load: 2000 "
                        "uniform random prompts (64/512/2048 tokens), 32 in flight",
            "baseline": "hit error with an index that ignores checkpoints (hybrid=False), same run",
            "router_decision_p99_ms": max(r["decision"]["p99_ms"] for r in rows),
            "router_decision_p99_ms_note": "wall time, the worst seed; the machine's 2 cores were shared (load "
                                           "average in each row); router_decision_cpu_p99_ms is the thread's CPU time",
            "router_decision_cpu_p99_ms": max(r["decision"]["cpu_p99_ms"] for r in rows),
            "router_predicted_hit_error_p95_pages": max(r["hit_error_checkpoint_aware"]["p95_pages"] for r in rows),
            "router_predicted_hit_error_p95_pages_ignoring_checkpoints":
                max(r["hit_error_ignoring_checkpoints"]["p95_pages"] for r in rows),
            "router_load_max_over_min": max(r["uniform_load"]["max_over_min"] for r in rows),
            "rows": rows})
        return 0
    if args.mode == "merge":
        from .router_bench_figures import merge_results

        parts = []
        for path in args.parts:
            with open(path) as f:
                parts.append(json.load(f))
        _write(args.out_name or "router_multi_turn.json", merge_results(parts))
        return 0
    from .router_bench_serve import run_serve

    result = run_serve(args)
    result.update({"date": time.strftime("%Y-%m-%d"), "commit": git_commit(), "load_average_1_5_15_before": load_before,
                   "load_average_1_5_15_after": os.getloadavg()})
    _write(args.out_name or "router_multi_turn.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
