"""router_bench.py's `serve` mode: the multi-turn workload against one Serve app per router,
in turn, on a local Ray (the built-in demo model on CPU, one torch thread per replica). The
users that drive it over HTTP: router_bench_users.py; the figures read from each app's /metrics
and the issue's ratios: router_bench_figures.py.

Routers: "prefix" (ours, AppConfig router: prefix), "serve_default" (Serve's power of two
choices), "round_robin" (below), "ray_prefix_affinity" (Ray's PrefixCacheAffinityRouter on
the token ids, with its defaults), "single_replica" (one replica with the cache and the threads
of all of them, Serve's default router: the hit-token reference).

Ray's router: `ray.serve.llm.request_router.PrefixCacheAffinityRouter` is an empty subclass
(`pass`) of `ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router.
PrefixCacheAffinityRouter`; the public module imports only with pyarrow and vLLM or SGLang
installed (`ray.serve.llm`'s protocol models), the internal one with neither, so the bench
takes the public class where it imports and the internal (same code) otherwise.

`--trace`: our router writes each decision (per replica: predicted reusable tokens, load;
the chosen replica, the reason) to a JSON-lines file, and the run's row gets `affinity`: for
each later turn, whether it went where the conversation's previous turn went, why not, and
the hit tokens lost against each turn's best case (`_affinity`).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import statistics
import time
import urllib.request

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .provenance import cpu_device
from .router_bench import _percentile, multi_turn
from .router_bench_figures import (
    decision_reasons, decision_time, metrics_text, replica_split, replica_sums, router_metrics,
)
from .router_bench_trace import affinity, hit_accounting
from .router_bench_users import drive


class RoundRobinRouter(RequestRouter):
    """Each request to the next replica in turn (the rest as Serve's fallbacks)."""

    def initialize_state(self, **kwargs) -> None:
        self._turn = itertools.count()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        i = next(self._turn) % len(ordered)
        return [[ordered[i]], ordered[:i] + ordered[i + 1:]]


def _import_ray_prefix_affinity():
    try:
        from ray.serve.llm.request_router import PrefixCacheAffinityRouter
    except Exception:  # noqa: BLE001 - ray.serve.llm needs pyarrow and vLLM or SGLang: the same class
        try:
            from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
                PrefixCacheAffinityRouter,
            )
        except Exception:  # noqa: BLE001 - an older Ray without it
            return None
    return PrefixCacheAffinityRouter


_RayPrefixCacheAffinityRouter = _import_ray_prefix_affinity()
if _RayPrefixCacheAffinityRouter is not None:  # (module level: Serve imports the class by name)
    class RayPrefixAffinityOnIds(_RayPrefixCacheAffinityRouter):
        """Ray's PrefixCacheAffinityRouter (its defaults) reading our token ids as text."""

        def _extract_text_from_request(self, pending_request):
            return "".join(chr(0x100 + t) for t in pending_request.args[0].prompt_token_ids)
else:
    RayPrefixAffinityOnIds = None


def model_args(args) -> dict:
    """The app's model and placement arguments: the built-in demo on CPU (default), or with
    `--model NAME` a `model_configs` architecture with dummy weights and the synthetic
    tokenizer (every id decodes), on `--device` with `--gpus-per-replica` of a GPU each
    (fractions share a card, as the issue allows); `--engine-args` (JSON) on top."""
    out: dict = {"engine_args": {"max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs}}
    if args.model != "demo":
        import tempfile

        from .model_configs import CONFIGS, write_model_dir
        from .synthetic_tokenizer import write_tokenizer

        tmp = tempfile.mkdtemp(prefix="router_bench_")
        out.update(model=write_model_dir(args.model, tmp), load_format="dummy", dtype=args.dtype,
                   tokenizer=write_tokenizer(os.path.join(tmp, "tokenizer"), CONFIGS[args.model]().vocab_size))
    if args.device != "cpu":
        out.update(device=args.device, num_gpus_per_shard=args.gpus_per_replica)
    out["engine_args"].update(json.loads(args.engine_args))
    return out


def cache_shortfall(num_state_slots: int, num_kv_pages: int, page_size: int, conversations: int, max_num_seqs: int,
                    conversation_tokens: int, shared_tokens: int) -> str | None:
    """What a replica's pools lack to keep `conversations` chats between turns (None: nothing):
    a state slot each for its resume checkpoint, one for each of up to `max_num_seqs` running at
    once and one for the prefix they share; KV pages for each history of up to
    `conversation_tokens`, the `shared_tokens` prefix once. Short of them the replica evicts
    histories whatever the router does (session 32: 32 users on 4 replicas of 48 MiB, 14 slots,
    lost 0.28 of the hits one replica with the whole cache keeps)."""
    slots_needed = conversations + min(conversations, max_num_seqs) + 1
    tokens_needed = conversations * (conversation_tokens - shared_tokens) + shared_tokens
    short = []
    if num_state_slots < slots_needed:
        short.append(f"{num_state_slots} state slots, {conversations} conversations need {slots_needed}")
    if (num_kv_pages - 1) * page_size < tokens_needed:
        short.append(f"{num_kv_pages - 1} KV pages ({(num_kv_pages - 1) * page_size} tokens), their histories "
                     f"need {tokens_needed} tokens")
    return "; ".join(short) or None


def check_replica_cache(args, model: dict, cache_bytes: int) -> None:
    """Before Ray starts: plan one replica's pools (an engine on the CPU with dummy weights) and
    raise ValueError if they cannot keep the workload's conversations a replica
    (`cache_shortfall`), unless --allow-short-cache. CPU runs only (on a GPU the plan would need
    the model on the host)."""
    if args.device != "cpu" or args.allow_short_cache:
        return
    import torch

    from ..llm import LLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(model=model.get("model"), tokenizer=model.get("tokenizer"),
                  **{k: model[k] for k in ("load_format", "dtype") if k in model},
                  **{**model["engine_args"], "cache_memory_bytes": cache_bytes})
        setup = llm.engine.pool_setup
        llm.shutdown()
    finally:
        torch.set_num_threads(threads)
    conversations = -(-args.users // args.replicas)
    history = args.system_tokens + args.turns * (args.user_tokens + args.reply_tokens)
    short = cache_shortfall(setup.num_state_slots, setup.num_kv_pages, setup.page_size, conversations,
                            model["engine_args"]["max_num_seqs"], history, args.system_tokens)
    if short:
        raise ValueError(f"--cache-mib {args.cache_mib}: a replica holds {short} ({args.users} users on "
                         f"{args.replicas} replicas): raise --cache-mib, or --allow-short-cache to measure it anyway")


def _app(router: str, replicas: int, cache_bytes: int, trace_path: str | None, model: dict, system_tokens: int):
    """The app for `router`; "NAME@K": the same with K ingress replicas (each with its own
    request router); "prefix_unshared": ours with a per-router index instead of the Router actor's;
    `trace_path`: ours (1 ingress replica, shared index) writes its decisions there; `model`:
    `model_args(...)`; `system_tokens`: the workload's system prompt (the trace's keys)."""
    from ray.serve.config import RequestRouterConfig

    from ..deploy.app import build_app

    router, _, ingress_replicas = router.partition("@")
    # "prefix:w2": ours with saved_weight=2; "prefix:c1": with continuation_weight=1; "prefix:s0": with
    # conversation_slack=0; "prefix:f":
    # the no-slot cost counting free state slots only (checkpoint_slots_obtainable=False) (routing/policy.py)
    router, *options = router.split(":")
    policy_kwargs = {}
    for option in options:
        if option == "f":
            policy_kwargs["checkpoint_slots_obtainable"] = False
            continue
        key = {"w": "saved_weight", "c": "continuation_weight", "s": "conversation_slack"}.get(option[:1])
        if key is None:
            raise ValueError(f"unknown router option {option!r} (w<saved_weight>, c<continuation_weight>, "
                             f"s<conversation_slack>, f)")
        policy_kwargs[key] = float(option[1:])
    unshared = router == "prefix_unshared"
    router = "prefix" if unshared else router
    single = router == "single_replica"
    # The one replica with all the cache also gets all the replicas' threads (and GPU share, below):
    # the baseline is the same cache and compute in one place.
    args = {"replicas": 1 if single else replicas, "num_cpus_per_replica": 0.5 * (replicas if single else 1),
            "torch_num_threads": replicas if single else 1,
            "router": "prefix" if router == "prefix" else "pow2", "router_stats_period_s": 0.5,
            "max_waiting_requests": 64, "max_waiting_tokens": 1 << 20, "max_queued_requests": 512,
            **model, "engine_args": {**model["engine_args"],
                                     "cache_memory_bytes": cache_bytes * (replicas if single else 1)}}
    if single and "num_gpus_per_shard" in args:  # the one replica with all the cache gets all their GPU share
        args["num_gpus_per_shard"] = min(1.0, args["num_gpus_per_shard"] * replicas)
    app = build_app(args)
    if router in ("round_robin", "ray_prefix_affinity"):
        custom = RoundRobinRouter if router == "round_robin" else RayPrefixAffinityOnIds
        if custom is None:
            return None
        server = app._bound_deployment.init_args[1]
        server._bound_deployment = server._bound_deployment.options(
            request_router_config=RequestRouterConfig(request_router_class=custom))
    traced = trace_path and router == "prefix" and not unshared and not ingress_replicas
    if unshared or traced or policy_kwargs:
        from .router_bench_trace import TracedHybridRequestRouter

        server = app._bound_deployment.init_args[1]
        config = server._bound_deployment._deployment_config.request_router_config
        extra = {"shared_index": False} if unshared else {"trace_path": trace_path, "key_at": system_tokens} if traced else {}
        extra.update(policy_kwargs)
        server._bound_deployment = server._bound_deployment.options(request_router_config=RequestRouterConfig(
            request_router_class=TracedHybridRequestRouter if traced else config.request_router_class,
            request_routing_stats_period_s=config.request_routing_stats_period_s,
            request_router_kwargs={**config.request_router_kwargs, **extra}))
    if ingress_replicas:
        app._bound_deployment = app._bound_deployment.options(num_replicas=int(ingress_replicas))
    return app


def _kill_router_later(app_name: str, after_s: float | None) -> dict | None:
    """Kill (restartable) the app's Router actor `after_s` into the run, from a timer thread."""
    if after_s is None:
        return None
    import threading

    import ray

    killed: dict = {}

    def kill() -> None:
        for actor in ray.util.list_named_actors(all_namespaces=True):
            if actor["name"].startswith(f"hybrid_serve_router:{app_name}:"):
                ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=False)
                killed["at"] = time.perf_counter()
                killed["name"] = actor["name"]

    threading.Timer(after_s, kill).start()
    return killed


def _recovery(results: list[dict], started: float, killed: dict) -> dict:
    """Later turns' hit ratio (cached / prompt tokens) and TTFT p50 before the kill and in the
    windows after it: routing quality lost and regained."""
    if "at" not in killed:
        return {"error": "no Router actor found to kill"}
    windows = {"before": (started, killed["at"]), "0-10 s after": (killed["at"], killed["at"] + 10),
               "10-30 s after": (killed["at"] + 10, killed["at"] + 30), "30 s after and later": (killed["at"] + 30, 1e18)}
    out = {"killed_at_s": round(killed["at"] - started, 1), "actor": killed["name"]}
    for label, (lo, hi) in windows.items():
        later = [r for r in results if r["turn"] and r["status"] == 200 and lo <= r["start_s"] < hi]
        if later:
            out[label] = {"requests": len(later),
                          "hit_ratio": round(sum(r["cached_tokens"] for r in later) / sum(r["prompt_tokens"] for r in later), 3),
                          "ttft_p50_s": round(statistics.median(r["ttft_s"] for r in later), 3)}
    return out


def _device_name(device: str) -> str:
    if device == "cpu":
        return cpu_device()
    import torch

    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_serve(args) -> dict:
    import ray
    from ray import serve

    replies = args.reply_tokens if args.generate_replies else 0
    if replies and args.model == "demo":
        raise ValueError("--generate-replies reads reply ids from the synthetic tokenizer: give --model NAME")

    cache_bytes = args.cache_mib * 1024**2
    model = model_args(args)
    check_replica_cache(args, model, cache_bytes)
    ray.init(address="local", num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    rows, skipped = {}, {}
    measuring = None  # the router being measured when a time limit's SIGINT arrives
    try:
        for seed in args.seeds:
            conversations = multi_turn(args.users, args.turns, seed, system_tokens=args.system_tokens,
                                       user_tokens=args.user_tokens, output_tokens=args.reply_tokens)
            apps = {}  # router -> (app, its name, its trace path), each with fresh replicas for this seed
            for router in args.routers:
                trace_path = f"/tmp/router_trace_{router}_seed{seed}_{os.getpid()}.jsonl" if args.trace else None
                app = _app(router, args.replicas, cache_bytes, trace_path, model, args.system_tokens)
                if app is None:
                    skipped[router] = "Ray's PrefixCacheAffinityRouter does not import here"
                    continue
                apps[router] = (app, f"rb-{router.replace('@', '-x').replace(':', '-')}", trace_path)
            if args.deploy_first:  # every router's app starts at once, before any is measured
                serve.run_many([serve.RunTarget(app, name=name, route_prefix=f"/{name}")
                                for app, name, _ in apps.values()])
            for router, (app, name, trace_path) in apps.items():
                if not args.deploy_first:
                    serve.run(app, name=name, route_prefix=f"/{name}")
                measuring = router
                base = f"http://127.0.0.1:{port}/{name}"
                for _ in range(1200):
                    try:
                        with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
                            if resp.status == 200:
                                break
                    except Exception:  # noqa: BLE001 - not up yet
                        pass
                    time.sleep(0.5)
                warm = multi_turn(2 * args.replicas, 1, seed + 1000, system_tokens=256)  # first calls, unshared
                asyncio.run(drive(f"{base}/v1/completions", warm, seed))
                time.sleep(2.0)  # (the replicas' metrics push: the warm-up stays out of the split below)
                metrics = metrics_text(base)
                reasons_before, replicas_before = decision_reasons(metrics), replica_sums(metrics)
                started = time.perf_counter()
                killer = _kill_router_later(name, args.kill_router_after_s) if router.startswith("prefix") else None
                results = asyncio.run(drive(f"{base}/v1/completions", conversations, seed, args.max_tokens,
                                             tuple(args.think_s), replies))
                wall = time.perf_counter() - started
                time.sleep(2.0)  # the ingress's metrics push
                metrics = metrics_text(base)
                reasons = {k: int(v) for k, v in (decision_reasons(metrics) - reasons_before).items()}
                split = replica_split(replicas_before, replica_sums(metrics))
                serve.delete(name)
                failures = [r for r in results if r["status"] != 200]
                assert not failures or killer, failures[:3]
                ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
                row = {"requests": len(results), "wall_s": round(wall, 1),
                       "ttft_p50_s": round(statistics.median(ttfts), 4), "ttft_p99_s": round(_percentile(ttfts, 0.99), 4),
                       "hit_tokens": sum(r["cached_tokens"] for r in results),
                       "prompt_tokens": sum(r["prompt_tokens"] for r in results),
                       "later_turn_ttft_p50_s": round(statistics.median(
                           [r["ttft_s"] for r in results if r["turn"] and r["ttft_s"] is not None]), 4)}
                by_turn = {}
                for r in results:
                    if r["ttft_s"] is not None:
                        by_turn.setdefault(r["turn"], []).append(r["ttft_s"])
                row["ttft_p50_by_turn_s"] = [round(statistics.median(by_turn[t]), 4) for t in sorted(by_turn)]
                # (each request, in the order sent: user, turn, TTFT in ms, prompt and hit tokens)
                row["per_request"] = [[r["user"], r["turn"], None if r["ttft_s"] is None else round(1e3 * r["ttft_s"], 1),
                                       r["prompt_tokens"], r["cached_tokens"]] for r in sorted(results, key=lambda r: r["start_s"])]
                row["failed_requests"] = len(failures)
                row["ttft_mean_ms"] = round(1e3 * statistics.mean(ttfts), 2)  # (beside the replicas' mean)
                row.update(split)
                if "replica_ttft_mean_ms" in row:  # before the replica: HTTP, ingress, routing, the hand-over
                    row["before_replica_mean_ms"] = round(row["ttft_mean_ms"] - row["replica_ttft_mean_ms"], 2)
                decision = decision_time(metrics)
                if decision:
                    row["decision_mean_ms"] = decision
                row["hits_vs_best_case"] = hit_accounting(results, conversations, args.system_tokens, replies)
                if reasons:
                    row["decision_reasons"] = reasons
                if trace_path and os.path.exists(trace_path):
                    row["affinity"] = affinity(trace_path, results, conversations, args.system_tokens, replies)
                if killer:
                    row["router_actor_killed"] = _recovery(results, started, killer)
                rows.setdefault(router, []).append({"seed": seed, **row})
                print(router, seed, row, flush=True)
                measuring = None
    except KeyboardInterrupt:  # (timeout -s INT): the routers measured so far still make the result
        skipped[measuring or "?"] = "stopped by SIGINT (the run's time limit) while it was measured"
    finally:
        serve.shutdown()
        ray.shutdown()

    return {
        "metric": "router_multi_turn",
        "device": _device_name(args.device),
        "setup": (f"local Ray Serve (num_cpus={args.ray_cpus}), model {args.model}"
                  + (" (11M params), 1 torch thread per replica" if args.model == "demo" else " (dummy weights)")
                  + (f", {args.gpus_per_replica} GPU per replica" if args.device != "cpu" else "")
                  + f", engine args {json.dumps(model['engine_args'])}"
                  + (", every router's app started before the first was measured (--deploy-first)"
                     if args.deploy_first else "")),
        "workload": f"benchmarks/router_bench.py multi_turn: {args.users} users x {args.turns} turns, shared "
                    f"{args.system_tokens}-token system prompt, {args.user_tokens}-token user turns + "
                    f"{args.reply_tokens}-token {'generated (sent back)' if replies else 'stand-in'} replies, "
                    f"arrivals over 2 s, think time "
                    f"{args.think_s[0]}-{args.think_s[1]} s, max_tokens {args.max_tokens}, greedy; {args.replicas} replicas x "
                    f"{cache_bytes >> 20} MiB cache (single_replica: one with {args.replicas}x the cache and "
                    f"threads), seeds {args.seeds}",
        "baseline": "round-robin, Serve's default (power of two choices), Ray's PrefixCacheAffinityRouter (its "
                    "defaults, on the token ids), one replica with the total cache and threads: same run, same seed",
        "trace": bool(args.trace),
        **router_metrics(rows),
        "skipped": skipped,
        "rows": rows,
    }
