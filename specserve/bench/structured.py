"""A workload's structured outputs in the bench: each prompt's grammar, and whether an output is valid.

A prompt file line may carry an OpenAI ``response_format``; every method then decodes that prompt
under its grammar (a method written ``name:grammar=off`` ignores it: plain decoding that way
measures what masking costs).  ``valid`` checks an output independently of the grammar engine: JSON
parsed with ``json`` and validated with ``jsonschema``, a regular expression with Python's ``re``.
"""

from __future__ import annotations

import json
import re

from specserve.constrain.grammar import from_response_format


def grammars(llm, prompts) -> list:
    """Each prompt's compiled grammar (None: free text)."""
    out = []
    for p in prompts:
        spec = from_response_format(p.response_format) if p.response_format else None
        out.append(llm.grammar(spec) if spec is not None else None)
    return out


def valid(text: str, rf: dict | None) -> bool | None:
    """Whether ``text`` satisfies ``rf`` (None: nothing to check, or a grammar only its engine reads)."""
    if not rf or rf.get("type") in ("text", "grammar"):
        return None
    if rf["type"] == "regex":
        return re.fullmatch(rf["regex"], text) is not None
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    if rf["type"] == "json_object":
        return isinstance(doc, dict)
    import jsonschema
    try:
        jsonschema.validate(doc, rf["json_schema"]["schema"])
    except jsonschema.ValidationError:
        return False
    return True
