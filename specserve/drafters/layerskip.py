"""``layerskip``: the target drafts for itself with some of its layers skipped (self-speculation).

Draft & Verify (Zhang et al. 2023) and SWIFT (Xia et al. 2024) draft with the target's own layers,
skipping some of them: no second model, no training, the same vocabulary by construction.  Here the
draft is ``Decoder.layer_subset``: a view of the target that runs only the kept layers, sharing
every weight (nothing is copied), with a KV cache of its own that the ``draft-model`` machinery
keeps in step with the sequence (rolled back to the longest prefix that still agrees, then fed the
rest), so rollback after a rejection is handled as for any draft model.

Which layers to skip (``skip=auto``, the default) is chosen at start-up by a short calibration:
1. the target continues a calibration prompt greedily for ``calib_tokens`` tokens;
2. each middle layer (never the first or the last) is skipped alone, and the draft's greedy
   prediction at every generated position is compared with the target's (teacher forced: one
   pass): layers whose removal changes the fewest predictions are the least important;
3. for m = 2, 4, ... up to half the layers, the m least important are skipped together and the
   agreement ``a`` measured again; the expected tokens per step of a k-token chain,
   (1 - a^(k+1)) / (1 - a), over the cost of k draft passes (each ``kept / L`` of a target pass)
   plus a (k+1)-token verification pass (measured), estimates the speed-up;
4. the (m, k) with the best estimate wins; ``describe()`` reports the skipped layers, the
   agreement, the draft's cost and the estimate.  When even the best estimate is below 1 the
   drafter declares ``max_auto_draft = 0``: under ``auto`` it drafts nothing (its draft cache,
   whose prefill alone costs about as much as the target's, is never built), so it is never slower
   than plain decoding; an explicit draft length still drafts.
An explicit ``skip`` (comma-separated layer indices) skips exactly those.  Under sampling the draft
samples from its own processed distribution (exact, like any draft model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specserve.drafters.base import option
from specserve.drafters.decode import greedy_continuation
from specserve.drafters.draft_model import DraftModelDrafter
from specserve.drafters.registry import register
from specserve.errors import SpecserveError
from specserve.models.loader import LoadedModel
from specserve.models.timing import median_seconds

CALIBRATION_TEXT = ("The history of the bicycle begins in the early nineteenth century. Write a short, clear "
                    "explanation of how a bicycle stays upright while it moves, and then list three tips for "
                    "riding safely in a city.")


@torch.inference_mode()
def _predictions(model, seq: list[int]) -> torch.Tensor:
    """Greedy next-token prediction at every position of ``seq``, teacher forced: [len(seq)]."""
    cache = model.new_cache(1, len(seq) + 16)
    return model(torch.tensor([seq], device=model.device), cache, [0], [0]).logits[0].argmax(-1).cpu()


def _pass_seconds(model, context: int, tokens: int, reps: int = 3) -> float:
    cache = model.new_cache(1, context + tokens + 16)
    x = torch.randint(0, model.config.vocab_size, (1, context))
    model(x, cache, [0], [0], last_only=True)
    feed = torch.randint(0, model.config.vocab_size, (1, tokens))
    return median_seconds(lambda: model(feed, cache, [0], [context]), reps, model.device)


def choose_skip(target: LoadedModel, prompt: list[int], calib_tokens: int, max_k: int) -> dict:
    """The calibration of the module docstring; returns the choice and what it measured."""
    model, n_layers = target.model, target.config.num_layers
    seq = prompt + greedy_continuation(model, prompt, calib_tokens)
    gen = slice(len(prompt) - 1, len(seq) - 1)               # positions whose next token was generated
    ref = _predictions(model, seq)[gen]

    def agreement(skip: list[int]) -> float:
        keep = [i for i in range(n_layers) if i not in skip]
        return float((_predictions(model.layer_subset(keep), seq)[gen] == ref).float().mean())

    middle = list(range(1, n_layers - 1))
    alone = {i: agreement([i]) for i in middle}
    order = sorted(middle, key=lambda i: -alone[i])          # least important first
    one = _pass_seconds(model, len(seq), 1)
    verify = {k: _pass_seconds(model, len(seq), k + 1) / one for k in range(1, max_k + 1)}
    best = {"estimate": 0.0}
    tried = []
    for m in range(2, max(len(middle) // 2, 2) + 1, 2):
        skip = sorted(order[:m])
        a = min(agreement(skip), 0.999)
        cost = (n_layers - m) / n_layers
        for k in range(1, max_k + 1):
            est = ((1 - a ** (k + 1)) / (1 - a)) / (k * cost + verify[k])
            if est > best["estimate"]:
                best = {"skip": skip, "agreement": a, "draft_cost": cost, "k": k, "estimate": est}
        tried.append({"skipped": m, "agreement": round(a, 3)})
    best["tried"] = tried
    return best


@dataclass(frozen=True)
class LayerSkipOptions:
    skip: str = option("auto", "'auto' (calibrated at start-up) or comma-separated layer indices to skip")
    calib_tokens: int = option(48, "tokens the target generates for the calibration")

    def __post_init__(self) -> None:
        if self.calib_tokens < 8:
            raise SpecserveError(f"layerskip calib_tokens must be >= 8, got {self.calib_tokens}")


@register("layerskip")
class LayerSkipDrafter(DraftModelDrafter):
    max_auto_draft = 6
    Options = LayerSkipOptions

    def __init__(self, target: LoadedModel, **options: Any):
        o = self.opts = self.Options(**options)
        skip, calib_tokens = o.skip, o.calib_tokens
        n = target.config.num_layers
        if skip == "auto":
            if n < 4:
                raise SpecserveError(f"layerskip needs a target of at least 4 layers to choose from, got {n}")
            self.choice = choose_skip(target, self._calibration_prompt(target), calib_tokens, self.max_auto_draft)
            skipped = self.choice["skip"]
            if self.choice["estimate"] < 1.0:
                # not worth it on this model and machine: under auto draft nothing (no draft cache is
                # built either, so the cost is nil); an explicit draft length still drafts
                self.max_auto_draft = 0
        else:
            try:
                skipped = sorted({int(x) for x in skip.split(",") if x.strip()})
            except ValueError:
                raise SpecserveError(f"layerskip skip must be 'auto' or layer indices, got {skip!r}") from None
            if not skipped or skipped[0] < 0 or skipped[-1] >= n or len(skipped) >= n:
                raise SpecserveError(f"layerskip skip needs indices in [0, {n}) leaving at least one layer, got {skip!r}")
            self.choice = {"skip": skipped}
        keep = [i for i in range(n) if i not in skipped]
        subset = target.model.layer_subset(keep)
        view = LoadedModel(model=subset, config=subset.config, path=target.path, options=target.options)
        self._start(target, view)

    @staticmethod
    def _calibration_prompt(target: LoadedModel) -> list[int]:
        try:
            from specserve.tokenizer import load_tokenizer
            return load_tokenizer(target).encode_chat([{"role": "user", "content": CALIBRATION_TEXT}])
        except Exception:  # noqa: BLE001 - a model without a tokenizer (tests): a fixed pseudo-random prompt
            g = torch.Generator().manual_seed(0)
            return torch.randint(0, target.config.vocab_size, (32,), generator=g).tolist()

    def describe(self) -> dict:
        out = {"skipped_layers": self.choice["skip"], "kept_layers": self.draft.config.num_layers,
               "drafts_under_auto": self.max_auto_draft > 0}
        for key in ("agreement", "draft_cost", "estimate", "k", "tried"):
            if key in self.choice:
                out[key] = self.choice[key]
        return out
