"""The Lab: experiments that test the claims explainers make about speculative decoding, live, on
the loaded pair and this hardware.

Each experiment is one module with the same shape:
  ``run(pipe, settings)``  a generator of :class:`~specviz.lab.common.Progress` records, then a
                           result dataclass (``to_json()``);
  ``figure(result)``       a small plotly figure (it also draws a partial result);
  ``takeaway(result)``     a few sentences written from the measured numbers.
They consume the engine's events like everything else; statistics come from ``trace`` and
``theory``. Nothing here imports gradio; this file imports nothing heavy (the CLI reads it).
"""

from __future__ import annotations

import importlib

# name -> (module, title, the claim it tests)
EXPERIMENTS: dict[str, tuple[str, str, str]] = {
    "same_outputs": ("same_outputs", "Same outputs?",
                     "speculative decoding gives exactly the target's output (greedy) and distribution (sampled)"),
    "gamma_sweep": ("gamma_sweep", "Is higher gamma better?",
                    "more draft tokens per iteration is better (or: at high gamma you accept fewer tokens)"),
    "when_not": ("when_not", "When not to use it",
                 "it pays at batch size 1, for long outputs and with drafts that keep >= ~1.5 tokens per iteration"),
    "cost_map": ("cost_map", "What does the draft have to cost?",
                 "a draft must be both cheap (c) and right often (alpha)"),
    "production": ("production", "Take it to production",
                   "the same setup in vLLM, and which of its metrics matches each specviz chart"),
}


def experiment(name: str):
    """The module of an experiment (imported on first use)."""
    from ..errors import SpecvizError

    if name not in EXPERIMENTS:
        raise SpecvizError(f"unknown experiment {name!r}: use one of {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"{__name__}.{EXPERIMENTS[name][0]}")
