"""The call formats: Hermes-style ``<tool_call>`` blocks (Qwen 2.5 and 3, SmolLM2, Hermes), Llama 3's
JSON calls, and Python-style call lists (Llama 3.2's and Gemma 3's pythonic format)."""

from __future__ import annotations

import ast
import json
import re

from specserve.constrain.ebnf import json_rules, literal
from specserve.errors import SpecserveError
from specserve.tools.base import (CallFormat, Found, Piece, arguments_json, held, json_call, json_call_rules,
                                  json_sequence, partial_json_call, register, repeated, tools_json)
from specserve.tools.spec import Call, Tool

_decoder = json.JSONDecoder()


@register
class Hermes(CallFormat):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call (a block
    holding a JSON list of calls is read too); text outside the blocks is the content."""
    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"

    def scan(self, text: str, final: bool) -> list[Piece]:
        pieces: list[Piece] = []
        i = 0
        while True:
            j = text.find(self.START, i)
            if j < 0:
                tail = text[i:]
                k = 0 if final else held(tail, (self.START,))
                pieces += [tail[:len(tail) - k]] + ([Found(tail[len(tail) - k:])] if k else [])
                return pieces
            pieces.append(text[i:j])
            body = j + len(self.START)
            e = self._end(text, body, final)
            if e < 0:                         # no end tag yet: the block runs to the end of the text
                calls = self._block(text[j:], text[body:]) if final else None
                if calls:
                    return pieces + calls
                if final:
                    return pieces + [text[j:]]
                found = partial_json_call(text[body:].lstrip())
                found.raw = text[j:]
                return pieces + [found]
            raw = text[j:e + len(self.END)]
            pieces += self._block(raw, text[body:e]) or [raw]
            i = e + len(self.END)

    def _end(self, text: str, body: int, final: bool) -> int:
        """Where the end tag of the block whose body starts at ``body`` is: after the JSON value the
        body holds (so an end tag written inside a string does not end it), else, at the end of
        the output, the first one (-1: none yet; before the end, a body that is not JSON yet may
        still become JSON)."""
        start = body + len(text[body:]) - len(text[body:].lstrip())
        try:
            _, end = _decoder.raw_decode(text, start)
        except ValueError:
            return text.find(self.END, body) if final else -1
        after = end + len(text[end:]) - len(text[end:].lstrip())
        if text.startswith(self.END, after):
            return after
        return text.find(self.END, body) if len(text) - after >= len(self.END) else -1

    @staticmethod
    def _block(raw: str, body: str) -> list[Found] | None:
        """A block's calls: one JSON call, or a JSON list of them (None if it is neither)."""
        s = body.strip()
        try:
            obj = json.loads(s)
        except ValueError:
            return None
        found = [json_call(obj, s)] if isinstance(obj, dict) else (
            [json_call(o, json.dumps(o)) for o in obj] if isinstance(obj, list) and obj else [None])
        if any(f is None for f in found):
            return None
        for f in found:
            f.raw = ""
        found[0].raw = raw
        return found

    def grammar(self, tools: list[Tool], parallel: bool) -> str:
        block = f"block ::= {literal(self.START + chr(10))} call {literal(chr(10) + self.END)}"
        return "\n".join([repeated("block", "\n", parallel), block] + json_call_rules(tools, self.key))

    def system_prompt(self, tools: list[Tool]) -> str:
        return ("You can call functions. Their signatures are within <tools></tools> tags:\n<tools>\n"
                f"{tools_json(tools)}\n</tools>\n"
                "To call a function, write a JSON object with its name and arguments within <tool_call></tool_call> "
                'tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

    def render_calls(self, calls: list[Call]) -> str:
        return "\n".join(f'{self.START}\n{{"name":{json.dumps(c.name)},"arguments":{arguments_json(c)}}}\n{self.END}'
                         for c in calls)

    def render_results(self, results: list[tuple[str, str]]) -> str:
        return "\n".join(f"<tool_response>\n{content}\n</tool_response>" for _, content in results)


@register
class Llama3Json(CallFormat):
    """Llama 3.1-3.3's JSON calls: the whole output is ``{"name": ..., "parameters": {...}}``, several
    separated by ``; ``; an output that is not is text."""
    name = "llama3_json"
    key = "parameters"
    SEP = ";"
    TAG = "<|python_tag|>"

    def scan(self, text: str, final: bool) -> list[Piece]:
        s = text.strip().removeprefix(self.TAG).lstrip()
        if final:
            calls = json_sequence(s, self.SEP)
            if calls:
                calls[0].raw = text
                return calls
            return [text]
        if self.TAG.startswith(text.strip()):
            return [Found(text)]
        if s and not s.startswith("{"):
            return [text]
        found, pos = [], 0
        while True:                               # complete calls so far, then the one being written
            try:
                _, end = _decoder.raw_decode(s, pos)
            except ValueError:
                return found + [partial_json_call(s[pos:])] if found or s else [Found(text)]
            found.append(partial_json_call(s[pos:end]))
            rest = s[end:].lstrip()
            if not rest.startswith(self.SEP):
                return found
            pos = len(s) - len(rest[1:].lstrip())

    def grammar(self, tools: list[Tool], parallel: bool) -> str:
        return "\n".join([repeated("call", self.SEP + " ", parallel)] + json_call_rules(tools, self.key))

    def system_prompt(self, tools: list[Tool]) -> str:
        return ("You can call functions. To call one, answer with nothing but a JSON object "
                '{"name": <function-name>, "parameters": <args-json-object>}; for several calls, separate them '
                f"with '; '. The functions:\n{tools_json(tools)}")

    def render_calls(self, calls: list[Call]) -> str:
        return "; ".join(f'{{"name":{json.dumps(c.name)},"parameters":{arguments_json(c)}}}' for c in calls)

    def render_results(self, results: list[tuple[str, str]]) -> str:
        return "\n".join(f"Result of {name}: {content}" for name, content in results)


@register
class Pythonic(CallFormat):
    """A Python list of calls with keyword arguments, ``[get_weather(city="Paris"), ...]``, the whole
    output or a fenced ```` ```tool_code ```` block after some text.  Values are Python literals
    (JSON's ``true``/``false``/``null`` are read too: the constrained form writes values as JSON)."""
    name = "pythonic"
    FENCES = ("```tool_code", "```python")

    def scan(self, text: str, final: bool) -> list[Piece]:
        s = text.strip()
        fence = min((i for i in (text.find(f) for f in self.FENCES) if i >= 0), default=-1)
        if final:
            body, before = (text[fence:], text[:fence]) if fence >= 0 else (s, "")
            calls = _python_calls(_unfence(body.strip(), self.FENCES))
            if calls is None:
                return [text]
            calls[0].raw = body
            return [before] + calls
        if fence >= 0:
            return [text[:fence]] + _partial_calls(text[fence:])
        if not s or s.startswith("["):
            return _partial_calls(text)
        k = held(text, self.FENCES)
        return [text[:len(text) - k]] + ([Found(text[len(text) - k:])] if k else [])

    def grammar(self, tools: list[Tool], parallel: bool) -> str:
        rules = [repeated("call", ", ", parallel, "[", "]"),
                 "call ::= " + " | ".join(f"call_{i}" for i in range(len(tools)))]
        for i, tool in enumerate(tools):
            if not tool.name.isidentifier():
                raise SpecserveError(f"{tool.where}.function.name: {tool.name!r} cannot be called in Python syntax "
                                     "(the pythonic tool parser)", f"{tool.where}.function.name")
            rules.append(f"call_{i} ::= {literal(tool.name + '(')} t{i}_a0_first {literal(')')}")
            rules += _keyword_rules(tool, f"t{i}")
        return "\n".join(rules)

    def system_prompt(self, tools: list[Tool]) -> str:
        return ("You can call functions. To call them, answer with nothing but a Python list of calls with keyword "
                "arguments: [func_name1(param1=value1, param2=value2), func_name2(param=value)]. "
                f"The functions:\n{tools_json(tools)}")

    def render_calls(self, calls: list[Call]) -> str:
        return "[" + ", ".join(f"{c.name}({_keywords(c)})" for c in calls) + "]"

    def render_results(self, results: list[tuple[str, str]]) -> str:
        return "\n".join(f"```tool_output\n{content}\n```" for _, content in results)


_CALL_START = re.compile(r"[ ,\n]*([A-Za-z_][A-Za-z0-9_]*)\(")


def _partial_calls(text: str) -> list[Found]:
    """The calls of a list still being written (none closed: only the end can tell): each finished
    call with its arguments as JSON, then the one being written, by name once its ``(`` is."""
    found, i = [], text.find("[")
    if i < 0:
        return [Found(text)]
    i += 1
    while True:
        m = _CALL_START.match(text, i)
        if not m:
            break
        end = _call_end(text, m.end())
        if end is None:
            found.append(Found("", m.group(1)))
            break
        calls = _python_calls("[" + text[m.start(1):end] + "]")
        if calls is None:
            break
        calls[0].closed = False
        found.append(calls[0])
        i = end
    if not found:
        return [Found(text)]
    found[0].raw = text
    return found


def _call_end(text: str, i: int) -> int | None:
    """The index after the ``)`` that closes a call whose arguments start at ``i`` (None: not yet
    written), skipping brackets inside string literals."""
    depth, quote = 1, None
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _unfence(s: str, fences: tuple[str, ...]) -> str:
    for f in fences:
        if s.startswith(f) and s.endswith("```") and len(s) >= len(f) + 3:
            return s[len(f):-3]
    return s


def _python_calls(code: str) -> list[Found] | None:
    """``[f(a=1), g()]`` as closed calls, arguments as JSON; None if it is not such a list."""
    try:
        tree = ast.parse(code.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    found = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            return None
        if any(kw.arg is None for kw in node.keywords):
            return None
        try:
            args = {kw.arg: _literal(kw.value) for kw in node.keywords}
        except ValueError:
            return None
        found.append(Found("", node.func.id, json.dumps(args, ensure_ascii=False), True))
    return found


_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node):
    """A Python (or JSON) literal's value, as JSON can hold it; ValueError for anything else."""
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        keys = [_literal(k) for k in node.keys]
        if all(isinstance(k, str) for k in keys):
            return {k: _literal(v) for k, v in zip(keys, node.values)}
    raise ValueError("not a literal")


def _keywords(call: Call) -> str:
    values = call.argument_values()
    if not isinstance(values, dict):
        return ""
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in values.items())


def _with_definitions(schema, parameters: dict) -> dict:
    """A property's schema with the parameters' ``$defs`` / ``definitions`` beside it, so that its
    ``$ref``s to them (``#/$defs/...``) resolve when it is compiled on its own."""
    schema = schema if isinstance(schema, dict) else {}
    return {**{k: parameters[k] for k in ("$defs", "definitions") if k in parameters}, **schema}


def _keyword_rules(tool: Tool, p: str) -> list[str]:
    """Keyword arguments in the schema's order, the required ones always, each value JSON valid under
    its property's schema: rules ``{p}_a{j}_first`` (no argument written yet) and ``{p}_a{j}_next``."""
    props = list(tool.properties.items())
    required = set(tool.parameters.get("required") or ())
    rules = [f'{p}_a{len(props)}_first ::= ""', f'{p}_a{len(props)}_next ::= ""']
    for j, (name, schema) in enumerate(props):
        if not name.isidentifier():
            raise SpecserveError(f"{tool.where}.function.parameters: {name!r} cannot be a Python keyword argument "
                                 "(the pythonic tool parser)", f"{tool.where}.function.parameters")
        item, nxt = f"{p}_v{j}", f"{p}_a{j + 1}"
        rules.append(json_rules(_with_definitions(schema, tool.parameters), item, lookahead=False,
                                param=f"{tool.where}.function.parameters"))
        take_first = f"{literal(name + '=')} {item} {nxt}_next"
        take_next = f"{literal(', ' + name + '=')} {item} {nxt}_next"
        if name in required:
            rules += [f"{p}_a{j}_first ::= {take_first}", f"{p}_a{j}_next ::= {take_next}"]
        else:
            rules += [f"{p}_a{j}_first ::= ({take_first}) | {nxt}_first",
                      f"{p}_a{j}_next ::= ({take_next}) | {nxt}_next"]
    return rules
