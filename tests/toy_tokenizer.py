"""A toy tokenizer for the tiny models: one token per character, a chat template, one end of text.

It is specserve's own ``Tokenizer`` around a real ``transformers`` fast tokenizer built in memory
(no files), so that what the server and ``LLM`` do with a tokenizer (encoding, the chat template,
decoding, the grammar compiler's vocabulary, the logprobs' token texts) runs the real code.  For a
vocabulary of ``vocab`` ids: the first ``vocab - 6`` characters of ``ALPHABET`` (64: space, lower
case letters, digits, punctuation; text is lower-cased when the alphabet has no capitals; past 103
ids, unused ``<xN>`` pieces), then ``<unk>`` (any other character), the chat markers
``<|system|>``, ``<|user|>``, ``<|assistant|>``, ``<|end|>``, and ``<eos>`` last (``vocab - 1``,
the one end-of-text id).
"""

from __future__ import annotations

import string

from specserve.tokenizer import Tokenizer

ALPHABET = (" " + string.ascii_lowercase + string.digits + ".,:;!?'\"-(){}[]/\n*#=+" + string.ascii_uppercase
            + "<>|_@$%&^~`\\\t")
MARKERS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
UNK, EOS = "<unk>", "<eos>"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def toy_pieces(vocab: int = 64) -> list[str]:
    """Each id's text, in id order."""
    n = vocab - len(MARKERS) - 2
    if n < 1:
        raise ValueError(f"a toy vocabulary has at least {len(MARKERS) + 3} ids, not {vocab}")
    chars = list(ALPHABET[:n])
    return chars + [f"<x{i}>" for i in range(n - len(chars))] + [UNK] + MARKERS + [EOS]


def toy_tokenizer(vocab: int = 64, chat_template: str | None = CHAT_TEMPLATE) -> Tokenizer:
    """The toy tokenizer of ``vocab`` ids (``chat_template`` None: a tokenizer without one)."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    pieces = toy_pieces(vocab)
    backend = Backend(WordLevel({p: i for i, p in enumerate(pieces)}, unk_token=UNK))
    if "A" not in pieces:
        backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")   # every character
    backend.decoder = decoders.Fuse()                                                       # joined as they are
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=UNK, eos_token=EOS,
                                 additional_special_tokens=MARKERS, clean_up_tokenization_spaces=False)
    hf.chat_template = chat_template
    return Tokenizer(hf, (pieces.index(EOS),))


def toy_model(seed: int = 0, vocab: int = 64, max_position_embeddings: int = 4096, **kw):
    """A tiny random model (``conftest.tiny_model``) to go with ``toy_tokenizer(vocab)``, whose greedy
    output never ends of itself: the head's row of ``<eos>`` is zero, so its logit (0) is below the
    largest of the others.  Requests then run to ``max_tokens`` (a grammar can still force the end)."""
    from conftest import tiny_config, tiny_model, tiny_state_dict

    cfg = tiny_config(vocab=vocab, max_position_embeddings=max_position_embeddings, **kw)
    sd = tiny_state_dict(cfg, seed)
    sd["lm_head.weight"][vocab - 1] = 0.0
    return tiny_model(seed=seed, sd=sd, vocab=vocab, max_position_embeddings=max_position_embeddings, **kw)
