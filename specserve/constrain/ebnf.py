"""EBNF pieces for grammars that embed JSON values in text of their own (tool calls).

xgrammar writes a JSON Schema's grammar as EBNF rules, ``root`` first among them; ``json_rules``
renames every rule of it under one prefix, so that several schemas' rules live side by side in one
grammar, each value reachable by its prefix as a rule name.  ``literal`` quotes a text for EBNF.
The JSON is compact, as for ``response_format`` (``grammar.SEPARATORS``).
"""

from __future__ import annotations

import json
import re

from specserve.constrain.grammar import SEPARATORS, one_line
from specserve.errors import SpecserveError

_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= (.*)$")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def literal(text: str) -> str:
    """``text`` as an EBNF string literal (JSON's escapes, which xgrammar's EBNF reads)."""
    return json.dumps(text, ensure_ascii=True)


def json_rules(schema: dict, prefix: str, lookahead: bool = True, param: str = "tools") -> str:
    """The rules of JSON valid under ``schema`` (compact; no properties beyond the schema's), renamed
    so that the value's rule is ``prefix`` and every other rule starts with ``prefix_``.  Without
    ``lookahead`` the rules drop xgrammar's lookahead assertions, which expect a JSON delimiter after
    a string or number: needed where the value is followed by other text (``)`` in a Python call).
    A schema xgrammar cannot compile raises ``SpecserveError`` naming ``param``."""
    import xgrammar as xgr

    try:
        text = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=SEPARATORS,
                                                strict_mode=True))
    except Exception as e:  # noqa: BLE001 - xgrammar's conversion errors, shown as one line
        raise SpecserveError(f"{param}: a JSON Schema this server cannot compile: {one_line(e)}", param) from None
    rules = [_RULE.match(line) for line in text.splitlines() if line.strip()]
    if any(m is None for m in rules):
        raise SpecserveError(f"{param}: unexpected grammar text from xgrammar", param)
    names = {m.group(1): (prefix if m.group(1) == "root" else f"{prefix}_{m.group(1)}") for m in rules}
    return "\n".join(f"{names[m.group(1)]} ::= {_rewrite(m.group(2), names, lookahead)}" for m in rules)


def _rewrite(body: str, names: dict[str, str], lookahead: bool) -> str:
    """A rule's body with its rule references renamed (text in quotes and character classes kept)
    and, without ``lookahead``, its lookahead assertions ``(= ...)`` left out."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c in "\"[":
            j = _skip_quoted(body, i)
            out.append(body[i:j])
            i = j
        elif body.startswith("(=", i) and not lookahead:
            i = _skip_group(body, i)
        else:
            m = _IDENT.match(body, i)
            if m and (i == 0 or not (body[i - 1].isalnum() or body[i - 1] == "_")):
                out.append(names.get(m.group(0), m.group(0)))
                i = m.end()
            else:
                out.append(c)
                i += 1
    return "".join(out)


def _skip_quoted(body: str, i: int) -> int:
    """The index after the string literal or character class that starts at ``i``."""
    close = '"' if body[i] == '"' else "]"
    j = i + 1
    while j < len(body) and body[j] != close:
        j += 2 if body[j] == "\\" else 1
    return j + 1


def _skip_group(body: str, i: int) -> int:
    """The index after the parenthesised group that starts at ``i``."""
    depth, j = 0, i
    while j < len(body):
        if body[j] in "\"[":
            j = _skip_quoted(body, j)
            continue
        depth += {"(": 1, ")": -1}.get(body[j], 0)
        j += 1
        if depth == 0:
            return j
    return j
