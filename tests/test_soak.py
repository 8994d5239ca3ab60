"""The soak, ``specserve bench soak`` (``specserve.bench.soak``): its judging of responses (fast, no
model), and one short soak of the real server (slow: about 75 s, the model load included).  A soak
of a tiny model, in process, is in ``test_bench.py``.

The soak run is ``specserve bench soak --minutes 1 --concurrency 4`` (4 KV rows, 64 waiting places,
warm-up 20 s: a third of the run; 20 requests per type in the object census).  Its thresholds, which the command itself
enforces (exit status 1) and this test checks again in the JSON report:

- 0 responses with a 5xx status;
- 0 4xx responses whose body is not ``{"error": {"message": ...}}`` (a 429 counts as an answer to a
  valid request; any other 4xx to a valid request, or a 2xx to a malformed one, is a problem);
- 0 transport errors (the deliberate disconnects are not errors), 0 streams without ``[DONE]`` or
  with an error event;
- requests of every type done: greedy, sampled, stream, disconnect, malformed;
- the engine empty at the end: nothing running or waiting, all 4 KV rows free, no unclaimed result,
  no per-sequence state left in the controller or any drafter;
- RSS growth from the end of the warm-up to the end at most 100 MiB (``--max-growth-mb``).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from specserve.bench.soak_requests import judge, malformed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("response,expect_ok,problem", [
    (httpx.Response(500, json={"error": {"message": "internal error"}}), True, "5xx"),
    (httpx.Response(503, text="busy"), False, "5xx"),
    (httpx.Response(400, text="Bad Request"), False, "non_json_4xx"),
    (httpx.Response(422, json={"detail": [{"msg": "field required"}]}), False, "non_json_4xx"),
    (httpx.Response(400, json={"error": {"message": "max_tokens: bad"}}), False, None),
    (httpx.Response(400, json={"error": {"message": "max_tokens: bad"}}), True, "valid_request_refused"),
    (httpx.Response(429, json={"error": {"message": "busy"}}), True, None),
    (httpx.Response(200, json={"choices": [{"text": "x"}]}), False, "malformed_accepted"),
    (httpx.Response(200, json={"choices": [{"text": "x"}]}), True, None),
    (httpx.Response(200, text="not json"), True, "bad_200_body"),
])
def test_judge(response, expect_ok, problem):
    assert judge(response, expect_ok) == problem


def test_malformed_bodies_cover_every_case_and_are_bad():
    rng = random.Random(0)
    seen = set()
    for _ in range(600):
        what, method, path, raw = malformed(rng, "ngram", "ngram", ["oracle"])
        seen.add(what)
        assert method == "POST" and path.startswith("/v1/")
        if what in ("invalid JSON", "empty body"):
            with pytest.raises(ValueError):
                json.loads(raw)
    assert len(seen) == 16 and "drafter not loaded" in seen


@pytest.mark.slow
def test_one_minute_soak_of_the_server(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "specserve.cli", "bench", "soak", "--minutes", "1", "--concurrency",
                           "4", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    totals, engine = report["totals"], report["engine_end"]
    assert report["ok"] and report["failures"] == []
    assert totals["5xx"] == 0 and totals["4xx_not_json"] == 0 and totals["transport_errors"] == 0
    assert totals["problems"] == {}
    assert totals["4xx"] >= totals["by_type"]["malformed"] > 0          # every malformed request got a 4xx
    assert all(totals["by_type"].get(kind, 0) > 0 for kind in ("greedy", "sampled", "stream", "disconnect"))
    assert engine["empty"] and engine["running"] == 0 and engine["free_kv_rows"] == engine["max_batch"] == 4
    assert engine["per_sequence_left"] == {} and engine["unclaimed_results"] == 0
    assert report["rss_mib"]["growth"] <= 100
    assert set(report["objects_per_type"]) == {"greedy", "sampled", "stream", "disconnect", "malformed"}
    assert report["samples"] and report["pools"]["end"]["prefix_blocks"] > 0       # the shared system prompt was cached
    assert report["pools"]["end"]["suffix_corpus_tokens"] > report["pools"]["start"]["suffix_corpus_tokens"]
