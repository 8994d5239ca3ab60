"""Grammars a request's output must follow, compiled against the target's vocabulary (xgrammar).

A ``GrammarSpec`` says what the user asked for, in one of four kinds:

- ``json_object``: any JSON object (OpenAI's ``response_format: {"type": "json_object"}``);
- ``json_schema``: JSON valid under a JSON Schema (``{"type": "json_schema", "json_schema": {...}}``;
  ``strict`` false lets objects carry properties the schema does not name);
- ``regex``: text matching a regular expression (whole text);
- ``grammar``: an EBNF grammar in xgrammar's (GBNF-like) syntax, rule ``root`` first.

JSON is written compact (separators ``,`` and ``:``, no other whitespace): the grammar never lets a
model loop on whitespace, and more of each object is forced.  ``GrammarCompiler.compile`` turns a spec
into a ``Grammar`` (a compiled grammar, cached by spec, shared by every request naming it), whose
``matcher()`` is one request's state: the engine advances it along committed tokens and along each
drafted path, and asks it which tokens may come next (a bitmask, one bit per token id).

Why xgrammar: on the default model's vocabulary its masks cost less per token than llguidance's
(BENCHMARKS.md, section 18), it compiles JSON Schema, EBNF and regular expressions, rolls back, and
proposes the tokens a grammar forces (jump-forward).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass

import torch
from torch import Tensor

from specserve.errors import SpecserveError
from specserve.models import rowops

KINDS = ("json_object", "json_schema", "regex", "grammar")
SEPARATORS = (",", ":")
CACHE_SIZE = 64          # compiled grammars kept per compiler


@dataclass(frozen=True)
class GrammarSpec:
    kind: str                # one of KINDS
    source: str = ""         # the schema (JSON text), the regular expression or the EBNF grammar
    strict: bool = True      # json_schema: no properties or items beyond the schema's

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecserveError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}",
                                 "response_format")
        if self.kind != "json_object" and not self.source:
            raise SpecserveError(f"a {self.kind} grammar needs its source", "response_format")


def from_response_format(rf) -> GrammarSpec | None:
    """OpenAI's ``response_format`` object (a dict, as sent) as a ``GrammarSpec``; None for ``text``.
    The extension types: ``{"type": "regex", "regex": ...}`` and ``{"type": "grammar", "grammar": ...}``."""
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise SpecserveError("response_format must be an object with a 'type'", "response_format")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
            raise SpecserveError("response_format json_schema needs json_schema.schema, an object", "response_format")
        return GrammarSpec("json_schema", json.dumps(js["schema"]), js.get("strict") is not False)
    if kind in ("regex", "grammar"):
        if not isinstance(rf.get(kind), str) or not rf[kind]:
            raise SpecserveError(f"response_format {kind} needs the field {kind!r}, a string", "response_format")
        return GrammarSpec(kind, rf[kind])
    return GrammarSpec(kind)          # json_object; an unknown type is refused by GrammarSpec


def one_line(e: Exception) -> str:
    """An xgrammar error as one line: its first, without xgrammar's time and source location."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return re.sub(r"^\[[\d:.]+\] \S+:\d+: ", "", first)


class Grammar:
    """A compiled grammar: ``matcher()`` gives a fresh per-request state."""

    def __init__(self, compiled, spec: GrammarSpec, vocab_size: int):
        self.compiled, self.spec, self.vocab_size = compiled, spec, vocab_size

    def matcher(self) -> "Matcher":
        import xgrammar as xgr
        return Matcher(xgr.GrammarMatcher(self.compiled), self.vocab_size)


class Matcher:
    """One request's grammar state.  ``accept`` advances it by a token (False, unchanged, when the
    grammar forbids it), ``rollback`` undoes accepted tokens, ``fill`` writes the allowed next tokens
    into a bitmask row, ``forced`` gives the tokens the grammar forces next (jump-forward)."""

    def __init__(self, m, vocab_size: int):
        self.m, self.vocab_size = m, vocab_size
        self.stop_ids = frozenset(m.stop_token_ids)

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(token))

    def rollback(self, n: int) -> None:
        if n:
            self.m.rollback(n)

    def fill(self, bitmask: Tensor, row: int) -> None:
        """bitmask: int32 [R, ceil(V / 32)]; row ``row`` gets the allowed next tokens."""
        self.m.fill_next_token_bitmask(bitmask, row)

    def forced_text(self) -> str:
        """The text the grammar forces next ('' when none is forced)."""
        return self.m.find_jump_forward_string()

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (the longest vocabulary tokens covering the forced text;
        empty when the next text is not forced, or the grammar has ended)."""
        return list(self.m.find_jump_forward_tokens())

    @property
    def terminated(self) -> bool:
        return bool(self.m.is_terminated())


def new_bitmask(rows: int, vocab_size: int) -> Tensor:
    """int32 [rows, ceil(V / 32)], every token forbidden."""
    return torch.zeros((rows, (vocab_size + 31) // 32), dtype=torch.int32)


def allowed(bitmask: Tensor, vocab_size: int) -> Tensor:
    """bitmask: int32 [R, W] -> bool [R, V]: which tokens each row allows (bit j of word w: token 32w + j)."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1                                  # [R, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_mask(logits: Tensor, bitmask: Tensor) -> None:
    """logits: float32 [R, V], rows with contiguous entries; every token its bitmask row forbids set to
    -inf, in place (the native kernel, else xgrammar's on the CPU; ``allowed`` + ``masked_fill`` is the
    slow reference, equal bit for bit)."""
    rowops.mask(logits, bitmask)


class GrammarCompiler:
    """Compiles ``GrammarSpec``s against one tokenizer's vocabulary (thread-safe, cached by spec)."""

    def __init__(self, info, vocab_size: int):
        import xgrammar as xgr
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: dict[GrammarSpec, Grammar] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_huggingface(cls, hf_tokenizer, vocab_size: int, stop_ids) -> "GrammarCompiler":
        import xgrammar as xgr
        info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=sorted(stop_ids))
        return cls(info, vocab_size)

    @classmethod
    def from_vocab(cls, pieces: list[str], stop_ids) -> "GrammarCompiler":
        """A vocabulary given as each token's text (tests' tiny models)."""
        import xgrammar as xgr
        info = xgr.TokenizerInfo(pieces, xgr.VocabType.RAW, vocab_size=len(pieces), stop_token_ids=sorted(stop_ids))
        return cls(info, len(pieces))

    def compile(self, spec: GrammarSpec) -> Grammar:
        with self._lock:
            hit = self._cache.get(spec)
        if hit is not None:
            return hit
        try:
            compiled = self._compile(spec)
        except SpecserveError:
            raise
        except Exception as e:  # noqa: BLE001 - xgrammar's parse errors, shown as one line
            raise SpecserveError(f"invalid {spec.kind}: {one_line(e)}", "response_format") from None
        grammar = Grammar(compiled, spec, self.vocab_size)
        with self._lock:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[spec] = grammar
        return grammar

    def _compile(self, spec: GrammarSpec):
        c = self._compiler
        if spec.kind == "json_object":
            return c.compile_json_schema('{"type": "object"}', any_whitespace=False, separators=SEPARATORS,
                                         strict_mode=False)
        if spec.kind == "json_schema":
            try:
                schema = json.loads(spec.source)
            except ValueError as e:
                raise SpecserveError(f"invalid json_schema: not JSON ({e})", "response_format") from None
            if not isinstance(schema, dict):
                raise SpecserveError("invalid json_schema: a schema is a JSON object", "response_format")
            return c.compile_json_schema(spec.source, any_whitespace=False, separators=SEPARATORS,
                                         strict_mode=spec.strict)
        if spec.kind == "regex":
            return c.compile_regex(spec.source)
        return c.compile_grammar(spec.source)
