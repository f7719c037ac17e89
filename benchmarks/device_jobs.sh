#!/usr/bin/env bash
# Several device scripts in one call, each on GPUs of its own and at the same time (a machine of
# two or more GPUs: one call instead of one per script), then every output packed into one file.
# Each job is "name|gpus|command": the command runs with CUDA_VISIBLE_DEVICES=gpus and OUT=$OUT/name,
# its console in $OUT/name/console.log; the project is installed and the Ray bundle unpacked once,
# before the jobs (SKIP_INSTALL=1 for them). Jobs that share a GPU, or that both start Ray, must
# not run in the same invocation: chain invocations instead (`bash device_jobs.sh A && bash ... B`).
# Each job is stopped (SIGINT) after JOB_TIMEOUT seconds (560). At the end: each job's console tail, then $OUT/<PACK>.tgz (PACK: "jobs") holds every job's folder.
# Usage (device machine, repo root): bash benchmarks/device_jobs.sh "http|0|bash benchmarks/..." "pw|1|..."
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 SKIP_INSTALL=1
if [ -z "${JOBS_READY:-}" ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  [ -d /tmp/raysite ] || { [ -f .devcache/raysite.tar.xz ] && tar -xJf .devcache/raysite.tar.xz -C /tmp; }
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
  export JOBS_READY=1
fi
[ -d /tmp/raysite ] && export PYTHONPATH=/tmp/raysite:${PYTHONPATH:-}  # Ray for the jobs that import it
names=()
for spec in "$@"; do
  IFS='|' read -r name gpus cmd <<< "$spec"
  names+=("$name"); mkdir -p "$OUT/$name"
  echo "[$(date +%T)] start $name on GPU(s) $gpus"
  ( dir="$OUT/$name"; export CUDA_VISIBLE_DEVICES="$gpus" OUT="$OUT/$name"; start=$(date +%s)
    timeout -s INT "${JOB_TIMEOUT:-560}" bash -c "$cmd" > "$dir/console.log" 2>&1; rc=$?
    echo "[$(date +%T)] $name done: exit $rc, $(( $(date +%s) - start )) s" ) &
done
wait
for name in "${names[@]}"; do
  echo "=================== $name (console tail)"
  grep -avE "Loading|Warm-up|it/s\]|UserWarning|_warn_once" "$OUT/$name/console.log" | tail -${TAIL:-30}
done
tar czf "$OUT/${PACK:-jobs}.tgz" -C "$OUT" "${names[@]}" && rm -rf "${names[@]/#/$OUT/}"
ls -la "$OUT"
