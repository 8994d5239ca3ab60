"""Building and loading the native kernel library: the compiler, its flags per source, the cache
of built libraries under ``$SPECSERVE_CACHE/kernels`` (named by a hash of the sources, headers,
flags and compiler version), and ``library()``, which builds on first use and loads with ctypes.

The flags target AVX2 + FMA + F16C (never ``-march=native``), so a library built on one x86-64
machine runs on any other with those extensions; the VNNI variants of the int8 products sit in files
of their own, compiled with their extra flags and called only where the CPU reports them
(``packed.set_path``).  It links ``libgomp.so.1``, which resolves to the OpenMP runtime torch has
already loaded, so both share one thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from specserve.host import cache_root, cpu_info
from specserve.models.native.abi import bind

HERE = Path(__file__).parent
# Each source with the instruction sets it is compiled for: the base set everywhere, and the int8
# kernels' VNNI paths (q8.h) in files of their own, called only where the CPU has them.
BASE_ISA = ["-mavx2", "-mfma", "-mf16c"]
VNNI512_ISA = BASE_ISA + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
SOURCES = {HERE / "linear.cpp": BASE_ISA, HERE / "layer_ops.cpp": BASE_ISA, HERE / "forward.cpp": BASE_ISA,
           HERE / "draft_layer.cpp": BASE_ISA,
           HERE / "q8.cpp": BASE_ISA, HERE / "logit_ops.cpp": BASE_ISA, HERE / "attention.cpp": BASE_ISA,
           HERE / "attention_avx512.cpp": BASE_ISA + ["-mavx512f"],
           HERE / "q8_vnni512.cpp": VNNI512_ISA, HERE / "q8_vnni512w.cpp": VNNI512_ISA,
           HERE / "q8_vnni512t.cpp": VNNI512_ISA,
           HERE / "q8_avxvnni.cpp": BASE_ISA + ["-mavxvnni"]}
OPTIONAL = {HERE / "q8_vnni512.cpp", HERE / "q8_vnni512w.cpp", HERE / "q8_vnni512t.cpp", HERE / "q8_avxvnni.cpp", HERE / "attention_avx512.cpp"}   # built as stubs (path never chosen) if the compiler lacks the flags
HEADERS = [HERE / "exports.h", HERE / "simd.h", HERE / "blocks.h", HERE / "q8.h", HERE / "q8_wide.h", HERE / "q8_entry.h",
           HERE / "attention.h"]
FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fopenmp", "-fPIC"]
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")


def cache_dir() -> Path:
    return cache_root() / "kernels"


def _cpu_flags() -> frozenset[str]:
    return frozenset(cpu_info().flags)


def unavailable_reason() -> str | None:
    """Why the native kernels cannot run here, or None when they can."""
    missing = [f for f in REQUIRED_CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        return f"this CPU lacks {', '.join(missing)} (native kernels need AVX2, FMA and F16C on x86-64 Linux)"
    try:
        library()
    except RuntimeError as e:
        return str(e)
    return None


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found (install g++ or set CXX) to build the native kernels")
    return cxx


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """Build (once per source/flags/compiler) and load the kernel library, its interface checked
    and its functions' signatures set (``abi.bind``)."""
    cxx = _compiler()
    target = cache_dir() / f"specserve_kernels_{_build_key(cxx)}.so"
    if not target.is_file():
        _build(cxx, target)
    lib = ctypes.CDLL(str(target))
    bind(lib, str(target))
    return lib


def build_key() -> str:
    """The hash naming the kernel library these sources build (what a cache of measurements taken
    with the kernels must be keyed by: new kernels, new timings)."""
    return _build_key(_compiler())


@lru_cache(maxsize=4)
def _build_key(cxx: str) -> str:
    """The library's name in the cache: a hash of the sources with their flags, the headers, the
    common flags and the compiler's version."""
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"C++ compiler {cxx!r} does not run: {e}") from None
    text = b"".join(p.read_bytes() + " ".join(isa).encode() for p, isa in SOURCES.items())
    text += b"".join(p.read_bytes() for p in HEADERS)
    return hashlib.sha256(text + " ".join(FLAGS).encode() + version.encode()).hexdigest()[:16]


def _build(cxx: str, target: Path) -> None:
    """Compile every source and link them into ``target``, which appears whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = _compile_all(cxx, tmp)
        out = Path(tmp) / target.name
        proc = subprocess.run([cxx, "-fopenmp", "-shared", *objects, "-o", str(out)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"linking the native kernels failed: {proc.stderr.strip()[-2000:]}")
        os.replace(out, target)                       # atomic: concurrent builders are harmless


def _compile_all(cxx: str, tmp: str) -> list[str]:
    """Every source compiled (in parallel) to an object file in ``tmp``; an optional source the
    compiler cannot build with its extra flags is built as a stub whose path is never chosen."""
    try:
        jobs = [(subprocess.Popen([cxx, *FLAGS, *isa, f"-I{HERE}", "-c", str(src), "-o", f"{tmp}/{src.stem}.o"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), src)
                for src, isa in SOURCES.items()]
    except OSError as e:
        raise RuntimeError(f"C++ compiler {cxx!r} does not run: {e}") from None
    for proc, src in jobs:
        _, err = proc.communicate()
        if proc.returncode != 0 and src in OPTIONAL:       # an older compiler: this path is left out
            proc = subprocess.run([cxx, *FLAGS, *BASE_ISA, "-DSS_Q8_STUB", "-DSS_ATT_STUB", "-c", str(src), "-o",
                                   f"{tmp}/{src.stem}.o"], capture_output=True, text=True)
            err = proc.stderr
        if proc.returncode != 0:
            raise RuntimeError(f"building the native kernels failed ({src.name}): {err.strip()[-2000:]}")
    return [f"{tmp}/{src.stem}.o" for src in SOURCES]
