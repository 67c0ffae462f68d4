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


def load_costs(spec: str | None) -> tuple[float, ...] | None:
    """None (measure), 'reference', a JSON list, or a JSON file: a list or a saved run."""
    if spec is None or spec in ("", "measured"):
        return None
    if spec == "reference":
        return REFERENCE
    text = spec
    if not spec.lstrip().startswith("["):
        try:
            text = Path(spec).read_text()
        except OSError as e:
            raise SpecvizError(f"--costs: cannot read {spec}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise SpecvizError(f"--costs: {spec} is neither 'reference', a JSON list nor a JSON file") from None
    if isinstance(data, dict):  # a saved run: the profile its speculative run used
        start = next(iter(data.get("speculative") or []), {})
        data = ((start or {}).get("costs") or {}).get("v") if isinstance(start, dict) else None
        if not data:
            raise SpecvizError(f"--costs: {spec} records no cost profile (its drafter was not cost-aware)")
    if not isinstance(data, list) or not data or not all(isinstance(x, (int, float)) and x > 0 for x in data):
        raise SpecvizError("--costs: a cost profile is a non-empty list of positive numbers")
    return tuple(float(x) for x in data)
