"""HTML for the live token view, its legend and the iteration inspector, from events alone.

Every model-produced string is HTML-escaped here; whitespace and special tokens are shown as
they are (a newline as a visible return mark followed by the line break).
"""

from __future__ import annotations

import html
import re

from ..events import IterationEvent
from .text import inert, plural

_SPECIAL = re.compile(r"^<[|｜]?[A-Za-z_/][^<>]*[|｜]?>$")

LEGEND = (
    '<div class="sv-legend">'
    '<span class="sv-tok sv-acc">accepted</span> draft token kept by the target '
    '<span class="sv-tok sv-rej">rejected</span> first draft token the target refused '
    '<span class="sv-tok sv-skip">unchecked</span> proposals after a rejection (discarded) '
    '<span class="sv-tok sv-res">resampled</span> the target\'s correction, drawn from norm(max(0, p &minus; q)) '
    '<span class="sv-tok sv-bonus">bonus</span> free extra token when all were kept, drawn from p '
    '<span class="sv-tok sv-plain">plain</span> target step with no proposal. '
    'A box is one iteration (one target pass); hover (or tap) a token for p, q, min(1, p/q) and, in a sampled run, the draw u; once the run has ended, click it to open its iteration in the inspector.'
    '</div>')


def number(index: int) -> int:
    """An iteration's ``index`` (from 0, as the events and exported runs count) as the page counts it:
    from 1, as the status line's count does."""
    return int(index) + 1


def show(piece: str, breaks: bool = True) -> str:
    """Escaped, with whitespace made visible where it would vanish. ``breaks=False`` (discarded
    proposals): a newline shows as its mark only, so text that was never emitted breaks no line."""
    if piece == "":
        return '<span class="sv-ws">&empty;</span>'
    out = html.escape(inert(piece))
    out = out.replace("\n", '<span class="sv-ws">&crarr;</span>' + ("\n" if breaks else "")).replace("\t", '<span class="sv-ws">&rarr;</span>\t')
    if piece.strip() == "":
        out = out.replace(" ", '<span class="sv-ws">&middot;</span>') if "\n" not in piece else out
    return out


def _attr(text: str) -> str:
    return html.escape(inert(text), quote=True)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.3g}" if x >= 1e-3 else f"{x:.1e}"


def one_hot(e: IterationEvent) -> bool:
    """p is one-hot at every examined position (greedy, or top-k 1): min(1, p/q) is 1 or 0, so a
    proposal is kept exactly when it is the target's top token, and the draw u decides nothing."""
    examined = e.p[:min(e.accepted + 1, len(e.p))]
    return bool(examined) and all(x in (0.0, 1.0) for x in examined)


def _token_title(e: IterationEvent, i: int, state: str) -> str:
    if len(e.q) <= i or len(e.p) <= i:  # a backend that does not report p and q (a serving engine)
        return f"iteration {number(e.index)}, draft position {i + 1}: {state}\np and q: not reported by this backend"
    lines = [f"iteration {number(e.index)}, draft position {i + 1}: {state}",
             f"q (draft) = {_fmt(e.q[i])}    p (target) = {_fmt(e.p[i])}",
             f"min(1, p/q) = {_fmt(e.accept_prob[i])}"]
    if e.draws[i] is not None and one_hot(e):
        lines.append("greedy: kept, the target's top token" if i < e.accepted else
                     "greedy: refused, the target's top token is another")
    elif e.draws[i] is not None:
        verdict = "<" if i < e.accepted else ">="
        lines.append(f"draw u = {e.draws[i]:.3f}  ({verdict} min(1, p/q))")
    if e.p_raw and (e.p[i] in (0.0, 1.0)):
        lines.append(f"softmax at T=1: p = {_fmt(e.p_raw[i])}, q = {_fmt(e.q_raw[i]) if e.q_raw else '-'}")
    return "\n".join(lines)


def _correction_title(e: IterationEvent) -> str:
    c = e.correction
    what = {"resample": "resampled from norm(max(0, p - q)) after the rejection",
            "bonus": "bonus token: every proposal was kept, drawn from p",
            "sample": "plain target step (no proposal), drawn from p"}[c.kind]
    if one_hot(e):
        what += " (greedy: the target's top token)"
    under = "norm(max(0, p - q))" if c.kind == "resample" else "p"
    top = ", ".join(f"{t!r} {_fmt(pr)}" for _, t, pr in c.top[:4])
    return f"iteration {number(e.index)}: {what}\nits probability under {under} = {_fmt(c.p)}\ntop: {top}"


def is_special(piece: str) -> bool:
    return bool(_SPECIAL.match(piece.strip())) and piece.strip() == piece


def _tok(cls: str, piece: str, title: str) -> str:
    special = " sv-special" if is_special(piece) else ""
    emitted = cls not in ("sv-rej", "sv-skip")
    return (f'<span class="sv-tok {cls}{special}" tabindex="0" title="{_attr(title)}">'
            f'{show(piece, emitted)}</span>')


def iteration_html(e: IterationEvent) -> str:
    parts = []
    n_emit = len(e.emitted)
    for i, piece in enumerate(e.proposed_text):
        if i < e.accepted:
            if i >= n_emit:
                break  # cut by EOS or the token limit
            parts.append(_tok("sv-acc", piece, _token_title(e, i, "accepted")))
        elif i == e.accepted:
            parts.append(_tok("sv-rej", piece, _token_title(e, i, "rejected")))
        else:
            parts.append(_tok("sv-skip", piece, f"iteration {number(e.index)}, draft position {i + 1}: "
                                                   "discarded unchecked (after a rejection)"))
    if n_emit > e.accepted:  # the target's own token made it into the output
        cls = {"resample": "sv-res", "bonus": "sv-bonus", "sample": "sv-plain"}[e.correction.kind]
        parts.append(_tok(cls, e.correction.text, _correction_title(e)))
    kept = f"{e.accepted} of {len(e.proposed)} kept" if e.proposed else "no proposal"
    title = f"iteration {number(e.index)}: {kept}; {e.reason}; verify {e.verify_ms:.0f} ms, draft {e.draft_ms:.0f} ms"
    # data-it: the page opens this iteration in the inspector when a token of it is clicked
    return f'<span class="sv-it" data-it="{number(e.index)}" title="{_attr(title)}">{"".join(parts)}</span>'


TOKENS_OPEN = '<div class="sv-tokens">'


TOKENS_DONE = '<div class="sv-tokens sv-done">'


def tokens_html(iterations: list[IterationEvent], rendered: list[str] | None = None, done: bool = False) -> str:
    """The token view. It only grows at the end while a run streams (no closing tag is emitted,
    the browser closes it), so the page receives appends, not the whole text each time.
    ``rendered``: iteration HTML already made (a streaming caller renders each iteration once).
    ``done``: the run's final view, whose tokens the page lets a click open in the inspector."""
    return (TOKENS_DONE if done else TOKENS_OPEN) + "".join(
        rendered if rendered is not None else (iteration_html(e) for e in iterations))


def inspector_html(e: IterationEvent | None, gamma: int | None = None) -> str:
    """One iteration in detail; ``gamma``: the run's γ, to say when this iteration's was capped lower."""
    if e is None:
        return '<div class="sv-inspect">No iteration yet: press Run, or load a saved run.</div>'
    rows = []
    known = len(e.p) == len(e.q) == len(e.accept_prob) == len(e.draws) == len(e.proposed)
    greedy = known and one_hot(e)

    def at(xs, i):
        return _fmt(xs[i]) if i < len(xs) else "-"

    for i, piece in enumerate(e.proposed_text):
        state = "accepted" if i < e.accepted else "rejected" if i == e.accepted else "unchecked"
        draw = "-" if not known or e.draws[i] is None or greedy else f"{e.draws[i]:.3f}"
        raw = f"{at(e.p_raw, i)} / {at(e.q_raw, i)}"
        # after a refusal the rule looks no further: no min(1, p/q) was taken there (p and q were computed)
        ratio = "-" if state == "unchecked" else at(e.accept_prob, i)
        rows.append(f"<tr class='sv-row-{state}'><td>{i + 1}</td><td><code>{show(piece)}</code></td>"
                    f"<td>{at(e.q, i)}</td><td>{at(e.p, i)}</td><td>{ratio}</td>"
                    f"<td>{draw}</td><td>{state}</td><td>{raw}</td></tr>")
    c = e.correction
    kind = {"resample": "resampled", "bonus": "bonus", "sample": "plain step"}[c.kind]
    used = kind if len(e.emitted) > e.accepted else f"{kind} (not emitted: the run stopped first)"
    cp = f"r(x) = {_fmt(c.p)}" if c.kind == "resample" else _fmt(c.p)  # the residual's, not p's
    rows.append(f"<tr class='sv-row-{c.kind}'><td>+</td><td><code>{show(c.text)}</code></td><td>-</td>"
                f"<td>{cp}</td><td>-</td><td>-</td><td>{used}</td><td></td></tr>")
    src = {"resample": "norm(max(0, p &minus; q)) at the rejected position",
           "bonus": "p after the last proposal", "sample": "p"}[c.kind]
    letter = "r" if c.kind == "resample" else "p"  # "1. 3 1" read as three numbers: the token, then its probability named
    top = "".join(f"<li><code>{show(t)}</code> {letter} = {_fmt(pr)}</li>" for _, t, pr in c.top)
    table = ("<div class='sv-scroll'><table class='sv-table'><tr><th>#</th><th>token</th><th>q(x)</th><th>p(x)</th>"
             "<th>min(1, p/q)</th><th>draw u</th><th>decision</th><th>softmax T=1 p / q</th></tr>"
             + "".join(rows) + "</table></div>")  # scrolls sideways where the page is narrower
    cap = f"γ max {e.gamma}"
    if gamma is not None and e.gamma < gamma:  # the run's end was near: the target adds a token of its own
        cap += f", not {gamma}: only {plural(e.gamma + 1, 'more token')} to generate"
    head = (f"<div class='sv-inspect'><b>Iteration {number(e.index)}</b> &middot; {_attr(e.drafter)} proposed "
            f"{len(e.proposed)} ({cap}; {_attr(e.reason)}) &middot; kept {e.accepted} &middot; "
            f"emitted {len(e.emitted)} &middot; draft {e.draft_ms:.1f} ms, verify {e.verify_ms:.1f} ms")
    if not known and e.proposed:
        table += "<p>p and q: not reported by this backend (a serving engine keeps them to itself).</p>"
    whose = ("that distribution's top tokens (r, the + row's value: p minus q, renormalised, not the target's p)"
             if c.kind == "resample" else "p's top tokens")
    if greedy:
        table += ("<p>Greedy: p is one-hot on the target's top token, so min(1, p/q) is 1 or 0: a proposal is kept "
                  "exactly when it is the target's top token, whatever the draw u (drawn all the same, so that a "
                  "seed gives the same numbers as the sampled rule), and the "
                  + ("resampled token is the target's top token at the refused position.</p>" if c.kind == "resample"
                     else f"{kind} token is the target's top token.</p>"))
    return (head + table + f"<p>The {kind} token was drawn from {src}; {whose}:</p><ol class='sv-top'>"
            + top + "</ol></div>")
