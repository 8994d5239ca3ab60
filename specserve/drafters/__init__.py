"""Drafters behind one interface, chosen by name through the registry."""

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Feedback, Option, option
from specserve.drafters.registry import DrafterSpec, available, create, drafter_class, register

__all__ = ["DraftProposal", "DraftRequest", "Drafter", "DrafterSpec", "Feedback", "Option", "available", "create",
           "drafter_class", "option", "register"]
