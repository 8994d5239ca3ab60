"""Tool calling below the server: tools and choices checked, each family's parser on recorded model
outputs (malformed ones included), streamed deltas that add up to the whole reply, the call
grammars (every output they allow parses and validates), and prompts rendered by each family's
chat template (fixtures: Qwen 2.5, Qwen 3, Llama 3.1 and 3.2 with tool support; SmolLM2 and
Gemma 3 without, through the fallback)."""

import json
import random
from pathlib import Path

import jsonschema
import pytest
from toy_tokenizer import toy_tokenizer

from specserve.constrain.grammar import GrammarCompiler, GrammarSpec
from specserve.errors import SpecserveError
from specserve.tools import FORMATS, CallStream, Tool, ToolChoice, call_format, read, tools_of
from specserve.tools.prompt import family_of, render, supports_tools

FIXTURES = Path(__file__).parent / "fixtures" / "tools"
OUTPUTS = [json.loads(line) for line in (FIXTURES / "outputs.jsonl").read_text().splitlines() if line.strip()]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city"], "additionalProperties": False}
EMAIL = {"type": "object", "properties": {"to": {"type": "string", "maxLength": 10},
                                          "urgent": {"type": "boolean"}, "tags": {"type": "array", "maxItems": 2,
                                                                                  "items": {"enum": ["a", "b"]}}},
         "required": ["to", "urgent"], "additionalProperties": False}
TOOLS = [Tool("get_weather", "The forecast.", WEATHER), Tool("send_email", "Send an email.", EMAIL), Tool("ping")]


def assemble(deltas: list[dict]) -> tuple[str | None, list[tuple[str, str]]]:
    """OpenAI's streamed deltas put together as a client does: (content, [(name, arguments)])."""
    content, calls = "", {}
    for d in deltas:
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            call = calls.setdefault(tc["index"], ["", ""])
            if "id" in tc:
                assert tc["type"] == "function" and tc["id"].startswith("call_") and not call[0]
                call[0] = tc["function"]["name"]
            call[1] += tc["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return content or None, [tuple(calls[i]) for i in range(len(calls))]


def stream(fmt, text: str, forced: bool, step: int, complete: bool = True) -> list[dict]:
    s = CallStream(fmt, forced)
    deltas = [d for i in range(0, len(text), step) for d in s.feed(text[i:i + step])]
    return deltas + s.feed("", final=True, complete=complete)


# -- tools and choices ----------------------------------------------------------------------------

@pytest.mark.parametrize("doc, param", [
    ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name"),
    ([{"type": "function"}], "tools[0]"),
    ([{"type": "retrieval", "function": {"name": "f"}}], "tools[0]"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "city"}}}],
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}], "tools"),
])
def test_bad_tools_are_refused_naming_the_field(doc, param):
    with pytest.raises(SpecserveError) as e:
        tools_of(doc)
    assert e.value.param == param and "\n" not in str(e.value)


def test_tool_choice():
    assert ToolChoice.of(None, TOOLS).mode == "auto" and ToolChoice.of(None, []).mode == "none"
    named = ToolChoice.of({"type": "function", "function": {"name": "ping"}}, TOOLS)
    assert named.forced and [t.name for t in named.offered(TOOLS)] == ["ping"]
    assert ToolChoice.of("required", TOOLS).offered(TOOLS) == TOOLS and not ToolChoice.of("auto", TOOLS).forced
    for doc, tools in (("always", TOOLS), ({"type": "function", "function": {"name": "nope"}}, TOOLS),
                       ("required", []), ({"function": "ping"}, TOOLS)):
        with pytest.raises(SpecserveError) as e:
            ToolChoice.of(doc, tools)
        assert e.value.param == "tool_choice"
    with pytest.raises(SpecserveError, match="unknown; known: hermes, llama3_json, pythonic"):
        call_format("xml")


# -- parsing --------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", OUTPUTS, ids=[f"{c['family']}-{i}" for i, c in enumerate(OUTPUTS)])
def test_recorded_outputs_parse_as_expected(case):
    """Real outputs of each family from peers' parser tests (``source``), and written cases; a
    malformed call comes back as text.  Then the same text streamed in pieces of 1, 4 and 9
    characters adds up to exactly the whole reply."""
    fmt = call_format(case["family"])
    got = read(fmt, case["text"], final=True, forced=False)
    assert [(n, json.loads(a)) for n, a in got.calls] == [(c["name"], c["arguments"]) for c in case["calls"]]
    assert ((got.content or "").strip() or None) == case["content"]
    for step in (1, 4, 9):
        assert assemble(stream(fmt, case["text"], False, step)) == ((got.content or None), got.calls)


def test_recorded_outputs_cover_every_family_with_malformed_ones():
    for family in FORMATS:
        cases = [c for c in OUTPUTS if c["family"] == family]
        assert len(cases) >= 8 and sum(1 for c in cases if not c["calls"]) >= 3


def test_forced_calls_stream_from_their_name_on():
    """A constrained call shows its name as soon as it is written whole, then its arguments in
    pieces; cut short by the token limit, the call so far is the reply, streamed or not."""
    fmt = call_format("hermes")
    text = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","days":2}}\n</tool_call>'
    deltas = stream(fmt, text, True, 3)
    first = next(i for i, d in enumerate(deltas) if "tool_calls" in d)
    args = [d["tool_calls"][0]["function"]["arguments"] for d in deltas[first + 1:]]
    assert deltas[first]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert len(args) > 3 and "".join(args) == '{"city":"Oslo","days":2}'
    cut = text[:50]
    whole = read(fmt, cut, final=True, forced=True, complete=False)
    assert whole.calls == [("get_weather", cut.split('"arguments":')[1])] and whole.content is None
    assert len(whole.calls[0][1]) > 2
    assert assemble(stream(fmt, cut, True, 2, complete=False)) == (None, whole.calls)
    # unconstrained, a call shows only once it is complete, and a cut one is text
    assert read(fmt, cut, final=True, forced=False).calls == []
    assert all("tool_calls" not in d for d in stream(fmt, cut, False, 2))


def test_content_is_held_while_it_may_become_a_call():
    fmt = call_format("hermes")
    s = CallStream(fmt, False)
    assert s.feed("The answer <tool") == [{"content": "The answer "}]
    assert s.feed("box> is here") == [{"content": "<toolbox> is here"}]
    s = CallStream(fmt, False)
    assert s.feed("\n\n") == [] and s.feed('<tool_call>{"name":"ping","arguments":{}}</tool_call>')[0]["tool_calls"]
    assert s.feed("", final=True) == [] and s.final.content is None


# -- grammars -------------------------------------------------------------------------------------

def _compiler():
    pieces = [chr(c) for c in range(32, 127)] + ["\n", "<eos>"]
    return GrammarCompiler.from_vocab(pieces, [len(pieces) - 1]), pieces


def _walk(matcher, pieces, rng, limit=600) -> str | None:
    """A random output the grammar allows (uniform over allowed tokens at each step), or None if
    it runs past ``limit`` tokens."""
    from specserve.constrain.grammar import allowed, new_bitmask
    out = []
    for _ in range(limit):
        mask = new_bitmask(1, len(pieces))
        matcher.fill(mask, 0)
        ids = allowed(mask, len(pieces))[0].nonzero().flatten().tolist()
        t = rng.choice(ids)
        if t == len(pieces) - 1:
            return "".join(out)
        assert matcher.accept(t)
        out.append(pieces[t])
    return None


@pytest.mark.parametrize("family", sorted(FORMATS))
@pytest.mark.parametrize("parallel", [False, True])
def test_every_output_a_call_grammar_allows_parses_and_validates(family, parallel):
    """40 random walks through each format's grammar (seeded): each output parses into calls of the
    offered tools whose arguments validate against their schemas, one call unless parallel.  The
    grammar itself refuses a wrong name, a value outside an enum and a missing required argument."""
    compiler, pieces = _compiler()
    fmt = call_format(family)
    grammar = compiler.compile(GrammarSpec("grammar", fmt.grammar(TOOLS, parallel)))
    rng = random.Random(7)
    schemas = {t.name: t.parameters for t in TOOLS}
    seen = set()
    for _ in range(40):
        text = _walk(grammar.matcher(), pieces, rng)
        if text is None:
            continue
        got = read(fmt, text, final=True, forced=True)
        assert got.calls and got.content is None, text
        assert parallel or len(got.calls) == 1
        for name, args in got.calls:
            jsonschema.validate(json.loads(args), schemas[name])
            seen.add(name)
    assert seen == set(schemas)
    good = {"hermes": '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}}\n</tool_call>',
            "llama3_json": '{"name":"get_weather","parameters":{"city":"Oslo","unit":"celsius"}}',
            "pythonic": '[get_weather(city="Oslo", unit="celsius")]'}[family]
    assert _accepts(grammar, pieces, good)
    for bad in (good.replace("get_weather", "get_wether"), good.replace("celsius", "kelvin"),
                good.replace('"Oslo"', '"Oslo","x":1').replace('city="Oslo"', 'x=1')):
        assert not _accepts(grammar, pieces, bad), bad
    named = compiler.compile(GrammarSpec("grammar", fmt.grammar([TOOLS[1]], parallel)))
    assert not _accepts(named, pieces, good)


def _accepts(grammar, pieces, text: str) -> bool:
    m = grammar.matcher()
    return all(m.accept(pieces.index(c)) for c in text) and m.accept(len(pieces) - 1)


def test_pythonic_arguments_keep_the_schema_order_with_optional_ones_left_out():
    compiler, pieces = _compiler()
    grammar = compiler.compile(GrammarSpec("grammar", call_format("pythonic").grammar(TOOLS, False)))
    assert _accepts(grammar, pieces, '[get_weather(city="Oslo", days=3)]')
    assert _accepts(grammar, pieces, '[send_email(to="a", urgent=true, tags=["b"])]')
    assert _accepts(grammar, pieces, "[ping()]")
    assert not _accepts(grammar, pieces, '[get_weather(days=3, city="Oslo")]')
    assert not _accepts(grammar, pieces, '[send_email(urgent=true)]')
    with pytest.raises(SpecserveError, match="Python keyword argument"):
        call_format("pythonic").grammar([Tool("f", "", {"type": "object", "properties": {"a-b": {}}})], False)
    with pytest.raises(SpecserveError, match="cannot be called in Python syntax") as e:
        call_format("pythonic").grammar([Tool("get-weather")], False)
    assert e.value.param == "tools.function.name"
    assert "get-weather" in call_format("hermes").grammar([Tool("get-weather")], False)


# -- prompts --------------------------------------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"high": 7}'},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize("template, family, native", [
    ("qwen2.5", "hermes", True), ("qwen3", "hermes", True), ("llama3.1", "llama3_json", True),
    ("llama3.2", "llama3_json", True), ("smollm2", "hermes", False), ("gemma3", "pythonic", False),
])
def test_each_family_renders_tools_calls_and_results(template, family, native):
    """The tools, the assistant's call and the tool's result all reach the prompt, by the template
    where it supports tools, else in the fallback's words; the template is asked for the model's
    turn at the end, and the family is read from the template."""
    source = (FIXTURES / "templates" / f"{template}.jinja").read_text()
    assert supports_tools(source) == native and family_of(source) == family
    hf = toy_tokenizer(110, chat_template=source).hf
    msgs, tools = render(CONVERSATION, TOOLS, call_format(family), native)
    text = hf.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    for needle in ("get_weather", "The forecast.", "maxLength", "Oslo", 'high', "And tomorrow?", "Be brief."):
        assert needle in text, needle
    assert text.count("Weather in Oslo?") == 1
    if not native:
        written = {"hermes": '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>',
                   "pythonic": '[get_weather(city="Oslo")]'}[family]
        assert written in text and call_format(family).system_prompt(TOOLS).splitlines()[0] in text


def test_fallback_merges_turns_for_templates_that_alternate_roles():
    """Two results in a row make one user turn, and a user turn after them joins it, so Gemma's
    template (which refuses two user turns in a row) takes the conversation."""
    source = (FIXTURES / "templates" / "gemma3.jinja").read_text()
    convo = CONVERSATION[1:3] + [
        {"role": "tool", "tool_call_id": "call_1", "content": "first"},
        {"role": "tool", "tool_call_id": "call_2", "content": "second"},
        {"role": "user", "content": "Thanks."}]
    msgs, _ = render(convo, TOOLS, call_format("pythonic"), native=False)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    text = toy_tokenizer(110, chat_template=source).hf.apply_chat_template(msgs, tokenize=False,
                                                                          add_generation_prompt=True)
    assert "```tool_output\nfirst\n```\n```tool_output\nsecond\n```\n\nThanks." in text


def test_an_end_tag_inside_a_string_does_not_end_the_call():
    """The grammar lets a string hold any text, the end tag included: the call is still read whole."""
    fmt = call_format("hermes")
    text = '<tool_call>\n{"name":"send_email","arguments":{"to":"a","urgent":true,"body":"x</tool_call>y"}}\n</tool_call>'
    want = [("send_email", '{"to":"a","urgent":true,"body":"x</tool_call>y"}')]
    for forced in (True, False):
        assert read(fmt, text, final=True, forced=forced).calls == want
        assert assemble(stream(fmt, text, forced, 5)) == (None, want)


def test_the_servers_tool_parser_is_checked_when_built():
    from specserve.server.settings import ServerSettings

    assert ServerSettings(tool_parser="pythonic").tool_parser == "pythonic"
    with pytest.raises(SpecserveError, match="--tool-parser must be auto or one of hermes, llama3_json, pythonic"):
        ServerSettings(tool_parser="xml")


def test_schemas_with_definitions_and_refs_compile_in_every_format():
    """``$ref`` to ``$defs`` resolves in each format's grammar (pythonic compiles each property on
    its own), and a schema xgrammar cannot compile is a one-line error naming the parameters."""
    compiler, pieces = _compiler()
    params = {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "required": ["a"],
              "$defs": {"x": {"type": "integer", "enum": [1, 2]}}}
    for family in FORMATS:
        grammar = compiler.compile(GrammarSpec("grammar", call_format(family).grammar([Tool("f", "", params)], False)))
        good = {"hermes": '<tool_call>\n{"name":"f","arguments":{"a":2}}\n</tool_call>',
                "llama3_json": '{"name":"f","parameters":{"a":2}}', "pythonic": "[f(a=2)]"}[family]
        assert _accepts(grammar, pieces, good) and not _accepts(grammar, pieces, good.replace("2", "3"))
    bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(SpecserveError) as e:
        call_format("hermes").grammar([Tool("f", "", bad)], False)
    assert e.value.param == "tools.function.parameters" and "\n" not in str(e.value)
    assert not str(e.value).split("compile: ")[1].startswith("[")
