"""python -m specviz: pairs | run | check | bench | lab | vllm-serve.

Errors a user can fix exit with status 2 and one line on standard error, no traceback.
"""

from __future__ import annotations

import argparse
import os
import json
import sys

from . import vllm_cli
from .errors import SpecvizError
from .lab.cli import add_parser as _add_lab, main as _lab

_PROG = "python -m specviz"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line, like every other error
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, default=0)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", help="a pair from models.yaml (default: the offline default pair)")
    p.add_argument("--target", help="a target model from models.yaml, instead of a pair (drafting with prompt lookup unless --draft)")
    p.add_argument("--draft", help="with --target or --pair: a draft model name, 'lookup[:N]', 'early-exit[:L]', "
                   "'head[:only]', 'recycling[:only]' or 'self[:int8|bf16]'")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | mps")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--models", help="registry file (default: models.yaml)")
    p.add_argument("--no-chat", action="store_true", help="feed the prompt as plain text, no chat template")
    p.add_argument("--exact", action="store_true",
                   help="exact by construction: a token's logits have the same bits alone or in a verify pass "
                        "(float32 on a CPU, where it is the default; same as SPECVIZ_EXACT=1: "
                        "refuses to load where it cannot hold)")
    p.add_argument("--costs", help="pin the cost profile of a cost-aware drafter: 'reference' (built in), a JSON "
                                   "list of v[g], or a saved run to take it from (same seed + same profile = "
                                   "same output); default: measured on this machine")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=_PROG, description="Speculative decoding you can see.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    p = sub.add_parser("pairs", help="list the registry's pairs")
    p.add_argument("--models", help="registry file (default: models.yaml)")

    p = sub.add_parser("run", help="decode one prompt and print every iteration")
    _model_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--gamma", type=int, help="proposals per iteration (default: the pair's; with --draft, that of "
                   "models.yaml's pair with that drafter, e.g. 3 for early-exit:L and self:int8)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    _sampling_args(p)
    p.add_argument("--vanilla", action="store_true", help="plain decoding, same settings")
    p.add_argument("--json", action="store_true", help="JSON lines only on standard output")

    p = sub.add_parser("check", help="sampled first tokens vs the target's exact distribution")
    _model_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--gamma", type=int)
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("bench", help="speculative vs vanilla vs transformers on a prompt set")
    _model_args(p)
    p.add_argument("--prompts", required=True, help="a .jsonl file like specbench-dev.jsonl")
    p.add_argument("--limit", type=int, help="prompts per category")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N prompts of each category")
    p.add_argument("--categories", nargs="+")
    p.add_argument("--gamma", nargs="+", type=int)
    p.add_argument("--temperature", nargs="+", type=float, default=[0.0])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-peer", action="store_true", help="skip transformers' assisted generation")
    p.add_argument("--peer-vllm", nargs="?", const="start", metavar="URLS",
                   help="add vLLM with speculation over vLLM without: 'start' (default) starts both servers "
                        "for the pair (bash scripts/setup.sh --vllm), or 'SPEC_URL,VANILLA_URL'")
    p.add_argument("--vllm-method", choices=("ngram", "suffix"), default=None,
                   help="vLLM's drafting for a lookup pair: its n-gram proposer, or suffix decoding "
                        "(arctic-inference; the cache of past answers off, since prompts repeat)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each prompt, interleaved; the minimum counts")
    p.add_argument("--progress", metavar="FILE",
                   help="append each prompt's result to FILE as a JSON line as soon as it is measured "
                        "(a long bench that is stopped keeps what it measured)")
    p.add_argument("--compare", nargs="+", default=[], metavar="PAIR",
                   help="other pairs over the same target, run in the same rotation against the same vanilla runs, "
                        "each at its own gamma (all at --gamma where given)")
    p.add_argument("--json", action="store_true")
    vllm_cli.add_parser(sub)  # vllm-serve: its own module (specviz never imports vllm)
    _add_lab(sub)
    return ap


def _pipeline(args, reg=None):
    """``reg``: the registry, where the caller has read it already."""
    from .pipeline import build_pipeline
    from .registry import load_registry

    if getattr(args, "exact", False) and args.dtype not in (None, "auto", "float32"):
        raise SpecvizError(f"--exact holds for float32 (the default on a CPU), not --dtype {args.dtype}: bit-equality "
                           "of 1-row and many-row passes is a float32 CPU kernel property")
    reg = reg or load_registry(args.models)
    if getattr(args, "exact", False):
        os.environ["SPECVIZ_EXACT"] = "1"  # read where models load: vanilla and speculative alike
    # progress only for a person watching a terminal: errors must stay a single line on stderr
    progress = (lambda m: print(f"[specviz] {m}", file=sys.stderr)) if sys.stderr.isatty() else None
    gamma = getattr(args, "gamma", None)  # bench takes a list of gammas and applies them itself
    return build_pipeline(reg, pair=args.pair, target=args.target, drafter=args.draft, device=args.device,
                          dtype=args.dtype, gamma=None if isinstance(gamma, list) else gamma, progress=progress)


def cmd_pairs(args) -> int:
    from .registry import load_registry

    reg = load_registry(args.models)
    default = reg.default()
    for pair, offline in reg.ordered_pairs():
        tags = ["default"] if pair.name == default else []
        tags.append(reg.availability(pair))
        drafter = pair.draft_model or pair.drafter["kind"].replace("_", "-")
        print(f"{pair.name}\t{pair.target} <- {drafter}\tgamma={pair.gamma}\t[{', '.join(tags)}]\t{pair.description}")
    return 0


def _cfg(args, gamma):
    from .costs import load_costs
    from .engine import DecodeConfig

    return DecodeConfig.from_settings(gamma, args.temperature, args.top_k, args.top_p,
                                      getattr(args, "max_new_tokens", 1), args.seed, load_costs(args.costs))


def _fmt_iteration(ev) -> str:
    if not ev.proposed:
        return f"#{ev.index:<3} {ev.correction.kind:8} {ev.correction.text!r}  ({ev.verify_ms:.0f} ms)"
    marks = []
    for i, (t, a) in enumerate(zip(ev.proposed_text, ev.accept_prob)):
        state = "ok" if i < ev.accepted else ("NO" if i == ev.accepted else "--")
        # a token after the refused one was never examined: the rule gave it no ratio to show
        marks.append(f"{t!r}:{state}" + (f"(min(1,p/q)={a:.2f})" if i <= ev.accepted else "(unchecked)"))
    return (f"#{ev.index:<3} {ev.accepted}/{len(ev.proposed)} kept  " + " ".join(marks) +
            f"  -> {ev.correction.kind} {ev.correction.text!r}  (draft {ev.draft_ms:.0f} ms, verify {ev.verify_ms:.0f} ms)")


def _settings_first(args) -> None:
    """Refuse bad settings before loading any model (~20 s on a CPU): a temperature, top-k or empty
    prompt was refused only after the load. The pair's own gamma is checked once it is known."""
    if not args.prompt.strip():
        raise SpecvizError("the prompt is empty: give one with --prompt")
    _cfg(args, args.gamma if args.gamma is not None else 1)


def cmd_run(args) -> int:
    from .events import to_dict

    _settings_first(args)
    pipe = _pipeline(args)
    cfg = _cfg(args, args.gamma if args.gamma is not None else pipe.gamma)  # the pair's gamma, known once loaded
    stream = (pipe.vanilla if args.vanilla else pipe.speculative)(args.prompt, cfg, chat=not args.no_chat)
    for ev in stream:
        if args.json:  # the start line records the settings, the kernels and the cost profile (--costs reads it)
            print(json.dumps(to_dict(ev)), flush=True)
        elif ev.event == "start":
            print(f"{ev.mode} decoding with {ev.drafter['name']} on {ev.target.get('device')} "
                  f"({ev.target.get('dtype')}); prompt {len(ev.prompt_ids)} tokens", file=sys.stderr)
        elif ev.event == "iteration":
            print(_fmt_iteration(ev), file=sys.stderr)
        else:
            rate = "n/a" if ev.acceptance_rate is None else f"{ev.acceptance_rate:.1%}"
            print(ev.text)
            print(f"\n{ev.new_tokens} tokens in {ev.iterations} iteration{'' if ev.iterations == 1 else 's'}, acceptance {rate}, "
                  f"{ev.tokens_per_iteration:.2f} tokens/iteration, {ev.tokens_per_second:.1f} tokens/s "
                  f"(draft {ev.draft_ms:.0f} ms, verify {ev.verify_ms:.0f} ms, prefill {ev.prefill_ms:.0f} ms), "
                  f"stop: {ev.stop_reason}", file=sys.stderr)
    return 0


MAX_CHECK_SAMPLES = 100_000


def cmd_check(args) -> int:
    from .check import first_token_check

    if not 10 <= args.samples <= MAX_CHECK_SAMPLES:  # each is a speculative iteration: ~20 an s on 2 cores
        raise SpecvizError(f"--samples must be from 10 to {MAX_CHECK_SAMPLES:,}, got {args.samples}")
    args.max_new_tokens = 1
    _settings_first(args)
    pipe = _pipeline(args)
    cfg = _cfg(args, args.gamma if args.gamma is not None else pipe.gamma)
    ids = pipe.encode(args.prompt, chat=not args.no_chat)
    res = first_token_check(pipe.target_lm, pipe.drafter, pipe.tokenizer, ids, cfg, args.samples)
    if args.json:
        print(json.dumps(res.to_dict(pipe.tokenizer)))
        return 0
    tok = pipe.tokenizer
    top = sorted(res.exact, key=res.exact.get, reverse=True)[:10]
    print(f"{'token':>16}  {'target p':>9}  {'sampled':>9}")
    for t in top:
        print(f"{tok.decode([t])!r:>16}  {res.exact[t]:9.4f}  {res.counts.get(t, 0) / res.samples:9.4f}")
    rest = 1 - sum(res.exact[t] for t in top)
    print(f"{'(all others)':>16}  {rest:9.4f}  {1 - sum(res.counts.get(t, 0) for t in top) / res.samples:9.4f}")
    rate = "n/a" if res.accept_rate is None else f"{res.accept_rate:.1%}"
    if res.dof > 0:
        test = f"chi-square {res.chi2:.2f} on {res.dof} dof, p-value {res.p_value:.3f}"
    elif len(res.exact) == 1:
        test = ("no chi-square test: the target gives one token all its mass (greedy or top-k 1), so every "
                "sample must be that token" + (" and was" if res.tv == 0 else ""))
    else:
        test = "no chi-square test: too few samples (no token is expected 5 times; raise --samples)"
    print(f"\n{res.samples} speculative samples (acceptance {rate}): TV distance {res.tv:.4f} (exact draws "
          f"from the target, as many, give {res.tv_noise:.4f}: sampling noise), {test}")
    return 0


def cmd_bench(args) -> int:
    from .bench import check_settings, load_prompts
    from .bench import main as bench_main
    from .costs import load_costs
    from .registry import load_registry

    # everything that needs no model is refused before the load (~20 s on a CPU)
    if args.vllm_method and not args.peer_vllm:
        raise SpecvizError("--vllm-method chooses vLLM's speculation for --peer-vllm: give --peer-vllm too")
    args.vllm_method = args.vllm_method or "ngram"
    prompts = load_prompts(args.prompts, args.limit, args.categories, args.skip)
    check_settings(args)
    costs = load_costs(args.costs)
    reg = load_registry(args.models)
    for name in args.compare:
        reg.pair(name)  # an unknown name is said with the known ones
    pipe = _pipeline(args, reg)
    others = []
    for name in args.compare:
        other = _pipeline(argparse.Namespace(**{**vars(args), "pair": name, "target": None, "draft": None}), reg)
        if other.target.model is not pipe.target.model:
            raise SpecvizError(f"--compare: pair {name} has another target than {pipe.name}")
        others.append(other)
    vllm = None
    if args.peer_vllm:
        from .backends.vllm import VLLMBackend

        if args.peer_vllm == "start":
            vllm = VLLMBackend.launch(pipe.name if args.pair or not args.target else None, method=args.vllm_method)
        else:
            urls = [u.strip() for u in args.peer_vllm.split(",")]
            vllm = VLLMBackend.connect(urls[0], urls[1] if len(urls) > 1 else None, pair=pipe.name)
    try:
        return bench_main(args, prompts, pipe, costs, others, vllm)
    finally:
        if vllm is not None:
            vllm.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        commands = {"pairs": cmd_pairs, "run": cmd_run, "check": cmd_check, "bench": cmd_bench, "lab": _lab,
                    "vllm-serve": vllm_cli.main}
        return commands[args.cmd](args)
    except SpecvizError as e:
        print(f"specviz: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specviz: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
