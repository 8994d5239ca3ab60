"""Command line: ``specserve generate``, ``serve`` (its flags and command: ``specserve.server.command``),
``bench`` (its subcommands: ``specserve.bench.cli``), ``profile``, ``train``, ``export`` and ``make-model``.

Drafters are named by spec (``name[:option=value]...``, see ``specserve.drafters.registry``); their
options, defaults and default draft lengths come from the registry, never from this file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specserve.bench.cli import COMMANDS as BENCH_COMMANDS
from specserve.bench.cli import epilog as bench_epilog
from specserve.cli_args import Parser, drafter_specs, engine_args, model_arg, runtime_args, runtime_options, sampling_args
from specserve.errors import SpecserveError
from specserve.server.command import add_serve_args


DEFAULT_METHODS = "none,ngram:k=4,oracle:alpha=0.8:k=4"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specserve", description="Exact speculative decoding for Llama-family models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _generate_parser(sub.add_parser("generate", help="generate text for one prompt"))
    add_serve_args(sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching"))
    _bench_parser(sub.add_parser("bench", help="benchmark methods against plain decoding on Spec-Bench prompts "
                                               f"(subcommands: {', '.join(BENCH_COMMANDS)})", epilog=bench_epilog()))
    _profile_parser(sub.add_parser("profile", help="time one target pass by part (projections, attention, LM head, "
                                                   "overhead)"))
    _advise_parser(sub.add_parser("advise", help="predict each drafter's speed-up on your prompts from a short "
                                                 "calibration, and recommend one (--check: measure it too)"))
    from specserve.train.cli import add_parser as add_train_parser
    add_train_parser(sub)
    from specserve.export import add_parser as add_export_parser
    add_export_parser(sub)
    _make_model_parser(sub.add_parser("make-model", help="write a GGUF of random weights in a real model's shape "
                                                         "(to measure speed at that size)"))
    return parser


def _make_model_parser(m: argparse.ArgumentParser) -> None:
    from specserve.models.make import FILE_TYPES
    from specserve.models.shapes import SHAPES
    m.add_argument("--shape", required=True, help=f"one of {', '.join(SHAPES)}")
    m.add_argument("--quant", required=True, help=f"one of {', '.join(FILE_TYPES)} (llama.cpp's per-tensor mix)")
    m.add_argument("--out", required=True, help="the .gguf file to write")
    m.add_argument("--seed", type=int, default=0, help="the weights' seed (the same seed writes the same file)")
    m.add_argument("--layers", type=int, default=None, help="fewer (or more) layers than the shape has")
    m.add_argument("--vocab", type=int, default=None,
                   help="another vocabulary size (a draft model's shape with its target's vocabulary)")


def _generate_parser(g: argparse.ArgumentParser) -> None:
    engine_args(g)
    g.add_argument("--prompt", required=True, help="the user message (chat template applied unless --raw)")
    g.add_argument("--raw", action="store_true", help="plain completion: no chat template")
    g.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate")
    sampling_args(g)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--compare-plain", action="store_true", help="also run plain decoding and print the speed-up")


def _bench_parser(b: argparse.ArgumentParser) -> None:
    model_arg(b)
    b.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated drafter specs name[:option=value]... (k = draft length or node budget); "
                        "plain decoding always runs")
    b.add_argument("--groups", default="all", help="all, or comma-separated groups (Spec-Bench's, or the "
                   "categories of --prompts)")
    b.add_argument("--per-group", type=int, default=5, help="prompts per group (the first ones, in file order)")
    b.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    b.add_argument("--prompts", default=None, help="a JSONL file of prompts ({prompt or turns, category}) instead "
                   "of Spec-Bench; its categories are the groups")
    b.add_argument("--concurrency", default="1", help="comma-separated levels, e.g. 1,2,4,8,16")
    b.add_argument("--concurrency-prompts", type=int, default=None, help="prompts per level above 1 (default all)")
    b.add_argument("--peers", default="", help="comma-separated: transformers, llama.cpp")
    b.add_argument("--assistant", default=None, help="draft model for the transformers assistant peer")
    b.add_argument("--peer-k", type=int, default=4, help="draft length of the peers' prompt lookup")
    b.add_argument("--cost-tokens", default="1,2,4,8,16", help="tokens per row for the cost curve ('' to skip)")
    b.add_argument("--cost-batches", default="1,4,16", help="batch sizes for the cost curve")
    b.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    b.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0: every method samples "
                   "(exactly the target's distribution), prompt i with seed --seed + i")
    b.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold when sampling")
    b.add_argument("--seed", type=int, default=0, help="first prompt's sampling seed")
    b.add_argument("--endpoint", default=None, help="benchmark a running OpenAI-compatible server instead")
    b.add_argument("--endpoint-model", default="default", help="model name to send to --endpoint")
    b.add_argument("--system-prompt", default=None, help="with --endpoint: a text file sent as the system message "
                   "of every request (a shared prefix)")
    b.add_argument("--warm-phases", action="store_true", help="drafters with memory across requests (suffix's corpus, "
                   "auto) keep it from one phase to the next (default: each phase starts as a fresh server)")
    b.add_argument("--out", default="results/bench", help="folder for results.json, report.md and plots")
    runtime_args(b)


def _advise_parser(a: argparse.ArgumentParser) -> None:
    model_arg(a)
    a.add_argument("--prompts", default=None, help="a JSONL file of prompts ({prompt or turns, category}); default: "
                   "Spec-Bench's")
    a.add_argument("--per-group", type=int, default=2, help="prompts per category in the sample (the first ones)")
    a.add_argument("--methods", default=None, help="comma-separated drafter specs (default: ngram-tree, suffix, "
                   "eagle where a head fits, auto)")
    a.add_argument("--concurrency", default="1,4", help="comma-separated levels to predict")
    a.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    a.add_argument("--check", action="store_true", help="also run every method and print predicted against measured")
    a.add_argument("--json", default=None, help="also write the predictions to this JSON file")
    runtime_args(a)


def cmd_advise(args: argparse.Namespace) -> int:
    from specserve.bench.advise import render_advice, run_advise
    from specserve.models.loader import resolve_model_path

    levels = _ints(args.concurrency, "--concurrency")
    if not levels or any(c < 1 for c in levels):
        raise SpecserveError("--concurrency takes levels >= 1")
    if args.per_group < 1 or args.max_tokens < 1:
        raise SpecserveError("--per-group and --max-tokens must be >= 1")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    if methods is not None:
        from specserve.drafters import DrafterSpec
        for m in methods:
            DrafterSpec.parse(m)                     # a typo is refused before the model loads
    resolve_model_path(args.model)
    doc = run_advise(args.model, runtime_options(args), args.prompts, args.per_group, methods, sorted(set(levels)),
                     args.max_tokens, args.check, log=lambda m: print(m, file=sys.stderr))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    print(render_advice(doc), end="")
    return 0


def _profile_parser(f: argparse.ArgumentParser) -> None:
    model_arg(f)
    f.add_argument("--runtimes", default="auto", help="comma-separated kernels[:activations[:kv]] settings to "
                   "compare, e.g. fbgemm,native,native:f32,native:int8:bf16")
    f.add_argument("--tokens", default="1,8,16", help="new tokens per row, comma-separated")
    f.add_argument("--batch", type=int, default=1, help="rows in each profiled pass")
    f.add_argument("--context", type=int, default=256, help="cached positions before the pass")
    f.add_argument("--reps", type=int, default=20, help="passes timed per shape")
    f.add_argument("--cost-batches", default="", help="also measure the cost curve (passes of --tokens per row) "
                   "at these batch sizes, e.g. 1,4,16")
    f.add_argument("--json", default=None, help="also write the rows to this JSON file")


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecserveError(f"{flag} takes comma-separated integers, got {text!r}") from None


def _system_prompt(args: argparse.Namespace) -> str | None:
    if args.system_prompt is None:
        return None
    if not args.endpoint:
        raise SpecserveError("--system-prompt is for --endpoint runs")
    try:
        return Path(args.system_prompt).read_text()
    except OSError as e:
        raise SpecserveError(f"--system-prompt: cannot read {args.system_prompt}: {e.strerror}") from None


def cmd_bench(args: argparse.Namespace) -> int:
    from specserve.bench.report import render_report
    from specserve.bench.runner import BenchConfig, run_bench
    from specserve.models.loader import resolve_model_path

    if args.per_group < 1 or args.max_tokens < 1:
        raise SpecserveError("--per-group and --max-tokens must be >= 1")
    if not args.endpoint:
        resolve_model_path(args.model)
    groups = None if args.groups == "all" else [g.strip() for g in args.groups.split(",") if g.strip()]
    cfg = BenchConfig(methods=args.methods.split(","), groups=groups, per_group=args.per_group,
                      max_tokens=args.max_tokens, out=args.out, model=args.model, prompts_file=args.prompts,
                      concurrency=_ints(args.concurrency, "--concurrency"),
                      concurrency_prompts=args.concurrency_prompts,
                      peers=[p.strip() for p in args.peers.split(",") if p.strip()], assistant=args.assistant,
                      peer_k=args.peer_k,
                      cost_tokens=_ints(args.cost_tokens, "--cost-tokens"),
                      cost_batches=_ints(args.cost_batches, "--cost-batches"), plots=not args.no_plots,
                      temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                      system_prompt=_system_prompt(args), warm_phases=args.warm_phases)
    if args.endpoint:
        from specserve.bench.report import render_endpoint_report
        from specserve.bench.runner import run_endpoint_bench
        methods = [m for m in args.methods.split(",") if m.strip()] if args.methods != DEFAULT_METHODS else []
        print(render_endpoint_report(run_endpoint_bench(cfg, args.endpoint, args.endpoint_model, methods)))
        return 0
    doc = run_bench(cfg, runtime_options(args))
    print(render_report(doc))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    import json

    from specserve.bench.costs import cost_curve, roofline
    from specserve.bench.profile import format_profile, format_rates, part_macs, part_rates, profile_pass, runtime_name
    from specserve.bench.report import cost_table, roofline_line
    from specserve.control import calibrate
    from specserve.models.loader import RuntimeOptions, load_model

    tokens = _ints(args.tokens, "--tokens")
    if not tokens or min(tokens) < 1 or args.batch < 1 or args.context < 1 or args.reps < 1:
        raise SpecserveError("--tokens, --batch, --context and --reps must be >= 1")
    batches = _ints(args.cost_batches, "--cost-batches")
    rows, curves, rooflines, cost_models = [], {}, [], []
    runtimes = [RuntimeOptions(kernels=k.split(":")[0], activations=(k.split(":") + ["auto"])[1],
                               kv=(k.split(":") + ["auto", "auto"])[2])
                for k in (k.strip() for k in args.runtimes.split(",")) if k]
    for opts in runtimes:                          # each runtime loaded once, measured every way
        lm = load_model(args.model, opts)
        name = runtime_name(lm)
        mine = [profile_pass(lm, t, args.context, args.reps, args.batch) for t in tokens]
        if batches:
            curves[name] = cost_curve(lm, tokens, batches, args.context)
        roof = roofline(lm)
        rooflines.append(f"\nroofline ({name}):" + roofline_line(roof))
        ceiling = roof["int8_multiply_adds_per_s"] if roof.get("activations") == "int8" else roof["multiply_adds_per_s"]
        if ceiling == ceiling:                     # nan without the native kernels: no ceiling to compare with
            macs = part_macs(lm.config)
            for row in mine:
                row["rates"] = part_rates(row, macs, ceiling, roof["weight_bytes"], roof["bandwidth_bytes_per_s"])
        rows.extend(mine)
        cost_models.append("\n".join([f"\ncost model the engine calibrates ({name}): a pass of N tokens at "
                                       "context 64, and the attention term", *calibrate(lm.model).describe()]))
        del lm
    print(format_profile(rows))
    rated = [r for r in rows if "rates" in r]
    if rated:
        print("\nagainst the multiply-add ceiling of each runtime's activations and the pass's floor (the "
              "roofline below):\n" + format_rates(rated))
    print("\n".join(rooflines))
    print("\n".join(cost_models))
    for kernels, curve in curves.items():
        print(f"\ncost curve, kernels={kernels}, context {args.context}: ms per pass (relative to 1 token)")
        print("\n".join(cost_table(curve)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": rows, "cost_curve": curves}, f, indent=1)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from specserve.llm import LLM
    from specserve.models.loader import resolve_model_path
    from specserve.sampling import SamplingParams

    # cheap checks first: a typo should not cost a model load
    if not args.prompt.strip():
        raise SpecserveError("empty prompt")
    if args.max_tokens < 1:
        raise SpecserveError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    spec = drafter_specs(args)[0]
    resolve_model_path(args.model)
    llm = LLM(args.model, runtime_options(args), drafters=[spec], max_batch=1, max_len=args.max_len)
    prompt_ids = llm.encode(args.prompt, raw=args.raw)
    num_draft = spec.k

    def run(drafter: str, k: int):
        req = llm.request(prompt_ids, args.max_tokens, sampling, drafter, k, args.stop)
        return llm.completion(llm.engine.generate([req])[0], args.stop)

    if args.compare_plain:
        run(spec.name, num_draft)                                # warm-up when timing matters
    out = run(spec.name, num_draft)
    plain = run("none", 0) if args.compare_plain else None
    if args.json:
        print(json.dumps(_generate_doc(llm, spec, out, plain)))
    else:
        _print_generated(spec, out, plain)
    return 0


def _generate_doc(llm, spec, out, plain) -> dict:
    """``generate --json``: the text, the ids, the request's stats and the runtime in one object."""
    doc = {"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
           "drafter": spec.text, "num_draft": spec.k,
           "stats": {k: v for k, v in out.stats.items() if k != "token_times_s"},
           "runtime": vars(llm.target.options) | {"batch_invariant": llm.target.options.batch_invariant}}
    if plain is not None:
        doc["plain"] = {"tokens_per_second": plain.stats["tokens_per_second"],
                        "identical": plain.token_ids == out.token_ids}
    return doc


def _print_generated(spec, out, plain) -> None:
    """The text on stdout; on stderr the summary line (where the time went, by the engine's timers)
    and, with --compare-plain, the speed-up over plain decoding."""
    s = out.stats
    print(out.text)
    label = f"{spec.text}{' (SYNTHETIC oracle: a study, not a real drafter)' if s['synthetic'] else ''}"
    timers = " ".join(f"{part} {s[part + '_s']:.2f}s" for part in ("draft", "size", "pass", "verify", "commit", "other"))
    print(f"\n[{label}, k={spec.k}] {s['generated_tokens']} tokens in {s['total_s']:.2f}s = "
          f"{s['tokens_per_second']:.1f} tok/s; mean accepted length {s['mean_accepted_length']:.2f} "
          f"({s['mean_nodes_per_step']:.1f} nodes drafted per step); "
          f"TTFT {s['ttft_s'] * 1000:.0f} ms; {timers}", file=sys.stderr)
    if plain is not None:
        ps = plain.stats
        same = "identical output" if plain.token_ids == out.token_ids else "OUTPUT DIFFERS"
        print(f"[plain decoding] {ps['generated_tokens']} tokens at {ps['tokens_per_second']:.1f} tok/s; "
              f"speed-up {s['tokens_per_second'] / ps['tokens_per_second']:.2f}x; {same}", file=sys.stderr)


def cmd_serve(args: argparse.Namespace) -> int:
    from specserve.server.command import cmd_serve as run
    return run(args)


def cmd_train(args: argparse.Namespace) -> int:
    from specserve.train.cli import cmd_train as run
    return run(args)


def cmd_export(args: argparse.Namespace) -> int:
    from specserve.export import cmd_export as run
    return run(args)


def cmd_make_model(args: argparse.Namespace) -> int:
    import time

    from specserve.models.make import make_model
    from specserve.models.shapes import shape_named
    shape = shape_named(args.shape, args.layers, args.vocab)
    t = time.perf_counter()
    size = make_model(shape, args.quant, args.out, args.seed)
    print(f"{args.out}: random-weight {shape.name} ({shape.layers} layers), {args.quant}, {size / 2**20:.0f} MiB "
          f"in {time.perf_counter() - t:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``specserve`` command (and ``python -m specserve``): its exit status.  Output cut short by
    the reader (``specserve ... | head``) ends quietly with status 141, as a command killed by SIGPIPE."""
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()          # here, inside the try, not at exit where the error would print
    except BrokenPipeError:
        try:                            # later writes (and Python's own flush at exit) go nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141


def _run(argv: list[str] | None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # FBGEMM fp16 ops print deprecation notices
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if len(argv) > 1 and argv[0] == "bench" and argv[1] in BENCH_COMMANDS:   # else bench's own options
            from specserve.bench.cli import main as bench_main
            return bench_main(argv[1], argv[2:])
        args = build_parser().parse_args(argv)
        return {"generate": cmd_generate, "bench": cmd_bench, "serve": cmd_serve,
                "profile": cmd_profile, "advise": cmd_advise, "train": cmd_train,
                "export": cmd_export, "make-model": cmd_make_model}[args.command](args)
    except SpecserveError as e:
        print(f"specserve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
