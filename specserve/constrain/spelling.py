"""How the target spells the text a grammar forces, learnt from the tokens it committed there.

A grammar often fixes the next characters (a schema's key, a quote, a brace) but not the tokens
that write them: ``":"`` may come as one token, or as ``":`` then ``"``.  xgrammar's jump-forward
proposes the longest vocabulary tokens; the model often writes others (under compact JSON it ends a
token where it would have written a space: ``{`` then ``"``, ``":`` then ``"``).  A forced draft in
another spelling than the model's is rejected at its first token, so ``Spelling`` remembers, for
each forced text seen where a token was committed, the token the model wrote there, keyed by the
token before it and the forced text (and by the forced text alone, for a new predecessor), and
``chain`` spells a forced text the way the model last did, with xgrammar's tokens where it has not
seen the text.  It changes only what is drafted, never what is accepted: verification still checks
every forced node against the target.
"""

from __future__ import annotations

from specserve.constrain.grammar import Matcher

CAPACITY = 1 << 16          # entries per table; the oldest go first


class Spelling:
    """The tokens the target wrote where a grammar forced a text (one engine's, one drafter label's)."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.after: dict[tuple[int, str], int] = {}      # (previous token, forced text) -> token written
        self.alone: dict[str, int] = {}                  # forced text -> token written
        self.end: int | None = None                      # the end-of-text token written last where the grammar ended

    def learn(self, prev: int, text: str, token: int) -> None:
        for table, key in ((self.after, (prev, text)), (self.alone, text)):
            table.pop(key, None)                         # re-inserted last: the newest entry
            table[key] = token
            if len(table) > self.capacity:
                table.pop(next(iter(table)))

    def guess(self, prev: int, text: str) -> int | None:
        hit = self.after.get((prev, text))
        return hit if hit is not None else self.alone.get(text)

    def reset(self) -> None:
        self.after.clear()
        self.alone.clear()
        self.end = None


def chain(matcher: Matcher, prev: int, budget: int, spelling: Spelling | None) -> list[int]:
    """Up to ``budget`` tokens spelling the text the grammar forces after the matcher's state (``prev``:
    the token that state ends with): at each step the remembered token for the rest of the text, else
    xgrammar's next jump-forward token; stops where the text is no longer forced, or where a guess does
    not fit the grammar.  The matcher is left as it was."""
    out: list[int] = []
    ahead: list[int] | None = None                       # xgrammar's tokens from here, while we follow them
    while len(out) < budget:
        text = matcher.forced_text()
        if not text:
            break
        token = spelling.guess(prev, text) if spelling is not None else None
        if ahead is None:
            ahead = matcher.forced() if token is None else []
        if token is None:
            if not ahead:
                break
            token = ahead[0]
        ahead = ahead[1:] if ahead and ahead[0] == token else None
        if not matcher.accept(token):
            break
        out.append(token)
        prev = token
    matcher.rollback(len(out))
    return out
