"""``specserve bench agent``: agent loops with tool calls, every method against plain decoding.

The workload (``specserve/data/bench/agent.json``, or ``--workload``) is conversations, each with
a few tools from one catalogue (the same schemas come back across conversations) and user turns.
A user turn names its ``tool_choice``: the model is asked for a call (``required`` or a named
function, constrained to the call syntax), the call's result (a deterministic stand-in for the
tool) goes back as a ``tool`` turn, and the model answers under ``auto``, free to write text or call
again (at most ``MAX_ROUNDS`` calls a user turn).  Every generation's prompt is the whole
conversation so far, rendered as the server renders it (``LLM.encode_tools``), and the engine keeps
earlier prompts' KV in its prefix pool, as ``specserve serve`` does.

Methods take conversations in rotated order (``datasets.rotation``), each running a conversation
whole, greedy; plain decoding is the reference.  Per method: the end-to-end seconds (every
generation's, prefill included), its speed-up over plain, mean accepted length, and of its calls how
many parsed, how many validate against their tool's schema (``jsonschema``), how many a stream
(the text fed token by token through ``tools.CallStream``) assembles to exactly, and how many
generations differ from plain decoding's tokens.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from specserve.bench.datasets import rotation
from specserve.bench.runner import Method, cpu_name
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams

WORKLOAD = Path(__file__).resolve().parent.parent / "data" / "bench" / "agent.json"
MAX_ROUNDS = 2          # calls the model may make under ``auto`` after a user turn's first
PER_STEP = ("token_times_s", "step_predicted_s", "step_measured_s")   # not kept in the records


@dataclass
class AgentConfig:
    methods: list[str]
    workload: str | None = None
    conversations: int | None = None        # the first N (None: all)
    max_tokens: int = 192
    model: str = "default"
    parallel: bool = False                  # parallel_tool_calls of the constrained turns
    tool_parser: str = "auto"               # the call format (auto: the chat template's)


def load_workload(path: str | None) -> dict:
    """The workload's tools and conversations, checked (a turn's named tool must be one of its tools)."""
    p = Path(path) if path else WORKLOAD
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise SpecserveError(f"cannot read the agent workload {p}: {e}") from None
    from specserve.tools import tools_of

    catalogue = {name: t for name, t in doc.get("tools", {}).items()}
    tools_of(list(catalogue.values()))
    for conv in doc.get("conversations", []):
        for name in conv["tools"]:
            if name not in catalogue:
                raise SpecserveError(f"{p}: conversation {conv['id']} names the unknown tool {name!r}")
        for turn in conv["turns"]:
            if turn["tool_choice"] not in ("auto", "required", "none", *conv["tools"]):
                raise SpecserveError(f"{p}: conversation {conv['id']}: tool_choice {turn['tool_choice']!r}")
    if not doc.get("conversations"):
        raise SpecserveError(f"{p}: no conversations")
    return doc


def tool_result(name: str, arguments: dict) -> str:
    """A deterministic stand-in for the tool's answer: JSON that depends on the arguments."""
    h = int(hashlib.sha256(f"{name}:{json.dumps(arguments, sort_keys=True)}".encode()).hexdigest(), 16)
    if name == "get_weather":
        return json.dumps({"city": arguments.get("city"), "unit": arguments.get("unit", "celsius"),
                           "forecast": [{"day": d + 1, "high": 10 + (h >> d) % 15, "low": 2 + (h >> (d + 8)) % 8,
                                         "sky": ["sunny", "cloudy", "rain"][(h >> d) % 3]}
                                        for d in range(min(int(arguments.get("days", 1) or 1), 3))]})
    if name == "get_order_status":
        return json.dumps({"order_id": arguments.get("order_id"), "status": ["shipped", "delayed", "processing"][h % 3],
                           "carrier": "PostNord", "expected": f"2026-01-{10 + h % 18:02d}"})
    if name == "convert_currency":
        amount = float(arguments.get("amount", 0) or 0)
        return json.dumps({"amount": round(amount * (0.8 + (h % 40) / 100), 2), "currency": arguments.get("to_currency")})
    return json.dumps({"ok": True, "result": f"{name} done", "id": h % 100000})


class Conversation:
    """One method's run of one conversation: generations in order, each with its record."""

    def __init__(self, llm, fmt, catalogue: dict, conv: dict, method: Method, cfg: AgentConfig):
        from specserve.tools import tools_of
        self.llm, self.fmt, self.method, self.cfg = llm, fmt, method, cfg
        self.tools = tools_of([catalogue[n] for n in conv["tools"]])
        self.messages = [{"role": "system", "content": conv["system"]}] if conv.get("system") else []
        self.conv, self.records = conv, []

    def run(self) -> list[dict]:
        for t, turn in enumerate(self.conv["turns"]):
            self.messages.append({"role": "user", "content": turn["user"]})
            choice = turn["tool_choice"]
            for r in range(MAX_ROUNDS + 1):
                calls = self.generate(choice if r == 0 else "auto", f"{t}.{r}")
                if not calls:
                    break
        return self.records

    def generate(self, choice_name: str, where: str) -> list:
        """One generation under ``choice_name``; its calls answered by ``tool_result`` (none: the
        model answered in text, or its call did not parse)."""
        from specserve.constrain import GrammarSpec
        from specserve.server.streaming import TextStream
        from specserve.tools import CallStream, ToolChoice, read

        doc = choice_name if choice_name in ("auto", "required", "none") else \
            {"type": "function", "function": {"name": choice_name}}
        choice = ToolChoice.of(doc, self.tools)
        grammar = self.llm.grammar(GrammarSpec("grammar", self.fmt.grammar(choice.offered(self.tools), self.cfg.parallel))) \
            if choice.forced else None
        ids = self.llm.encode_tools(self.messages, self.tools, self.fmt)
        req = self.llm.request(ids, self.cfg.max_tokens, SamplingParams(), self.method.label, self.method.k,
                               grammar=grammar)
        start = time.perf_counter()
        res = self.llm.engine.generate([req])[0]
        wall = time.perf_counter() - start
        text = self.llm.tokenizer.decode(res.tokens)
        complete = res.finish_reason == "stop"
        reading = read(self.fmt, text, True, choice.forced, complete)
        stream, pieces = CallStream(self.fmt, choice.forced), TextStream(self.llm, [])
        for t in res.tokens:                                 # as the server streams it, token by token
            stream.feed(pieces.feed([t], final=False))
        stream.feed(pieces.feed([], final=True), final=True, complete=complete)
        streamed = [(c.name, c.arguments) for c in stream.calls()] == reading.calls and \
            (stream.content or None) == (reading.content or None)
        valid = [self._valid(name, args) for name, args in reading.calls]
        stats = {k: v for k, v in res.stats.to_dict().items() if k not in PER_STEP}
        self.records.append(stats | {
            "conversation": self.conv["id"], "turn": where, "tool_choice": choice_name, "wall_s": wall,
            "tokens": res.tokens, "finish_reason": res.finish_reason, "calls": len(reading.calls),
            "valid_calls": sum(valid), "streamed_equal": streamed, "text": text})
        if not reading.calls:
            self.messages.append({"role": "assistant", "content": text})
            return []
        calls = [{"id": f"call_{where}_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                 for i, (n, a) in enumerate(reading.calls)]
        self.messages.append({"role": "assistant", "content": reading.content, "tool_calls": calls})
        for c, ok in zip(calls, valid):
            args = json.loads(c["function"]["arguments"]) if ok else {}
            result = tool_result(c["function"]["name"], args) if ok else json.dumps({"error": "invalid arguments"})
            self.messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
        return calls

    def _valid(self, name: str, arguments: str) -> bool:
        """Whether the call names one of the conversation's tools, with arguments valid under its schema."""
        import jsonschema
        tool = next((t for t in self.tools if t.name == name), None)
        if tool is None:
            return False
        try:
            jsonschema.validate(json.loads(arguments), tool.parameters)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True


def run_agent(cfg: AgentConfig, options=None, log=print) -> dict:
    """Every method over every conversation (plain decoding first among them, as the reference)."""
    from specserve.control import PrefillPolicy
    from specserve.llm import LLM, freeze_heap

    workload = load_workload(cfg.workload)
    convs = workload["conversations"][:cfg.conversations] if cfg.conversations else workload["conversations"]
    methods = [Method.parse("none")] + [m for m in map(Method.parse, cfg.methods) if m.label != "none"]
    llm = LLM(cfg.model, options, drafters={m.label: {"drafter": m.drafter, **m.options} for m in methods[1:]},
              max_batch=1, max_len=4096, prefill=PrefillPolicy(256, 5.0, 256))
    freeze_heap()
    fmt = llm.call_format(cfg.tool_parser)
    warm = dict(convs[0], turns=convs[0]["turns"][:1])
    for m in methods:                                   # warm-up: grammars compiled, kernels and drafters ready
        Conversation(llm, fmt, workload["tools"], warm, m, AgentConfig(cfg.methods, max_tokens=16)).run()
    llm.reset_memory()
    records: dict[str, list[dict]] = {m.label: [] for m in methods}
    for i, conv in enumerate(convs):
        for m in (methods[j] for j in rotation(len(methods), i)):
            records[m.label] += Conversation(llm, fmt, workload["tools"], conv, m, cfg).run()
        log(f"  conversation {i + 1}/{len(convs)}")
    plain = records["none"]
    summary = {m.label: summarise(records[m.label], plain) for m in methods}
    return {"cpu": cpu_name(), "model": cfg.model, "call_format": fmt.name, "max_tokens": cfg.max_tokens,
            "parallel_tool_calls": cfg.parallel, "conversations": len(convs), "summary": summary,
            "records": records}


def summarise(recs: list[dict], plain: list[dict]) -> dict:
    """One method's figures over its generations (``plain``: plain decoding's, the reference)."""
    wall, plain_wall = sum(r["wall_s"] for r in recs), sum(r["wall_s"] for r in plain)
    tokens = sum(len(r["tokens"]) for r in recs)
    passes = sum(r["verify_passes"] for r in recs)
    forced = [r for r in recs if r["tool_choice"] != "auto"]
    divergent = sum(1 for i, r in enumerate(recs) if i >= len(plain) or r["tokens"] != plain[i]["tokens"])
    return {"generations": len(recs), "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0.0,
            "speedup": plain_wall / wall if wall else 0.0,
            "mean_accepted_length": (sum(r["accepted_tokens"] for r in recs) + passes) / passes if passes else 0.0,
            "forced": len(forced), "forced_parsed": sum(1 for r in forced if r["calls"] >= 1),
            "forced_valid": sum(1 for r in forced if r["calls"] >= 1 and r["valid_calls"] == r["calls"]),
            "calls": sum(r["calls"] for r in recs), "auto_calls": sum(r["calls"] for r in recs if r["tool_choice"] == "auto"),
            "streamed_equal": sum(1 for r in recs if r["streamed_equal"]),
            "divergent": divergent + abs(len(recs) - len(plain))}


def render_agent(doc: dict) -> str:
    lines = [f"agent loops: {doc['conversations']} conversations, {doc['call_format']} calls, greedy, "
             f"max_tokens {doc['max_tokens']}, CPU {doc['cpu']}", "",
             "| method | generations | tokens | seconds | tok/s | vs plain | accepted length | forced calls parsed "
             "| valid | streams equal | divergent |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, s in doc["summary"].items():
        lines.append(f"| {label} | {s['generations']} | {s['tokens']} | {s['wall_s']:.1f} | {s['tokens_per_s']:.1f} | "
                     f"{s['speedup']:.2f}x | {s['mean_accepted_length']:.2f} | {s['forced_parsed']}/{s['forced']} | "
                     f"{s['forced_valid']}/{s['forced']} | {s['streamed_equal']}/{s['generations']} | "
                     f"{s['divergent']} |")
    return "\n".join(lines)
