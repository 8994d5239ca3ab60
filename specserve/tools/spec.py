"""What a request says about tools: the functions it offers, the choice it leaves the model, and
the calls a reply carries.

``Tool`` is one function (OpenAI's ``{"type": "function", "function": {...}}``), checked when built:
a name of 1-64 letters, digits, ``_`` or ``-``, and parameters that are a valid JSON Schema of an
object.  ``ToolChoice`` is ``none`` (the model writes text), ``auto`` (text or calls, as the model
chooses), ``required`` (one call or more) or one named function.  ``Call`` is a call as a reply
carries it: the function's name and its arguments as JSON text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from specserve.errors import SpecserveError

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")      # OpenAI's rule for a function's name
MODES = ("none", "auto", "required", "named")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: dict(EMPTY_PARAMETERS), hash=False, compare=False)
    where: str = "tools"          # the request field it came from, for errors

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise SpecserveError(f"{self.where}.function.name: {self.name!r} must be 1-64 letters, digits, "
                                 "'_' or '-'", f"{self.where}.function.name")
        check_schema(self.parameters, f"{self.where}.function.parameters")

    @property
    def properties(self) -> dict:
        return self.parameters.get("properties") or {}

    def openai(self) -> dict:
        """The tool as OpenAI writes it (what chat templates read)."""
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}


def check_schema(schema, where: str) -> None:
    """Refuse (``SpecserveError`` naming ``where``) parameters that are not a JSON Schema of an object."""
    if not isinstance(schema, dict):
        raise SpecserveError(f"{where}: a JSON Schema object is required", where)
    if schema.get("type", "object") != "object":
        raise SpecserveError(f"{where}: the parameters' type must be 'object', got {schema.get('type')!r}", where)
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise SpecserveError(f"{where}: not a valid JSON Schema: {e.message}", where) from None


def tools_of(doc: list[dict]) -> list[Tool]:
    """A request's ``tools`` (OpenAI's form) as ``Tool``s; a repeated name is refused."""
    tools: list[Tool] = []
    for i, t in enumerate(doc):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise SpecserveError(f"tools[{i}]: a tool is {{'type': 'function', 'function': {{...}}}}", f"tools[{i}]")
        if not isinstance(fn.get("name"), str):
            raise SpecserveError(f"tools[{i}].function.name: a string is required", f"tools[{i}].function.name")
        params = fn.get("parameters")
        tools.append(Tool(fn["name"], fn.get("description") or "",
                          EMPTY_PARAMETERS if params is None else params, f"tools[{i}]"))
    names = [t.name for t in tools]
    repeated = next((n for n in names if names.count(n) > 1), None)
    if repeated is not None:
        raise SpecserveError(f"tools: the function name {repeated!r} appears twice", "tools")
    return tools


@dataclass(frozen=True)
class ToolChoice:
    mode: str = "auto"            # one of MODES
    name: str | None = None       # the function, for mode "named"

    @classmethod
    def of(cls, doc, tools: list[Tool]) -> "ToolChoice":
        """OpenAI's ``tool_choice`` (``"none"``, ``"auto"``, ``"required"``, or ``{"type": "function",
        "function": {"name": ...}}``; absent: ``auto`` with tools, ``none`` without), checked against
        the tools offered."""
        if doc is None:
            return cls("auto" if tools else "none")
        if isinstance(doc, str):
            if doc not in ("none", "auto", "required"):
                raise SpecserveError(f"tool_choice: 'none', 'auto', 'required' or a named function, got {doc!r}",
                                     "tool_choice")
            choice = cls(doc)
        else:
            fn = doc.get("function") if isinstance(doc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise SpecserveError("tool_choice: a named choice is {'type': 'function', 'function': {'name': ...}}",
                                     "tool_choice")
            choice = cls("named", fn["name"])
            if fn["name"] not in {t.name for t in tools}:
                raise SpecserveError(f"tool_choice: no tool named {fn['name']!r} in tools", "tool_choice")
        if choice.mode in ("required", "named") and not tools:
            raise SpecserveError(f"tool_choice {choice.mode!r} needs tools", "tool_choice")
        return choice

    @property
    def forced(self) -> bool:
        """Whether the reply must be calls (the output is constrained to the call syntax)."""
        return self.mode in ("required", "named")

    def offered(self, tools: list[Tool]) -> list[Tool]:
        """The tools the model may call under this choice."""
        return [t for t in tools if t.name == self.name] if self.mode == "named" else list(tools)


@dataclass(frozen=True)
class Call:
    """A function call as a reply carries it; ``arguments``: JSON text, as the model wrote it."""
    name: str
    arguments: str
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def argument_values(self):
        """The arguments parsed (None where they are not JSON)."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return None
