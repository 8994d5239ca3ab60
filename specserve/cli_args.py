"""The command line's shared arguments: the model, its runtime, the drafters, sampling; and the
parser that turns an argparse error into one line.  ``specserve.cli`` and the server's command
(``specserve.server.command``) build their parsers from these."""

from __future__ import annotations

import argparse

from specserve.errors import SpecserveError


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise SpecserveError(message)


def drafter_help() -> str:
    """Every registered drafter with its options and defaults, for --help."""
    from specserve.drafters import available, drafter_class

    parts = []
    for name in available():
        cls = drafter_class(name)
        opts = ", ".join(f"{o.name}={'REQUIRED' if o.required else o.default}" for o in cls.options)
        kind = "tree, k = node budget" if cls.tree else "chain"
        parts.append(f"{name} ({kind}; auto chooses k <= {cls.max_auto_draft}{'; ' + opts if opts else ''})")
    return "; ".join(parts)


MODEL_HELP = "'default', 'gemma3-270m', a Hugging Face model directory, or a .gguf file"


def model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help=MODEL_HELP)


def runtime_args(p: argparse.ArgumentParser) -> None:
    """How the target runs: dtype, device, kernels, attention, activations, kv (``RuntimeOptions``)."""
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="activation dtype (float32 keeps greedy identity by construction on CPU)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--kernels", default="auto", help="auto, native, fbgemm or torch (auto: native when this CPU and compiler allow)")
    p.add_argument("--attention", default="auto", help="auto, native, invariant or sdpa (native goes with kernels=native)")
    p.add_argument("--activations", default="auto", help="auto, int8 or f32 (native kernels; auto: int8 over GGUF "
                   "blocks, f32 over float weights)")
    p.add_argument("--kv", default="auto", help="the KV cache's element type: auto, f32 or bf16 (native kernels; "
                   "bf16 halves the bytes attention reads and rounds keys and values; see the README)")


def engine_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    """The model, its runtime, the drafter(s) and the context length: generate's and serve's."""
    model_arg(p)
    p.add_argument("--drafter", default=None, action="append" if many else "store",
                   help="drafter spec name[:option=value]... (default auto: every drafter merged, each "
                        "request's draft chosen per step"
                        + ("; repeatable, the first is the default for requests" if many else "") + "). "
                        + "Drafters: " + drafter_help().replace("%", "%%"))
    p.add_argument("--num-draft", default=None,
                   help="draft length k per step (tree drafters: node budget), or 'auto' (the default): the "
                        "engine chooses it every step, down to 0, from measured costs and acceptance")
    runtime_args(p)
    p.add_argument("--max-len", type=int, default=4096, help="context length the engine allocates for")


def sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples exactly the target's distribution")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0: all)")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler (default: a fresh one)")


def runtime_options(args: argparse.Namespace):
    """The ``RuntimeOptions`` the runtime flags name."""
    from specserve.models.loader import RuntimeOptions
    return RuntimeOptions(args.dtype, args.device, args.kernels, args.attention, args.activations, args.kv)


def drafter_specs(args: argparse.Namespace) -> list:
    """The drafter specs the command line names (parsed and checked: no model is loaded yet)."""
    from specserve.drafters import DrafterSpec
    from specserve.drafters.registry import parse_num_draft

    from specserve.llm import DEFAULT_DRAFTER

    texts = args.drafter if isinstance(args.drafter, list) else [args.drafter or DEFAULT_DRAFTER]
    specs = [DrafterSpec.parse(t) for t in (texts or [DEFAULT_DRAFTER])]
    if args.num_draft is not None:
        k = parse_num_draft(args.num_draft, "--num-draft")
        specs[0] = DrafterSpec(specs[0].name, specs[0].options, k, specs[0].text)
    return specs
