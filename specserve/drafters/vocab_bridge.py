"""Drafting with another tokenizer: translating token sequences between two vocabularies through text.

As transformers' universal assisted generation does: the draft model reads the target's text
re-encoded with its own tokenizer, drafts in its own vocabulary, and its tokens are decoded and
re-encoded with the target's tokenizer.  Terms:

* the **context** is the sequence's target tokens (prompt + generated); the draft's view of it is
  ``to_draft(context)``: the context's text (without the target's special tokens, which would be
  plain characters to the draft) encoded by the draft's tokenizer.  Re-encoded every step, it
  changes only near its end, so the draft's cache (rolled back to the longest common prefix) feeds
  only the changed tail.
* ``to_target(context, drafted)`` turns drafted draft tokens into target tokens that *continue the
  context*: the context's last ``TAIL`` tokens' text plus the drafted text is encoded by the
  target's tokenizer; when that encoding starts with those same ``TAIL`` tokens (the boundary
  round-trips), the tokens after them are the proposal; otherwise the drafted text encoded on its
  own is.  The last of them is dropped (the drafted text may end inside a word that a longer text
  would tokenize differently), unless it is the only one.

Exactness: any proposal is verified by the target, so greedy output is the target's whatever the
translation does; under sampling the draft drafts greedily (its q is one-hot on the proposed
tokens), which keeps the output distribution exactly the target's.  A translation that loses
text only lowers acceptance.
"""

from __future__ import annotations

TAIL = 8          # target tokens of context re-encoded with the drafted text, to find the boundary


class TextBridge:
    def __init__(self, target_tokenizer, draft_tokenizer):
        self.t, self.d = target_tokenizer.hf, draft_tokenizer.hf
        self.draft_specials = set(self.d.all_special_ids)

    def _text(self, tok, ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _encode(self, tok, text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def to_draft(self, context: list[int]) -> list[int]:
        """The context's text as the draft's tokens (never empty: the draft needs a token to continue).
        The target's special tokens (BOS, chat markers) are left out: to a draft with other ones they
        would be plain characters."""
        ids = self._encode(self.d, self.t.decode(context, skip_special_tokens=True, clean_up_tokenization_spaces=False))
        return ids or [self.d.bos_token_id or 0]

    def to_target(self, context: list[int], drafted: list[int]) -> list[int]:
        """Target tokens continuing ``context`` with the drafted text (see the module docstring)."""
        cut = next((i for i, x in enumerate(drafted) if x in self.draft_specials), len(drafted))
        text = self._text(self.d, drafted[:cut])            # stop at the draft's end-of-text
        if not text:
            return []
        tail = context[-TAIL:]
        joined = self._encode(self.t, self._text(self.t, tail) + text)
        out = joined[len(tail):] if joined[:len(tail)] == tail else self._encode(self.t, text)
        return out[:-1] if len(out) > 1 else out
