"""The ``logprobs`` documents of OpenAI's two endpoints, from the engine's ``TokenLogprob`` lists.

Chat (``logprobs: true``, ``top_logprobs: n``): ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}]}]}``.  Completions (``logprobs: n``, the legacy
form): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``; with ``echo`` the prompt's
tokens come first, the first of them with a null logprob, and ``text_offset`` counts characters of
the returned text.  An end-of-text token is not listed (its text is not in the output).  The numbers
are the target's raw log-probabilities (before penalties, grammar and temperature).
"""

from __future__ import annotations

from specserve.engine.types import TokenLogprob
from specserve.llm import LLM


def _text(llm: LLM, token: int) -> str:
    return llm.tokenizer.hf.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _listed(llm: LLM, lps: list[TokenLogprob]) -> list[TokenLogprob]:
    return [lp for lp in lps if lp.token not in llm.tokenizer.eos_ids]


def chat_logprobs(llm: LLM, lps: list[TokenLogprob] | None) -> dict | None:
    if lps is None:
        return None

    def one(token: int, logprob: float) -> dict:
        text = _text(llm, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**one(lp.token, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}
                        for lp in _listed(llm, lps)]}


def completion_logprobs(llm: LLM, lps: list[TokenLogprob] | None, prompt_ids: list[int] | None = None,
                        prompt_lps: list[TokenLogprob | None] | None = None) -> dict | None:
    """``prompt_ids`` / ``prompt_lps``: with echo, the prompt's tokens and their logprobs first."""
    if lps is None:
        return None
    tokens, values, tops, offsets, at = [], [], [], [], 0
    entries: list[tuple[int, TokenLogprob | None]] = list(zip(prompt_ids, prompt_lps)) if prompt_ids else []
    entries += [(lp.token, lp) for lp in _listed(llm, lps)]
    for token, lp in entries:
        text = _text(llm, token)
        tokens.append(text)
        values.append(lp.logprob if lp is not None else None)
        tops.append({_text(llm, t): v for t, v in lp.top} if lp is not None else None)
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
