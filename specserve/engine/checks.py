"""What makes a request unservable, found before anything is allocated (``Engine.check``)."""

from __future__ import annotations

from specserve.engine.types import Request
from specserve.errors import SpecserveError
from specserve.limits import AUTO_SIZE, MAX_DRAFT, MAX_LOGPROBS


def check_request(req: Request, max_len: int, drafters: dict, vocab: int) -> None:
    """Raise ``SpecserveError`` naming the field a request cannot be served with."""
    if not req.prompt:
        raise SpecserveError("empty prompt", "prompt")
    least = 0 if req.prompt_logprobs is not None else 1       # scoring a prompt may generate nothing
    if isinstance(req.max_tokens, bool) or not isinstance(req.max_tokens, int) or req.max_tokens < least:
        raise SpecserveError(f"max_tokens must be >= {least}, got {req.max_tokens}", "max_tokens")
    for name in ("logprobs", "prompt_logprobs"):
        v = getattr(req, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_LOGPROBS):
            raise SpecserveError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {v!r}", name)
    if len(req.prompt) + req.max_tokens > max_len:
        raise SpecserveError(f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.max_tokens}) exceeds "
                             f"the context length {max_len}", "max_tokens")
    if req.drafter not in drafters:
        raise SpecserveError(f"drafter {req.drafter!r} is not loaded; loaded: {', '.join(drafters)}", "drafter")
    if req.num_draft != AUTO_SIZE and (isinstance(req.num_draft, bool) or not isinstance(req.num_draft, int)
                                       or not 0 <= req.num_draft <= MAX_DRAFT):
        raise SpecserveError(f"num_draft must be 'auto' or in [0, {MAX_DRAFT}], got {req.num_draft!r}", "num_draft")
    if any(not 0 <= t < vocab for t in req.prompt):
        raise SpecserveError(f"prompt token ids must be in [0, {vocab})", "prompt")
    if req.grammar is not None and req.grammar.vocab_size != vocab:
        raise SpecserveError(f"the grammar was compiled for {req.grammar.vocab_size} tokens, the model has "
                             f"{vocab}", "response_format")
    drafters[req.drafter].validate(req.sampling)
