"""``specserve bench SUBCOMMAND``: the benchmark's subcommands beside ``specserve bench``'s own run.

``specserve.cli.main`` hands ``specserve bench WORD ...`` here when WORD is one of ``COMMANDS``;
any other ``specserve bench ...`` is the benchmark run of ``specserve.cli`` (options only, as before).
Each subcommand checks its flags and reads its prompts before it loads a model (which checks
``--model``), and refuses bad input with ``SpecserveError`` (one line, exit status 2).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from specserve.cli_args import Parser, model_arg, runtime_args, runtime_options
from specserve.errors import SpecserveError

COMMANDS = {
    "soak": "a mixed HTTP load on one server in this process: errors, memory and what the engine holds at the end",
    "interleaved": "methods against plain decoding at one concurrency level, each over every prompt, in rotated "
                   "order, for several rounds",
    "steps": "where a decoding step's time goes, per method (the engine's timers), at concurrency 1",
    "compare": "the tokens of two `specserve bench` runs, method by method, on the prompts both ran",
    "agent": "agent loops with tool calls (multi-turn, tool results fed back), every method against plain decoding",
}


def epilog() -> str:
    """What ``specserve bench --help`` says of the subcommands."""
    return "subcommands (specserve bench SUBCOMMAND --help): " + "; ".join(
        f"{name}: {text}" for name, text in COMMANDS.items())


def _writable(path: str | None, flag: str) -> None:
    """Refuse an output file whose folder does not exist, before a long run."""
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise SpecserveError(f"{flag}: no folder {Path(path).resolve().parent}")


def _write_json(path: str | None, doc: dict) -> None:
    if path is None:
        return
    try:
        Path(path).write_text(json.dumps(doc, indent=1))
    except OSError as e:
        raise SpecserveError(f"cannot write {path}: {e.strerror}") from None


def _run_logged(args: argparse.Namespace, cfg, run, render) -> int:
    """``run(cfg, runtime options, log)`` with each log line printed as it comes, then ``render``'s
    report of its document; the document into ``--json`` where asked (checked writable first)."""
    _writable(args.json, "--json")
    doc = run(cfg, runtime_options(args), log=lambda line: print(line, flush=True))
    print(render(doc))
    _write_json(args.json, doc)
    return 0


def _methods(text: str) -> list[str]:
    """Comma-separated drafter specs, each checked (a typo is refused before the model loads)."""
    from specserve.bench.runner import Method

    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods:
        raise SpecserveError("--methods names no method")
    for m in methods:
        Method.parse(m)
    return methods


def _soak_parser(p: argparse.ArgumentParser) -> None:
    model_arg(p)
    p.add_argument("--minutes", type=float, required=True, help="how long the load runs")
    p.add_argument("--concurrency", type=int, required=True, help="client threads sending requests")
    p.add_argument("--max-requests", type=int, default=None, help="stop the load after this many requests")
    p.add_argument("--drafters", default="ngram,ngram-tree,suffix,lookahead,eagle,medusa",
                   help="loaded besides none and the cheap ones; the first is the server's default")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument("--warmup-s", type=float, default=None, help="default: min(120, a third of the run)")
    p.add_argument("--gc-batch", type=int, default=20, help="requests per type in the object census")
    p.add_argument("--sample-s", type=float, default=30.0, help="seconds between two sample rows")
    p.add_argument("--max-growth-mb", type=float, default=100.0, help="RSS growth after the warm-up that fails")
    p.add_argument("--max-batch", type=int, default=4, help="the server's KV rows")
    p.add_argument("--max-waiting", type=int, default=64, help="the server's waiting places")
    p.add_argument("--seed", type=int, default=0, help="seeds the clients' choices")


def cmd_soak(args: argparse.Namespace) -> int:
    from specserve.bench.soak import SoakConfig, run_soak
    from specserve.drafters import DrafterSpec

    if args.minutes <= 0 or args.sample_s <= 0:
        raise SpecserveError("--minutes and --sample-s must be > 0")
    if min(args.concurrency, args.max_batch, args.max_waiting) < 1 or (args.max_requests or 1) < 1:
        raise SpecserveError("--concurrency, --max-batch, --max-waiting and --max-requests must be >= 1")
    if args.gc_batch < 0 or (args.warmup_s or 0) < 0:
        raise SpecserveError("--gc-batch and --warmup-s must be >= 0")
    cfg = SoakConfig(**vars(args))
    for d in cfg.drafter_list:
        DrafterSpec.parse(d)
    _writable(cfg.out, "--out")
    return run_soak(cfg)


def _prompts_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", default=None, help="a JSONL file of prompts ({prompt or turns, category}) instead "
                   "of Spec-Bench")


def _interleaved_parser(p: argparse.ArgumentParser) -> None:
    model_arg(p)
    p.add_argument("--methods", required=True, help="comma-separated drafter specs name[:option=value]...; plain "
                   "decoding always runs, first")
    p.add_argument("--concurrency", type=int, default=1, help="requests the engine runs together")
    p.add_argument("--num-prompts", type=int, default=24, help="prompts: every (N / this)-th of the N there are")
    p.add_argument("--rounds", type=int, default=2, help="times every method runs every prompt")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default); above 0: sampled, "
                   "prompt i seeded with i")
    _prompts_arg(p)
    p.add_argument("--json", default=None, help="also write every run and the summary to this JSON file")
    runtime_args(p)


def cmd_interleaved(args: argparse.Namespace) -> int:
    from specserve.bench.interleaved import InterleavedConfig, render_interleaved, run_interleaved

    cfg = InterleavedConfig(_methods(args.methods), args.concurrency, args.num_prompts, args.rounds, args.max_tokens,
                            args.prompts, args.model, args.temperature)
    return _run_logged(args, cfg, run_interleaved, render_interleaved)


def _steps_parser(p: argparse.ArgumentParser) -> None:
    model_arg(p)
    p.add_argument("--methods", default="none,ngram-tree,auto", help="comma-separated drafter specs, run as named")
    p.add_argument("--per-group", type=int, default=2, help="prompts per group (the first ones, in file order)")
    p.add_argument("--groups", default="all", help="all, or comma-separated groups (Spec-Bench's, or the "
                   "categories of --prompts)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    _prompts_arg(p)
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    runtime_args(p)


def cmd_steps(args: argparse.Namespace) -> int:
    from specserve.bench.steps import StepsConfig, render_steps, run_steps

    groups = None if args.groups == "all" else [g.strip() for g in args.groups.split(",") if g.strip()]
    cfg = StepsConfig(_methods(args.methods), args.per_group, groups, args.max_tokens, args.prompts, args.model)
    _writable(args.json, "--json")
    doc = run_steps(cfg, runtime_options(args))
    print("\n".join(render_steps(doc)))
    _write_json(args.json, doc)
    return 0


def _compare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("before", help="a `specserve bench` results.json, or the folder holding it")
    p.add_argument("after", help="the other run's")
    p.add_argument("--methods", default="", help="comma-separated labels (default: every method both ran)")


def cmd_compare(args: argparse.Namespace) -> int:
    from specserve.bench.compare import compare_tokens, load_results, render_comparison

    labels = [m.strip() for m in args.methods.split(",") if m.strip()] or None
    rows = compare_tokens(load_results(args.before), load_results(args.after), labels)
    print("\n".join(render_comparison(rows)))
    return 0


def _agent_parser(p: argparse.ArgumentParser) -> None:
    model_arg(p)
    p.add_argument("--methods", default="ngram,ngram-tree,suffix,lookahead,eagle,medusa,layerskip,auto",
                   help="comma-separated drafter specs; plain decoding always runs, as the reference")
    p.add_argument("--workload", default=None, help="a JSON file of tools and conversations (default: the shipped one)")
    p.add_argument("--conversations", type=int, default=None, help="run the first N conversations (default: all)")
    p.add_argument("--max-tokens", type=int, default=192, help="tokens per generation at most")
    p.add_argument("--parallel-tool-calls", action="store_true", help="let constrained turns make several calls")
    p.add_argument("--tool-parser", default="auto", help="the call format: hermes, llama3_json, pythonic, or auto "
                   "(the chat template's)")
    p.add_argument("--json", default=None, help="also write every generation and the summary to this JSON file")
    runtime_args(p)


def cmd_agent(args: argparse.Namespace) -> int:
    from specserve.bench.agent import AgentConfig, load_workload, render_agent, run_agent

    if args.max_tokens < 1 or (args.conversations is not None and args.conversations < 1):
        raise SpecserveError("--max-tokens and --conversations must be >= 1")
    load_workload(args.workload)
    if args.tool_parser != "auto":
        from specserve.tools import call_format
        call_format(args.tool_parser)
    cfg = AgentConfig(_methods(args.methods), args.workload, args.conversations, args.max_tokens, args.model,
                      args.parallel_tool_calls, args.tool_parser)
    return _run_logged(args, cfg, run_agent, render_agent)


_PARSERS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "soak": (_soak_parser, cmd_soak), "interleaved": (_interleaved_parser, cmd_interleaved),
    "steps": (_steps_parser, cmd_steps), "compare": (_compare_parser, cmd_compare),
    "agent": (_agent_parser, cmd_agent),
}


def build_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``specserve bench NAME``."""
    p = Parser(prog=f"specserve bench {name}", description=COMMANDS[name])
    _PARSERS[name][0](p)
    return p


def main(name: str, argv: list[str]) -> int:
    """``specserve bench NAME argv...``: its status (errors raise ``SpecserveError``)."""
    return _PARSERS[name][1](build_parser(name).parse_args(argv))
