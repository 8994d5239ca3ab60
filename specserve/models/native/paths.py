"""The instruction-set paths the kernels choose between at run time: the int8 products (``q8.h``:
AVX2, AVX512-VNNI on 256- or 512-bit registers or tiled by the pass, AVX-VNNI) and attention (``attention.h``: AVX2 or
AVX-512).  Every path of a kernel gives the same bits (each kernel's header says why, and the tests
check it), so a choice changes speed only.  By default each kernel takes the best path the CPU runs,
measured once where that depends on how the CPU executes 512-bit operations.
"""

from __future__ import annotations

from specserve.models.native.build import library


class PathChoice:
    """One kernel's paths by name, and the library's three functions that report whether the CPU runs
    a path, choose one (-1: the best) and say which is in use."""

    def __init__(self, kernel: str, codes: dict[str, int], runs: str, choose: str, in_use: str):
        self.kernel, self.codes = kernel, codes
        self._runs, self._choose, self._in_use = runs, choose, in_use

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.codes)

    def runs(self, name: str) -> bool:
        """Whether this CPU runs path ``name``."""
        return bool(getattr(library(), self._runs)(self.codes[name]))

    def set(self, name: str | None) -> str:
        """Use path ``name`` for later calls (None: the best this CPU runs); returns the one in use."""
        code = getattr(library(), self._choose)(-1 if name is None else self.codes[name])
        if code < 0:
            raise ValueError(f"this CPU cannot run the {self.kernel} path {name!r}")
        return self.current()

    def current(self) -> str:
        code = int(getattr(library(), self._in_use)())
        return next(k for k, v in self.codes.items() if v == code)


INT8 = PathChoice("int8", {"avx2": 0, "avx512-vnni": 1, "avx-vnni": 2, "avx512-vnni-512": 3,
                           "avx512-vnni-tiles": 4},
                  "ss_q8_path_runs", "ss_q8_set_path", "ss_q8_path")
ATTENTION = PathChoice("attention", {"avx2": 0, "avx512": 1},
                       "ss_attention_path_runs", "ss_attention_set_path", "ss_attention_path")
