"""The command line, in process through ``main()`` (what the console script calls): one-line errors
(before any model load, or on a tiny model where only the layer count matters), real --json runs on
the session's default model; one subprocess smoke test of the installed ``specserve`` command."""

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from conftest import tiny_model
from specserve.cli import main


def _one_line_error(argv: list[str], msg: str, capsys) -> None:
    """``main(argv)``: status 2 and one line on stderr, ``specserve: error: ...msg...``, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("specserve: error: ") and msg in lines[0], err
    assert "Traceback" not in err


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
    (["train", "eagle", "--out", "/tmp/x", "--head-layers", "0"], "--head-layers takes N >= 1, got 0"),
    (["train", "eagle", "--out", "/tmp/x", "--parallel", "1"], "--parallel takes K >= 2"),
    (["train", "eagle", "--out", "/tmp/x", "--also-data", "/no/such/data"], "--also-data /no/such/data: no training data"),
    (["bench", "--per-group", "0"], "--per-group and --max-tokens must be >= 1"),     # bench's own options
    (["bench", "nope"], "unrecognized arguments: nope"),
    (["bench", "soak", "--concurrency", "2"], "the following arguments are required: --minutes"),
    (["bench", "soak", "--minutes", "0", "--concurrency", "2"], "--minutes and --sample-s must be > 0"),
    (["bench", "soak", "--minutes", "1", "--concurrency", "0"], "--concurrency, --max-batch, --max-waiting"),
    (["bench", "soak", "--minutes", "1", "--concurrency", "2", "--gc-batch", "-1"], "--gc-batch and --warmup-s"),
    (["bench", "soak", "--minutes", "1", "--concurrency", "2", "--drafters", "ngram,bogus"], "unknown drafter 'bogus'"),
    (["bench", "soak", "--minutes", "1", "--concurrency", "2", "--out", "/no/such/dir/soak.json"], "--out: no folder"),
    (["bench", "interleaved"], "the following arguments are required: --methods"),
    (["bench", "interleaved", "--methods", "ngram:alpha=1"], "takes no option 'alpha'"),
    (["bench", "interleaved", "--methods", "ngram", "--rounds", "0"], "--concurrency, --rounds and --max-tokens"),
    (["bench", "interleaved", "--methods", "ngram", "--temperature", "-1"], "--temperature must be >= 0"),
    (["bench", "interleaved", "--methods", "ngram", "--num-prompts", "481"], "--num-prompts must lie in 1..480"),
    (["bench", "interleaved", "--methods", "ngram", "--prompts", "/no/such.jsonl"], "cannot read prompts"),
    (["bench", "steps", "--methods", " , "], "--methods names no method"),
    (["bench", "steps", "--groups", "qa,nope"], "unknown group 'nope'"),
    (["bench", "steps", "--per-group", "0"], "--per-group and --max-tokens must be >= 1"),
    (["bench", "steps", "--json", "/no/such/dir/steps.json"], "--json: no folder"),
    (["bench", "compare", "only-one.json"], "the following arguments are required: after"),
    (["bench", "compare", "/no/such.json", "/no/other.json"], "cannot read /no/such.json"),
])
def test_bad_input_one_line_error(args, msg, capsys):
    """None of these loads a model (the fast tier would refuse it): the flags are checked first."""
    _one_line_error(args, msg, capsys)


@pytest.mark.parametrize("args,msg", [
    (["train", "eagle", "--out", "/tmp/x", "--features", "bogus"], "--features takes last, fused or layer numbers"),
    (["train", "eagle", "--out", "/tmp/x", "--features", "99"], "--features layers must lie in 0..30"),
    (["train", "medusa", "--out", "/tmp/x", "--prompts", "/no/such.jsonl", "--data-dir", "/tmp/no-such-data"],
     "cannot read training prompts"),
])
def test_train_bad_input_one_line_error(args, msg, capsys, monkeypatch):
    """``train`` reads the model's layer count before it checks --features or reads the prompts: a
    tiny model of 30 layers (the default model's count) stands in for it, and a stand-in for its
    tokenizer, which is loaded before the prompts are read and not used by then."""
    import specserve.tokenizer
    from specserve.models import loader

    model = tiny_model(layers=30, kernels="torch")        # native: its first load runs the compiler (a subprocess)
    monkeypatch.setattr(loader, "load_model", lambda spec, options=None: model)
    monkeypatch.setattr(specserve.tokenizer, "load_tokenizer", lambda target: None)
    _one_line_error(args, msg, capsys)


def test_bench_keeps_its_options_beside_its_subcommands():
    """A first word that names a subcommand goes to it; ``specserve bench`` with options parses as before."""
    from specserve.bench.cli import COMMANDS
    from specserve.cli import build_parser

    args = build_parser().parse_args(["bench", "--methods", "none,ngram:k=4", "--concurrency", "1,4", "--no-plots"])
    assert (args.command, args.methods, args.concurrency, args.no_plots) == ("bench", "none,ngram:k=4", "1,4", True)
    assert set(COMMANDS) == {"soak", "interleaved", "steps", "compare", "agent"}


def test_the_console_script_is_main():
    """The installed ``specserve`` command calls ``main()``, whose status (2 above) it exits with."""
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "specserve"]
    assert script.value == "specserve.cli:main" and script.load() is main


@pytest.mark.smoke
def test_the_installed_command_end_to_end():
    """The one subprocess of the fast tier: the installed ``specserve`` command generates a few
    tokens on the default model in a fresh process (about 5 s) and exits 0 with one JSON object."""
    cmd = Path(sys.executable).with_name("specserve")
    r = subprocess.run([str(cmd), "generate", "--prompt", "Say hi.", "--max-tokens", "4", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "specserve: error" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert 1 <= len(doc["token_ids"]) <= 4 and doc["text"].strip() and doc["stats"]["generated_tokens"] == len(
        doc["token_ids"])


@pytest.fixture
def session_model(monkeypatch, default_target):
    """``main()`` runs on the session's default model instead of loading its own copy (the same file,
    the same options)."""
    import specserve.llm
    from specserve.models.loader import RuntimeOptions

    def load(spec, options=None):
        assert spec == "default" and (options or RuntimeOptions()).resolve() == default_target.options, options
        return default_target
    monkeypatch.setattr(specserve.llm, "load_model", load)
    return default_target


@pytest.mark.slow
def test_prompt_longer_than_context(capsys, session_model):
    _one_line_error(["generate", "--prompt", "word " * 600, "--max-len", "256"], "exceeds the context length",
                    capsys)


@pytest.mark.slow
def test_generate_json_tree_drafter(capsys, session_model):
    assert main(["generate", "--prompt", "Repeat: one two three, one two three, one two three.", "--max-tokens",
                 "24", "--drafter", "ngram-tree:max_depth=4", "--num-draft", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["drafter"] == "ngram-tree:max_depth=4" and doc["num_draft"] == 8
    s = doc["stats"]
    assert len(s["nodes_per_step"]) == s["verify_passes"] and max(s["nodes_per_step"]) <= 8
    assert len(s["drafted_per_depth"]) <= 4
    assert all(a <= d for a, d in zip(s["accepted_per_depth"], s["drafted_per_depth"]))
    assert all(0 <= r <= 1 for r in s["acceptance_by_depth"])


@pytest.mark.slow
def test_generate_json(capsys, session_model, default_tokenizer):
    """--json: the text is the decoded ids, the counts agree with each other and with --max-tokens, and
    the measured parts of the time lie inside the total (``other_s``, the rest, would hide an excess:
    it is clipped at 0)."""
    assert main(["generate", "--prompt", "Say hello.", "--max-tokens", "12", "--drafter", "ngram", "--num-draft",
                 "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    s, ids = doc["stats"], doc["token_ids"]
    assert doc["drafter"] == "ngram" and doc["num_draft"] == 3 and doc["finish_reason"] in ("stop", "length")
    assert 1 <= len(ids) <= 12 and (doc["finish_reason"] == "stop" or len(ids) == 12)
    tokenizer = default_tokenizer
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
    # one request alone: its measured parts are disjoint stretches of its own time, so they fit inside it
    # (a part charged twice, or a total that misses the prefill, breaks this)
    parts = {k: s[k] for k in ("draft_s", "size_s", "pass_s", "verify_s", "shape_s", "commit_s")}
    assert min(parts.values()) >= 0 and sum(parts.values()) <= s["total_s"] * (1 + 1e-9)
    assert s["other_s"] == pytest.approx(s["total_s"] - sum(parts.values()), abs=1e-9)
    assert 0 < parts["pass_s"] < s["total_s"] and parts["pass_s"] == max(parts.values())   # passes dominate
    assert parts["draft_s"] > 0 and parts["verify_s"] > 0 and parts["commit_s"] > 0        # each part is timed
    assert doc["runtime"]["batch_invariant"] is True
