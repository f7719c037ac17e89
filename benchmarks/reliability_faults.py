"""`reliability.py disconnects` and `kill`: clients that hang up mid-stream (nothing left running,
no page or slot held), and replica processes killed under load (statuses, streams ended by an
error event, retries before the first token, recovery times)."""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import time
from collections import Counter

from hybrid_serve.benchmarks.reliability_harness import (APP_NAME, LocalApp, call, completion_body, good_retry_after,
                                                        ms, pct, prompt_pool, session, table)


# ----- disconnects ----------------------------------------------------------------------------
def run_disconnects(args) -> dict:
    # a first-token queue of 64 per replica: all `clients` arrive at once and are admitted (with the
    # default, max_num_seqs // 2 = 16, a replica answers 503 to those past 32 + 16 without a first token)
    engine_args = {"max_num_seqs": 32, "max_model_len": 256, "cache_memory_bytes": 64 * 2**20}
    app_args = {"replicas": 2, "num_cpus_per_replica": 0.5, "torch_num_threads": 1, "engine_args": engine_args,
                "max_waiting_requests": 64}
    prompts = prompt_pool(args.clients, args.seed + 10)
    rng = random.Random(args.seed + 11)
    hang_after = [rng.randint(1, 3) for _ in prompts]
    load_at_start = os.getloadavg()
    pages, slots = pool_sizes(engine_args)  # per replica: usage ratios -> counts
    with LocalApp(app_args) as app:
        fresh = app.engine_state()

        async def run(hang: bool):
            async with session() as http:
                return await asyncio.gather(*(call(http, app, completion_body(p, True, args.max_tokens),
                                                   hang_up_after=h if hang else None)
                                              for p, h in zip(prompts, hang_after)))

        def settle() -> dict:
            """Idle, then a step on every replica (the engine checks its pools when a step leaves
            it idle: an abort alone runs no step), idle again; the engines' state."""
            app.wait_idle()
            before = app.engine_state()["finished_length"]
            for _ in range(20):
                asyncio.run(_many(app, [f"settle {i}" for i in range(8)], 2))
                if all(v > before.get(r, 0) for r, v in app.engine_state()["finished_length"].items()):
                    break
            _, state = app.wait_idle()
            return state

        # 0: the same prompts to completion: what the prefix cache keeps of them
        full = asyncio.run(run(False))
        after_full = settle()
        rounds = []
        for _ in range(2):  # 1, 2: every client hangs up after 1-3 chunks (twice: a leak would grow)
            t = time.monotonic()
            hung = asyncio.run(run(True))
            hang_s = time.monotonic() - t
            idle_s, at_idle = app.wait_idle()
            rounds.append({"records": hung, "hang_s": hang_s, "idle_s": idle_s, "at_idle": at_idle,
                           "settled": settle()})
        ok_after = asyncio.run(_one(app, "after the disconnects", 4))
        config = app.config_record()
    if args.dump:
        with open(args.dump, "w") as f:
            f.writelines(json.dumps(r) + "\n" for rnd in rounds for r in rnd["records"])
    sums = lambda d: round(sum(d.values()), 5)
    outcome = lambda r: ("hung_up" if r["hung_up"] else "done" if r["done"] else
                         f"status_{r['status']}" if r["status"] != 200 else "other")
    per_round = [{
        "outcomes": dict(Counter(outcome(r) for r in rnd["records"])),
        "hung_up_after_chunks": dict(Counter(r["chunks"] for r in rnd["records"] if r["hung_up"])),
        "hang_up_phase_s": round(rnd["hang_s"], 1), "seconds_to_idle": round(rnd["idle_s"], 1),
        "running_at_idle": sums(rnd["at_idle"]["running"]), "waiting_at_idle": sums(rnd["at_idle"]["waiting"]),
        "kv_usage": sums(rnd["settled"]["kv_usage"]), "state_usage": sums(rnd["settled"]["state_usage"]),
        # at idle, what the pools hold beyond the prefix cache's pages and checkpoints: a request's (a leak)
        "kv_pages_held_by_requests": round(pages * (sums(rnd["settled"]["kv_usage"])
                                                    - sums(rnd["settled"]["kv_prefix_cached"]))),
        "state_slots_held_by_requests": round(slots * (sums(rnd["settled"]["state_usage"])
                                                       - sums(rnd["settled"]["state_prefix_cached"]))),
        "invariant_violations": sums(rnd["settled"]["invariant_violations"]),
        # (a stream can finish before the server sees its client gone: then it ends "length", not "abort")
        "aborted_total": sums(rnd["settled"]["aborted"]),
    } for rnd in rounds]
    last = rounds[-1]["settled"]
    figures = {
        "clients_per_round": len(prompts), "rounds": per_round,
        "completed_in_baseline": sum(r["status"] == 200 and r["done"] for r in full),
        "baseline_outcomes": dict(Counter("done" if r["done"] else str(r["status"]) if r["exc"] is None else "exception"
                                          for r in full)),
        "fresh": {k: sums(v) for k, v in fresh.items()},
        "baseline_completed": {"kv_usage": sums(after_full["kv_usage"]),
                               "state_usage": sums(after_full["state_usage"])},
        "after": last, "invariant_violations": sums(last["invariant_violations"]),
        "request_after_status": ok_after["status"],
        "load_average_at_start": [round(x, 2) for x in load_at_start],
    }
    hung_total = sum(r["hung_up"] for rnd in rounds for r in rnd["records"])
    # in use, summed over both replicas, as counts (at idle: the prefix cache's pages and checkpoints)
    held = [(round(figures["baseline_completed"]["kv_usage"] * pages), round(figures["baseline_completed"]
                                                                              ["state_usage"] * slots))]
    held += [(round(r["kv_usage"] * pages), round(r["state_usage"] * slots)) for r in per_round]
    for r, (p, sl) in zip(per_round, held[1:]):
        r["kv_pages_in_use"], r["state_slots_in_use"] = p, sl
    figures["pool_size_per_replica"] = {"kv_pages": pages, "state_slots": slots}
    figures["baseline_completed"].update(kv_pages_in_use=held[0][0], state_slots_in_use=held[0][1])
    growth = [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(held)]
    figures["in_use_growth_per_round_pages_slots"] = growth
    checks = {
        "every_client_hung_up_mid_stream": hung_total == 2 * len(prompts),
        "nothing_running_or_waiting": all(r["running_at_idle"] == 0 and r["waiting_at_idle"] == 0
                                          for r in per_round),
        "no_pool_invariant_violation": figures["invariant_violations"] == 0,
        # at idle, every page and slot in use is the prefix cache's (which may grow by the aborted
        # requests' prompts and outputs: their growth is a figure, not the check)
        "no_page_or_slot_held_per_aborted_request": all(r["kv_pages_held_by_requests"] == 0
                                                        and r["state_slots_held_by_requests"] == 0
                                                        for r in per_round),
        "serves_after": ok_after["status"] == 200,
    }
    table([("clients hung up", f"{hung_total}/{2 * len(prompts)} in 2 rounds"),
           ("seconds to idle", [r["seconds_to_idle"] for r in per_round]),
           ("running / waiting at idle", [(r["running_at_idle"], r["waiting_at_idle"]) for r in per_round]),
           ("KV pages in use baseline / round 1 / round 2", f"{[h[0] for h in held]} of {2 * pages}"),
           ("state slots in use baseline / round 1 / round 2", f"{[h[1] for h in held]} of {2 * slots}"),
           ("pages / slots held by requests at idle", [(r["kv_pages_held_by_requests"],
                                                        r["state_slots_held_by_requests"]) for r in per_round]),
           ("invariant violations", figures["invariant_violations"]),
           ("aborted sequences", per_round[-1]["aborted_total"]), ("checks", checks)], "disconnects")
    workload = (f"demo model, 2 LLMServer replicas x 1 thread, max_num_seqs=32, max_waiting_requests=64; "
                f"{args.clients} distinct seeded "
                f"prompts streamed concurrently (/v1/completions, greedy, ignore_eos, max_tokens={args.max_tokens}) "
                f"to completion first (what the prefix cache keeps of them: the baseline), then the same "
                f"{args.clients} twice more, each client closing its connection after 1-3 chunks (seeded); after "
                f"each phase: idle, then small requests until both replicas ran a step (the idle pool check), idle "
                f"again, usage summed over both replicas from /metrics (ratios x pool sizes = counts)")
    return {"workload": workload, "config": config, "figures": figures, "checks": checks}


def pool_sizes(engine_args: dict) -> tuple[int, int]:
    """KV pages and state slots of one demo engine with these args (built here, offline)."""
    from hybrid_serve import LLM

    cache = LLM(**engine_args).engine.cache
    return cache.pages.num_ids, cache.state_slots.num_ids


async def _many(app: LocalApp, prompts: list[str], max_tokens: int) -> list[dict]:
    async with session() as http:
        return await asyncio.gather(*(call(http, app, completion_body(p, False, max_tokens), timeout_s=120)
                                      for p in prompts))


async def _one(app: LocalApp, prompt: str, max_tokens: int) -> dict:
    async with session() as http:
        return await call(http, app, completion_body(prompt, False, max_tokens), timeout_s=120)


# ----- kill -----------------------------------------------------------------------------------
def grep_logs(folder: str, needle: str) -> int:
    """Lines containing `needle` in `folder` (a file, or the files under a folder: a Ray session's logs)."""
    paths = [folder] if os.path.isfile(folder) else [os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs]
    n = 0
    for path in paths:
        try:
            with open(path, errors="replace") as fh:
                n += sum(needle in line for line in fh)
        except OSError:
            pass
    return n


def run_kill(args) -> dict:
    # small batches and a deeper first-token queue, so that each replica has requests without a
    # token yet when it is killed (the retry path) and the survivor can take them all without a 503
    engine_args = {"max_num_seqs": args.kill_max_num_seqs, "max_model_len": 256, "cache_memory_bytes": 64 * 2**20}
    app_args = {"replicas": 2, "num_cpus_per_replica": 0.5, "torch_num_threads": 1, "engine_args": engine_args,
                "max_waiting_requests": args.kill_max_waiting}
    prompts = prompt_pool(200, args.seed + 20)
    load_at_start = os.getloadavg()
    with LocalApp(app_args) as app:
        result = asyncio.run(_kill_loop(app, prompts, args))
        logs = os.path.join(app.session_dir, "logs")
        retries_logged = grep_logs(logs, "replica failed before its first token; retrying")
        # our processes' logs (Serve's controller logs a traceback when a dead replica's routing
        # stats cannot be read: Serve's own, expected after a kill, counted apart)
        tracebacks = sum(grep_logs(os.path.join(logs, "serve", f), "Traceback (most recent call last)")
                         for f in os.listdir(os.path.join(logs, "serve")) if f.startswith("replica_"))
        controller_tracebacks = sum(grep_logs(os.path.join(logs, "serve", f), "Traceback (most recent call last)")
                                    for f in os.listdir(os.path.join(logs, "serve")) if f.startswith("controller"))
        for k in result["kills"]:  # Serve's router logs this once per call that failed on the dead replica
            k["calls_lost_with_killed_replica"] = grep_logs(
                os.path.join(logs, "serve"),
                f"Replica(id='{k['killed_replica']}', deployment='LLMServer', app='{APP_NAME}') will not be "
                f"considered for future requests because it has died")  # (logs/serve/: each line once)
        after = app.engine_state()
        config = app.config_record()
    recs, kills, health = result["records"], result["kills"], result["health"]
    if args.dump:
        with open(args.dump, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
    cls = Counter(r["class"] for r in recs)
    statuses = Counter(str(r["status"]) if r["exc"] is None else "exception" for r in recs)
    in_flight = [r for r in recs if r["at_kill"] is not None]
    # had no token at the kill and succeeded anyway (either replica: the killed one's were retried)
    no_token_ok = [r for r in in_flight if r["token_before_kill"] is False and r["class"] == "ok"]
    figures = {
        "kills": len(kills), "requests": len(recs), "by_class": dict(cls), "by_status": dict(statuses),
        "http_500": statuses.get("500", 0),
        "in_flight_at_a_kill": len(in_flight),
        "in_flight_with_token_at_kill": sum(r["token_before_kill"] is True for r in in_flight),
        "in_flight_without_token_at_kill_succeeded": len(no_token_ok),
        "in_flight_without_token_at_kill_failed": sum(r["token_before_kill"] is False and r["class"] != "ok"
                                                      for r in in_flight),
        "retries_logged_by_ingress": retries_logged,
        "streams_ended_error_event_then_done": cls.get("stream_error_done", 0),
        "nonstream_503_with_retry_after": cls.get("503_retry_after", 0),
        "error_event_codes": dict(Counter((r["error_event"] or {}).get("code") for r in recs if r["error_event"])),
        "per_kill": kills,
        "recovery_s": {"serve_2_running_max": max((k["serve_running_s"] for k in kills), default=None),
                       "new_replica_serving_max": max((k["new_replica_serving_s"] for k in kills), default=None)},
        "health_non_200": health,
        "ttft_ms_overall": {"p50": ms(pct([r["ttft"] for r in recs if r["ttft"]], 0.5)),
                            "p99": ms(pct([r["ttft"] for r in recs if r["ttft"]], 0.99)),
                            "max": ms(max([r["ttft"] for r in recs if r["ttft"]], default=None))},
        "tracebacks_in_replica_logs": tracebacks, "tracebacks_in_serve_controller_log": controller_tracebacks,
        "engine_after": after,
        "load_average_at_start": [round(x, 2) for x in load_at_start],
    }
    failed_other = [k for k in kills if k["survivor_failed_or_aborted"] > 0]
    checks = {
        "no_http_500": statuses.get("500", 0) == 0,
        "no_unexpected_outcome": all(c in ("ok", "stream_error_done", "503_retry_after") for c in cls),
        "requests_without_token_succeeded": figures["in_flight_without_token_at_kill_failed"] == 0,
        "started_streams_ended_with_error_event_and_done": cls.get("stream_broken", 0) == 0,
        "replica_serves_again_within_60s": all(k["new_replica_serving_s"] is not None and
                                               k["new_replica_serving_s"] <= 60 for k in kills),
        "surviving_replica_requests_all_succeeded": not failed_other and all(
            k["failed_requests"] <= k["calls_lost_with_killed_replica"] for k in kills),
    }
    table([("kills", len(kills)), ("requests", len(recs)), ("by class", dict(cls)), ("by status", dict(statuses)),
           ("no token at kill -> ok", f"{len(no_token_ok)} (retries logged: {retries_logged})"),
           ("recovery (2 RUNNING / new serving)", [(k["serve_running_s"], k["new_replica_serving_s"]) for k in kills]),
           ("per kill: failed / calls lost with the killed replica",
            [(k["failed_requests"], k["calls_lost_with_killed_replica"]) for k in kills]),
           ("health non-200", health), ("checks", checks)], "kill")
    workload = (f"demo model, 2 LLMServer replicas x 1 thread (max_num_seqs={args.kill_max_num_seqs}, "
                f"max_waiting_requests={args.kill_max_waiting}); {args.clients} streaming and "
                f"{args.nonstream_clients} non-streaming clients looping /v1/completions (greedy, ignore_eos, "
                f"max_tokens={args.max_tokens}); {args.kills} SIGKILLs of one LLMServer replica's worker pid (alternating), "
                f"each once Serve reports 2 RUNNING replicas and the new one has taken requests, plus "
                f"{args.settle} s; /health polled every 0.5 s")
    return {"workload": workload, "config": config, "figures": figures, "checks": checks}


def _classify_kill(rec: dict) -> str:
    if rec["exc"] is not None:
        return "client_error"
    if rec["status"] == 200:
        if not rec["stream"]:
            return "ok"
        if rec["done"] and rec["error_event"] is None and rec["finish"] is not None:
            return "ok"
        if rec["done"] and rec["error_event"] is not None:
            return "stream_error_done"
        return "stream_broken"
    if rec["status"] == 503:
        return "503_retry_after" if good_retry_after(rec) else "503_no_retry_after"
    return f"http_{rec['status']}"


async def _kill_loop(app: LocalApp, prompts: list[str], args) -> dict:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    records: list[dict] = []
    kill_times: list[float] = []
    health: list[dict] = []

    async def client(i: int, http):
        rng = random.Random(args.seed + 100 + i)
        stream = i >= args.nonstream_clients  # clients 0..nonstream_clients-1 are non-streaming
        while not stop.is_set():
            body = completion_body(rng.choice(prompts), stream, args.max_tokens)
            rec = await call(http, app, body, timeout_s=180)
            rec["at_kill"] = None
            rec["token_before_kill"] = None
            for tk in kill_times:
                if rec["t0"] < tk < rec["t_end"]:
                    rec["at_kill"] = tk
                    if stream:  # (a non-streaming client cannot tell)
                        rec["token_before_kill"] = rec["t_first"] is not None and rec["t_first"] < tk
            rec["class"] = _classify_kill(rec)
            records.append(rec)
            if rec["status"] == 503:  # as a client should: wait as long as Retry-After says (at most 5 s here)
                await asyncio.sleep(min(5, int(rec["retry_after"]) if good_retry_after(rec) else 1))
            elif rec["error_event"] is not None:
                await asyncio.sleep(1)

    async def poll_health(http):
        while not stop.is_set():
            t = time.monotonic()
            try:
                async with http.get(app.base + "/health") as resp:
                    status = resp.status
            except Exception as exc:  # noqa: BLE001
                status = type(exc).__name__
            if status != 200:
                health.append({"t_since_last_kill": round(t - kill_times[-1], 1) if kill_times else None,
                               "status": status})
            await asyncio.sleep(0.5)

    kills: list[dict] = []
    async with session() as http:
        tasks = [asyncio.create_task(client(i, http)) for i in range(args.clients + args.nonstream_clients)]
        tasks.append(asyncio.create_task(poll_health(http)))
        await asyncio.sleep(args.settle)
        for k in range(args.kills):
            reps = await loop.run_in_executor(None, app.replicas)
            if len(reps) < 2:
                raise RuntimeError(f"expected 2 LLMServer replicas, found {reps}")
            victim, survivor = reps[k % 2], reps[1 - k % 2]
            state = await loop.run_in_executor(None, app.engine_state)
            before_surv = (state["aborted"].get(survivor["replica"], 0) + state["errored"].get(survivor["replica"], 0))
            n_before = len(records)
            t_kill = time.monotonic()
            os.kill(victim["pid"], signal.SIGKILL)
            kill_times.append(t_kill)
            print(f"kill {k + 1}: replica {victim['replica']} pid {victim['pid']} "
                  f"(running {state['running'].get(victim['replica'])})", flush=True)
            running_s = serving_s = None
            new_id = None
            while time.monotonic() - t_kill < 120:
                await asyncio.sleep(0.5)
                now = time.monotonic() - t_kill
                if running_s is None:
                    reps_now = await loop.run_in_executor(None, app.replicas)
                    ids = {r["replica"] for r in reps_now}
                    n_running = await loop.run_in_executor(None, app.running_llm_replicas)
                    if len(ids - {victim["replica"]}) == 2 and n_running == 2:
                        running_s = round(now, 1)
                        new_id = next(iter(ids - {victim["replica"], survivor["replica"]}))
                if new_id is not None:
                    s = await loop.run_in_executor(None, app.metrics)
                    routed = app.by_replica(s, "hybrid_serve_router_decisions_total").get(new_id, 0)
                    if routed > 0:
                        serving_s = round(time.monotonic() - t_kill, 1)
                        break
            await asyncio.sleep(args.settle)
            state2 = await loop.run_in_executor(None, app.engine_state)
            after_surv = (state2["aborted"].get(survivor["replica"], 0) + state2["errored"].get(survivor["replica"], 0))
            window = [r for r in records[n_before:] if r["at_kill"] == t_kill]
            kills.append({
                "killed_replica": victim["replica"], "killed_pid": victim["pid"],
                "killed_replica_running_metric": int(state["running"].get(victim["replica"], 0)),
                "in_flight_at_kill": len(window),
                "failed_requests": sum(r["class"] != "ok" for r in window),
                "outcomes": dict(Counter(r["class"] for r in window)),
                "survivor_failed_or_aborted": int(after_surv - before_surv),
                "serve_running_s": running_s, "new_replica_serving_s": serving_s, "new_replica": new_id,
            })
            print(f"  -> {kills[-1]}", flush=True)
        stop.set()
        await asyncio.gather(*tasks)
    return {"records": records, "kills": kills, "health": health}
