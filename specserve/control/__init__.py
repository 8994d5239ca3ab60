"""Adaptive speculation: what a pass costs, what a draft is worth, and how big each draft should be.

Modules, and what each owns:

* ``config``: ``ControllerConfig``, every tuning number of the modules below, once.
* ``types``: what the engine and the controller hand each other (``Traits``, ``SeqView``, ``StepPlan``).
* ``cost``: ``CostModel``, the pure model of a target pass's seconds (a measured table, an
  attention term, an online correction).
* ``measure``: the only module that runs a model: it measures the cost model's table, once per
  engine at construction, kept on disk per model, CPU and runtime.
* ``acceptance``: ``AcceptanceModel`` (a node's **gain**: its probability of acceptance) and
  ``decayed``, the running decayed average (``specserve.averages``).
* ``choice``: the **rate** rule and ``choose`` (the nodes a step keeps), probes (``ProbeState``,
  and ``DraftHistory``: per drafter or part, nodes kept and probes per sequence).
* ``controller``: ``Controller``, the one object the engine asks each step (budgets, kept nodes,
  probes, threads), from the drafters' declared ``Traits`` and plain numbers.
* ``parts``: ``PartPricing``, a merging drafter's parts each priced as a drafter (``part_key``),
  through the controller's public methods.
* ``threads``: ``ThreadGovernor`` (compute threads from measured pass times).
* ``prefill``: ``PrefillPolicy`` and the prefill planner (how many prompt tokens each pass takes).
"""

from specserve.averages import decayed
from specserve.control.acceptance import AcceptanceModel
from specserve.control.choice import Candidate, DraftHistory, ProbeState, choose, rate
from specserve.control.config import DEFAULTS, ControllerConfig
from specserve.control.controller import Controller
from specserve.control.cost import LONG_RUN, CostModel
from specserve.control.measure import calibrate, cost_model
from specserve.control.parts import PartPricing, part_key
from specserve.control.prefill import PrefillPolicy, PromptState, plan_chunks, prefill_shares
from specserve.control.threads import ThreadGovernor
from specserve.control.types import SeqView, StepPlan, Traits

__all__ = ["DEFAULTS", "AcceptanceModel", "Candidate", "Controller", "ControllerConfig", "CostModel", "DraftHistory",
           "LONG_RUN", "PartPricing", "PrefillPolicy", "ProbeState", "PromptState", "SeqView", "StepPlan",
           "ThreadGovernor", "Traits", "calibrate", "choose", "cost_model", "decayed", "part_key", "plan_chunks",
           "prefill_shares", "rate"]
