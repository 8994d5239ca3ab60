"""Conversations with tools, as a chat template reads them.

A template with tool support (it reads ``tools``: Qwen 2.5 and 3, Llama 3.1-3.3, Hermes) renders the
tools, the assistant's calls and the tool results itself (transformers' ``apply_chat_template(tools=)``).
For a template without it (SmolLM2, Gemma 3) the conversation is rewritten in the call format's own
words, the documented fallback: a system prompt listing the tools and how to call them (after the
conversation's own system text), each assistant turn's calls written as the model would write them,
and tool results as a user turn; consecutive turns of one role are merged, as templates that insist
on alternating roles need.
"""

from __future__ import annotations

import json

from specserve.tools.base import CallFormat
from specserve.tools.spec import Call, Tool

FAMILY_MARKERS = (("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"), ("ipython", "llama3_json"),
                  ("<start_of_turn>", "pythonic"))


def supports_tools(template: str | None) -> bool:
    """Whether a chat template renders tools itself."""
    return bool(template) and "tools" in template


def family_of(template: str | None) -> str:
    """The call format a template's model writes (``hermes`` where the template does not say)."""
    return next((family for marker, family in FAMILY_MARKERS if template and marker in template), "hermes")


def render(messages: list[dict], tools: list[Tool], fmt: CallFormat, native: bool) -> tuple[list[dict], list | None]:
    """The messages and the ``tools`` argument to give the chat template.  ``messages``: OpenAI's
    (``tool_calls`` on assistant turns, ``role: tool`` results with ``tool_call_id``); ``native``:
    the template has tool support."""
    if native:
        return [_native(m) for m in messages], [t.openai() for t in tools] or None
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out: list[dict] = []
    if tools:
        system = fmt.system_prompt(tools)
        if messages and messages[0]["role"] == "system":
            system = f"{messages[0]['content']}\n\n{system}"
            messages = messages[1:]
        out.append({"role": "system", "content": system})
    results: list[tuple[str, str]] = []
    for m in messages + [{"role": "end"}]:
        if m["role"] == "tool":
            results.append((names.get(m.get("tool_call_id"), m.get("name") or ""), m.get("content") or ""))
            continue
        if results:
            _append(out, fmt.result_role, fmt.render_results(results))
            results = []
        if m["role"] == "end":
            break
        text = m.get("content") or ""
        calls = [Call(c["function"]["name"], c["function"]["arguments"], c["id"]) for c in m.get("tool_calls") or ()]
        if calls:
            text = (text + "\n" if text else "") + fmt.render_calls(calls)
        _append(out, m["role"], text)
    return out, None


def _append(out: list[dict], role: str, text: str) -> None:
    if out and out[-1]["role"] == role and role != "system":
        out[-1]["content"] += "\n\n" + text
    else:
        out.append({"role": role, "content": text})


def _native(m: dict) -> dict:
    """A message as tool-aware templates read it: call arguments as objects."""
    if not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        try:
            args = json.loads(c["function"]["arguments"])
        except ValueError:
            args = c["function"]["arguments"]
        calls.append({"id": c["id"], "type": "function", "function": {"name": c["function"]["name"], "arguments": args}})
    return {**m, "tool_calls": calls}
