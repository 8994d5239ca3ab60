"""The machine specserve runs on: where it keeps what it builds and measures, and what its CPU is.

``cache_root()`` is ``$SPECSERVE_CACHE``, else ``~/.cache/specserve``; under it live the native
kernels (``kernels/``), the cost tables (``costs/``), converted tokenizers (``tokenizers/``) and
assembled model files (``models/``).  ``cpu_info()`` reads ``/proc/cpuinfo`` once.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


def cache_root() -> Path:
    """The folder for everything specserve builds or measures once and reuses."""
    return Path(os.environ.get("SPECSERVE_CACHE", Path.home() / ".cache" / "specserve"))


@dataclass(frozen=True)
class CpuInfo:
    name: str                     # the model name (figures are only comparable on one CPU)
    flags: tuple[str, ...]        # feature flags, in /proc/cpuinfo's order (empty where it cannot be read)
    cores: int                    # logical CPUs


@lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """This machine's CPU: its first processor's model name and flags from /proc/cpuinfo (else
    ``platform.processor()`` and no flags)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    return CpuInfo(name, tuple(fields.get("flags", "").split()), os.cpu_count() or 1)
