"""A mutation check of the test suite: hand-made bugs that the fast tier must catch.

Each mutant is one plausible bug (an off-by-one in an acceptance length, the residual not clamped,
a limit check inverted, a fault not isolated, an int8 block sum's correction term dropped, ...): a
snippet of a source file that occurs in it exactly once, and its replacement.  The script copies
the repository's tree (tracked and untracked-but-not-ignored files, as they are now on disk;
``--head``: the last commit) into a scratch folder, with ``.venv`` linked and its own
``SPECSERVE_CACHE`` (its ``kernels`` seeded from the real cache, keyed by a hash of the sources, so
a C++ mutant builds its own library; ``models`` and ``tokenizers`` linked to the real ones), runs
the fast tier there once unmutated (the baseline: tests that fail there are deselected from every
later run and named in the report), then for each mutant in turn: writes it in, runs its own test
files with ``-x``, and if they pass, the rest of the fast tier with ``-x``; restores the file.
Killed: pytest exits 1.  Survived: 0.  Error: anything else (a mutant that does not import, or a
C++ mutant that does not compile, is a bad mutant, not a kill).  ``--full``: survivors of the fast
tier are then run against the full tier (slow tests too, real models).

    .venv/bin/python scripts/mutants.py --list             # every snippet (EXTRA's too) found exactly once?
    .venv/bin/python scripts/mutants.py --report results/mutants.md        # the MUTANTS list
    .venv/bin/python scripts/mutants.py --only chain-accept-le --only 'limits-*'
    .venv/bin/python scripts/mutants.py --extra --full --report results/mutants.md
    .venv/bin/python scripts/mutants.py --head ...          # the last commit (tests being edited on disk)

``MUTANTS`` is the list run by default; ``EXTRA`` holds more of the same kinds of bug, run with
``--extra`` or by name.  The script renices itself (``--nice``, default 10).

The report (markdown; stdout without ``--report``, rewritten after every mutant so an interrupted
run keeps what it did): one row per mutant with its file, its result, the first test that failed
and the seconds it took.  Exit status 0 when every mutant run was killed, 1 when some survived or
erred, 2 for a snippet that is not in its file exactly once (checked for every selected mutant
before anything runs, and again in the scratch tree).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str            # relative to the repository root
    old: str             # occurs exactly once in the file
    new: str
    what: str            # the bug, in a few words
    tests: tuple[str, ...]   # test files (or node ids) run first, with -x


def M(name: str, file: str, old: str, new: str, what: str, *tests: str) -> Mutant:
    return Mutant(name, file, old, new, what, tuple(tests))


CHAIN, TREE, VROWS = "specserve/verify/chain.py", "specserve/verify/tree.py", "specserve/verify/rows.py"
ROWS, CHOICE, LIMITS = "specserve/engine/rows.py", "specserve/control/choice.py", "specserve/server/limits.py"
SETTINGS = "specserve/server/settings.py"
FAULTS, DRAFTING, ENGINE = "specserve/engine/faults.py", "specserve/engine/drafting.py", "specserve/engine/engine.py"
CTREE, SHAPER = "specserve/constrain/tree.py", "specserve/constrain/shaper.py"
PENALTIES, SPELLING = "specserve/constrain/penalties.py", "specserve/constrain/spelling.py"
Q8H, Q8CPP = "specserve/models/native/q8.h", "specserve/models/native/q8.cpp"
T = "tests/"
VERIFY_T = (T + "test_verify.py", T + "test_distribution.py")
ENGINE_T = (T + "test_engine.py", T + "test_prefill.py")
GRAMMAR_T = (T + "test_grammar.py", T + "test_spelling.py", T + "test_distribution_grammar.py")
INT8_T = (T + "test_int8.py", T + "test_native.py", T + "test_model.py")

MUTANTS: list[Mutant] = [
    # ---- verify/chain.py: greedy and sampled acceptance, the residual, the emitted tokens ----------
    M("chain-accept-le", CHAIN, "accept = (uniform * q_x < p_x)", "accept = (uniform * q_x <= p_x)",
      "acceptance test u*q < p made non-strict (accepts a token p excludes when u = 0)", *VERIFY_T),
    M("chain-ratio-inverted", CHAIN, "accept = (uniform * q_x < p_x)", "accept = (uniform * p_x < q_x)",
      "acceptance ratio inverted: accept with min(1, q/p)", *VERIFY_T),
    M("chain-valid-off-by-one", CHAIN, "torch.arange(k, device=num_draft.device)[None, :] < num_draft[:, None]",
      "torch.arange(k, device=num_draft.device)[None, :] <= num_draft[:, None]",
      "valid drafted positions off by one (one padded slot counted)", *VERIFY_T),
    M("chain-sampled-no-cumprod", CHAIN, "accept.long().cumprod(dim=1).sum(dim=1)", "accept.long().sum(dim=1)",
      "sampled acceptance length counts every accept, not the accepted prefix", *VERIFY_T),
    M("chain-greedy-final-index", CHAIN, "final = argmax.gather(1, num_accepted[:, None]).squeeze(1)",
      "final = argmax.gather(1, (num_accepted - 1).clamp(min=0)[:, None]).squeeze(1)",
      "greedy recovered/bonus token read one position too early", *VERIFY_T),
    M("chain-residual-unclamped", CHAIN, "residual = (p_final - q_final).clamp_min(0)",
      "residual = (p_final - q_final)", "residual max(0, p - q) without the max(0, .)", *VERIFY_T),
    M("chain-residual-q-index", CHAIN, "at = num_accepted.clamp(max=max(k - 1, 0))",
      "at = (num_accepted - 1).clamp(min=0)", "residual subtracts q of the previous drafted position", *VERIFY_T),
    M("chain-bonus-from-residual", CHAIN, "rejected = num_accepted < num_draft", "rejected = num_accepted <= num_draft",
      "all drafts accepted, the bonus token is still drawn from the residual", *VERIFY_T),
    # ---- verify/tree.py: greedy walk and recursive rejection over siblings ----------------------------
    M("tree-greedy-parent-row", TREE, "(tok[:, i] == argmax[rows, p + 1])", "(tok[:, i] == argmax[rows, i])",
      "greedy tree compares a node with the argmax at its own index, not its parent's row", *VERIFY_T),
    M("tree-greedy-path-as-chain", TREE, "node = np.where(here, par[rows, np.maximum(node, 0)], node)",
      "node = np.where(here, node - 1, node)", "accepted path walked up as if node - 1 were the parent", *VERIFY_T),
    M("tree-rej-against-p", TREE, "if bool(uniform[c] * q_x < r[x]):",
      "if bool(uniform[c] * q_x < target_probs[node + 1][x]):",
      "later siblings tested against p, not the residual r", *VERIFY_T),
    M("tree-accept-le", TREE, "if bool(uniform[c] * q_x < r[x]):", "if bool(uniform[c] * q_x <= r[x]):",
      "a sibling's acceptance test made non-strict (accepts a token r excludes when u = 0)", *VERIFY_T),
    M("tree-rej-unnormalised", TREE, "r = residual / residual.sum()", "r = residual",
      "residual not normalised before the next sibling's test", *VERIFY_T),
    M("tree-rej-recovered-from-r", TREE, "dist = residual if residual is not None else r", "dist = r",
      "every child rejected: recovered token from r, without the last sibling's residual", *VERIFY_T),
    # ---- verify/rows.py: a step's routing ------------------------------------------------------------
    M("vrows-greedy-row-shift", VROWS, "r.offset + min(j, len(r.tokens))", "r.offset + min(j + 1, len(r.tokens))",
      "greedy rows read the argmax one logits row late", T + "test_verify.py", *ENGINE_T),
    M("vrows-logits-shift", VROWS, "return logits[r.offset: r.offset + len(r.tokens) + 1]",
      "return logits[r.offset + 1: r.offset + len(r.tokens) + 2]",
      "sampled rows' logits sliced one row late", T + "test_verify.py", *ENGINE_T, T + "test_distribution.py"),
    M("vrows-onehot-missing", VROWS, "q[b, :n] = trees.one_hot_rows(draft[b, :n], vocab, q.dtype, dev)",
      "pass", "a deterministic row batched with q-carrying rows gets q = 0 (always accepted)",
      T + "test_verify.py", *ENGINE_T, T + "test_distribution.py"),
    # ---- engine/rows.py: KV lengths ----------------------------------------------------------------
    M("rows-keep-not-rolled-back", ROWS, "self.cache.set_length(row, start + len(kept))",
      "self.cache.set_length(row, start + len(kept) + 1)",
      "KV length not rolled back past one rejected slot", *ENGINE_T),
    M("rows-keep-no-compact", ROWS, "        self.cache.compact(row, start, kept)\n", "",
      "accepted tree path's KV entries not moved into place", *ENGINE_T),
    M("rows-take-not-emptied", ROWS, "        self.cache.set_length(row, 0)\n", "",
      "a reused row keeps the previous sequence's length", *ENGINE_T),
    M("rows-extend-sets", ROWS, "self.cache.set_length(row, self.cache.lengths[row] + n)", "self.cache.set_length(row, n)",
      "a prompt chunk sets the row's length instead of extending it", T + "test_prefill.py", T + "test_engine.py"),
    # ---- control/choice.py: the keep rule and probes ---------------------------------------------------
    M("choice-gain-uncapped", CHOICE, "capped.append(min(g, capped[p]) if p >= 0 else g)", "capped.append(g)",
      "a node's gain not capped at its parent's (a child may be kept without its parent)",
      T + "test_control.py", T + "test_auto.py"),
    M("choice-rate-no-drafting", CHOICE, "return tokens / (pass_s + drafting_s) if pass_s > 0 else 0.0",
      "return tokens / pass_s if pass_s > 0 else 0.0", "the drafting seconds left out of the rate",
      T + "test_control.py", T + "test_auto.py", T + "test_spelling.py"),
    M("choice-probe-not-forced", CHOICE, "        if n < len(probed):\n            continue\n", "",
      "a probe's node may be dropped (the forced prefix is not required)", T + "test_control.py", T + "test_auto.py"),
    # ---- constrain/: grammar over a tree, masks, penalties, spelling ---------------------------------
    M("grammar-drawn-forbidden-dropped", CTREE, "            elif drawn[c]:\n                keep.append(c)\n", "",
      "a forbidden drawn node removed (changes the residual, so the law)", *GRAMMAR_T),
    M("grammar-forced-beside-skipped", CTREE, "if jump and -1 not in allowed:", "if jump and not allowed:",
      "no forced chain beside deterministic children (jump-forward rule skipped)", *GRAMMAR_T),
    M("grammar-mask-row-shift", CTREE, "matcher.fill(bitmask, node + 1)", "matcher.fill(bitmask, max(node, 0))",
      "a node's mask written into its parent's row", *GRAMMAR_T),
    M("grammar-greedy-mask-inverted", SHAPER, "if not (int(words[r, t >> 5]) >> (t & 31)) & 1:",
      "if (int(words[r, t >> 5]) >> (t & 31)) & 1:", "greedy rows masked only where the argmax is allowed",
      *GRAMMAR_T),
    M("penalty-negative-divided", PENALTIES, "torch.where(out > 0, out / repetition, out * repetition)",
      "out / repetition", "repetition penalty divides negative logits too (raising them)", T + "test_grammar.py",
      T + "test_distribution_grammar.py"),
    # ---- server/settings.py (TokenLimits), server/limits.py (the body limit) ------------------------------
    M("limits-prompt-at-limit", SETTINGS, "prompt_tokens > self.max_prompt_tokens",
      "prompt_tokens >= self.max_prompt_tokens",
      "a prompt of exactly --max-prompt-tokens refused", T + "test_server_limits.py", T + "test_server.py"),
    M("limits-max-tokens-inverted", SETTINGS, "max_tokens > self.max_tokens_limit", "max_tokens < self.max_tokens_limit",
      "--max-tokens-limit check inverted", T + "test_server_limits.py", T + "test_server.py"),
    M("limits-chunked-uncounted", LIMITS, "received += len(message.get(\"body\", b\"\"))",
      "received = len(message.get(\"body\", b\"\"))", "a chunked body counted chunk by chunk, not in total",
      T + "test_server_limits.py", T + "test_server.py"),
    # ---- engine/faults.py (and the drafting calls it guards) -------------------------------------------
    M("faults-call-true", FAULTS, "            self.record(drafter, seq_id, phase, e)\n            return False",
      "            self.record(drafter, seq_id, phase, e)\n            return True",
      "a drafter that failed in begin keeps serving its sequence", T + "test_faults.py"),
    M("faults-batch-not-isolated", DRAFTING, "return [e] if len(reqs) == 1 else [draft(drafter, [r])[0] for r in reqs]",
      "return [e] * len(reqs)", "a batched propose that raises costs every sequence its drafts", T + "test_faults.py"),
    M("faults-drafter-kept", DRAFTING, "s.drafter, s.prompt_feats = PLAIN, {}", "s.prompt_feats = {}",
      "after a fault the sequence keeps its failed drafter", T + "test_faults.py"),
    M("faults-pass-row-leak", ENGINE, "            self.rows.release(s.row)\n        return PassFailed",
      "        return PassFailed", "a failed pass's sequences' KV rows never freed", T + "test_faults.py"),
    # ---- the int8 kernels' block sums (q8.h, q8.cpp; the AVX2 path runs everywhere) -------------------
    M("q8-bias-correction-dropped", Q8H, "  return _mm256_sub_epi32(raw, _mm256_set1_epi32(P::bias * qsum));",
      "  return raw;", "a block's bias * sum(qx) correction dropped (Q4_0, Q5_0, Q6_K)", *INT8_T),
    M("q8-min-term-dropped", Q8H,
      "      if constexpr (P::min) acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.sx[ab]), acc[i]);\n",
      "", "a block's offset term mw * sx dropped (Q4_1, Q5_1, Q4_K, Q5_K)", *INT8_T),
    M("q8-act-scale-block0", Q8H, "_mm256_mul_ps(dw, _mm256_set1_ps(a.d[ab]))",
      "_mm256_mul_ps(dw, _mm256_set1_ps(a.d[(m0 + i) * a.nb]))", "every block scaled by the row's first block's dx",
      *INT8_T),
    M("q8-q6k-half-scale-swapped", Q8H, "_mm256_mullo_epi32(hi, sc1)", "_mm256_mullo_epi32(hi, sc0)",
      "Q6_K second half multiplied by the first half's scale", *INT8_T),
    M("q8-odd-steps-dropped", Q8H, "    for (int i = 0; i < MB; ++i) I[i] = _mm256_add_epi32(I[i], odd[i]);\n",
      "    for (int i = 0; i < MB; ++i) I[i] = I[i];\n", "the odd steps' chain left out of a block's sum (8-bit formats)",
      *INT8_T),
    M("q8-act-half-sum-off-by-one", Q8CPP, "for (int l = 16; l < 32; ++l) s1 += q[32 * b + l];",
      "for (int l = 17; l < 32; ++l) s1 += q[32 * b + l];", "an activation block's second-half sum skips element 16",
      *INT8_T),
]

# Run only with --extra (or named with --only): more of the same kinds of bug, kept checked by --list.
EXTRA: list[Mutant] = [
    # ---- verify/chain.py: greedy and sampled acceptance, the residual, the emitted tokens ----------
    M("chain-accept-unmasked", CHAIN, "accept = (uniform * q_x < p_x) & _valid(num_draft, k)",
      "accept = (uniform * q_x < p_x)", "sampled acceptance ignores num_draft (padding can be accepted)", *VERIFY_T),
    M("chain-greedy-no-cumprod", CHAIN, "match.long().cumprod(dim=1).sum(dim=1)", "match.long().sum(dim=1)",
      "greedy acceptance length counts every match, not the matching prefix", *VERIFY_T),
    M("chain-p-shifted", CHAIN, "p_x = target_probs[:, :k].gather(-1, idx)", "p_x = target_probs[:, 1:].gather(-1, idx)",
      "p(x_i) read from the position after x_i", *VERIFY_T),
    # ---- verify/tree.py: greedy walk and recursive rejection over siblings ----------------------------
    M("tree-greedy-orphan", TREE, "valid & np.where(p >= 0, ok[rows, up], True) & ", "valid & ",
      "greedy tree accepts a node whose parent was rejected", *VERIFY_T),
    M("tree-greedy-final-index", TREE, "final = argmax[rows, np.where(num_accepted > 0, best + 1, 0)]",
      "final = argmax[rows, np.where(num_accepted > 0, best, 0)]",
      "greedy tree bonus token read at the leaf's parent row", *VERIFY_T),
    M("tree-rej-uniform-per-depth", TREE, "if bool(uniform[c] * q_x < r[x]):",
      "if bool(uniform[len(path)] * q_x < r[x]):",
      "one uniform per depth shared by siblings (the same as chains on a chain)", *VERIFY_T),
    # ---- verify/rows.py: a step's routing ------------------------------------------------------------
    M("trees-tree-as-chain", "specserve/trees.py", "all(p == i - 1 for i, p in enumerate(parents))",
      "all(p <= i - 1 for i, p in enumerate(parents))",
      "every topological tree taken for a chain (verification, layout, merged drafts)", T + "test_verify.py", *ENGINE_T),
    # ---- engine/rows.py: KV lengths ----------------------------------------------------------------
    M("rows-prefix-off-by-one", ROWS, "self.cache.set_length(row, match.tokens)",
      "self.cache.set_length(row, match.tokens - 1)",
      "a copied prefix keeps one position too few", T + "test_prefill.py", T + "test_engine.py"),
    # ---- control/choice.py: the keep rule and probes ---------------------------------------------------
    M("choice-forced-charged", CHOICE, "node < cands[i].drafter_nodes", "node <= cands[i].drafter_nodes",
      "the first grammar-forced node charged the drafter's cost", T + "test_control.py", T + "test_spelling.py"),
    M("choice-probe-due-late", CHOICE, "return self.idle >= self.gap", "return self.idle > self.gap",
      "probe due one step late", T + "test_control.py", T + "test_auto.py"),
    M("choice-probe-no-reset", CHOICE,
      "self.gap = config.probe_gap if accepted else min(self.gap * 2, config.max_probe_gap)",
      "self.gap = min(self.gap * 2, config.max_probe_gap)", "an accepted probe does not reset the back-off",
      T + "test_control.py", T + "test_auto.py"),
    # ---- constrain/: grammar over a tree, masks, penalties, spelling ---------------------------------
    M("grammar-forced-over-room", CTREE, "budget = min(room - out.forced, max_depth - depth)",
      "budget = min(room, max_depth - depth)", "forced chains ignore the room already used", *GRAMMAR_T),
    M("grammar-single-token-bit", CTREE, "int(nz[0]) * 32 + w.bit_length() - 1", "int(nz[0]) * 32 + w.bit_length()",
      "the only allowed token's bit index off by one", *GRAMMAR_T),
    M("penalty-path-row-shift", PENALTIES, "rows = [i + 1 for i, p in enumerate(paths) for _ in p]",
      "rows = [i for i, p in enumerate(paths) for _ in p]", "a node's path counts written into its parent's row",
      T + "test_grammar.py", T + "test_distribution_grammar.py"),
    M("spelling-rollback-short", SPELLING, "matcher.rollback(len(out))", "matcher.rollback(max(len(out) - 1, 0))",
      "spelling a forced chain leaves the matcher one token ahead", T + "test_spelling.py", T + "test_grammar.py"),
    # ---- server/settings.py (TokenLimits) -----------------------------------------------------------------
    M("limits-zero-accepted", SETTINGS, "if value is not None and value < 1:", "if value is not None and value < 0:",
      "a limit of 0 accepted at construction", T + "test_server_limits.py", T + "test_cli.py"),
    # ---- engine/faults.py (and the drafting calls it guards) -------------------------------------------
    M("faults-traceback-always", FAULTS, "first = key not in self._traced", "first = True",
      "every fault logged with its traceback", T + "test_faults.py"),
    M("faults-count-reset", FAULTS, "self.counts[drafter] = self.counts.get(drafter, 0) + 1", "self.counts[drafter] = 1",
      "faults per drafter not accumulated", T + "test_faults.py", T + "test_metrics.py"),
    # ---- the int8 kernels' block sums (q8.h, q8.cpp; the AVX2 path runs everywhere) -------------------
    M("q8-bias-half-sum", Q8H, "I = unbias<P>(ia[i], a.hs[2 * ab] + a.hs[2 * ab + 1]);",
      "I = unbias<P>(ia[i], a.hs[2 * ab]);",
      "bias correction uses the first half's activation sum only", *INT8_T),
    M("q8-min-scale-wrong", Q8H, "_mm256_fmadd_ps(mw, _mm256_set1_ps(a.sx[ab]), acc[i])",
      "_mm256_fmadd_ps(mw, _mm256_set1_ps(a.d[ab]), acc[i])", "offset term scaled by dx instead of dx * sum(qx)",
      *INT8_T),
]

CPP_SUFFIXES = (".h", ".cpp", ".cc", ".hpp")
FAST_ENV = {"SPECSERVE_FAST_TIER": "1"}


# ---- the snippets ----------------------------------------------------------------------------------

def check_snippets(mutants: list[Mutant], root: Path) -> list[str]:
    """Problems: a snippet found other than exactly once, a missing file, a no-op replacement."""
    problems = []
    for m in mutants:
        path = root / m.file
        if not path.is_file():
            problems.append(f"{m.name}: no file {m.file}")
            continue
        text = path.read_text()
        n = text.count(m.old)
        if n != 1:
            problems.append(f"{m.name}: snippet found {n} times in {m.file} (must be exactly once): {m.old!r}")
        elif m.file.endswith(".py"):
            try:
                compile(text.replace(m.old, m.new), m.file, "exec")
            except SyntaxError as e:
                problems.append(f"{m.name}: the mutated {m.file} is not Python ({e})")
        if m.old == m.new:
            problems.append(f"{m.name}: the replacement is the snippet itself")
        for t in m.tests:
            if not (root / t.split("::")[0]).exists():
                problems.append(f"{m.name}: no test file {t}")
    return problems


def select(names: list[str] | None, extra: bool) -> list[Mutant]:
    """The default list (and EXTRA with ``extra``); ``names`` (globs) pick from both lists."""
    every = MUTANTS + EXTRA
    dup = {m.name for m in every if sum(x.name == m.name for x in every) > 1}
    if dup:
        sys.exit(f"mutants.py: duplicate mutant names {sorted(dup)}")
    if not names:
        return every if extra else list(MUTANTS)
    patterns = [p for n in names for p in n.split(",") if p]
    pool = every if extra or any(fnmatch.fnmatchcase(m.name, p) for p in patterns for m in EXTRA) else MUTANTS
    chosen = [m for m in pool if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(m.name, p) for m in every)]
    if unmatched:
        sys.exit(f"mutants.py: no mutant named {', '.join(unmatched)} (see --list)")
    return chosen


# ---- the scratch tree --------------------------------------------------------------------------------

def real_cache() -> Path:
    return Path(os.environ.get("SPECSERVE_CACHE", Path.home() / ".cache" / "specserve"))


def make_scratch(base: Path, head: bool) -> tuple[Path, Path]:
    """(repository copy, its SPECSERVE_CACHE) under ``base``."""
    repo, cache = base / "repo", base / "cache"
    repo.mkdir(parents=True)
    if head:
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
    else:
        listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                                capture_output=True).stdout.decode().split("\0")
        for rel in filter(None, listed):
            src = ROOT / rel
            if src.is_file():                      # a file deleted but not yet staged is listed too
                (repo / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, repo / rel)
    (repo / ".venv").symlink_to(ROOT / ".venv")
    cache.mkdir()
    src = real_cache()
    for name in ("models", "tokenizers"):          # large, read by the smoke test and the slow tier
        (src / name).mkdir(parents=True, exist_ok=True)
        (cache / name).symlink_to(src / name)
    for name in ("kernels", "costs"):              # copied: written to here, never shared
        if (src / name).is_dir():
            shutil.copytree(src / name, cache / name)
        else:
            (cache / name).mkdir()
    return repo, cache


def scrub_pycache(repo: Path) -> None:
    for d in (repo / "specserve").rglob("__pycache__"):
        shutil.rmtree(d, ignore_errors=True)


# ---- running pytest ------------------------------------------------------------------------------------

TIMED_OUT = -1000


@dataclasses.dataclass
class Run:
    rc: int                     # pytest's exit status (-N: killed by signal N); TIMED_OUT
    failed: list[str]           # node ids that failed or erred, in order
    seconds: float
    tail: str


def run(cmd: list[str], repo: Path, env: dict[str, str], timeout: float) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)          # the group this call started (pytest and its children)
        out, _ = p.communicate()
        rc = TIMED_OUT
    return rc, out, time.perf_counter() - t0


def failures(junit: Path) -> list[str]:
    """Node ids of the tests that failed or erred, in run order, from pytest's junit XML (xunit1:
    each case names its file)."""
    if not junit.is_file():
        return []
    try:
        tree = ET.parse(junit)
    except ET.ParseError:
        return []
    out = []
    for case in tree.iter("testcase"):
        if case.find("failure") is None and case.find("error") is None:
            continue
        file, cls, name = case.get("file", ""), case.get("classname", ""), case.get("name", "")
        module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
        inner = cls[len(module) + 1:] if module and cls.startswith(module + ".") else ""
        out.append("::".join(x for x in (file or cls, inner, name) if x))
    return out


def pytest(repo: Path, env: dict[str, str], args: list[str], fast: bool, deselect: list[str], timeout: float,
           stop_first: bool = True) -> Run:
    junit = repo.parent / "junit.xml"
    junit.unlink(missing_ok=True)
    cmd = [str(ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    cmd += ["-x"] if stop_first else []
    cmd += ["-m", "not slow"] if fast else []
    for d in deselect:
        cmd += ["--deselect", d]
    rc, out, seconds = run(cmd + args, repo, env, timeout)
    return Run(rc, failures(junit), seconds, out[-3000:])


def test_env(repo: Path, cache: Path, fast: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SPECSERVE_FAST_TIER"}
    env.update(SPECSERVE_CACHE=str(cache), PYTHONPATH=str(repo), PYTHONDONTWRITEBYTECODE="1")
    if fast:
        env.update(FAST_ENV)
    return env


def check_imports_scratch(repo: Path, env: dict[str, str]) -> None:
    """The scratch copy's specserve is the one imported there (not the editable install's)."""
    rc, out, _ = run([str(ROOT / ".venv" / "bin" / "python"), "-c", "import specserve; print(specserve.__file__)"],
                     repo, env, 120)
    if rc != 0 or not Path(out.strip().splitlines()[-1]).resolve().is_relative_to(repo.resolve()):
        sys.exit(f"mutants.py: the scratch tree does not import its own specserve ({out.strip()!r})")


BUILD_TIMEOUT = 1800     # seconds to compile the kernels (about a minute on two busy cores)


def build_kernels(repo: Path, env: dict[str, str], cache: Path,
                  timeout: float = BUILD_TIMEOUT) -> tuple[bool, str, set[Path]]:
    """Build (or find) the scratch tree's kernel library; (ok, output, library files that appeared)."""
    before = set((cache / "kernels").glob("*.so"))
    code = ("from specserve.models import native as nt; import sys; r = nt.unavailable_reason(); "
            "print(r or nt.library()._name); sys.exit(1 if r else 0)")
    rc, out, _ = run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], repo, env, timeout)
    if rc == TIMED_OUT:
        out += f"\n(timed out after {timeout:.0f} s)"
    return rc == 0, out[-3000:], set((cache / "kernels").glob("*.so")) - before


# ---- one mutant -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Result:
    mutant: Mutant
    status: str = ""           # killed / survived / error / timeout
    tier: str = "fast"         # the tier that decided it (full: a fast-tier survivor run with --full)
    by: str = ""               # the first failing test, or why it erred
    seconds: float = 0.0
    fast_survived: bool = False


def classify(r: Run) -> str:
    return {0: "survived", 1: "killed", TIMED_OUT: "timeout"}.get(r.rc, "error")


def stages(repo: Path, env: dict[str, str], m: Mutant, fast: bool, deselect: list[str],
           timeout: float) -> tuple[str, str, float]:
    """Its own tests with -x, then (if they pass) the rest of the tier with -x: (status, by, seconds)."""
    own = [t for t in m.tests]
    first = pytest(repo, env, own, fast, deselect, timeout)
    if first.rc != 0:
        return classify(first), describe(first, "own tests"), first.seconds
    ignore = [f"--ignore={t}" for t in own if "::" not in t]
    rest = pytest(repo, env, ignore + ["tests"], fast, deselect, max(1.0, timeout - first.seconds))
    return classify(rest), describe(rest, "rest of the tier"), first.seconds + rest.seconds


def describe(r: Run, stage: str) -> str:
    if r.rc == 0:
        return ""
    if r.rc == TIMED_OUT:
        return f"timed out ({stage})"
    if r.rc == 1 and r.failed:
        return r.failed[0] + ("" if stage == "own tests" else " (not in its own tests)")
    if r.rc < 0:
        return f"pytest killed by signal {-r.rc} ({stage}; a crash, e.g. a kernel's bad memory access)"
    last = [line for line in r.tail.strip().splitlines() if line.strip()][-3:]
    return f"pytest exit {r.rc} ({stage}): " + " | ".join(last)


def run_mutant(repo: Path, cache: Path, m: Mutant, args, deselect_fast: list[str], deselect_full: list[str]) -> Result:
    res = Result(m)
    path = repo / m.file
    original = path.read_text()
    if original.count(m.old) != 1:
        print(f"mutants.py: {m.name}: snippet found {original.count(m.old)} times in the scratch {m.file}",
              file=sys.stderr)
        sys.exit(2)
    t0 = time.perf_counter()
    new_libs: set[Path] = set()
    try:
        path.write_text(original.replace(m.old, m.new))
        scrub_pycache(repo)
        if m.file.endswith(CPP_SUFFIXES):
            ok, out, new_libs = build_kernels(repo, test_env(repo, cache, True), cache)
            if not ok:
                res.status, res.by = "error", "does not build: " + " | ".join(out.strip().splitlines()[-3:])
                return res
            if not new_libs:
                res.status, res.by = "error", "no new kernel library was built (is the file compiled?)"
                return res
        status, by, _ = stages(repo, test_env(repo, cache, True), m, True, deselect_fast, args.timeout)
        res.status, res.by = status, by
        if status == "survived" and args.full:
            res.fast_survived, res.tier = True, "full"
            status, by, _ = stages(repo, test_env(repo, cache, False), m, False, deselect_full, args.full_timeout)
            res.status, res.by = status, by
        return res
    finally:
        path.write_text(original)
        scrub_pycache(repo)
        for lib in new_libs:
            lib.unlink(missing_ok=True)
        res.seconds = time.perf_counter() - t0


# ---- the report -------------------------------------------------------------------------------------

def report(results: list[Result], header: list[str], pending: list[Mutant]) -> str:
    counts = {s: sum(r.status == s for r in results) for s in ("killed", "survived", "error", "timeout")}
    lines = ["# Mutation check", ""] + header + [
        "", f"{len(results)} run: {counts['killed']} killed, {counts['survived']} survived, "
        f"{counts['error']} error, {counts['timeout']} timed out"
        + (f"; {len(pending)} not run yet" if pending else ""), "",
        "| mutant | file | result | killed by | seconds |", "|---|---|---|---|---|"]
    for r in results:
        status = r.status + (" (full tier)" if r.tier == "full" else "")
        if r.fast_survived and r.status == "killed":
            status = "killed by the full tier only"
        by = r.by.replace("|", "\\|") if r.status != "survived" else ""
        lines.append(f"| {r.mutant.name} | {r.mutant.file} | {status} | {by} | {r.seconds:.0f} |")
    survivors = [r for r in results if r.status != "killed" or r.fast_survived]
    if survivors:
        lines += ["", "## Not killed by the fast tier", ""]
        for r in survivors:
            why = f" — {r.by}" if r.by and r.status != "killed" else ""
            why += " — the full tier kills it" if r.fast_survived and r.status == "killed" else ""
            lines.append(f"- **{r.mutant.name}** ({r.mutant.file}): {r.mutant.what}{why}")
    return "\n".join(lines) + "\n"


def git(*a: str) -> str:
    return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="list the mutants and check every snippet is in its file once")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="run these mutants (a name or a glob such as 'q8-*'; repeatable, or comma-separated)")
    ap.add_argument("--report", type=Path, help="write the markdown report here (default: print it)")
    ap.add_argument("--extra", action="store_true", help=f"also run the {len(EXTRA)} extra mutants (EXTRA)")
    ap.add_argument("--full", action="store_true", help="run the fast tier's survivors against the full tier")
    ap.add_argument("--head", action="store_true", help="copy the last commit, not the working tree as it is on disk")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run (assume the tier passes)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds for one mutant's fast-tier runs (default 3600)")
    ap.add_argument("--full-timeout", type=float, default=3 * 3600, help="seconds for one mutant's full-tier runs")
    ap.add_argument("--scratch", type=Path, help="the scratch folder's parent (default: the system's temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder afterwards")
    ap.add_argument("--nice", type=int, default=10, help="niceness added to this process and its tests (default 10)")
    args = ap.parse_args()

    chosen = select(args.only, args.extra or args.list)
    problems = check_snippets(chosen, ROOT)
    if args.list:
        width = max(len(m.name) for m in chosen)
        for m in chosen:
            print(f"{m.name:<{width}}  {'extra' if m in EXTRA else '     '}  {m.file:<34}  {m.what}")
        print(f"\n{len(chosen)} mutants ({sum(m in EXTRA for m in chosen)} extra, run with --extra); "
              + ("every snippet found exactly once" if not problems else f"{len(problems)} problems:"))
        for p in problems:
            print("  " + p)
        sys.exit(2 if problems else 0)
    if problems:
        print("mutants.py: " + "\n  ".join(["the mutant list does not match the sources:"] + problems), file=sys.stderr)
        sys.exit(2)
    if args.nice:
        os.nice(args.nice)

    base = Path(tempfile.mkdtemp(prefix="specserve-mutants-", dir=args.scratch))
    results: list[Result] = []
    try:
        repo, cache = make_scratch(base, args.head)
        now = datetime.datetime.now().isoformat(timespec="seconds")
        header = [f"- {now}, commit {git('rev-parse', '--short', 'HEAD')}"
                  + (" (the commit)" if args.head else
                     f" + the working tree as on disk ({len(git('status', '--porcelain').splitlines())} paths changed)"),
                  f"- fast tier: `SPECSERVE_FAST_TIER=1 pytest -x -m 'not slow'`, the mutant's own tests first"
                  + ("; fast-tier survivors then against the full tier" if args.full else "")]
        env = test_env(repo, cache, True)
        check_imports_scratch(repo, env)
        ok, out, _ = build_kernels(repo, env, cache)
        if not ok:
            sys.exit(f"mutants.py: the unmutated kernels do not build or load:\n{out}")
        deselect_fast: list[str] = []
        deselect_full: list[str] = []
        if not args.no_baseline:
            print("baseline: the unmutated fast tier ...", file=sys.stderr, flush=True)
            base_run = pytest(repo, env, ["tests"], True, [], args.timeout, stop_first=False)
            if base_run.rc not in (0, 1):
                sys.exit(f"mutants.py: the unmutated fast tier does not run (pytest exit {base_run.rc}; tests being "
                         f"edited? --head runs the last commit's tree):\n{base_run.tail}")
            deselect_fast = base_run.failed
            header.append(f"- baseline (unmutated fast tier): {base_run.seconds:.0f} s, "
                          + (f"{len(deselect_fast)} failing tests deselected everywhere: "
                             + ", ".join(f"`{t}`" for t in deselect_fast) if deselect_fast else "passes"))
            if args.full:
                print("baseline: the unmutated full tier ...", file=sys.stderr, flush=True)
                full_run = pytest(repo, test_env(repo, cache, False), ["tests"], False, [], args.full_timeout,
                                  stop_first=False)
                if full_run.rc not in (0, 1):
                    sys.exit(f"mutants.py: the unmutated full tier does not run (pytest exit {full_run.rc}):\n"
                             f"{full_run.tail}")
                deselect_full = full_run.failed
                header.append(f"- baseline (unmutated full tier): {full_run.seconds:.0f} s, "
                              + (f"{len(deselect_full)} failing tests deselected there: "
                                 + ", ".join(f"`{t}`" for t in deselect_full) if deselect_full else "passes"))
        else:
            header.append("- no baseline run (--no-baseline): the tier is assumed to pass unmutated")

        def emit(final: bool) -> None:
            text = report(results, header, chosen[len(results):])
            if args.report:
                args.report.parent.mkdir(parents=True, exist_ok=True)
                args.report.write_text(text)
            elif final:
                print(text)

        for i, m in enumerate(chosen):
            print(f"[{i + 1}/{len(chosen)}] {m.name} ({m.file}) ...", file=sys.stderr, flush=True)
            r = run_mutant(repo, cache, m, args, deselect_fast, deselect_full)
            results.append(r)
            print(f"    {r.status}{' (full tier)' if r.tier == 'full' else ''} in {r.seconds:.0f} s"
                  + (f": {r.by}" if r.by else ""), file=sys.stderr, flush=True)
            emit(False)
        emit(True)
    finally:
        if args.keep:
            print(f"scratch kept: {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    sys.exit(0 if all(r.status == "killed" for r in results) else 1)


if __name__ == "__main__":
    main()
