"""Where a request's time goes between the serving path's processes: joins the hop log's files
(`HYBRID_SERVE_HOP_LOG=PREFIX` on the server, deploy/hop_log.py; `serve_bench.py --hop-log
PREFIX` on the client) and prints, over the requests the client marked, each hop's latency
(ms: p50, p90, max) at a request's start and end, and when the burst reached each hop (ms
after the first send: the first, the median and the last request's arrival).

    python benchmarks/hop_report.py PREFIX [--json OUT.json]

Segments (a request's own marks):
    client send -> ingress in          HTTP, Serve's proxy, its routing to an ingress replica, the
                                       body's way back from the proxy, parsing and checks
    ingress in -> replica in           the ingress's call: routing to an engine replica, Serve's hand-off
    replica in -> replica first        the replica's queue and the prompt's prefill
    replica first -> ingress first     the first tokens' way back to the ingress
    ingress first -> client first      ... and on through the proxy to the client
    replica last -> ingress last, ingress last -> client last: the same for the final tokens
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from collections import defaultdict

from hybrid_serve.deploy.hop_log import read

SEGMENTS = [("client", "send", "ingress", "in"), ("ingress", "in", "replica", "in"),
            ("replica", "in", "replica", "first"), ("replica", "first", "ingress", "first"),
            ("ingress", "first", "client", "first"), ("replica", "last", "ingress", "last"),
            ("ingress", "last", "client", "last")]
ARRIVALS = [("client", "send"), ("ingress", "in"), ("replica", "in"), ("replica", "first"),
            ("replica", "last"), ("ingress", "last"), ("client", "last")]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(rows) -> dict:
    marks: dict[str, dict[tuple[str, str], float]] = defaultdict(dict)
    for t, hop, event, rid in rows:
        marks[rid].setdefault((hop, event), t)  # the first of a repeated mark (a retried request)
    requests = {rid: m for rid, m in marks.items() if ("client", "send") in m}
    if not requests:
        raise SystemExit("no request carries the client's marks (serve_bench.py --hop-log)")
    t0 = min(m[("client", "send")] for m in requests.values())
    out = {"requests": len(requests), "segments_ms": {}, "arrivals_ms": {}}
    for a_hop, a_ev, b_hop, b_ev in SEGMENTS:
        xs = [(m[(b_hop, b_ev)] - m[(a_hop, a_ev)]) * 1e3 for m in requests.values()
              if (a_hop, a_ev) in m and (b_hop, b_ev) in m]
        if xs:
            out["segments_ms"][f"{a_hop} {a_ev} -> {b_hop} {b_ev}"] = {
                "n": len(xs), "p50": _pct(xs, 0.5), "p90": _pct(xs, 0.9), "max": max(xs)}
    for hop, ev in ARRIVALS:
        ts = sorted((m[(hop, ev)] - t0) * 1e3 for m in requests.values() if (hop, ev) in m)
        if ts:
            out["arrivals_ms"][f"{hop} {ev}"] = {"n": len(ts), "first": ts[0], "median": ts[len(ts) // 2],
                                                 "last": ts[-1]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefix")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    paths = sorted(glob.glob(f"{glob.escape(args.prefix)}.*"))
    if not paths:
        raise SystemExit(f"no files {args.prefix}.*")
    out = report(read(paths))
    print(f"{out['requests']} requests")
    print(f"{'segment':40s} {'n':>5s} {'p50':>8s} {'p90':>8s} {'max':>8s}  (ms)")
    for name, s in out["segments_ms"].items():
        print(f"{name:40s} {s['n']:5d} {s['p50']:8.1f} {s['p90']:8.1f} {s['max']:8.1f}")
    print(f"{'reached (ms after the first send)':40s} {'n':>5s} {'first':>8s} {'median':>8s} {'last':>8s}")
    for name, s in out["arrivals_ms"].items():
        print(f"{name:40s} {s['n']:5d} {s['first']:8.1f} {s['median']:8.1f} {s['last']:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
