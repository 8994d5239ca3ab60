"""Native CPU kernels (``simd.h``, ``blocks.h``, ``linear.cpp``, ``layer_ops.cpp``, ``forward.cpp``,
``logit_ops.cpp`` (row argmax, the greedy walk, grammar masks), and the int8-activation linears ``q8.h`` / ``q8*.cpp``):
built on first use with the system C++ compiler, loaded with ctypes, cached under
``$SPECSERVE_CACHE/kernels`` by a hash of the source and flags.  No torch headers and no ninja are
needed: the library exports plain C functions over raw pointers.

``build`` compiles and loads the library, ``abi`` states its interface (signatures and the
structures of a whole pass) and checks it at load, ``formats`` holds the weight formats and the
weights they make, ``kernels`` the row kernels called from Python, ``packed`` the weights repacked
for int8 activations, and ``model`` the decoder that runs a whole pass in one call.  The names most
callers need are here.
"""

from specserve.models.native.abi import ABI_VERSION, MAX_TREE_TOKENS
from specserve.models.native.build import REQUIRED_CPU_FLAGS, cache_dir, library, unavailable_reason
from specserve.models.native.formats import (BLOCK, BLOCK_BYTES, F16, F32, FORMAT_NAMES, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1,
                                             Q5_K, Q6_K, Q8_0, BlockWeight, NativeWeight, row_bytes)
from specserve.models.native.kernels import argmax_rows, fma_peak, greedy_walk_rows, linear, mask_rows

__all__ = ["ABI_VERSION", "MAX_TREE_TOKENS", "REQUIRED_CPU_FLAGS", "cache_dir", "library", "unavailable_reason",
           "BLOCK", "BLOCK_BYTES", "F16", "F32", "FORMAT_NAMES", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K",
           "Q6_K", "Q8_0", "BlockWeight", "NativeWeight", "row_bytes", "argmax_rows", "fma_peak", "greedy_walk_rows",
           "linear", "mask_rows"]
