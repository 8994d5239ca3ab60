"""``ngram-tree``: prompt lookup that merges many earlier matches into a trie of candidates.

Chain n-gram lookup (``ngram``) proposes what followed the single most recent occurrence of the
sequence's longest matching suffix.  Here every earlier position whose preceding tokens match the
sequence's last ``min_n``..``max_n`` tokens is a match, and the continuations of the
``max_matches`` best of them are merged into a trie scored as ``specserve.drafters.trie`` says
(terms, scores and a worked example there); its estimates are the proposal's ``confidence``.  The
proposal is deterministic (one-hot q), so it is exact under sampling as well.
"""

from __future__ import annotations

import numpy as np

from specserve.drafters.base import DraftProposal
from specserve.drafters.ngram import LookupDrafter
from specserve.drafters.registry import register
from specserve.drafters.trie import DEFAULT, TrieOptions, own_matches, trie_proposal


def ngram_tree_propose(tokens: np.ndarray, k: int, depth: int, opts: TrieOptions = DEFAULT) -> DraftProposal:
    """A trie of at most k nodes, no deeper than ``depth``, from ``tokens`` [L] (the whole sequence;
    ``opts.max_depth`` is the drafter's cap, applied by the caller)."""
    if k <= 0 or depth <= 0:
        return DraftProposal([])
    return trie_proposal(own_matches(tokens, opts.min_n, opts.max_n, depth), k, opts)


@register("ngram-tree")
class NgramTreeDrafter(LookupDrafter):
    tree = True
    max_auto_draft = 16
    Options = TrieOptions

    def lookup(self, tokens: np.ndarray, k: int, max_depth: int) -> DraftProposal:
        return ngram_tree_propose(tokens, k, min(self.opts.max_depth, max_depth), self.opts)
