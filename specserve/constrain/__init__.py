"""What shapes the target's distribution at every position besides temperature, top-k and top-p:
grammars (``grammar``, ``tree``) and repetition penalties (``penalties``), per sequence (``shaper``)."""

from specserve.constrain.grammar import KINDS, Grammar, GrammarCompiler, GrammarSpec
from specserve.constrain.shaper import Shaper

__all__ = ["KINDS", "Grammar", "GrammarCompiler", "GrammarSpec", "Shaper"]
