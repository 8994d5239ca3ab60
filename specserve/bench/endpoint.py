"""Benchmark any OpenAI-compatible server (ours, vLLM, SGLang, llama.cpp's) over streaming requests.

Metrics follow ``vllm bench serve``: TTFT is the time from sending a request to its first streamed
token; ITL the gaps between successive streamed chunks; TPOT (end-to-end - TTFT) / (output tokens -
1); E2E the time to the last byte.  Output tokens come from the server's ``usage``
(``stream_options.include_usage``), falling back to the number of content chunks.
"""

from __future__ import annotations

import asyncio
import json
import time

from specserve.bench.datasets import turns
from specserve.bench.metrics import percentile


async def _one(client, url: str, model: str, prompt: str | list[dict], max_tokens: int, extra: dict) -> dict:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}} | extra
    t0 = time.perf_counter()
    times, text, usage, error = [], [], None, None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return {"ok": False, "status": r.status_code, "error": (await r.aread()).decode()[:200]}
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                if doc.get("usage"):
                    usage = doc["usage"]
                for ch in doc.get("choices", []):
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        times.append(time.perf_counter() - t0)
                        text.append(piece)
    except Exception as e:  # noqa: BLE001 - counted as a failed request
        error = f"{type(e).__name__}: {e}"
    e2e = time.perf_counter() - t0
    if error or not times:
        return {"ok": False, "status": None, "error": error or "no tokens"}
    n_out = usage["completion_tokens"] if usage else len(times)
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ok": True, "ttft_s": times[0], "e2e_s": e2e, "output_tokens": n_out, "cached_tokens": cached,
            "tpot_s": (e2e - times[0]) / (n_out - 1) if n_out > 1 else float("nan"),
            "itl_s": [b - a for a, b in zip(times, times[1:])], "text": "".join(text)}


async def _run(url: str, model: str, prompts: list, max_tokens: int, concurrency: int,
               extra: dict, per_prompt: list[dict] | None = None) -> tuple[list[dict], float]:
    """Closed loop: ``concurrency`` requests in flight until every prompt is done (prompt i's body
    also carries ``per_prompt[i]``, e.g. its ``response_format``).  Returns the per-request results
    (in prompt order) and the wall seconds."""
    import httpx

    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        async def run(p, own):
            async with sem:
                return await _one(client, url, model, p, max_tokens, extra | own)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(run(p, own) for p, own in zip(prompts, per_prompt or [{}] * len(prompts))))
        return list(results), time.perf_counter() - t0


def _summary(concurrency: int, results: list[dict], wall: float) -> dict:
    ok = [r for r in results if r["ok"]]

    def dist(xs):
        xs = [x for x in xs if x == x]
        return {"mean": sum(xs) / len(xs) if xs else float("nan"), "p50": percentile(xs, 50),
                "p90": percentile(xs, 90), "p99": percentile(xs, 99)}

    return {"concurrency": concurrency, "requests": len(results), "completed": len(ok),
            "failed": [r for r in results if not r["ok"]][:5], "wall_s": wall,
            "request_throughput": len(ok) / wall, "output_tok_s": sum(r["output_tokens"] for r in ok) / wall,
            "ttft_s": dist([r["ttft_s"] for r in ok]), "tpot_s": dist([r["tpot_s"] for r in ok]),
            "itl_s": dist([x for r in ok for x in r["itl_s"]]), "e2e_s": dist([r["e2e_s"] for r in ok]),
            "cached_prompt_tokens": sum(r.get("cached_tokens") or 0 for r in ok),
            "texts": [r.get("text") for r in results]}


def bench_endpoint(url: str, model: str, prompts: list, max_tokens: int, levels: list[int],
                   variants: list[tuple[str, dict]], per_prompt: list[dict] | None = None) -> list[dict]:
    """Every variant (label, request extension) closed loop at every concurrency level, after one
    warm-up request each.  At each level the prompts are cut into chunks of at least 2 x level and
    the variants take turns chunk by chunk (in a rotated order), so that a slow spell of a shared
    machine falls on every variant alike (a level whose prompts fit in one chunk runs the variants
    one after another).  A prompt is a user message, or a list of chat messages; ``per_prompt``: what
    each prompt's body carries besides (its ``response_format``).  Returns one row per variant and
    level, variant by variant."""
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    for _, extra in variants:
        asyncio.run(_run(url, model, prompts[:1], 8, 1, extra, (per_prompt or [{}])[:1]))
    rows: dict[tuple[int, int], dict] = {}
    for c in levels:
        got: list[tuple[list[dict], float]] = [([], 0.0) for _ in variants]
        for part, order in turns(len(prompts), c, len(variants), repeat=False):
            for v in order:
                results, wall = asyncio.run(_run(url, model, prompts[part], max_tokens, c, variants[v][1],
                                                 per_prompt[part] if per_prompt else None))
                got[v] = (got[v][0] + results, got[v][1] + wall)
        for v, (label, _) in enumerate(variants):
            rows[(v, c)] = _summary(c, *got[v]) | {"label": label or url, "endpoint": url}
    return [rows[key] for key in sorted(rows)]
