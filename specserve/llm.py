"""Text in, text out: tokenizer, chat template and stop strings around the engine."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from specserve.constrain import Grammar, GrammarCompiler, GrammarSpec
from specserve.drafters import Drafter, DrafterSpec, available, drafter_class
from specserve.engine import Engine, Request, Result
from specserve.engine.types import TokenLogprob
from specserve.errors import SpecserveError
from specserve.models.loader import LoadedModel, RuntimeOptions, load_model
from specserve.control import CostModel, PrefillPolicy
from specserve.sampling import SamplingParams
from specserve.tokenizer import Tokenizer, load_tokenizer
from specserve.tools import CallFormat, Tool, call_format
from specserve.tools.prompt import family_of, render, supports_tools

DEFAULT_DRAFTER = "auto"       # what the Python API, the command line and the server load unless told


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: dict
    logprobs: list[TokenLogprob] | None = None


def freeze_heap() -> None:
    """Put every object alive now (a loaded model's tokenizer, drafters, compiled grammars: hundreds
    of thousands of tracked objects) out of the cyclic garbage collector's reach (``gc.freeze``), so
    that its full collections, which would otherwise walk them all, no longer stall a decoding
    stream.  For long-lived processes (the server, the bench), called once after loading; objects
    made later are collected as usual."""
    gc.collect()
    gc.freeze()


def stop_checker(tokenizer: Tokenizer, stops: list[str]):
    """A ``stop_fn`` for the engine: True once the decoded tail of the output contains a stop string."""
    if not stops:
        return None
    longest = max(len(s) for s in stops)

    def hit(generated: list[int]) -> bool:
        tail = tokenizer.decode(generated[-(longest + 8):])
        return any(s in tail for s in stops)
    return hit


def check_tokenizer(tokenizer: Tokenizer, target: LoadedModel) -> Tokenizer:
    """``tokenizer``, refused (``SpecserveError``, naming why) unless every id it can produce is one of
    ``target``'s (below its ``vocab_size``) and it names at least one end-of-text id, also within."""
    size = target.config.vocab_size
    vocab = tokenizer.vocab()
    if not vocab:
        raise SpecserveError(f"the tokenizer does not fit {target.path}: its vocabulary is empty", "tokenizer")
    top = max(vocab.values())
    if top >= size:
        token = next(t for t, i in vocab.items() if i == top)
        raise SpecserveError(f"the tokenizer does not fit {target.path}: its vocabulary reaches id {top} "
                             f"({token!r}), the model has {size} ids (0-{size - 1})", "tokenizer")
    if not tokenizer.eos_ids:
        raise SpecserveError("the tokenizer names no end-of-text id (eos_ids is empty)", "tokenizer")
    outside = sorted(i for i in tokenizer.eos_ids if not 0 <= i < size)
    if outside:
        raise SpecserveError(f"the tokenizer does not fit {target.path}: end-of-text id(s) {outside} outside "
                             f"the model's {size} ids (0-{size - 1})", "tokenizer")
    return tokenizer


def trim_at_stop(text: str, stops: list[str]) -> str:
    """Cut the text before the earliest stop string, as OpenAI does."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


class LLM:
    """A target model, its tokenizer and an engine with the named drafters loaded."""

    def __init__(self, model: str = "default", options: RuntimeOptions | None = None,
                 drafters: Iterable[str | DrafterSpec] | Mapping[str, dict[str, Any]] | None = None,
                 max_batch: int = 16, max_len: int | None = 4096, loaded: LoadedModel | None = None,
                 preload: bool = False, prefill: PrefillPolicy | None = None, tokenizer: Tokenizer | None = None):
        """``tokenizer``: the one to use instead of the model's own (``load_tokenizer``), e.g. a test's
        toy tokenizer for a tiny model; its ``eos_ids`` are the end of text (the model's configured ones
        are not added), and it is refused here (``SpecserveError``) unless its ids fit the model
        (``check_tokenizer``).
        ``prefill``: chunked prefill and prefix reuse (default: chunks of 256, no prefix pool).
        ``drafters``: specs (``"ngram:max_n=5"``; the label a request names is the drafter's name),
        or a mapping label -> options, where the option ``drafter`` names the registered drafter
        (default: the label) and ``k`` its default draft length; None (the default): ``auto``, every
        drafter merged (``specserve.drafters.auto``).  The first one named is what a request that
        names no drafter gets (``default_drafter``).  ``none`` is always loaded; with ``preload`` so
        is every drafter that declares itself cheap (``Drafter.preload``)."""
        self.target = loaded or load_model(model, options)
        self.tokenizer = load_tokenizer(self.target) if tokenizer is None else check_tokenizer(tokenizer, self.target)
        specs: dict[str, DrafterSpec] = {"none": DrafterSpec("none")}
        if drafters is None:
            drafters = [DEFAULT_DRAFTER]
        if isinstance(drafters, Mapping):
            for label, opts in drafters.items():
                opts = dict(opts)
                k = opts.pop("k", None)
                specs[label] = DrafterSpec(opts.pop("drafter", label), opts, k, label)
        else:
            for d in drafters or ():
                spec = d if isinstance(d, DrafterSpec) else DrafterSpec.parse(d)
                specs[spec.name] = spec
        if preload:
            for name in available():
                if drafter_class(name).preload and name not in specs:
                    specs[name] = DrafterSpec(name)
        named = [label for label in specs if label != "none"]
        self.default_drafter = named[0] if named else "none"   # what a request that names none gets
        self._drafters = {label: spec.build(self.target) for label, spec in specs.items()}
        self.default_k = {label: spec.k for label, spec in specs.items()}   # draft length when a request names none
        self._max_len, self._prefill = max_len, prefill
        self.engine = Engine(self.target, self._drafters, max_batch=max_batch, max_len=max_len, prefill=prefill)
        self._grammars: GrammarCompiler | None = None

    def grammar(self, spec: GrammarSpec) -> Grammar:
        """``spec`` compiled against this model's vocabulary (cached; an invalid one raises
        ``SpecserveError`` naming the problem).  The compiler is built on first use."""
        if self._grammars is None:
            self._grammars = GrammarCompiler.from_huggingface(self.tokenizer.hf, self.target.config.vocab_size,
                                                              self.tokenizer.eos_ids)
        return self._grammars.compile(spec)

    def drafter(self, label: str) -> Drafter:
        """The loaded drafter object of ``label``."""
        if label not in self._drafters:
            raise SpecserveError(f"drafter {label!r} is not loaded; loaded: {', '.join(self._drafters)}", "drafter")
        return self._drafters[label]

    def engine_with(self, max_batch: int, drafters: Iterable[str] | None = None, target: LoadedModel | None = None,
                    cost: CostModel | None = None, guard: bool = True) -> Engine:
        """A new engine of ``max_batch`` rows over the same target (or ``target``, a decoder of the same
        model, as a replay's) and the same loaded drafter objects (``drafters``: the labels it serves,
        default all), with this LLM's context length and prefill policy (``cost``: its pass costs,
        default measured).  A drafter object serves one engine at a time: building an engine re-binds its drafters
        (``Drafter.bind``) to that engine's sizes, and a drafter's per-sequence state belongs to the
        engine running it.  So engines that share a drafter run one after another, never together, and
        an older engine (``self.engine`` included) is not used again with a drafter a newer one holds."""
        labels = list(self._drafters) if drafters is None else list(drafters)
        unknown = [label for label in labels if label not in self._drafters]
        if unknown:
            raise SpecserveError(f"drafter {unknown[0]!r} is not loaded; loaded: {', '.join(self._drafters)}",
                                 "drafter")
        return Engine(target or self.target, {label: self.drafter(label) for label in labels}, max_batch=max_batch,
                      max_len=self._max_len, prefill=self._prefill, cost=cost, guard=guard)

    def reset_memory(self) -> list[str]:
        """Every loaded drafter forgets what it learnt across requests, as on a fresh server
        (``Drafter.reset_memory``), and the engine forgets how it saw the target spell forced text
        (``Drafting.forget_spellings``); the labels of the drafters that had such memory."""
        self.engine.drafting.forget_spellings()
        return [label for label, d in self._drafters.items() if d.reset_memory()]

    def describe_drafters(self) -> dict[str, dict]:
        """label -> what each loaded drafter reports about itself (``Drafter.describe``)."""
        return {label: d.describe() for label, d in self._drafters.items()}

    def encode(self, prompt: str | list[dict], raw: bool = False) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise SpecserveError("empty prompt", "prompt")
            return self.tokenizer.encode(prompt) if raw else self.tokenizer.encode_chat(
                [{"role": "user", "content": prompt}])
        if not prompt:
            raise SpecserveError("empty messages", "messages")
        return self.tokenizer.encode_chat(prompt)

    def call_format(self, name: str = "auto") -> CallFormat:
        """The tool-call format ``name`` (``hermes``, ``llama3_json``, ``pythonic``), or for ``auto``
        the one this model's chat template implies (``tools.prompt.family_of``)."""
        return call_format(family_of(self.tokenizer.hf.chat_template) if name == "auto" else name)

    def encode_tools(self, messages: list[dict], tools: list[Tool], fmt: CallFormat) -> list[int]:
        """A chat prompt with ``tools`` offered (may be empty) and the conversation's calls and tool
        results, rendered by the chat template where it supports tools, else in ``fmt``'s own words
        (``tools.prompt``)."""
        if not messages:
            raise SpecserveError("empty messages", "messages")
        template = self.tokenizer.hf.chat_template
        msgs, tool_docs = render(messages, tools, fmt, supports_tools(template))
        return self.tokenizer.encode_chat(msgs, tool_docs)

    def request(self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams, drafter: str | None = None,
                num_draft: int | str | None = None, stop: list[str] | None = None,
                grammar: GrammarSpec | Grammar | None = None, logprobs: int | None = None,
                prompt_logprobs: int | None = None) -> Request:
        """An engine request; ``drafter``: a loaded label, None for ``default_drafter``; ``num_draft``: a
        number (0 stays 0), ``"auto"``, or None for the drafter's configured default (``auto`` unless
        its spec named a number); ``grammar``: what the output must follow (a spec is compiled here);
        ``logprobs`` / ``prompt_logprobs``: top logprobs per generated / prompt token (None: none)."""
        drafter = drafter or self.default_drafter
        if num_draft is None:
            num_draft = self.default_k.get(drafter, 0)
        if isinstance(grammar, GrammarSpec):
            grammar = self.grammar(grammar)
        return Request(prompt=prompt_ids, max_tokens=max_tokens, sampling=sampling, drafter=drafter,
                       num_draft=num_draft, eos_ids=self.tokenizer.eos_ids,
                       stop_fn=stop_checker(self.tokenizer, stop or []), grammar=grammar, logprobs=logprobs,
                       prompt_logprobs=prompt_logprobs)

    def completion(self, result: Result, stop: list[str] | None = None) -> Completion:
        text = self.tokenizer.decode(result.tokens)
        if stop:
            text = trim_at_stop(text, stop)
        return Completion(text, result.tokens, result.finish_reason, result.stats.to_dict(), result.logprobs)

    def generate(self, prompts: list[str | list[dict]], max_tokens: int = 128,
                 sampling: SamplingParams | None = None, drafter: str | None = None, num_draft: int | str | None = None,
                 stop: list[str] | None = None, raw: bool = False, grammar: GrammarSpec | None = None,
                 logprobs: int | None = None) -> list[Completion]:
        sampling = sampling or SamplingParams()
        compiled = self.grammar(grammar) if grammar is not None else None
        reqs = [self.request(self.encode(p, raw), max_tokens, sampling, drafter, num_draft, stop, compiled, logprobs)
                for p in prompts]
        return [self.completion(r, stop) for r in self.engine.generate(reqs)]
