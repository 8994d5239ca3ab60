#!/usr/bin/env bash
# Chunked prefill and prefix reuse through the server, against the server before them.
#   bash experiments/prefill_bench.sh OUT_DIR [BASELINE_SOURCE_DIR]
# BASELINE_SOURCE_DIR: a checkout of the version to compare with (its `specserve` package is run
# with this checkout's virtual environment); skipped when not given.
# 1. Spec-Bench, 64 tokens, plain and n-gram auto: 12 prompts (2 per group) at concurrency 1 and 12
#    (a burst: all 12 arrive at once), and 36 prompts (6 per group) at concurrency 12 (a closed
#    loop: a new request arrives whenever one ends): the baseline server, then this server with its
#    prefix cache off (chunked prefill alone) and on (the default).
# 2. A shared 1,050-token system prompt, 12 prompts, concurrency 1: this server with the prefix
#    cache (the warm-up request computes the shared prompt; the measured ones reuse it) and without.
# 3. Greedy identity: each run's texts at concurrency 1 against concurrency 12, and cached against cold.
# Run it with nothing else busy on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:?usage: experiments/prefill_bench.sh OUT_DIR [BASELINE_SOURCE_DIR]}")
venv=$PWD/.venv
base=${2:-}
port=8131
mkdir -p "$out"
spec=(--groups all --per-group 2 --max-tokens 64)
loop=(--groups all --per-group 6 --max-tokens 64 --concurrency 12)
system=specserve/data/bench/agent_system_prompt.txt

serve() {   # serve NAME PYTHONPATH ARGS...: start a server, wait until it answers
  local name=$1 path=$2; shift 2
  # run from the source folder: `python -m` puts the working directory first on the module path
  (cd "$path" && PYTHONPATH=$path exec "$venv/bin/python" -m specserve.cli serve --port "$port" --drafter ngram \
    --max-batch 16 "$@") >"$out/$name-server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "server $name did not start" >&2; exit 1
}
stop() {
  grep -E 'VmHWM' "/proc/$server/status" >"$out/$1-memory.txt" || true
  kill "$server"; wait "$server" 2>/dev/null || true
  sleep 2
}
bench() {   # bench NAME ARGS...
  local name=$1; shift
  .venv/bin/specserve bench --endpoint "http://127.0.0.1:$port/v1" --out "$out/$name" "$@" >/dev/null
}

git log --oneline -1 >"$out/version.txt"
if [ -n "$base" ]; then
  git -C "$base" log --oneline -1 >"$out/baseline-version.txt"
  serve baseline "$(realpath "$base")"
  bench baseline-specbench --methods none,ngram "${spec[@]}" --concurrency 1,12
  bench baseline-loop --methods none,ngram "${loop[@]}"
  stop baseline
fi
serve chunked-nocache "$PWD" --no-prefix-cache
bench chunked-specbench --methods none,ngram "${spec[@]}" --concurrency 1,12
bench chunked-loop --methods none,ngram "${loop[@]}"
bench cold-system --methods none "${spec[@]}" --concurrency 1 --system-prompt "$system"
stop chunked-nocache
serve chunked-cache "$PWD"
bench cached-system --methods none "${spec[@]}" --concurrency 1 --system-prompt "$system"
bench cached-specbench --methods none,ngram "${spec[@]}" --concurrency 1,12
bench cached-loop --methods none,ngram "${loop[@]}"
stop chunked-cache

.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path
from specserve.bench.datasets import sample
out = Path(sys.argv[1])
def rows(name):
    p = out / name / "results.json"
    return json.loads(p.read_text())["endpoint"] if p.exists() else []
few = [p.text for p in sample(2, None, None)[0]]
many = [p.text for p in sample(6, None, None)[0]]
lines = []
for name in ("baseline", "chunked", "cached"):
    by = {(r["label"], r["concurrency"]): dict(zip(few, r["texts"])) for r in rows(f"{name}-specbench")}
    by |= {(r["label"], "loop"): dict(zip(many, r["texts"])) for r in rows(f"{name}-loop")}
    for label in ("none", "ngram"):
        alone = by.get((label, 1))
        for other in (12, "loop"):
            if alone and (label, other) in by:
                pairs = [(t, by[(label, other)][p]) for p, t in alone.items() if p in by[(label, other)]]
                same = sum(a == b for a, b in pairs)
                lines.append(f"{name} {label}: concurrency 1 vs {other if other == 12 else '12 (closed loop of 36)'}: "
                             f"{same}/{len(pairs)} identical")
cold, warm = rows("cold-system"), rows("cached-system")
if cold and warm:
    same = sum(a == b for a, b in zip(cold[0]["texts"], warm[0]["texts"]))
    lines.append(f"system prompt: cached vs cold: {same}/{len(cold[0]['texts'])} identical; TTFT p50 "
                 f"{warm[0]['ttft_s']['p50'] * 1e3:.0f} ms vs {cold[0]['ttft_s']['p50'] * 1e3:.0f} ms "
                 f"({warm[0]['ttft_s']['p50'] / cold[0]['ttft_s']['p50']:.0%}); cached prompt tokens "
                 f"{warm[0]['cached_prompt_tokens']} vs {cold[0]['cached_prompt_tokens']}")
(out / "identity.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
