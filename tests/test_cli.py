"""The command line: one-line errors without a model load, and a real --json run."""

import json
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "specserve.cli"]


@pytest.mark.parametrize("args,msg", [
    (["generate", "--prompt", ""], "empty prompt"),
    (["generate", "--prompt", "hi", "--model", "/no/such/model"], "does not exist"),
    (["generate", "--prompt", "hi", "--num-draft", "-2"], "--num-draft takes 'auto' or an integer >= 0"),
    (["generate", "--prompt", "hi", "--num-draft", "lots"], "--num-draft takes 'auto' or an integer >= 0"),
    (["generate", "--prompt", "hi", "--temperature", "-1"], "temperature must be >= 0"),
    (["generate", "--prompt", "hi", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["generate", "--prompt", "hi", "--top-p", "1.01"], "top_p must be in (0, 1]"),
    (["generate", "--prompt", "hi", "--drafter", "bogus"], "unknown drafter"),
    (["generate", "--prompt", "hi", "--drafter", "draft-model"], "needs option 'model'"),
    (["generate", "--prompt", "hi", "--drafter", "draft-model:model=/no/such.gguf"], "does not exist"),
    (["generate", "--prompt", "hi", "--drafter", "ngram:max_n=x"], "takes int"),
    (["generate", "--prompt", "hi", "--drafter", "ngram:alpha=1"], "takes no option 'alpha'"),
    (["generate", "--prompt", "hi", "--drafter", "ngram-tree:k=-1"], "takes 'auto' or an integer >= 0"),
    (["generate", "--prompt", "hi", "--max-tokens", "x"], "invalid int value"),
    (["generate"], "required"),
    (["generate", "--prompt", "hi", "--drafter", "eagle:head=/no/such/head"], "no head at"),
    (["generate", "--prompt", "hi", "--drafter", "eagle:topk=0"], "topk must be >= 1"),
    (["generate", "--prompt", "hi", "--drafter", "eagle:window=-1"], "window must be >= 0, got -1"),
    (["serve", "--api-key", ""], "--api-key must not be empty"),
    (["serve", "--api-key", "two words"], "must not contain whitespace"),
    (["serve", "--max-tokens-limit", "0"], "--max-tokens-limit must be >= 1, got 0"),
    (["serve", "--max-prompt-tokens", "-3"], "--max-prompt-tokens must be >= 1, got -3"),
    (["serve", "--max-body-mb", "0"], "--max-body-mb must be > 0"),
    (["serve", "--shutdown-timeout", "-1"], "--shutdown-timeout must be >= 0"),
    (["train", "eagle"], "required"),
    (["train", "eagle", "--out", "/tmp/x", "--features", "bogus"], "--features takes last, fused or layer numbers"),
    (["train", "eagle", "--out", "/tmp/x", "--features", "99"], "--features layers must lie in 0..30"),
    (["train", "medusa", "--out", "/tmp/x", "--prompts", "/no/such.jsonl", "--data-dir", "/tmp/no-such-data"],
     "cannot read training prompts"),
])
def test_bad_input_one_line_error(args, msg):
    r = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("[W")]
    assert len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr


@pytest.mark.slow
def test_prompt_longer_than_context():
    r = subprocess.run(CLI + ["generate", "--prompt", "word " * 600, "--max-len", "256"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "exceeds the context length" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_generate_json_tree_drafter():
    r = subprocess.run(CLI + ["generate", "--prompt", "Repeat: one two three, one two three, one two three.",
                              "--max-tokens", "24", "--drafter", "ngram-tree:max_depth=4", "--num-draft", "8",
                              "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["drafter"] == "ngram-tree:max_depth=4" and doc["num_draft"] == 8
    s = doc["stats"]
    assert len(s["nodes_per_step"]) == s["verify_passes"] and max(s["nodes_per_step"]) <= 8
    assert len(s["drafted_per_depth"]) <= 4
    assert all(a <= d for a, d in zip(s["accepted_per_depth"], s["drafted_per_depth"]))
    assert all(0 <= r <= 1 for r in s["acceptance_by_depth"])


@pytest.mark.slow
def test_generate_json():
    """--json: the text is the decoded ids, the counts agree with each other and with --max-tokens,
    and the timers add up to the total."""
    from specserve.models.loader import load_model
    from specserve.tokenizer import load_tokenizer

    r = subprocess.run(CLI + ["generate", "--prompt", "Say hello.", "--max-tokens", "12", "--drafter", "ngram",
                              "--num-draft", "3", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    s, ids = doc["stats"], doc["token_ids"]
    assert doc["drafter"] == "ngram" and doc["num_draft"] == 3 and doc["finish_reason"] in ("stop", "length")
    assert 1 <= len(ids) <= 12 and (doc["finish_reason"] == "stop" or len(ids) == 12)
    tokenizer = load_tokenizer(load_model("default"))
    assert doc["text"] == tokenizer.decode(ids) and doc["text"].strip()
    if doc["finish_reason"] == "stop":
        assert ids[-1] in tokenizer.eos_ids
    assert s["generated_tokens"] == len(ids) and s["prompt_tokens"] > 0
    assert s["verify_passes"] == len(s["nodes_per_step"]) and max(s["nodes_per_step"]) <= 3
    assert s["drafted_tokens"] == sum(s["nodes_per_step"]) and s["accepted_tokens"] == sum(s["accepted_per_depth"])
    # each verification pass commits its accepted tokens plus one; the prompt's last pass gives the first
    assert s["accepted_tokens"] + s["verify_passes"] + 1 >= len(ids)
    assert s["mean_accepted_length"] == pytest.approx((s["accepted_tokens"] + s["verify_passes"]) / s["verify_passes"])
    assert 0 < s["ttft_s"] <= s["total_s"] and s["tokens_per_second"] == pytest.approx(len(ids) / s["total_s"])
    timers = [s[k] for k in ("draft_s", "size_s", "pass_s", "verify_s", "shape_s", "commit_s", "other_s")]
    assert min(timers) >= 0 and s["pass_s"] > 0
    assert sum(timers) >= s["total_s"] * (1 - 1e-9)        # other_s is the rest (clipped at 0)
    assert doc["runtime"]["batch_invariant"] is True
