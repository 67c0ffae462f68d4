"""Cost profiles: v[g], the cost of a target pass over g + 1 tokens relative to a 1-token pass.

A cost-aware drafter (prompt lookup) chooses how many tokens to propose from this profile, so a
sampled run's text depends on it. By default it is measured on this machine (once per model and
process); pinning it (``--costs``, the app's "reference costs" option, or the profile recorded in
a saved run) makes a seed reproduce the same output on any machine with the same numerics.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import SpecvizError

# Measured for SmolLM2-135M-Instruct (fp32, packed CPU kernels) on a 2-core Xeon, context 40:
# the median of 3 passes of g + 1 tokens over a 1-token pass, g = 0..16.
REFERENCE = (1.0, 1.05, 1.12, 1.2, 1.3, 1.33, 1.38, 1.42, 1.48, 1.52, 1.57, 1.62, 1.66, 1.72, 1.76, 1.81, 1.86)


def fit_profile(samples: list[list[float]]) -> list[float]:
    """v[g] from timed passes: ``samples[g]`` holds the times (ms) of passes over g + 1 tokens.

    A shared machine only ever adds time, so each length's fastest pass is the estimate of what it
    costs; the estimates are then fitted with the closest non-decreasing sequence (least squares,
    pool-adjacent-violators), since a pass over more tokens never costs less, and divided by the
    1-token pass's fitted time. On a 2-core box with busy neighbours, three passes' medians gave
    profiles such as 1.0, 0.97, 0.92, 0.80, 0.87, 0.96 (a 4-token pass "cheaper" than one token,
    where the same padded kernel runs for both): a cost-aware drafter reads each dip as a reason to
    propose and each spike as a reason not to."""
    if not samples or not all(samples):
        raise SpecvizError("a cost profile needs at least one timed pass per length")
    blocks: list[tuple[float, int]] = []  # (mean, lengths) of pooled runs of lengths
    for t in (min(ms) for ms in samples):
        blocks.append((t, 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1), (m2, w2) = blocks[-2], blocks.pop()
            blocks[-1] = ((m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2)
    fitted = [m for m, w in blocks for _ in range(w)]
    return [t / fitted[0] for t in fitted]


MAX_COST = 1e3  # a pass costs at most this many 1-token passes: anything above is no measurement
MAX_LENGTHS = 32  # v[0..31]: a pass over up to 32 tokens (gamma at most 31)


def check_profile(data, where: str = "costs") -> tuple[float, ...]:
    """``data`` as a cost profile: a list of 1 to MAX_LENGTHS numbers (not booleans), each in
    (0, MAX_COST]; anything else is a SpecvizError that names ``where``."""
    ok = (isinstance(data, (list, tuple)) and 1 <= len(data) <= MAX_LENGTHS
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= MAX_COST for x in data))
    if not ok:
        shown = repr(data)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise SpecvizError(f"{where}: a cost profile is a list of 1 to {MAX_LENGTHS} numbers, each of which must be in "
                           f"(0, {MAX_COST:g}] (a pass's cost in 1-token passes), got {shown}")
    return tuple(float(x) for x in data)


def load_costs(spec: str | None) -> tuple[float, ...] | None:
    """None (measure), 'reference', a JSON list, or a JSON file: a list or a saved run."""
    if spec is None or spec in ("", "measured"):
        return None
    if spec == "reference":
        return REFERENCE
    text = spec
    if not spec.lstrip().startswith("["):
        try:
            text = Path(spec).read_text(encoding="utf-8-sig")
        except OSError as e:
            raise SpecvizError(f"--costs: cannot read {spec}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise SpecvizError(f"--costs: {spec} is not UTF-8 text (byte {e.start}): give a JSON list or a "
                               f"saved run") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = _start_line(text)  # the JSON lines of `run --json`: its first line is the start event
        if data is None:
            raise SpecvizError(f"--costs: {spec} is neither 'reference', a JSON list nor a JSON file") from None
    except RecursionError:
        raise SpecvizError(f"--costs: {spec} nests too deeply to be a cost profile") from None
    if isinstance(data, dict):  # a saved run (the page's export, or run --json's start line): the profile it used
        runs = data.get("speculative") if "speculative" in data else [data]
        start = runs[0] if isinstance(runs, list) and runs else None
        costs = start.get("costs") if isinstance(start, dict) else None
        data = costs.get("v") if isinstance(costs, dict) else None
        if not data:
            raise SpecvizError(f"--costs: {spec} records no cost profile (its drafter was not cost-aware, "
                               f"or the file is no saved run)")
    return check_profile(data, "--costs")


def _start_line(text: str) -> dict | None:
    """The start event among JSON lines (what `run --json` prints), or None."""
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            return None
        if isinstance(row, dict) and row.get("event") == "start":
            return row
    return None
