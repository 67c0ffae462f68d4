"""The page's menus and the pair's text, from the registry: what each entry is called and what a
choice will really run. Markdown comes out escaped (``md``), whatever the registry holds."""

from __future__ import annotations

from ..errors import SpecvizError
from ..pipeline import resolve_pair
from ..registry import Registry
from .text import md


def drafter_label(p) -> str:
    """A pair's drafter in a few words: its draft model, else its kind."""
    return p.draft_model or p.drafter["kind"].replace("_", " ")


def offline_tag(name: str, offline: bool) -> str:
    return name if offline else f"{name}  (needs the Hub)"


def pair_choices(reg: Registry) -> list[tuple[str, str]]:
    """Dropdown entries for pairs, the default first, tagged when the weights must come from the Hub or
    the pair cannot run here (a drafter's file or every model source missing)."""
    def tag(p) -> str:
        said = reg.availability(p)
        return p.name if said == "offline" else f"{p.name}  ({said if said == 'needs the Hub' else 'unavailable here'})"
    return [(tag(p), p.name) for p, _ in reg.ordered_pairs()]


def model_choices(reg: Registry, names) -> list[tuple[str, str]]:
    """Dropdown entries for models: the name, tagged when its weights must come from the Hub."""
    return [(offline_tag(n, reg.models[n].offline_source() is not None), n) for n in names]


def pair_details(reg: Registry, pair: str) -> str:
    p = reg.pair(pair)
    return (f"**{md(p.name)}**: {md(p.description, 300)} (target {md(p.target)}, drafter "
            f"{md(drafter_label(p))})")


def choice_details(reg: Registry, pair: str, target: str | None, drafter: str | None) -> str:
    """The pair's text, and what actually runs when the page picks its own ``target`` or ``drafter``
    (None: the pair's), as ``resolve_pair`` will resolve it at Run."""
    text = pair_details(reg, pair)
    if not (target or drafter):
        return text
    try:
        runs = resolve_pair(reg, None if target else pair, target, drafter)
    except SpecvizError:
        return text  # Run will say what is wrong with the choice
    return (f"{text}\n\n**Runs instead** (chosen below): target {md(runs.target)}, drafter "
            f"{md(drafter or drafter_label(runs))}")
