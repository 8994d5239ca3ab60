"""A tool-call format: how a model family writes calls, read back from its text, and the grammar
that makes it write one.

Each format (``hermes``, ``llama3_json``, ``pythonic``) is a ``CallFormat`` registered by name.
``scan(text, final)`` splits an output into pieces: text, and ``Found`` calls in the order written.
While the output is still growing (``final`` false) the last pieces may be open: a call begun but
not finished, or text that may still become one (a partial opening tag), held back from the content.
``grammar`` is the EBNF a ``required`` or named choice constrains the output to: the format's call
syntax around JSON valid under each tool's parameters, compact, the name written first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar

from specserve.constrain.ebnf import json_rules, literal
from specserve.errors import SpecserveError
from specserve.tools.spec import Call, Tool

FORMATS: dict[str, type["CallFormat"]] = {}


@dataclass
class Found:
    """A call in an output.  ``raw``: its text (a block holding several calls: on the first);
    ``name``: None until written whole; ``arguments``: the JSON text written so far; ``closed``:
    complete and valid in the format's syntax."""
    raw: str
    name: str | None = None
    arguments: str = ""
    closed: bool = False


Piece = str | Found


def register(cls: type["CallFormat"]) -> type["CallFormat"]:
    FORMATS[cls.name] = cls
    return cls


def call_format(name: str) -> "CallFormat":
    """The format registered as ``name``; an unknown one is refused, naming those there are."""
    if name not in FORMATS:
        raise SpecserveError(f"tool parser {name!r} unknown; known: {', '.join(sorted(FORMATS))}", "tool_parser")
    return FORMATS[name]()


class CallFormat:
    name: ClassVar[str]
    key: ClassVar[str] = "arguments"        # the arguments' key in a JSON call
    result_role: ClassVar[str] = "user"     # the role that carries tool results in a fallback prompt

    def scan(self, text: str, final: bool) -> list[Piece]:
        raise NotImplementedError

    def grammar(self, tools: list[Tool], parallel: bool) -> str:
        raise NotImplementedError

    def system_prompt(self, tools: list[Tool]) -> str:
        """What a prompt says of the tools where the chat template has no tool support."""
        raise NotImplementedError

    def render_calls(self, calls: list[Call]) -> str:
        """An assistant turn's calls written in this format (for a template without tool support)."""
        raise NotImplementedError

    def render_results(self, results: list[tuple[str, str]]) -> str:
        """Tool results (name, content) as the text of one turn, for a template without tool support."""
        raise NotImplementedError


# -- JSON calls, shared by the formats that write them --------------------------------------------

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_decoder = json.JSONDecoder()


def json_call(obj, raw_text: str = "") -> Found | None:
    """A parsed JSON call ``{"name": str, "arguments"|"parameters": object}`` as a closed ``Found``
    (None if it is not one).  Its arguments are their text in ``raw_text`` where the name comes
    first there, else the parsed object written as JSON."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if not isinstance(args, dict) or set(obj) - {"name", "arguments", "parameters"}:
        return None
    m = _HEAD.match(raw_text)
    text = None
    if m:
        try:
            value, end = _decoder.raw_decode(raw_text, m.end())
            text = raw_text[m.end():end] if value == args else None
        except ValueError:
            text = None
    return Found(raw_text, obj["name"], text if text is not None else json.dumps(args, ensure_ascii=False), True)


def partial_json_call(text: str) -> Found:
    """An open call from the start of a JSON call written name first: the name once written whole,
    the arguments' text so far (the whole value once it ends)."""
    m = _HEAD.match(text)
    if not m:
        return Found(text)
    try:
        name = json.loads(f'"{m.group(1)}"')
    except ValueError:
        return Found(text)
    rest = text[m.end():].lstrip()
    try:
        _, end = _decoder.raw_decode(rest)
        rest = rest[:end]
    except ValueError:
        pass
    return Found(text, name, rest)


def json_sequence(text: str, sep: str) -> list[Found] | None:
    """``text`` as JSON calls separated by ``sep`` (whitespace around each allowed), or None."""
    found, pos, s = [], 0, text.strip()
    while True:
        while pos < len(s) and s[pos].isspace():
            pos += 1
        try:
            obj, end = _decoder.raw_decode(s, pos)
        except ValueError:
            return None
        call = json_call(obj, s[pos:end])
        if call is None:
            return None
        found.append(call)
        pos = end
        while pos < len(s) and s[pos].isspace():
            pos += 1
        if pos == len(s):
            return found
        if not s.startswith(sep, pos):
            return None
        pos += len(sep)


def held(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` may be the start of one of ``markers``."""
    for k in range(min(len(text), max(len(m) for m in markers) - 1), 0, -1):
        if any(m.startswith(text[-k:]) for m in markers):
            return k
    return 0


def json_call_rules(tools: list[Tool], key: str) -> list[str]:
    """Rules ``call ::= call_0 | call_1 | ...``, each ``{"name":"<name>","<key>":<arguments>}``."""
    rules = ["call ::= " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        head = literal(f'{{"name":{json.dumps(tool.name)},"{key}":')
        rules.append(f"call_{i} ::= {head} args_{i} {literal('}')}")
        rules.append(json_rules(tool.parameters, f"args_{i}", param=f"{tool.where}.function.parameters"))
    return rules


def repeated(item: str, sep: str, parallel: bool, before: str = "", after: str = "") -> str:
    """``root ::= before item (sep item)* after`` (no repetition unless ``parallel``)."""
    more = f" ({literal(sep)} {item})*" if parallel else ""
    parts = [literal(before)] if before else []
    parts += [item + more] + ([literal(after)] if after else [])
    return "root ::= " + " ".join(parts)


def tools_json(tools: list[Tool]) -> str:
    """One line of JSON per tool, as prompts list them."""
    return "\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools)


def arguments_json(call: Call) -> str:
    """A call's arguments to write back into a prompt: their text if it is JSON, else a JSON string."""
    return call.arguments if call.argument_values() is not None else json.dumps(call.arguments)
