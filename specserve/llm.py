"""Text in, text out: tokenizer, chat template and stop strings around the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specserve.drafters import create
from specserve.engine import Engine, Request, Result
from specserve.errors import SpecserveError
from specserve.models.loader import LoadedModel, RuntimeOptions, load_model
from specserve.sampling import SamplingParams
from specserve.tokenizer import Tokenizer, load_tokenizer


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: dict


def stop_checker(tokenizer: Tokenizer, stops: list[str]):
    """A ``stop_fn`` for the engine: True once the decoded tail of the output contains a stop string."""
    if not stops:
        return None
    longest = max(len(s) for s in stops)

    def hit(generated: list[int]) -> bool:
        tail = tokenizer.decode(generated[-(longest + 8):])
        return any(s in tail for s in stops)
    return hit


def trim_at_stop(text: str, stops: list[str]) -> str:
    """Cut the text before the earliest stop string, as OpenAI does."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


class LLM:
    """A target model, its tokenizer and an engine with the named drafters loaded."""

    def __init__(self, model: str = "default", options: RuntimeOptions | None = None,
                 drafters: dict[str, dict[str, Any]] | None = None, max_batch: int = 16,
                 max_len: int | None = 4096, loaded: LoadedModel | None = None):
        self.target = loaded or load_model(model, options)
        self.tokenizer = load_tokenizer(self.target)
        # drafters: label -> options; the option "drafter" names the registered drafter (default: the label)
        specs = {"none": {}} | dict(drafters or {})
        built = {label: create(opts.get("drafter", label), self.target,
                               **{k: v for k, v in opts.items() if k != "drafter"}) for label, opts in specs.items()}
        self.engine = Engine(self.target, built, max_batch=max_batch, max_len=max_len)

    def encode(self, prompt: str | list[dict], raw: bool = False) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise SpecserveError("empty prompt", "prompt")
            return self.tokenizer.encode(prompt) if raw else self.tokenizer.encode_chat(
                [{"role": "user", "content": prompt}])
        if not prompt:
            raise SpecserveError("empty messages", "messages")
        return self.tokenizer.encode_chat(prompt)

    def request(self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams, drafter: str = "none",
                num_draft: int = 0, stop: list[str] | None = None) -> Request:
        return Request(prompt=prompt_ids, max_tokens=max_tokens, sampling=sampling, drafter=drafter,
                       num_draft=num_draft, eos_ids=self.tokenizer.eos_ids,
                       stop_fn=stop_checker(self.tokenizer, stop or []))

    def completion(self, result: Result, stop: list[str] | None = None) -> Completion:
        text = self.tokenizer.decode(result.tokens)
        if stop:
            text = trim_at_stop(text, stop)
        return Completion(text, result.tokens, result.finish_reason, result.stats.to_dict())

    def generate(self, prompts: list[str | list[dict]], max_tokens: int = 128,
                 sampling: SamplingParams | None = None, drafter: str = "none", num_draft: int = 0,
                 stop: list[str] | None = None, raw: bool = False) -> list[Completion]:
        sampling = sampling or SamplingParams()
        reqs = [self.request(self.encode(p, raw), max_tokens, sampling, drafter, num_draft, stop) for p in prompts]
        return [self.completion(r, stop) for r in self.engine.generate(reqs)]
