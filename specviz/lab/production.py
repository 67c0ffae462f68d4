"""5. Take it to production: the vLLM configuration equivalent to the chosen pair and gamma
(checked against vLLM's current docs: ``--speculative-config`` with ``method`` ``draft_model``,
``ngram`` or ``suffix``) and which vLLM metric corresponds to each specviz statistic, with this
prompt's measured values in vLLM's definitions."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Iterator

import plotly.graph_objects as go

from ..pipeline import Pipeline
from ..view.charts import COLORS, layout, whole_ticks
from ..trace import Trace
from .common import Progress, Settings, greedy_cfg, jsonable


@dataclass
class ProductionResult:
    pair: str
    gamma: int
    configs: list[dict] = field(default_factory=list)  # {"label", "speculative_config", "command", "note"}
    metrics: list[dict] = field(default_factory=list)  # {"specviz", "vllm", "value"}
    by_position: list[list[int]] = field(default_factory=list)
    target_source: str = ""  # where specviz's target weights came from (a GGUF is not the Hub's checkpoint)

    def to_json(self) -> dict:
        return jsonable(self)


def _hub_id(pipe: Pipeline, registry_name: str | None) -> str:
    src = getattr(pipe.target, "source", "") or ""  # a GGUF from the Hub names its file too: "hub ID (FILE)"
    return src.split("hub ", 1)[1] if src.startswith("hub ") and " (" not in src else {
        "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}.get(registry_name or pipe.target.name, pipe.target.name)


def configs(pipe: Pipeline, gamma: int) -> list[dict]:
    """vLLM's nearest speculative configs for the pair's drafter, as commands to copy; where vLLM has
    no equivalent, a note without a command (never a command with a placeholder that would fail)."""
    target = _hub_id(pipe, pipe.target.name)
    d = pipe.drafter.describe()
    kind = d.get("kind")
    out = []

    def add(label, cfg, note):
        cmd = (f"vllm serve {target} --speculative-config '{json.dumps(cfg)}' --per-request-spec-decode-metrics detailed"
               if cfg else None)
        out.append({"label": label, "speculative_config": cfg, "command": cmd, "note": note})

    alone = {"head": "the trained draft head", "recycling": "Token Recycling"}.get(kind)
    if alone:
        add(alone, None, f"vLLM has no equivalent of {alone}" + (
            " (its nearest is an EAGLE head, \"method\": \"eagle\", which needs an EAGLE checkpoint trained for "
            "this target; specviz's head is in its own format and does not load there)" if kind == "head" else "")
            + (": the lookup it drafts beside is below." if d.get("lookup", True) else "."))
    if kind == "prompt_lookup" or alone and d.get("lookup", True):
        add("n-gram lookup", {"method": "ngram", "num_speculative_tokens": gamma,
                              "prompt_lookup_max": d.get("max_ngram", 4), "prompt_lookup_min": d.get("min_ngram", 1)},
            "vLLM proposes a fixed number of tokens per match; specviz's cost-aware length choice has no equivalent.")
        if d.get("datastore_tokens"):
            add("suffix decoding (past answers)", {"method": "suffix", "num_speculative_tokens": gamma},
                "the closest match to specviz's datastore: a global suffix tree over earlier outputs (needs arctic-inference).")
    elif kind == "model":
        draft = _hub_id(pipe, getattr(pipe.draft, "name", None)) if pipe.draft else "DRAFT"
        add("draft model", {"method": "draft_model", "model": draft, "num_speculative_tokens": gamma},
            "same tokenizer required, as in specviz.")
    elif kind == "early_exit" and isinstance(d.get("layers"), int):
        layers = d["layers"]
        add("early exit (as a draft model)", {"method": "draft_model", "model": f"./{target.split('/')[-1]}-first-{layers}-layers",
                                              "num_speculative_tokens": gamma},
            f"vLLM has no layer-skip drafter: save the target's first {layers} layers + norm + head as a checkpoint "
            "(or write a custom_class proposer). It then costs its own weights' memory, unlike specviz's shared view.")
    elif kind == "self_quantized":
        add(f"the target in {d.get('precision', 'lower precision')} as its own draft", None,
            "vLLM has no self-quantized drafter; its nearest is \"method\": \"draft_model\" with a separate, "
            "smaller or quantized checkpoint that shares the target's tokenizer.")
    elif not alone:
        add(str(d.get("name") or kind), None, "vLLM has no equivalent of this drafter.")
    return out


def run(pipe: Pipeline, s: Settings, load: Callable[..., Pipeline] | None = None) -> Iterator:
    gamma = s.gamma or pipe.gamma
    n = s.max_new_tokens or 48
    res = ProductionResult(pipe.name, gamma, configs(pipe, gamma),
                           target_source=str(getattr(pipe.target, "source", "") or ""))
    yield Progress(0, 1, f"one speculative run of {n} tokens for the metrics", res)
    ids = pipe.encode(s.prompt, s.chat)
    tr = Trace.of(pipe.speculative(ids, greedy_cfg(gamma, n, s.seed, s.temperature)))
    drafts = [e for e in tr.iterations if e.proposed]  # vLLM skips steps without a draft
    accepted = sum(e.accepted for e in drafts)
    proposed = sum(len(e.proposed) for e in drafts)
    res.by_position = [list(r) for r in tr.by_position()]
    per_pos = [k for k, _ in tr.by_position()]
    res.metrics = [
        {"specviz": "tokens per iteration over iterations that drafted", "vllm": "mean_acceptance_length = 1 + accepted / drafts",
         "value": round(1 + accepted / len(drafts), 3) if drafts else None},
        {"specviz": "acceptance rate (accepted / proposed)", "vllm": "draft_acceptance_rate; vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_draft_tokens_total",
         "value": round(accepted / proposed, 3) if proposed else None},
        {"specviz": "iterations that drafted", "vllm": "num_spec_steps; vllm:spec_decode_num_drafts_total", "value": len(drafts)},
        {"specviz": "proposed tokens", "vllm": "num_draft_tokens; vllm:spec_decode_num_draft_tokens_total", "value": proposed},
        {"specviz": "accepted tokens", "vllm": "num_accepted_draft_tokens; vllm:spec_decode_num_accepted_tokens_total", "value": accepted},
        {"specviz": "acceptance by draft position (kept counts)", "vllm": "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=i}",
         "value": per_pos},
        {"specviz": "accepted length histogram", "vllm": "acceptance_histogram (per request, detailed)",
         "value": tr.accepted_length_counts()[0]},
        {"specviz": "per-iteration proposed / accepted (iteration view)", "vllm": "per_step_drafted / per_step_accepted (detailed)",
         "value": None},
    ]
    yield Progress(1, 1, "done", res)
    yield res


def figure(res: ProductionResult) -> go.Figure:
    """Kept tokens per draft position: what vLLM's ``…_per_pos_total`` counter would read. The title
    is short (the metric's name alone ran off a phone's width) and the bars leave room for their labels."""
    fig = go.Figure()
    rows = res.by_position
    # numbered from 1 like the page's "Acceptance by draft position" (the same bar under two numbers
    # confused a class); vLLM's counter numbers from 0, said in the axis title and the hover
    fig.add_bar(x=[i + 1 for i in range(len(rows))], y=[k for k, _ in rows], name="kept (specviz)",
                marker_color=COLORS["accepted"], text=[f"{k}/{n}" for k, n in rows], textposition="outside",
                cliponaxis=False, customdata=list(range(len(rows))),
                hovertemplate="position %{x} (vLLM's position=%{customdata}): %{text} kept<extra></extra>")
    fig.update_yaxes(range=[0, 1.2 * max([k for k, _ in rows] + [1])])
    fig.update_xaxes(range=[0.4, len(rows) + 0.6])
    whole_ticks(fig, len(rows))  # positions, not -0.5, 0, 0.5, ...
    return layout(fig, "Kept tokens by draft position",
                  "position in the proposal (vLLM's …_per_pos_total counts from 0)<br>label = kept / examined",
                  "kept tokens", height=280)


def takeaway(res: ProductionResult) -> str:
    lines = [f"For {res.pair} at γ = {res.gamma}:"]
    for c in res.configs:
        lines.append(f"{c['label']}: `{c['command']}` ({c['note']})" if c["command"] else f"{c['label']}: {c['note']}")
    m = {x["specviz"]: x["value"] for x in res.metrics}
    mal = m.get("tokens per iteration over iterations that drafted")
    rate = m.get("acceptance rate (accepted / proposed)")
    lines.append(f"Expect vLLM to report mean_acceptance_length ≈ {mal} and draft_acceptance_rate ≈ {rate} on this "
                 "prompt if it proposes what specviz proposed (vLLM's n-gram length is fixed, so it usually proposes more).")
    # the mapping itself, in the text too (it was only in --json and the page's file)
    lines.append("Which vLLM metric matches which specviz number (this prompt's value): "
                 + "; ".join(f"{x['specviz']} = `{x['vllm']}`" + ("" if x["value"] is None else f" ({x['value']})")
                             for x in res.metrics) + ".")
    if ".gguf" in res.target_source.lower():
        lines.append(f"specviz's target here is a quantised GGUF ({res.target_source}), dequantised; the Hub checkpoint "
                     "in the commands has the original weights, so its outputs and these numbers will differ somewhat. "
                     f"To serve these very weights, `python -m specviz vllm-serve --pair {res.pair}` converts the GGUF "
                     "for vLLM.")
    return "\n\n".join(lines)
