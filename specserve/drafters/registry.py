"""Drafters by name.  ``create`` is the only place that maps a name to a class.

A drafter is written on the command line, in the benchmark's method list and in the Python API as
a *spec*: ``name[:option=value]...``, e.g. ``ngram:max_n=5`` or ``draft-model:model=PATH``; the
key ``k`` is the draft length (node budget for tree drafters).  Option values are converted to the
types the drafter declares, and unknown or badly typed options are refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from specserve.drafters.base import Drafter, Option
from specserve.errors import SpecserveError
from specserve.limits import AUTO_SIZE

_REGISTRY: dict[str, type[Drafter]] = {}


def parse_num_draft(value, what: str = "num_draft") -> int | str:
    """``auto`` or an integer >= 0 (the draft length, or node budget for tree drafters)."""
    if value == AUTO_SIZE:
        return AUTO_SIZE
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise SpecserveError(f"{what} takes 'auto' or an integer >= 0, got {value!r}", "num_draft") from None
    if k < 0 or isinstance(value, float) and value != k:
        raise SpecserveError(f"{what} takes 'auto' or an integer >= 0, got {value!r}", "num_draft")
    return k


def register(name: str) -> Callable[[type[Drafter]], type[Drafter]]:
    def deco(cls: type[Drafter]) -> type[Drafter]:
        if name in _REGISTRY:
            raise ValueError(f"drafter {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def available() -> list[str]:
    """Registered drafter names (``none`` first)."""
    _load_builtin()
    return sorted(_REGISTRY, key=lambda n: (n != "none", n))


def drafter_class(name: str) -> type[Drafter]:
    _load_builtin()
    if name not in _REGISTRY:
        raise SpecserveError(f"unknown drafter {name!r}; choose from {', '.join(available())}", "drafter")
    return _REGISTRY[name]


def _convert(name: str, opt: Option, value: Any) -> Any:
    if not isinstance(value, (str, int, float, bool)):
        return value                     # an object from the Python API (say, a loaded draft model)
    if isinstance(value, opt.type) and not (opt.type is int and isinstance(value, bool)):
        return value
    if opt.type is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return opt.type(value)
        except ValueError:
            pass
    raise SpecserveError(f"drafter {name!r} option {opt.name!r} takes {opt.type.__name__}, got {value!r}")


def resolve_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The drafter's declared options with ``options`` applied: converted, defaults filled in."""
    cls = drafter_class(name)
    declared = {o.name: o for o in cls.options}
    unknown = [k for k in options if k not in declared]
    if unknown:
        raise SpecserveError(f"drafter {name!r} takes no option {unknown[0]!r}; it accepts: "
                             f"{', '.join(declared) or 'none'}")
    out = {}
    for opt in cls.options:
        if opt.name in options:
            out[opt.name] = _convert(name, opt, options[opt.name])
            if opt.check is not None and isinstance(out[opt.name], (str, int, float)):
                opt.check(out[opt.name])
        elif opt.required:
            raise SpecserveError(f"drafter {name!r} needs option {opt.name!r} ({opt.help}); "
                                 f"write it as {name}:{opt.name}=VALUE")
        else:
            out[opt.name] = opt.default
    return out


def create(name: str, target: Any, **options: Any) -> Drafter:
    """Build drafter ``name`` for ``target`` (a LoadedModel); unknown or bad options are refused."""
    return drafter_class(name)(target, **resolve_options(name, options))


@dataclass(frozen=True)
class DrafterSpec:
    """``name[:option=value]...[:k=N]``: a drafter, its options and (optionally) its draft length."""
    name: str
    options: dict = field(default_factory=dict)
    num_draft: int | str | None = None    # a number, "auto", or None: auto (for ``none``: 0)
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> "DrafterSpec":
        name, *parts = text.strip().split(":")
        drafter_class(name)
        opts: dict[str, Any] = {}
        k = None
        for part in parts:
            key, sep, val = part.partition("=")
            if not sep or not key:
                raise SpecserveError(f"drafter spec {text!r}: expected option=value, got {part!r}", "drafter")
            if key == "k":
                k = parse_num_draft(val, f"drafter spec {text!r}: k")
            else:
                opts[key] = val
        resolved = resolve_options(name, opts)    # refuse bad options now, before anything is loaded
        return cls(name, {key: resolved[key] for key in opts}, k, text.strip())

    @property
    def label(self) -> str:
        return self.text or self.name

    @property
    def k(self) -> int | str:
        """The draft length to use: the spec's, else ``auto`` (0 for a drafter that never drafts)."""
        if self.num_draft is not None:
            return self.num_draft
        return AUTO_SIZE if drafter_class(self.name).max_auto_draft else 0

    def build(self, target: Any) -> Drafter:
        return create(self.name, target, **self.options)


def _load_builtin() -> None:
    # importing the modules runs their @register decorators
    from specserve.drafters import (auto, draft_model, eagle, eagle_parallel, layerskip, lookahead, medusa,  # noqa: F401
                                    ngram, ngram_tree, none, oracle, suffix)
