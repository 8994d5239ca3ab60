"""Drafters behind one interface, chosen by name through the registry."""

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter
from specserve.drafters.registry import available, create, drafter_class, register

__all__ = ["DraftProposal", "DraftRequest", "Drafter", "available", "create", "drafter_class", "register"]
