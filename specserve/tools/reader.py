"""One reply's calls read out of its text: whole at the end, and as OpenAI's streamed deltas.

``read`` says what a reply holds at a moment: its content and its calls.  Before the end it holds
back what may still change (text that may become a call; content that is only whitespace so far)
and, unless the output is constrained to calls, every call until it is complete; a constrained
call is shown from its name on, its arguments as they are written.  So each later reading extends
the earlier one, and ``CallStream``'s deltas add up to exactly the reply ``read`` gives at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.tools.base import CallFormat
from specserve.tools.spec import Call


@dataclass
class Reading:
    content: str | None                                       # None: calls only
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments text)


def read(fmt: CallFormat, text: str, final: bool, forced: bool, complete: bool = True) -> Reading:
    """What the output ``text`` holds.  ``final``: the output has ended (``complete``: by itself,
    not cut short by a token limit); ``forced``: a grammar constrains it to ``fmt``'s calls, so a call
    is kept from its name on (at the end too, when cut short)."""
    partial = not final or (forced and not complete)
    pieces = fmt.scan(text, final=not partial)
    calls, content = [], []
    for piece in pieces:
        if isinstance(piece, str):
            content.append(piece)
            continue
        keep = piece.closed or (forced and piece.name is not None)
        if not keep and not final:
            break                    # an open call: nothing after it is settled yet
        if keep:
            calls.append(piece)
        else:
            content.append(piece.raw)    # at the end, a call that did not complete is text
    joined = "".join(content)
    named = [(c.name, c.arguments) for c in calls]
    if not final:
        return Reading(joined if joined.strip() else "", named)
    return Reading(joined if joined.strip() or not calls else None, named)


def calls_of(reading: Reading) -> list[Call]:
    return [Call(name, args) for name, args in reading.calls]


class CallStream:
    """The streamed deltas of one reply: ``feed`` the text as it grows, get OpenAI's ``delta``
    objects (``content``, or ``tool_calls`` entries: a call's id, type and name first, then its
    arguments in pieces, each with the call's index)."""

    def __init__(self, fmt: CallFormat, forced: bool):
        self.fmt, self.forced = fmt, forced
        self.text, self.content = "", ""
        self.sent: list[list[str]] = []            # per call: [id, arguments sent]
        self.final = Reading("")                   # the latest reading

    def feed(self, delta: str, final: bool = False, complete: bool = True) -> list[dict]:
        self.text += delta
        now = read(self.fmt, self.text, final, self.forced, complete)
        out = []
        content = now.content or ""
        if len(content) > len(self.content) and content.startswith(self.content):
            out.append({"content": content[len(self.content):]})
            self.content = content
        for i, (name, args) in enumerate(now.calls):
            if i == len(self.sent):
                call = Call(name, "")
                self.sent.append([call.id, ""])
                out.append({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                            "function": {"name": name, "arguments": ""}}]})
            before = self.sent[i][1]
            if len(args) > len(before) and args.startswith(before):
                out.append({"tool_calls": [{"index": i, "function": {"arguments": args[len(before):]}}]})
                self.sent[i][1] = args
        self.final = now
        return out

    def calls(self) -> list[Call]:
        """The calls sent, with their ids (after the final ``feed``)."""
        return [Call(name, args, self.sent[i][0]) for i, (name, args) in enumerate(self.final.calls)]
