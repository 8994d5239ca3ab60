"""Verification: pure functions over tensors (``chain``, ``tree``) and a step's routing (``rows``).

Terms (used everywhere in specserve) are fixed in ``specserve.verify.chain``'s docstring.
"""

from specserve.verify.chain import (PLACEHOLDER, VerifyResult, greedy_verify, greedy_verify_argmax, reference_verify,
                                    rejection_verify)
from specserve.verify.rows import Outcome, Row, verify_rows
from specserve.verify.tree import (TreeVerifyResult, greedy_tree_verify, greedy_tree_verify_argmax,
                                   reference_tree_verify, tree_rejection_verify_row)

__all__ = ["PLACEHOLDER", "Outcome", "Row", "TreeVerifyResult", "VerifyResult", "greedy_tree_verify",
           "greedy_tree_verify_argmax", "greedy_verify", "greedy_verify_argmax", "reference_tree_verify",
           "reference_verify", "rejection_verify", "tree_rejection_verify_row", "verify_rows"]
