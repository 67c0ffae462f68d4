"""Markdown and HTML text of a run: status lines, the summary table, the plain output panel.

Every string that comes from a model, a registry or a saved file goes through ``md`` (Markdown)
or ``html.escape`` before it is shown: a crafted run file cannot add markup to the page.
"""

from __future__ import annotations

import html
import re

from ..exactness import Exactness, first_difference
from ..trace import Trace, compare_speed

_MD_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character
# explicit direction controls (embeddings, overrides, isolates, marks): one in a saved run's text turned
# the page's own words around it backwards ("...dedaol saw ledom on"), and "\u202egnp.exe" read "exe.png"
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def inert(text: str) -> str:
    """``text`` with each direction control shown as its code point (``[U+202E]``), so that text from a
    model or a file cannot reorder what is shown around it; escape it as well."""
    return _BIDI.sub(lambda m: f"[U+{ord(m.group()):04X}]", text)


def md(value, limit: int = 200) -> str:
    """Untrusted text as inert Markdown, on one line: every ASCII punctuation character is
    backslash-escaped (CommonMark makes each a literal), so ``<`` never opens a tag, ``&`` never
    starts an entity and ``[`` never a link, and the reader still sees the text as it is."""
    text = inert(str(value if value is not None else "?"))
    text = " ".join(text.split())[:limit]
    return _MD_SPECIAL.sub(r"\\\1", text)


def md_text(value, limit: int = 4000) -> str:
    """Untrusted multi-paragraph text as inert Markdown: paragraphs (blank lines) kept, each escaped
    as ``md`` does, and each `backticked` span shown as code. A code span renders its content
    literally (no tag, entity or link can open inside it); it cannot hold a backtick, since the
    text is split on them, so nothing can close it early."""
    text = inert(str(value if value is not None else "?"))[:limit].replace("\r\n", "\n")
    out = []
    for para in text.split("\n\n"):
        parts = para.split("`")
        if len(parts) % 2 == 0:  # an unpaired backtick: the last one is text
            parts[-2:] = ["`".join(parts[-2:])]
        out.append("".join(_spaced(p, limit) if i % 2 == 0 else f"`{' '.join(p.split())}`" if p.strip() else ""
                           for i, p in enumerate(parts)).strip())
    return "\n\n".join(o for o in out if o)


def _spaced(text: str, limit: int) -> str:
    """``md`` keeping one space at each edge where the text had any (it sits beside a code span)."""
    if not text.strip():
        return " " if text else ""
    return (" " if text[0].isspace() else "") + md(text, limit) + (" " if text[-1].isspace() else "")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def waiting_status(ahead: int, eta_s: float | None, startup_s: float | None = None) -> str:
    """A queued run's status line (the page and the Lab share the decode queue with the API).
    ``startup_s``: what is ahead is the server's own start-up (loading and timing the default pair),
    under way for that many seconds (a visitor on a busy machine saw the same line for 4 minutes,
    with nothing to say it was moving)."""
    eta = f", about {eta_s:.0f} s" if eta_s else ""
    if startup_s is not None:
        return ("● waiting for the decoder: the server is still starting (loading the default pair and timing "
                f"its passes, once; {startup_s:.0f} s so far, ~30 s on a quiet CPU){eta}…")
    return f"● waiting for the decoder: {plural(ahead, 'run')} ahead{eta}…"


def progress_line(fraction: float, done: int, total: int, message: str) -> str:
    """A long experiment's progress as Markdown: a 20-cell bar, the count and what it is doing."""
    n = round(20 * max(0.0, min(1.0, fraction)))
    # plain text, not a code span: the theme's dark code box hid the filled cells (█ on near-black)
    return f"{'█' * n}{'░' * (20 - n)} {done}/{total} · {md(message, 200)}"


def lab_stopped(drawn: bool, done: tuple[int, int] | None) -> tuple[str, str]:
    """A stopped Lab experiment: (what it left, for its status line; the takeaway's place, saying why
    there is no takeaway: it is written from a whole run's numbers). ``drawn``: its chart has grown;
    ``done``: its latest progress (steps done, of how many)."""
    if not drawn and not (done and done[0]):
        return ("stopped before anything was measured",
                "*Stopped before anything was measured: press the experiment's button to run it again.*")
    part = f" ({done[0]:,} of {done[1]:,} steps)" if done and done[1] else ""
    if drawn:
        what, shown = "the chart shows what ran", "the chart shows what was measured so far"
    else:  # steps measured, none of them drawn yet (a sweep draws once a point is whole)
        what = f"stopped after {done[0]:,} of {done[1]:,} steps, before its chart had a point"
        shown = "too early for the chart's first point"
    return what, (f"*Stopped before the end{part}: {shown}. The takeaway is written from a whole run's numbers, "
                  "so there is none for a part of one; run it again to finish.*")


def rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def running_status(spec: Trace, vanilla: Trace | None, phase: str) -> str:
    if phase == "vanilla" and vanilla is not None:
        # greedy: the same answer, so as long as the speculative one; a sampled answer has its own length
        # (a sampled run read "93 of 88 tokens")
        if spec.greedy and spec.tokens and vanilla.tokens <= spec.tokens:
            so_far = f"{vanilla.tokens} of {spec.tokens} tokens"
        else:
            so_far = f"{plural(vanilla.tokens, 'token')} (the speculative run wrote {spec.tokens})"
        return (f"● vanilla decoding of the same prompt, for comparison: {so_far}, "
                f"{vanilla.tokens_per_second:.1f} tok/s (speculative: {spec.tokens_per_second:.1f} tok/s)")
    return (f"● speculative decoding: {plural(spec.tokens, 'token')}, {plural(len(spec.iterations), 'iteration')}, "
            f"acceptance {rate(spec.acceptance_rate)}, {spec.tokens_per_second:.1f} tok/s")


def final_status(spec: Trace, vanilla: Trace | None, stopped: bool, exact: Exactness | None = None) -> str:
    """The status line at the end: what ran, and when both runs ended, the speedup and the greedy
    verdict (a room watching a projector sees this line, not the Summary tab below the fold)."""
    van = vanilla if vanilla is not None and vanilla.iterations else None
    s = spec.summary
    if stopped and s is None:
        what = f"■ stopped after {plural(spec.tokens, 'token')}"
        return what + ": the results below are for what ran"
    if not s:
        return "■ done"
    line = f"■ done: {plural(s.new_tokens, 'token')}, stop: {md(s.stop_reason)}"
    if stopped:  # the speculative run had ended; Stop cut the comparison short
        cut = f" after {plural(van.tokens, 'token')}" if van else " before its first token"
        return line + f"; the vanilla comparison was stopped{cut}, so there is no speedup"
    if van is not None and van.summary is not None:
        cmp = compare_speed(spec, van)
        line += f" · **{cmp.speedup:.2f}x** vanilla's speed"
        if cmp.implausible:  # the line a room reads carries the Summary's warning too
            line += " (⚠ timing noise: see Summary)"
    if exact is not None and spec.greedy:
        line += " · identical to vanilla" if exact.identical else " · **differs from vanilla** (see Summary)"
    return line


def guidance(spec: Trace) -> str:
    """One line when a run proposed little (or ended at once), saying why and what to try instead."""
    if not spec.iterations or spec.start is None:
        return ""
    if spec.summary is not None and spec.summary.stop_reason == "eos" and spec.tokens <= 2:
        chat = "<|im_start|>" in spec.start.prompt_text or "assistant" in spec.start.prompt_text
        return ("The model ended its answer at once." + ("" if chat else " The chat template is off: an "
                "instruction-tuned model given a bare question often has nothing to continue; turn it on."))
    proposing = sum(1 for e in spec.iterations if e.proposed)
    # a few iterations say nothing of how often a drafter proposes (a run stopped after one iteration
    # that proposed was told "proposed in only 1 of 1")
    if len(spec.iterations) < 4 or proposing >= max(1, len(spec.iterations) // 4):
        return ""
    kind = str(spec.start.drafter.get("kind", ""))
    if kind == "prompt_lookup":
        why = (f"The lookup drafter proposed in only {proposing} of {len(spec.iterations)} iterations: it proposes "
               "when the text so far (or the model's past answers) has something to copy, and this answer had little.")
    else:
        why = f"The drafter proposed in only {proposing} of {len(spec.iterations)} iterations."
    return (why + " Try the **summarise** or **translation** example (copy-heavy: long accepted runs), or the "
            "**early-exit** pair to watch rejections and resampling.")


def summary_markdown(spec: Trace, vanilla: Trace | None, exact: Exactness | None = None,
                     stopped: bool = False) -> str:
    if spec.start is None:
        return ""
    s = spec.start
    tgt, drf = s.target or {}, s.draft or {}
    weights = f" (weights: {md(tgt.get('source'))})" if tgt.get("source") else ""
    lines = [f"**Target** {md(tgt.get('name'))}{weights} on **{md(tgt.get('device'))}** ({md(tgt.get('dtype'))}) · "
             f"**drafter** {md(s.drafter.get('name'))}"
             + (f" on {md(drf.get('device'))} ({md(drf.get('dtype'))})" if drf.get("device") else "")]
    if tgt.get("fallback"):  # the registry's first source failed (a Space whose pinned file did not load)
        lines += ["", f"*The target's first source failed ({md(tgt.get('fallback'))}); these are other weights, "
                      "so a drafter trained on the first drafts worse here. Outputs are exact either way.*"]
    if stopped:
        lines += ["", "*Stopped: these numbers cover what ran before Stop.*"]
    van = vanilla if vanilla is not None and vanilla.iterations else None
    lines += ["", "| measure | speculative | vanilla |", "|:---|---:|---:|",
              f"| tokens | {spec.tokens} | {van.tokens if van else '-'} |",
              f"| target passes (iterations) | {len(spec.iterations)} | {len(van.iterations) if van else '-'} |",
              f"| tokens / s | {spec.tokens_per_second:.1f} | {f'{van.tokens_per_second:.1f}' if van else '-'} |",
              f"| acceptance: kept / proposed | {rate(spec.acceptance_rate)} | |",
              f"| per-position acceptance α: kept / examined | {rate(spec.alpha)} | |",
              f"| tokens per iteration | {spec.tokens / max(1, len(spec.iterations)):.2f} | {1 if van else '-'} |"]
    if van and van.summary and spec.summary:
        cmp = compare_speed(spec, van)
        lines.append(f"| **speedup** (measured, prefill included) | **{cmp.speedup:.2f}x** | 1x |")
        lines.append(f"| decode speedup: measured / theory from α, c, v | {cmp.decode_speedup:.2f}x / "
                     f"{cmp.predicted:.2f}x | |")
        lines.append(f"| measured this run: draft cost c, verify cost v(g) of a pass over g drafted tokens + 1 "
                     f"(vs one vanilla step) | c = {cmp.c:.3f}, "
                     + ", ".join(f"v({g}) = {v:.2f}" for g, v in sorted(cmp.v.items())) + " | |")
        if cmp.implausible:
            lines += ["", f"⚠ **Timing noise:** a speedup of {max(cmp.speedup, cmp.decode_speedup):.2f}x is more than "
                          f"{cmp.tokens_per_iteration:.2f} tokens per iteration allow (each iteration costs at least one target pass, "
                          "and a vanilla step is one pass per token): something else on this machine slowed the "
                          "vanilla run. Run it again before relying on it."]
        if abs(spec.tokens - van.tokens) > 0.25 * max(spec.tokens, van.tokens):
            lines += ["", f"The two runs wrote {spec.tokens} and {van.tokens} tokens (each ends where its own draws end "
                          "it). The speedup compares their tokens per second, but the shorter run spreads the same "
                          "prefill over fewer tokens: the decode speedup, without the prefill, is the fairer figure here."]
    if s.costs:
        v = s.costs.get("v") or []
        lines += ["", f"The drafter plans with a cost profile ({md(s.costs.get('source'))}), not with this run's "
                      "timings (so that its choices do not move with the machine's load): v = "
                  + ", ".join(f"{float(x):.2f}" for x in v[:9] if isinstance(x, (int, float)))
                  + ("…" if len(v) > 9 else "") + f" for passes of 1 to {len(v)} tokens. Pin it (`--costs`, or "
                  "*reference costs* in the page) and the same seed gives the same output on any machine."]
    if spec.summary is not None:
        both = "for both runs" if van else "as it is for vanilla runs"
        lines += ["", f"Timings are the decoders' own: the {spec.summary.consumer_ms / 1000:.2f} s this page spent "
                      f"drawing between iterations is left out, {both}. One run is one sample: on a busy "
                      "machine the speedup of identical runs varies by ±20% or more; `python -m specviz bench` "
                      "repeats and pairs runs."]
    if exact is not None:
        if spec.greedy:
            verdict = "**identical to vanilla**, token for token" if exact.identical else f"**{md(exact.describe())}**"
            if spec.start is not None and spec.start.target.get("kernels") == "exact":
                verdict += (" (exact by construction on these kernels: a token's logits have the same bits "
                            "alone or inside a verify pass)")
            lines += ["", f"Greedy check: {verdict}"]
        else:
            lines += ["", "Outputs: a sampled run, so the two differ by design (the same distribution, other "
                          "draws); the Lab's *Same outputs?* experiment tests the distribution"]
    tip = guidance(spec)
    if tip:
        lines += ["", "💡 " + tip]
    return "\n".join(lines)


def _pieces_html(pieces: list[str], mark: int | None, eos: bool = False, sampled: bool = False) -> str:
    """The output's text; ``eos``: its last piece is the end-of-sequence token, shown as a small tag
    (its raw text, e.g. ``<|im_end|>``, read as part of the answer)."""
    out = []
    for i, piece in enumerate(pieces):
        text = html.escape(inert(piece))
        if eos and i == len(pieces) - 1:
            text = f'<span class="sv-eos" title="the end-of-sequence token {text}: the model ended its answer here">end</span>'
        elif i == len(pieces) - 1 and "\ufffd" in piece:  # byte tokens of a character the run stopped inside
            text = (f'<span class="sv-partial" title="part of a character: the run stopped before the tokens '
                    f'that complete it">{text}</span>')
        if i == mark:  # the mark starts at the word: a leading space inside it drew an empty box at a line's end
            body = text.lstrip(" ") or text  # a token of spaces only keeps them inside the mark
            text = (" " * (len(text) - len(body)) + f'<mark class="sv-diverge{" sv-sampled" if sampled else ""}" '
                    f'title="the two outputs part here">{body or "∅"}</mark>')
        out.append(text)
    return "".join(out)


def _ended_at_eos(trace: Trace) -> bool:
    return trace.summary is not None and trace.summary.stop_reason == "eos"


def output_html(spec: Trace, vanilla: Trace | None) -> str:
    """The plain output: speculative and vanilla side by side, the first token where they part marked."""
    spec_pieces = [p for e in spec.iterations for p in e.emitted_text]
    cols = [("speculative", spec_pieces, spec.output_ids, _ended_at_eos(spec))]
    if vanilla is not None and vanilla.iterations:
        cols.append(("vanilla", [p for e in vanilla.iterations for p in e.emitted_text], vanilla.output_ids,
                     _ended_at_eos(vanilla)))
    mark = None
    note = ""
    if len(cols) == 2:
        mark = first_difference(cols[0][2], cols[1][2])
        done = vanilla.summary is not None and spec.summary is not None
        if mark is not None and (done or mark < min(len(cols[0][2]), len(cols[1][2]))):
            note = (f"<p class='sv-out-note'>The outputs part at new token {mark + 1} (marked).</p>" if spec.greedy
                    else f"<p class='sv-out-note'>Sampled: each run draws its own tokens, so the outputs part (here "
                         f"at new token {mark + 1}, marked) as two plain runs with other draws would; both follow the "
                         "target's distribution.</p>")
        elif done:
            note = "<p class='sv-out-note'>Identical outputs, token for token.</p>"
            mark = None
        else:
            mark = None
    body = "".join(f"<div class='sv-out-col'><div class='sv-out-head'>{name} · {plural(len(ids), 'token')}</div>"
                   f"<div class='sv-out-text'>{_pieces_html(pieces, mark, eos, not spec.greedy)}</div></div>"
                   for name, pieces, ids, eos in cols)
    return f"<div class='sv-out'>{body}</div>{note}"
