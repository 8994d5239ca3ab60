"""report.md and PNG plots from a results document."""

from __future__ import annotations

from pathlib import Path

from specserve.bench.metrics import TIME_PARTS


def _ms(x: float) -> str:
    return "-" if x != x else f"{x * 1e3:.0f}"


def _pct(x: float | None) -> str:
    """A share as a whole percentage; "-" when absent (a results file from before the timer existed)."""
    return "-" if x is None or x != x else f"{x * 100:.0f}"


def render_report(doc: dict) -> str:
    """report.md: the run's setting and roofline, then each table the document has data for."""
    lines = _head(doc) + _overall_table(doc) + _structured_table(doc) + _draft_size_table(doc) + _learned(doc)
    lines += _group_table(doc)
    lines += _concurrency_table(doc) + _cost_section(doc) + _peer_table(doc)
    if doc.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in doc["plots"]]
    return "\n".join(lines) + "\n"


def _head(doc: dict) -> list[str]:
    cfg = doc["config"]
    return ["# specserve bench", "", f"Command: `{cfg['command']}`", "",
            f"Model `{Path(cfg['model_path']).name}`, runtime {cfg['runtime']}, {cfg['max_tokens']} new tokens, "
            f"{_sampling(cfg)}, prompts: {cfg.get('prompt_format', 'chat template')}. Machine: "
            f"{doc['machine'].get('processor') or 'CPU'}, {doc['machine']['cpus']} CPUs, {doc['machine']['platform']}.", "",
            "## Roofline", "", roofline_line(doc["roofline"]).strip()] + _memory_line(doc)


def _memory_line(doc: dict) -> list[str]:
    """Which drafters remember across requests, and whether each phase started them fresh."""
    mem = doc.get("memory")
    if not mem or not mem["drafters"]:
        return []
    names = ", ".join(mem["drafters"])
    how = ("each phase (concurrency 1, then each level) started them empty, as a fresh server would, and they "
           "learnt from that phase's requests alone" if mem["phases"] == "fresh" else
           "they kept their memory from one phase to the next (a warm workload: later phases replay earlier answers)")
    return ["", f"Drafters with memory across requests ({names}): {how}."]


def _overall_table(doc: dict) -> list[str]:
    """Concurrency 1 over all prompts: speed, acceptance, latency, and where the time goes."""
    sampled = bool(doc["config"].get("temperature"))
    parts = " | ".join(f"{p} %" for p in TIME_PARTS)
    lines = ["", "## Concurrency 1, all prompts", "",
             "| method | tok/s (mean) | tok/s (total) | speed-up (Spec-Bench) | speed-up (total time) | mean accepted length "
             f"| nodes per step | acceptance by depth | TTFT p50/p90 ms | TPOT p50/p90 ms | E2E p50/p99 s | {parts} "
             "| divergent |",
             "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(TIME_PARTS) + "---|"]
    for label, s in doc["summary"].items():
        o = s["overall"]
        acc = " ".join(f"{a:.2f}" for a in o["acceptance_by_depth"][:8]) or "-"
        name = f"{label} (SYNTHETIC)" if s["synthetic"] else label
        shares = " | ".join(_pct(o.get(f"share_{p}")) for p in TIME_PARTS)
        lines.append(f"| {name} | {o['tokens_per_second_mean']:.1f} | {o['tokens_per_second_total']:.1f} | "
                     f"{o['speedup']['spec_bench']:.2f}x | {o['speedup']['total_time']:.2f}x | "
                     f"{o['mean_accepted_length']:.2f} | {o['mean_nodes_per_step']:.2f} | {acc} | "
                     f"{_ms(o['ttft_s']['p50'])}/{_ms(o['ttft_s']['p90'])} | "
                     f"{_ms(o['tpot_s']['p50'])}/{_ms(o['tpot_s']['p90'])} | {o['e2e_s']['p50']:.2f}/{o['e2e_s']['p99']:.2f} | "
                     f"{shares} | " + (f"{o['divergent_prompts']}/{o['requests']} |" if not sampled else "- (sampled) |"))
    return lines


def _structured_table(doc: dict) -> list[str]:
    """Prompts with a response format: outputs valid under their schema, and the forced tokens drafted."""
    rows = [(label, s["overall"]) for label, s in doc["summary"].items()]
    if not any(o.get("constrained") for _, o in rows):
        return []
    lines = ["", "## Structured outputs (prompts with a response format)", "",
             "Valid: the output parses and validates against its schema (`json`, `jsonschema`); a method named "
             "`...:grammar=off` decodes the same prompts without their grammar. Forced: tokens the grammar forced, "
             "drafted for free (accepted / drafted).", "",
             "| method | valid | forced tokens accepted / drafted |", "|---|---|---|"]
    for label, o in rows:
        valid = f"{o['valid']}/{o['constrained']}" if o.get("constrained") else "- (no grammar)"
        lines.append(f"| {label} | {valid} | {o.get('forced_accepted', 0)} / {o.get('forced_tokens', 0)} |")
    return lines


def _draft_size_table(doc: dict) -> list[str]:
    lines = ["", "## Draft sizes chosen (nodes per verification step; auto: the controller's choice)", "",
             "| method | steps with no draft | nodes per step: steps | measured / predicted pass time p50 (p90) |",
             "|---|---|---|---|"]
    for label, s in doc["summary"].items():
        d = s["overall"].get("draft_sizes")
        if not d:
            continue
        hist = " ".join(f"{n}:{c}" for n, c in d["nodes_histogram"].items())
        ratio = (f"{d['measured_over_predicted_p50']:.2f} ({d['measured_over_predicted_p90']:.2f})"
                 if d["measured_over_predicted_p50"] == d["measured_over_predicted_p50"] else "-")
        lines.append(f"| {label} | {d['off_share'] * 100:.0f}% | {hist} | {ratio} |")
    return lines


def _group_table(doc: dict) -> list[str]:
    groups = doc["config"]["groups"]
    lines = ["", "## Per group: speed-up (Spec-Bench definition) / mean accepted length / nodes per step", "",
             "| method | " + " | ".join(groups) + " |", "|---|" + "---|" * len(groups)]
    for label, s in doc["summary"].items():
        cells = [f"{s['groups'][g]['speedup']['spec_bench']:.2f}x / {s['groups'][g]['mean_accepted_length']:.2f} / "
                 f"{s['groups'][g]['mean_nodes_per_step']:.1f}" if g in s["groups"] else "-" for g in groups]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _concurrency_table(doc: dict) -> list[str]:
    if not doc.get("concurrency"):
        return []
    asked = doc["config"].get("concurrency_prompts")
    n = doc.get("concurrency_requests")
    note = ([f"Levels above 1 ran {n} requests each: --concurrency-prompts asked for {asked}, but only {n} prompts "
             "were selected (--per-group x groups).", ""] if asked and n is not None and asked > n else [])
    if any("predicted_vs_plain" in c for c in doc["concurrency"]):
        note += ["Predicted: `specserve advise`'s prediction (in brackets its mean accepted length), from replaying "
                 "each method over plain decoding's output with the engine's controller and cost model, calibrated "
                 "on plain decoding's measured time at the same level." + "".join(
                     f" Not predicted: {k} ({v})." for k, v in doc.get("not_predicted", {}).items()), ""]
    lines = ["", "## Concurrency (closed loop, batched engine)", "", *note,
             "| method | concurrency | requests | req/s | output tok/s | vs plain | predicted | TTFT p50/p99 ms | "
             "TPOT p50/p99 ms | ITL p50/p99 ms | E2E p50/p99 s | mean accepted length | nodes per step | "
             "steps with no draft |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    plain = {c["concurrency"]: c["output_tok_s"] for c in doc["concurrency"] if c["method"] == "none"}
    for c in doc["concurrency"]:
        vs = c["output_tok_s"] / plain[c["concurrency"]] if plain.get(c["concurrency"]) else float("nan")
        off = c.get("draft_sizes", {}).get("off_share", float("nan"))
        lines.append(f"| {c['method']} | {c['concurrency']} | {c['requests']} | {c['request_throughput']:.3f} | "
                     f"{c['output_tok_s']:.1f} | {vs:.2f}x | {_predicted(c)} | "
                     f"{_ms(c['ttft_s']['p50'])}/{_ms(c['ttft_s']['p99'])} | "
                     f"{_ms(c['tpot_s']['p50'])}/{_ms(c['tpot_s']['p99'])} | {_ms(c['itl_s']['p50'])}/{_ms(c['itl_s']['p99'])} | "
                     f"{c['e2e_s']['p50']:.2f}/{c['e2e_s']['p99']:.2f} | {c['mean_accepted_length']:.2f} | "
                     f"{c.get('mean_nodes_per_step', float('nan')):.2f} | {off * 100:.0f}% |")
    return lines


def _predicted(row: dict) -> str:
    """The advisor's predicted speed-up (and mean accepted length) for a row, or "-"."""
    if "predicted_vs_plain" not in row:
        return "-"
    return f"{row['predicted_vs_plain']:.2f}x ({row['predicted_mean_accepted_length']:.2f})"


def _cost_section(doc: dict) -> list[str]:
    if not doc.get("cost_curve"):
        return []
    lines = ["", "## Cost of one target pass (ms; in brackets: relative to 1 token at the same batch size)", "",
             *cost_table(doc["cost_curve"])]
    ceiling = doc["roofline"].get("compute_ms_per_token")
    if ceiling == ceiling and ceiling:
        lines += ["", "Each extra token of a pass against the multiply-add ceiling "
                  f"({ceiling:.2f} ms per token): " + "; ".join(
                      f"batch {b}: {ms:.2f} ms ({ms / ceiling:.1f}x the ceiling)"
                      for b, ms in marginal_token_ms(doc["cost_curve"]).items()) + "."]
    return lines


def _peer_table(doc: dict) -> list[str]:
    if not doc.get("peers"):
        return []
    lines = ["", "## Peers (same prompts, greedy)", "",
             "| engine | tok/s (mean) | tok/s (total) | greedy text equal to ours |", "|---|---|---|---|"]
    for p in doc["peers"]:
        if "error" in p:
            lines.append(f"| {p['peer']} | failed after {p['requests']} prompts: {p['error']} | | |")
            continue
        lines.append(f"| {p['peer']} | {p['tokens_per_second_mean']:.1f} | {p['tokens_per_second_total']:.1f} | "
                     f"{p['same_greedy_text']}/{p['requests']} |")
    return lines


def _sampling(cfg: dict) -> str:
    if not cfg.get("temperature"):
        return "greedy"
    return (f"sampled (temperature {cfg['temperature']}, top-p {cfg.get('top_p', 1.0)}, prompt i seeded "
            f"{cfg.get('seed', 0)} + i; the output distribution is the target's, the tokens differ by method)")


def _short(path: str) -> str:
    """A shipped head's path from the package folder on."""
    i = path.find("specserve/data/heads/")
    return path[i:] if i >= 0 else path


def _learned(doc: dict) -> list[str]:
    """Where each learned drafter's head came from."""
    heads: dict[str, tuple[list[str], dict]] = {}
    for label, d in doc.get("drafters", {}).items():
        if d.get("head"):
            heads.setdefault(d["head"], ([], d))[0].append(label)
    if not heads:
        return []
    out = ["", "## Learned drafters: the heads behind them", "",
           "| methods | head | features | reduced vocabulary | trained on | training | validation (greedy chain) |",
           "|---|---|---|---|---|---|---|"]
    for labels, d in heads.values():
        label = ", ".join(labels)
        data, val = d.get("training_data", {}), d.get("validation", {})
        trained = (f"{data.get('train_sequences', '?')} sequences, {data.get('train_positions', '?')} positions "
                   f"({d.get('positions')} positions; {data.get('prompts', '?')} prompts answered by the target)")
        secs = d.get("training_wall_seconds")
        how = f"`{d.get('training_command', '')}`" + (f", {secs / 60:.0f} min" if secs else "")
        acc = (f"{val['accepted']:.2f} tokens / step of a {val['depth']}-deep chain" if val else "-")
        out.append(f"| {label} | `{_short(d['head'])}` | {d.get('feature_layers')} | {d.get('reduced_vocabulary')} | "
                   f"{trained} | {how} | {acc} |")
    return out


def write_plots(doc: dict, outdir: Path) -> list[str]:
    """speedup_by_group.png, acceptance_by_depth.png, concurrency.png, cost_curve.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    groups = doc["config"]["groups"]
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = list(doc["summary"])
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        s = doc["summary"][label]
        vals = [s["groups"][g]["speedup"]["spec_bench"] if g in s["groups"] else 0 for g in groups]
        ax.bar([x + i * width for x in range(len(groups))], vals, width,
               label=label + (" (synthetic)" if s["synthetic"] else ""))
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(groups))], groups, rotation=20)
    ax.set_ylabel("speed-up vs plain decoding")
    ax.legend(fontsize=8)
    paths.append(_save(fig, outdir / "speedup_by_group.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, s in doc["summary"].items():
        acc = s["overall"]["acceptance_by_depth"]
        if acc:
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=label)
    ax.set_xlabel("draft depth (chain: position)")
    ax.set_ylabel("acceptance rate at depth")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    paths.append(_save(fig, outdir / "acceptance_by_depth.png"))

    if doc.get("concurrency"):
        paths.append(_concurrency_plot(plt, doc, outdir / "concurrency.png"))

    if doc.get("cost_curve"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for b in sorted({c["batch"] for c in doc["cost_curve"]}):
            rows = [c for c in doc["cost_curve"] if c["batch"] == b and c.get("shape", "chain") == "chain"]
            ax.plot([c["tokens"] for c in rows], [c["seconds"] * 1e3 for c in rows], marker="o", label=f"batch {b}")
        ax.set_xlabel("tokens per row in the pass")
        ax.set_ylabel("ms per target pass")
        ax.legend(fontsize=8)
        paths.append(_save(fig, outdir / "cost_curve.png"))
    return paths


def family(label: str) -> str:
    """A method's drafter with its options but without its draft size: 'ngram:k=4' -> 'ngram'."""
    return ":".join(part for part in label.split(":") if not part.startswith("k="))


def _concurrency_plot(plt, doc: dict, path: Path) -> str:
    """Output tokens/s against concurrency, one panel per drafter: plain decoding (dashed), each
    fixed draft size and auto, so that each panel answers 'which size wins at this load'."""
    base = next(iter(doc["summary"]))                     # plain decoding runs first
    families: dict[str, list[str]] = {}
    for label in doc["summary"]:
        if label != base:
            families.setdefault(family(label), []).append(label)
    cols = min(3, max(len(families), 1))
    rows = -(-max(len(families), 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)

    def series(label):
        pts = sorted((c["concurrency"], c["output_tok_s"]) for c in doc["concurrency"] if c["method"] == label)
        return [p[0] for p in pts], [p[1] for p in pts]

    levels = sorted({c["concurrency"] for c in doc["concurrency"]})
    for ax, (name, labels) in zip(axes.flat, families.items()):
        ax.plot(*series(base), "k--", marker=".", label="plain")
        for label in labels:
            ax.plot(*series(label), marker="o", ms=3, label=label[len(name):].lstrip(":") or "auto")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(level) for level in levels])
        ax.set_title(name if len(name) < 40 else name[:37] + "...", fontsize=9)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(families):]:
        ax.axis("off")
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return str(path)


def marginal_token_ms(curve: list[dict]) -> dict[int, float]:
    """Per batch size: ms each extra token per row adds to a chain pass (per token of the batch),
    from the smallest to the largest tokens-per-row measured."""
    out = {}
    for b in sorted({c["batch"] for c in curve}):
        rows = sorted((c["tokens"], c["seconds"]) for c in curve if c["batch"] == b and c.get("shape", "chain") == "chain")
        if len(rows) > 1 and rows[-1][0] > rows[0][0]:
            out[b] = 1e3 * (rows[-1][1] - rows[0][1]) / ((rows[-1][0] - rows[0][0]) * b)
    return out


def roofline_line(r: dict) -> str:
    """The roofline card in one paragraph: weights, bandwidth ceiling, multiply-add ceilings."""
    return (f" {r['parameters'] / 1e6:.1f}M parameters, {r['weight_bytes'] / 2**20:.0f} MiB of weights as run; "
            f"measured copy bandwidth {r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; bandwidth-bound ceiling for plain "
            f"decoding {r['plain_decoding_ceiling_tok_s']:.0f} tok/s." + _ceilings(r))


def _ceilings(r: dict) -> str:
    """The multiply-add ceilings of the roofline card, fp32 and int8, and the compute-bound ceiling of
    the activations the model runs."""
    macs = r.get("multiply_adds_per_s")
    if macs is None or macs != macs:                  # not measured (no native kernels): nan
        return ""
    text = f" Measured multiply-add ceilings (every core): fp32 {r['multiply_adds_per_s'] / 1e9:.1f} G/s (AVX2+FMA)"
    if "int8_multiply_adds_per_s" in r:
        text += f", int8 {r['int8_multiply_adds_per_s'] / 1e9:.1f} G/s ({r['int8_path']})"
    if "attention_path" in r:
        text += f"; attention on the {r['attention_path']} path"
    return text + (f"; with {r.get('activations', 'f32')} activations the compute-bound ceiling is "
                   f"{r['compute_ceiling_tok_s']:.0f} tok/s, {r['compute_ms_per_token']:.2f} ms per token of a pass at the least.")


def cost_table(curve: list[dict]) -> list[str]:
    """Markdown rows of a cost curve: one line per batch size and pass shape (chain, or the same
    number of tokens as a binary tree), one column per tokens-per-row.  Chain cells show the ratio
    to a 1-token pass, tree cells the ratio to the chain of as many tokens."""
    keys = sorted({(c["batch"], c.get("shape", "chain")) for c in curve})
    tokens = sorted({c["tokens"] for c in curve})
    cell = {(c["batch"], c.get("shape", "chain"), c["tokens"]): c for c in curve}

    def fmt(c: dict | None) -> str:
        if c is None:
            return "-"
        if c.get("shape", "chain") == "tree":
            return f"{c['seconds'] * 1e3:.1f} (x{c['relative_to_chain']:.2f} chain)"
        rel = c["relative_to_1_token"]
        return f"{c['seconds'] * 1e3:.1f}" + (f" ({rel:.2f})" if rel is not None else "")

    lines = ["| batch \\ tokens per row | " + " | ".join(map(str, tokens)) + " |", "|---|" + "---|" * len(tokens)]
    return lines + [f"| {b}{' tree' if shape == 'tree' else ''} | " + " | ".join(fmt(cell.get((b, shape, t))) for t in tokens)
                    + " |" for b, shape in keys]


def render_endpoint_report(doc: dict) -> str:
    cfg = doc["config"]
    lines = ["# specserve bench --endpoint", "", f"Command: `{cfg['command']}`", "",
             f"Endpoint {cfg['endpoint']} (model `{cfg['endpoint_model']}`), streaming chat completions, greedy, "
             f"{cfg['max_tokens']} max new tokens, closed loop; at each level the variants take turns in chunks "
             "of at least 2 x concurrency prompts. Metrics as `vllm bench serve` defines them."
             + (" Every request starts with the same system message (--system-prompt)." if cfg.get("system_prompt")
                else ""), "",
             "| variant | concurrency | completed | req/s | output tok/s | TTFT p50/p99 ms | TPOT p50/p99 ms | "
             "ITL p50/p99 ms | ITL p99/p50 | E2E p50/p99 s | prompt tokens cached | same text as baseline | "
             "valid structured outputs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["endpoint"]:
        lines.append(f"| {r['label']} | {r['concurrency']} | {r['completed']}/{r['requests']} | "
                     f"{r['request_throughput']:.3f} | {r['output_tok_s']:.1f} | "
                     f"{_ms(r['ttft_s']['p50'])}/{_ms(r['ttft_s']['p99'])} | {_ms(r['tpot_s']['p50'])}/{_ms(r['tpot_s']['p99'])} | "
                     f"{_ms(r['itl_s']['p50'])}/{_ms(r['itl_s']['p99'])} | {r['itl_s']['p99'] / r['itl_s']['p50']:.1f} | "
                     f"{r['e2e_s']['p50']:.2f}/{r['e2e_s']['p99']:.2f} | {r.get('cached_prompt_tokens', 0)} | "
                     f"{r['same_text_as_baseline']}/{r['requests']} | "
                     + (f"{r['valid']}/{r['constrained']} |" if r.get("constrained") else "- |"))
    return "\n".join(lines) + "\n"
