#!/usr/bin/env bash
# router_bench.py serve on the device machine's CPU cores, GPU unused (issue 14): each replica a
# core of its own, so a request's TTFT is its replica's work, not the machine's. Ray comes from
# the bundle (../shared/tools/device-ray-bundle; carry .devcache, and .whl for Ray's router).
# Each "NAME ARGS..." runs `router_bench serve ARGS` after the ones before it and writes
# $OUT/NAME.json (each stopped after RUN_TIMEOUT seconds, 540: its per-run lines still print).
# Usage (device machine, repo root):
#   bash benchmarks/device_router_cpu16.sh "u16t8 --users 16 --turns 8 --think-s 3 6 --routers prefix round_robin" ...
# The issue's 32 users x 5 turns, Ray's router beside the others (its run is long, ~350 s: every
# request on one replica), two Ray clusters; 8 conversations a replica need --cache-mib 128 (48 MiB
# leaves 14 state slots for 8 running rows: the replicas evict the histories, session 32; the bench
# now refuses such a cache before Ray starts, unless --allow-short-cache):
#   W="--users 32 --turns 5 --user-tokens 256 --reply-tokens 128 --generate-replies --think-s 2 4 --seeds 0 \
#      --deploy-first --cache-mib 128"
#   PARALLEL=1 MERGE=u32t5_all RUN_TIMEOUT=545 bash benchmarks/device_router_cpu16.sh \
#     "u32t5_a $W --routers prefix round_robin serve_default single_replica" "u32t5_b $W --routers ray_prefix_affinity"
# Ray's router needs ~300 s after its ~55-s deploy (session 33: cut at RUN_TIMEOUT=345); give its part
# RUN_TIMEOUT >= 420, and the call 600 s.
# Users who read the reply before typing (--think-s 8 16, session 34): a later turn's TTFT is then its own
# prefill (the issue's "prefill dominates" setting). The five routers fit one call as above (session 35: seeds
# 0-2, 480-528 s a call; W with --think-s 8 16, PARALLEL=1, RUN_TIMEOUT=548, Ray's router in the second spec).
# All five routers in one 600-s call (--deploy-first starts their apps at once, ~55 s, not ~55 s each):
#   RUN_TIMEOUT=545 bash benchmarks/device_router_cpu16.sh "u8t6_gen128_all --users 8 --turns 6 --user-tokens 256 \
#     --reply-tokens 128 --generate-replies --think-s 3 6 --seeds 0 --deploy-first \
#     --routers prefix round_robin serve_default ray_prefix_affinity single_replica"
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=""
[ -d /tmp/raysite ] || tar -xJf .devcache/raysite.tar.xz -C /tmp || { echo "no Ray bundle (.devcache)"; exit 1; }
# Ray's PrefixCacheAffinityRouter (the ray_prefix_affinity baseline) lives in ray/llm, which the
# bundle drops, and needs orjson, which the GPU machine lacks. Here, once:
#   (cd "$(python3 -c 'import ray, os; print(os.path.dirname(ray.__file__))')" && mkdir -p "$OLDPWD/.devcache/rayllm" \
#     && tar --exclude=__pycache__ -cJf "$OLDPWD/.devcache/rayllm/llm.tar.xz" llm)   # the bundle's Ray version
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .whl orjson                               # and carry .whl
[ -f .devcache/rayllm/llm.tar.xz ] && tar -xJf .devcache/rayllm/llm.tar.xz -C /tmp/raysite/ray
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=/tmp/raysite:${PYTHONPATH:-}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
echo "cores: $(nproc)"
# The 30M model of the demo's layout (fp32 dummy weights, one thread a replica), 4 replicas, the
# 1,024-token system prompt; each run adds its own workload and routers.
# MODEL / MAX_MODEL_LEN: another benchmarks/model_configs.py name, a longer context.
COMMON=(--model "${MODEL:-qwen3_5_30m_cpu}" --dtype float32 --max-model-len "${MAX_MODEL_LEN:-4096}"
        --ray-cpus "$(nproc)" --system-tokens 1024)
run_spec() {  # "NAME ARGS...": router_bench serve ARGS -> $OUT/NAME.json, its log $OUT/NAME.log
  local name rest
  read -r name rest <<< "$1"
  echo "[$(date +%T)] $name: $rest"
  # shellcheck disable=SC2086 # (the spec's arguments split on purpose)
  timeout -s INT "${RUN_TIMEOUT:-540}" python3 -m hybrid_serve.benchmarks.router_bench serve "${COMMON[@]}" $rest --out-name "$(realpath "$OUT")/$name.json" \
    > "$OUT/$name.log" 2>&1; echo "[$(date +%T)] $name: exit $?"
}
# PARALLEL=1: every spec at once, each in its own local Ray cluster (for a router whose run is long,
# e.g. Ray's, which puts every request on one replica: measured beside the others, not after
# them); MERGE=NAME then writes the specs' one result to $OUT/NAME.json (router_bench merge).
names=()
for spec in "$@"; do
  read -r name _ <<< "$spec"; names+=("$name")
  if [ -n "${PARALLEL:-}" ]; then run_spec "$spec" & sleep 5; else run_spec "$spec"; fi
done
wait
for name in "${names[@]}"; do
  grep -aE "^(prefix|round_robin|serve_default|ray_prefix_affinity|single_replica)" "$OUT/$name.log" | cut -c1-260
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: v for k, v in d.items() if k.startswith('router_')})" \
    "$OUT/$name.json" 2>/dev/null
done
if [ -n "${MERGE:-}" ]; then
  parts=(); for name in "${names[@]}"; do parts+=("$(realpath "$OUT")/$name.json"); done
  python3 -m hybrid_serve.benchmarks.router_bench merge --parts "${parts[@]}" \
    --out-name "$(realpath "$OUT")/$MERGE.json" && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print('merged:', {k: v for k, v in d.items() if k.startswith('router_')})" "$OUT/$MERGE.json"
fi
