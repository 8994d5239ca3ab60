"""Drafters by name.  ``create`` is the only place that maps a name to a class."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from specserve.drafters.base import Drafter
from specserve.errors import SpecserveError

_REGISTRY: dict[str, type[Drafter]] = {}


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
        raise SpecserveError(f"unknown drafter {name!r}; choose from {', '.join(available())}")
    return _REGISTRY[name]


def create(name: str, target: Any, **options: Any) -> Drafter:
    """Build drafter ``name`` for ``target`` (a LoadedModel); unknown or bad options are refused."""
    cls = drafter_class(name)
    params = inspect.signature(cls.__init__).parameters
    unknown = [k for k in options if k not in params]
    if unknown:
        accepted = [p for p in params if p not in ("self", "target")]
        raise SpecserveError(f"drafter {name!r} takes no option {unknown[0]!r}; it accepts: {', '.join(accepted) or 'none'}")
    return cls(target, **options)


def _load_builtin() -> None:
    # importing the modules runs their @register decorators
    from specserve.drafters import draft_model, ngram, none, oracle  # noqa: F401
