"""The page's menus and the pair's text, from the registry: what each entry is called and what a
choice will really run; and the page's typed seed. Markdown comes out escaped (``md``), whatever the
registry holds."""

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


BROWSER_EXACT = 2 ** 53 - 1  # a browser's number box holds whole numbers exactly up to here (a double: 2^53 + 1 arrives as 2^53)


def typed_seed(seed):
    """The page's seed as typed. A browser sends numbers as doubles: one typed above 2^53 - 1 may arrive
    already rounded (18446744073709551615 as 18446744073709551616, 2^53 + 1 as 2^53), and ran another
    seed than the box showed. gradio hands it over as an int or a float, so neither type says whether it
    was rounded: from 2^53 up the page refuses both (2^53 itself may be a rounded 2^53 + 1; the /v1 API
    and the CLI take any 64-bit seed)."""
    if seed in (None, ""):
        return 0
    if isinstance(seed, (int, float)) and not isinstance(seed, bool):
        if abs(seed) > BROWSER_EXACT:
            raise SpecvizError(f"a seed above 2^53 - 1 ({BROWSER_EXACT:,}) cannot be typed exactly in a browser: it "
                               f"may arrive rounded (here as {seed:,.0f}), so another seed would run than the box shows; "
                               "use one up to 2^53 - 1 here, or the /v1 API or the CLI for any 64-bit seed")
        if seed < 0 or seed != int(seed):  # the engine's message would name its range, 0 to 2^64 - 1
            raise SpecvizError(f"the seed must be a whole number from 0 to 2^53 - 1 ({BROWSER_EXACT:,}) here, got "
                               f"{seed:g} (the /v1 API and the CLI take any 64-bit seed)")
    return seed
