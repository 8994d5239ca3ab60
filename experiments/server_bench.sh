#!/usr/bin/env bash
# The server under load, against the same prompts in process.
#   bash experiments/server_bench.sh OUT_DIR [PORT]
# 1. starts `specserve serve` (n-gram drafter preloaded, draft size auto) and waits until it answers;
# 2. `specserve bench --endpoint` at concurrency 1, 4 and 16: plain, n-gram auto, n-gram k=4;
# 3. records the server's resident memory, stops it;
# 4. the same 18 prompts in process at concurrency 1 (plain and n-gram auto), for time per output token.
# Run it with nothing else busy on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: experiments/server_bench.sh OUT_DIR [PORT]}
port=${2:-8123}
mkdir -p "$out"
common=(--groups all --per-group 3 --max-tokens 64)

.venv/bin/specserve serve --port "$port" --drafter ngram --max-batch 16 --max-waiting 64 >"$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null

.venv/bin/specserve bench --endpoint "http://127.0.0.1:$port/v1" --methods none,ngram,ngram:k=4 "${common[@]}" \
  --concurrency-prompts 18 --concurrency 1,4,16 --out "$out/endpoint"
grep -E 'VmRSS|VmHWM' "/proc/$server/status" >"$out/server-memory.txt"
kill "$server"; wait "$server" 2>/dev/null || true
trap - EXIT

.venv/bin/specserve bench --methods none,ngram "${common[@]}" --concurrency 1 --cost-tokens '' --no-plots \
  --out "$out/in-process"
