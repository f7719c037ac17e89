"""`router_bench serve --trace`: our router's decisions written down, and where a run's hit
tokens went (what `router_hit_tokens_vs_single_replica` misses, turn by turn).

    TracedHybridRequestRouter  HybridRequestRouter appending one JSON line per decision
                               ("place": each replica's predicted reusable tokens and load,
                               the choice and its reason) and per routed request ("routed":
                               the replica Serve sent it to)
    hit_accounting(results)    any router's run: hit tokens lost against each turn's best case
    affinity(...)              ours, traced: did each later turn go where its previous turn
                               went, and if not, why (the decision's reason and scores)

A turn's best case: its conversation's previous prompt up to the last page boundary before
that prompt's last token (the prompt-end checkpoint the engine keeps; the reply that followed
is the bench's stand-in, not the model's output, so nothing past it is reusable), and the
system prompt for a first turn. With generated replies (`reply_tokens`: the model's own reply
is sent back), the previous prompt and the reply up to the last page boundary its generation
fed (the engine's reply checkpoint).
"""
from __future__ import annotations

import json
import time
from collections import Counter

from ..deploy.request_router import HybridRequestRouter

KEY_AT = 1024  # the workload's default system prompt length: the user's first message starts here


def conversation_key(ids, key_at: int = KEY_AT) -> int:
    """The same for every turn of one conversation (its first user message's first tokens;
    key_at: the system prompt's length)."""
    return hash(tuple(ids[key_at:key_at + 16]))


class TracedHybridRequestRouter(HybridRequestRouter):
    """Ours, writing each decision to `trace_path` (JSON lines). Bench only: a file write per
    decision."""

    def initialize_state(self, trace_path: str = "", key_at: int = KEY_AT, **kwargs) -> None:
        super().initialize_state(**kwargs)
        self.key_at = key_at
        self.trace = open(trace_path, "a", buffering=1)  # noqa: SIM115 - open for the router's life

    def place(self, request, replicas):
        placement = super().place(request, replicas)
        with self.lock:
            saved = self.index.match(request.prompt_token_ids)
        ids = request.prompt_token_ids
        self.trace.write(json.dumps({
            "kind": "place", "t": time.time(), "key": conversation_key(ids, self.key_at), "len": len(ids),
            "reason": placement.reason, "chosen": placement.replica_id, "predicted": placement.predicted_hit_tokens,
            "replicas": {r.replica_id: {"saved": saved.get(r.replica_id, 0), "running": r.num_running,
                                        "waiting": r.num_waiting, "waiting_tokens": r.num_waiting_tokens,
                                        "running_prefill_tokens": r.num_running_prefill_tokens,
                                        "free_slots": r.num_free_state_slots,
                                        "checkpoint_slots": r.num_checkpoint_state_slots} for r in replicas}}) + "\n")
        return placement

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        super().on_request_routed(pending_request, replica_id, result)
        request = self._routing_request(pending_request)
        if request is not None:
            ids = request.prompt_token_ids
            self.trace.write(json.dumps({"kind": "routed", "t": time.time(), "key": conversation_key(ids, self.key_at),
                                         "len": len(ids), "replica": replica_id.unique_id}) + "\n")


def best_case_tokens(prompts: list[list[int]], turn: int, page_size: int = 16, system_tokens: int = KEY_AT,
                     reply_tokens: int = 0) -> int:
    if turn == 0:
        return system_tokens // page_size * page_size
    return (len(prompts[turn - 1]) + reply_tokens - 1) // page_size * page_size


def hit_accounting(results: list[dict], conversations, system_tokens: int = KEY_AT, reply_tokens: int = 0) -> dict:
    """Hit tokens against the best case, first turns and later turns apart (`reply_tokens`:
    generated replies of that length, sent back)."""
    out = {}
    for label, turns in (("first_turns", lambda t: t == 0), ("later_turns", lambda t: t > 0)):
        rows = [r for r in results if r["status"] == 200 and turns(r["turn"])]
        bests = [best_case_tokens(conversations[r["user"]], r["turn"], system_tokens=system_tokens,
                                  reply_tokens=reply_tokens) for r in rows]
        hit = sum(r["cached_tokens"] for r in rows)
        out[label] = {"requests": len(rows), "best_case_tokens": sum(bests), "hit_tokens": hit,
                      "lost_tokens": sum(bests) - hit,
                      "requests_below_best": sum(r["cached_tokens"] < b for r, b in zip(rows, bests))}
    return out


def affinity(trace_path: str, results: list[dict], conversations, system_tokens: int = KEY_AT,
             reply_tokens: int = 0) -> dict:
    """For each later turn of the traced run: stayed on its previous turn's replica, or moved
    (by the decision's reason, and whether the previous replica was predicted to hold more);
    hit tokens lost against the best case in each group; for moved turns, what the load
    reports said of the previous replica against the chosen one (no free state slot there
    and one here, more waiting tokens, more running: which cost term moved them); the
    workload's requests per replica."""
    users = {conversation_key(c[0], system_tokens): u for u, c in enumerate(conversations)}
    turn_of = [{len(p): t for t, p in enumerate(c)} for c in conversations]
    decisions, routed = {}, {}
    with open(trace_path) as f:
        for line in f:
            e = json.loads(line)
            u = users.get(e["key"])
            if u is None or e["len"] not in turn_of[u]:  # warm-up traffic
                continue
            t = turn_of[u][e["len"]]
            if e["kind"] == "place":
                decisions[(u, t)] = e  # the last decision before it was routed
            else:
                routed[(u, t)] = e["replica"]
    hits = {(r["user"], r["turn"]): r["cached_tokens"] for r in results if r["status"] == 200}
    groups: dict[str, Counter] = {}
    reasons = Counter(e["reason"] for e in decisions.values())
    for (u, t), replica in routed.items():
        if t == 0 or (u, t - 1) not in routed or (u, t) not in hits:
            continue
        prev = routed[(u, t - 1)]
        d = decisions.get((u, t))
        if replica == prev:
            group = "stayed"
        else:
            scores = (d or {}).get("replicas", {})
            prev_saved, chosen_saved = scores.get(prev, {}).get("saved", 0), scores.get(replica, {}).get("saved", 0)
            group = (f"moved:{(d or {}).get('reason', '?')}:"
                     f"{'previous predicted more' if prev_saved > chosen_saved else 'previous not predicted more'}"
                     f"{'' if d is None or d['chosen'] == replica else ':Serve sent it past the choice'}")
        c = groups.setdefault(group, Counter())
        best = best_case_tokens(conversations[u], t, system_tokens=system_tokens, reply_tokens=reply_tokens)
        c["requests"] += 1
        c["lost_tokens"] += best - hits[(u, t)]
        if replica != prev and d is not None:  # what the load reports said of the two replicas
            was, now = d["replicas"].get(prev, {}), d["replicas"].get(replica, {})
            c["previous_no_free_slot_chosen_had_one"] += was.get("free_slots", 1) == 0 and now.get("free_slots", 0) > 0
            c["previous_more_waiting_tokens"] += was.get("waiting_tokens", 0) > now.get("waiting_tokens", 0)
            c["waiting_tokens_previous_minus_chosen"] += was.get("waiting_tokens", 0) - now.get("waiting_tokens", 0)
            c["previous_more_running"] += was.get("running", 0) > now.get("running", 0)
    per_replica = Counter(routed.values())
    return {"decision_reasons": dict(reasons), "requests_per_replica": sorted(per_replica.values()),
            "later_turns": {g: dict(c) for g, c in sorted(groups.items())}}
