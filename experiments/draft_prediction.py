"""What a draft model would buy a target, predicted from measured pass costs: a prediction, not a run.

    .venv/bin/python experiments/draft_prediction.py TARGET.gguf DRAFT.gguf [--alphas 0.6,0.8] [--ks 2,4,8]

Random-weight files (``specserve make-model``; the draft in the ``smollm2-135m`` shape with the
target's ``--vocab``) have the real costs but no real acceptance, so acceptance is taken as a
parameter, as the synthetic oracle takes it: each drafted token right with probability alpha,
independently.  A step of a chain of k drafted tokens then yields E(k) = (1 - alpha^(k+1)) / (1 - alpha)
tokens (the accepted prefix and the target's own token), and costs one target pass of k + 1 tokens
T(k+1) plus k one-token draft passes D(1).  Predicted speed-up over plain decoding (one T(1) a token):

    oracle (free drafts):   E(k) * T(1) / T(k+1)
    draft model:            E(k) * T(1) / (T(k+1) + k * D(1))

Both ignore the step's work outside its passes (drafting bookkeeping, verification, commit), so they
are upper bounds of what the engine reaches; the oracle's line, beside the oracle's measured speed-up
in the same benchmark section, shows how far off the bound is.  Passes are the median of ``--reps``
at ``--context`` tokens of cache (``specserve.bench.profile``).
"""
import argparse
import json

from specserve.bench.profile import profile_pass
from specserve.models import RuntimeOptions
from specserve.models.loader import load_model


def expected_tokens(alpha: float, k: int) -> float:
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--alphas", default="0.6,0.8")
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    alphas = [float(x) for x in a.alphas.split(",")]
    ks = [int(x) for x in a.ks.split(",")]
    target = load_model(a.target, RuntimeOptions())
    t = {n: profile_pass(target, n, a.context, a.reps)["pass_ms"] for n in sorted({1, *[k + 1 for k in ks]})}
    del target
    draft = load_model(a.draft, RuntimeOptions())
    d1 = profile_pass(draft, 1, a.context, a.reps)["pass_ms"]
    print(f"target passes (ms, context {a.context}): " + ", ".join(f"{n} tokens {ms:.2f}" for n, ms in t.items()))
    print(f"draft one-token pass: {d1:.2f} ms ({d1 / t[1]:.3f} of the target's)\n")
    print("| alpha | k | tokens a step | oracle (predicted) | draft model (predicted) |")
    print("|---:|---:|---:|---:|---:|")
    rows = []
    for alpha in alphas:
        for k in ks:
            e = expected_tokens(alpha, k)
            oracle = e * t[1] / t[k + 1]
            model = e * t[1] / (t[k + 1] + k * d1)
            rows.append({"alpha": alpha, "k": k, "tokens_per_step": e, "oracle": oracle, "draft_model": model})
            print(f"| {alpha} | {k} | {e:.2f} | {oracle:.2f}x | {model:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"target_pass_ms": t, "draft_pass_ms": d1, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
