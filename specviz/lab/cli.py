"""python -m specviz lab EXPERIMENT [--pair ...] [--prompt ...] [--json]

Progress goes to standard error; the takeaway and the numbers to standard output (with --json:
JSON lines only, progress records then one ``"event": "result"`` object)."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

from ..errors import SpecvizError
from . import EXPERIMENTS

DEFAULT_PROMPT = "What are three tips for staying focused while working from home?"


def add_parser(sub) -> None:
    p = sub.add_parser("lab", help="test an explainer's claim on the loaded pair (see 'lab list')")
    p.add_argument("experiment", choices=list(EXPERIMENTS) + ["list"])
    p.add_argument("--pair")
    p.add_argument("--target", help="a target model instead of a pair (drafting with prompt lookup unless --draft)")
    p.add_argument("--draft", help="a draft model name, 'lookup[:N]', 'early-exit[:L]', ... (as for run)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--models", help="registry file (default: models.yaml)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--no-chat", action="store_true")
    p.add_argument("--gamma", type=int)
    p.add_argument("--temperature", type=float, default=0.0, help="runs; the distribution checks use 0.7 when 0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int,
                   help="new tokens per run (defaults: same_outputs and production 48; gamma_sweep 40, 24 for a "
                        "drafter with its own q; cost_map 32; when_not (c) 32, while its (b) sweeps 8..128 by design)")
    p.add_argument("--samples", type=int, help="same_outputs: real speculative iterations (default 200)")
    p.add_argument("--break-samples", type=int, help="same_outputs: draws per rule in break-it (default 2000)")
    p.add_argument("--variant", help="same_outputs: the broken rule drawn in the figure")
    p.add_argument("--gammas", type=int, nargs="+")
    p.add_argument("--depths", type=int, nargs="+", help="early-exit depths (when_not, cost_map)")
    p.add_argument("--repeats", type=int, help="timed runs of each drafter and of vanilla, alternated; the fastest "
                   "of each is compared (gamma_sweep, when_not, cost_map; default 3)")
    p.add_argument("--no-dtype-control", action="store_true", help="same_outputs: skip the bfloat16 control")
    p.add_argument("--figure", help="write the chart to this .html or .png file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(lab=True)


def main(args) -> int:
    from functools import partial

    from ..pipeline import build_pipeline
    from ..registry import load_registry
    from . import experiment
    from .broken import BROKEN
    from .common import GLOSSARY, Progress, Settings

    if args.experiment == "list":
        if args.json:
            print(json.dumps([{"name": name, "title": title, "claim": claim}
                              for name, (_, title, claim) in EXPERIMENTS.items()]))
            return 0
        for name, (_, title, claim) in EXPERIMENTS.items():
            print(f"{name}\t{title}\t{claim}")
        return 0
    if args.samples is not None and args.samples < 10:
        raise SpecvizError(f"--samples must be at least 10, got {args.samples}")
    if args.variant is not None and args.variant not in BROKEN:
        raise SpecvizError(f"--variant must be one of {', '.join(BROKEN)}; got {args.variant!r}")
    _check_figure(args.figure)
    mod = experiment(args.experiment)
    # settings checked before a model loads or a minute is measured
    s = Settings(prompt=args.prompt, chat=not args.no_chat, seed=args.seed, gamma=args.gamma,
                 temperature=args.temperature, max_new_tokens=args.max_new_tokens, samples=args.samples,
                 break_samples=args.break_samples, variant=args.variant, gammas=args.gammas, depths=args.depths,
                 dtype_control=not args.no_dtype_control, repeats=args.repeats)
    reg = load_registry(args.models)
    load = partial(build_pipeline, reg, pair=args.pair, target=args.target, drafter=args.draft,
                   device=args.device, gamma=args.gamma)
    t0 = time.perf_counter()
    pipe = load(dtype=args.dtype)
    loaded = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = None
    for item in mod.run(pipe, s, load):
        if isinstance(item, Progress):
            if args.json:
                print(json.dumps(item.to_json()), flush=True)
            else:
                print(f"[{item.done:>3}/{item.total} {time.perf_counter() - t1:5.1f} s] {item.message}", file=sys.stderr, flush=True)
        else:
            result = item
    took = time.perf_counter() - t1
    if args.json:
        print(json.dumps({"event": "result", "experiment": args.experiment, "pair": pipe.name,
                          "seconds": round(took, 1), "load_seconds": round(loaded, 1),
                          "result": result.to_json(), "takeaway": mod.takeaway(result), "glossary": GLOSSARY}))
    else:
        print(mod.takeaway(result))
        print(f"\n({args.experiment} on {pipe.name}: {took:.1f} s, after {loaded:.1f} s loading)", file=sys.stderr)
    if args.figure:  # after the result is out: a failed write loses nothing measured
        fig = mod.figure(result)
        try:
            if args.figure.lower().endswith(".html"):
                fig.write_html(args.figure, config={"displayModeBar": False})
            else:
                fig.write_image(args.figure)
        except (OSError, ValueError, RuntimeError) as e:
            raise SpecvizError(f"the figure could not be written to {args.figure}: {e}") from None
    return 0


def _check_figure(path: str | None) -> None:
    """--figure: an .html file (or .png where kaleido is installed) in a folder that exists."""
    if path is None:
        return
    suffix = Path(path).suffix.lower()
    if suffix not in (".html", ".png"):
        raise SpecvizError(f"--figure must name an .html or .png file, got {path!r}")
    if suffix == ".png" and importlib.util.find_spec("kaleido") is None:
        raise SpecvizError("--figure .png needs the kaleido package (pip install kaleido); .html needs nothing")
    if not Path(path).resolve().parent.is_dir():
        raise SpecvizError(f"--figure: the folder {str(Path(path).parent)!r} does not exist")
