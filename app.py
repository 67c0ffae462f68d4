"""specviz: watch speculative decoding happen.  A thin Gradio layer over the specviz package:
layout and wiring here, every computation in specviz/ (which never imports gradio)."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import gradio as gr
import yaml

from specviz import charts, render
from specviz.engine import DecodeConfig
from specviz.errors import SpecvizError
from specviz.exactness import Comparison as Exactness, first_difference
from specviz.live import LiveState, live_run
from specviz.mainthread import MainThreadRunner
from specviz.loading import build_pipeline, is_loaded
from specviz.registry import load_registry
from specviz.sampling import SamplingConfig
from specviz.trace import Trace, compare_runs, load_runs, save_runs

try:  # ZeroGPU on Hugging Face Spaces; a no-op everywhere else
    import spaces

    gpu = spaces.GPU(duration=180)
except ImportError:  # pragma: no cover - depends on the host
    def gpu(fn):
        return fn

ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
REGISTRY = load_registry()
DEFAULT_PAIR = REGISTRY.default()
EXAMPLES = yaml.safe_load((ASSETS / "examples.yaml").read_text())
DEVICE = os.environ.get("SPECVIZ_DEVICE", "auto")
DTYPE = os.environ.get("SPECVIZ_DTYPE", "auto")
TOKENS_EVERY_S = 0.2  # send the token view at most this often (several iterations may arrive at once)
CHARTS_EVERY_S = 2.0  # redraw charts at most this often (figures are resent whole, and slow to draw)
EXPORT_DIR = Path(tempfile.gettempdir()) / "specviz-runs"
PAIR_CHOICE = "(the pair's)"
RUNNER = MainThreadRunner()  # decoding runs on the main thread when app.py is the program (see mainthread.py)
OUTPUT_NAMES = ("status", "tokens", "fig_accept", "fig_length", "fig_position", "fig_throughput",
                "fig_split", "summary", "iteration", "inspect_html", "inspect_fig", "download", "runs")


def pair_choices() -> list[tuple[str, str]]:
    return [(f"{p.name}{'' if off else '  (needs the Hub)'}", p.name) for p, off in REGISTRY.ordered_pairs()]


def drafter_choices() -> list[str]:
    return [PAIR_CHOICE, "lookup", "early-exit:4", "early-exit:8", "early-exit:12"] + list(REGISTRY.models)


def pair_details(pair: str) -> tuple[str, int]:
    p = REGISTRY.pair(pair)
    drafter = p.draft_model or p.drafter["kind"].replace("_", " ")
    return f"**{p.name}**: {p.description} (target `{p.target}`, drafter {drafter})", p.gamma


# ---- rendering a state into the page ---------------------------------------------------------

def _fmt_rate(x):
    return "n/a" if x is None else f"{x:.1%}"


def summary_markdown(spec: Trace, vanilla: Trace | None, exact=None) -> str:
    if spec.start is None:
        return ""
    s = spec.start
    tgt, drf = s.target or {}, s.draft or {}
    lines = [f"**Target** `{tgt.get('name', '?')}` on **{tgt.get('device', '?')}** ({tgt.get('dtype', '?')}) · "
             f"**drafter** {s.drafter.get('name')}"
             + (f" on {drf.get('device')} ({drf.get('dtype')})" if drf.get("device") else ""),
             "",
             "| measure | speculative | vanilla |", "|:---|---:|---:|"]
    van = vanilla if vanilla is not None and vanilla.iterations else None
    lines.append(f"| tokens | {spec.tokens} | {van.tokens if van else '-'} |")
    lines.append(f"| target passes (iterations) | {len(spec.iterations)} | {len(van.iterations) if van else '-'} |")
    lines.append(f"| tokens / s | {spec.tokens_per_second:.1f} | {van.tokens_per_second:.1f} |" if van else
                 f"| tokens / s | {spec.tokens_per_second:.1f} | - |")
    lines.append(f"| acceptance rate | {_fmt_rate(spec.acceptance_rate)} | |")
    lines.append(f"| tokens per iteration | {spec.tokens / max(1, len(spec.iterations)):.2f} | 1 |")
    if van and van.summary and spec.summary:
        cmp = compare_runs(spec, van)
        lines.append(f"| **speedup** (measured, prefill included) | **{cmp.speedup:.2f}x** | 1x |")
        lines.append(f"| decode speedup: measured / theory from a, c, v | {cmp.decode_speedup:.2f}x / "
                     f"{cmp.predicted:.2f}x | |")
        lines.append(f"| draft cost c, verify cost v (vs one vanilla step) | c = {cmp.c:.3f}, v = "
                     + ", ".join(f"{v:.2f} @ {g}" for g, v in sorted(cmp.v.items())) + " | |")
    if spec.summary is not None:
        lines += ["", f"Timings are the decoders' own: the {spec.summary.consumer_ms / 1000:.2f} s this page spent "
                      "drawing the speculative run between iterations is left out, as vanilla's is."]
    if exact is not None:
        greedy = spec.start.sampling.get("temperature", 0) == 0
        if greedy:
            verdict = "**identical to vanilla**, token for token" if exact.identical else f"**{exact.describe()}**"
        else:
            verdict = ("sampled run: outputs differ by design (same distribution, different draws); "
                       "`python -m specviz check` tests the distribution")
        lines += ["", f"Greedy check: {verdict}"]
    return "\n".join(lines)


def status_line(state: LiveState) -> str:
    spec, van = state.spec, state.vanilla
    if state.phase == "speculative":
        return (f"● speculative decoding: {spec.tokens} tokens, {len(spec.iterations)} iterations, "
                f"acceptance {_fmt_rate(spec.acceptance_rate)}, {spec.tokens_per_second:.1f} tok/s")
    if state.phase == "vanilla":
        return f"● vanilla decoding of the same prompt for comparison: {van.tokens} tokens, {van.tokens_per_second:.1f} tok/s"
    if spec.summary is None:
        return "■ stopped"
    return f"■ done: {spec.summary.new_tokens} tokens, stop: {spec.summary.stop_reason}"


def inspector(runs: dict | None, index):
    spec = (runs or {}).get("spec")
    if not spec or not spec.iterations:
        return render.inspector_html(None), charts.inspector_figure(None)
    i = max(0, min(int(index or 0), len(spec.iterations) - 1))
    e = spec.iterations[i]
    return render.inspector_html(e), charts.inspector_figure(e)


def _export(spec: Trace, vanilla: Trace | None) -> str:
    EXPORT_DIR.mkdir(parents=True, exist_ok=True)
    path = EXPORT_DIR / f"specviz-run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{id(spec) % 10000}.json"
    save_runs(path, spec, vanilla, {"saved": time.strftime("%Y-%m-%d %H:%M:%S")})
    return str(path)


def full_view(spec: Trace, vanilla: Trace | None, status: str, exact=None, export: bool = True):
    n = len(spec.iterations)
    last = n - 1 if n else 0
    html_, fig = inspector({"spec": spec}, last)
    return (status, render.tokens_html(spec.iterations), *charts.all_figures(spec, vanilla),
            summary_markdown(spec, vanilla, exact),
            gr.update(maximum=max(1, last), value=last, interactive=n > 1), html_, fig,
            _export(spec, vanilla) if export and spec.summary else None,
            {"spec": spec, "vanilla": vanilla})


def _skip_all(status: str | None = None):
    return tuple([status if status is not None else gr.skip()] + [gr.skip()] * (len(OUTPUT_NAMES) - 1))


def _error(message: str):
    gr.Warning(message)
    return (f"**Error:** {message}",) + tuple(gr.skip() for _ in OUTPUT_NAMES[1:])


# ---- handlers ------------------------------------------------------------------------------------

def _settings(gamma, temperature, top_k, top_p, max_new_tokens, seed) -> DecodeConfig:
    def whole(x, name):
        if x is None or float(x) != int(float(x)):
            raise SpecvizError(f"{name} must be a whole number, got {x!r}")
        return int(float(x))

    sampling = SamplingConfig(float(temperature if temperature is not None else -1), whole(top_k, "top-k"),
                              float(top_p if top_p is not None else 0))
    return DecodeConfig(gamma=whole(gamma, "gamma"), max_new_tokens=whole(max_new_tokens, "max new tokens"),
                        sampling=sampling, seed=whole(seed, "seed"))


@gpu
def run_decoding(pair, target, drafter, prompt, chat, gamma, temperature, top_k, top_p, max_new_tokens,
                 seed, with_vanilla):
    """Stream one run into the page: status, tokens every iteration, charts every few."""
    try:
        cfg = _settings(gamma, temperature, top_k, top_p, max_new_tokens, seed)
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecvizError("the prompt is empty: type one or pick an example")
        custom_target = target if target and target != PAIR_CHOICE else None
        custom_drafter = drafter if drafter and drafter != PAIR_CHOICE else None
        name = custom_target or REGISTRY.pair(pair).target
        if not is_loaded(REGISTRY.model(name), DEVICE, DTYPE):
            yield _skip_all(f"● loading {name} (the first run of a model loads its weights; ~20 s on a CPU)…")
        pipe = build_pipeline(REGISTRY, pair=None if custom_target else pair, target=custom_target,
                              drafter=custom_drafter, device=DEVICE, dtype=DTYPE, gamma=cfg.gamma)
        yield _skip_all("● prefilling the prompt…")
        rendered: list[str] = []  # each iteration's HTML, made once
        last_tokens = last_charts = 0.0
        stream = RUNNER.stream(lambda: live_run(pipe, prompt, cfg, chat=bool(chat), with_vanilla=bool(with_vanilla)))
        for state in stream:
            now = time.perf_counter()
            if state.last is not None:
                rendered.append(render.iteration_html(state.last))
            if state.phase == "done":
                yield full_view(state.spec, state.vanilla, status_line(state), state.exact)
            elif state.phase == "speculative" and state.last is not None and now - last_tokens >= TOKENS_EVERY_S:
                last_tokens = now
                redraw = now - last_charts >= CHARTS_EVERY_S
                if redraw:
                    last_charts = now
                # acceptance charts live; throughput and time split (which need vanilla) at the end
                figs = ((charts.acceptance_figure(state.spec), charts.accepted_length_figure(state.spec),
                         charts.position_figure(state.spec), gr.skip(), gr.skip()) if redraw else (gr.skip(),) * 5)
                yield (status_line(state), render.tokens_html([], rendered), *figs,
                       gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), {"spec": state.spec, "vanilla": None})
            elif state.phase == "vanilla" and now - last_tokens >= 0.5:
                last_tokens = now
                yield _skip_all(status_line(state))
    except SpecvizError as e:
        yield _error(str(e))
    except MemoryError:
        yield _error("out of memory: try a smaller pair, fewer new tokens or a shorter prompt")
    except Exception as e:  # keep serving whatever happened; say what it was
        if type(e).__name__ == "OutOfMemoryError":
            yield _error("the GPU ran out of memory: try a smaller pair or fewer new tokens")
        else:
            yield _error(f"unexpected error: {type(e).__name__}: {e}")


def replay(file):
    """Replay a saved run without any model: iterations appear as they did, sped up."""
    if file is None:
        yield _skip_all()
        return
    path = file if isinstance(file, str) else getattr(file, "name", None) or file.get("path")
    try:
        spec, vanilla, meta = load_runs(path)
    except ValueError as e:
        yield _error(str(e))
        return
    shown = Trace(start=spec.start)
    step = max(1, len(spec.iterations) // 40)  # about 40 frames
    for i, e in enumerate(spec.iterations):
        shown.iterations.append(e)
        if i % step == 0:
            yield (f"► replaying a saved run ({i + 1}/{len(spec.iterations)} iterations)",
                   render.tokens_html(shown.iterations), *(gr.skip(),) * 11)
            time.sleep(0.05)
    exact = None
    if vanilla and vanilla.summary and spec.summary:  # no model here: compare ids, no logit margin
        i = first_difference(vanilla.output_ids, spec.output_ids)
        exact = Exactness(i is None, i)
    yield full_view(spec, vanilla, f"► replayed a saved run ({meta.get('saved', 'undated')}): no model was loaded",
                    exact, export=False)


# ---- layout --------------------------------------------------------------------------------------

INTRO = """# specviz · speculative decoding, live
A small **draft** proposes γ tokens; the **target** checks them all in **one** forward pass, keeps each
with probability min(1, p/q), replaces the first refused one with a draw from norm(max(0, p − q)), and adds a
**bonus** token when all pass. The output is *exactly* the target's. Press **Run** and watch every iteration."""


def build_demo() -> gr.Blocks:
    default_pair = REGISTRY.default()
    details, gamma0 = pair_details(default_pair)
    with gr.Blocks(title="specviz: speculative decoding, live") as demo:
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=2, min_width=320):
                pair = gr.Dropdown(pair_choices(), value=default_pair, label="Model pair (models.yaml)")
                pair_md = gr.Markdown(details)
                prompt = gr.Textbox(value=EXAMPLES[1]["prompt"], lines=5, label="Prompt", elem_id="sv-prompt")
                gr.Examples([[e["prompt"]] for e in EXAMPLES], inputs=[prompt], label="Examples: chat, summary, code, maths, translation",
                            cache_examples=False, example_labels=[e["kind"] for e in EXAMPLES])
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="sv-run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="sv-stop")
                with gr.Row():
                    gamma = gr.Slider(1, 16, value=gamma0, step=1, label="γ (max draft tokens per iteration)")
                    max_new = gr.Slider(8, 512, value=96, step=8, label="Max new tokens")
                with gr.Row():
                    temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)")
                    seed = gr.Number(value=0, precision=0, label="Seed")
                with gr.Row():
                    top_k = gr.Number(value=0, precision=0, label="Top-k (0 = off)")
                    top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p (1 = off)")
                with gr.Row():
                    chat = gr.Checkbox(value=True, label="Chat template")
                    with_vanilla = gr.Checkbox(value=True, label="Then run vanilla decoding to compare")
                with gr.Accordion("Choose target and drafter separately", open=False):
                    target = gr.Dropdown([PAIR_CHOICE] + list(REGISTRY.models), value=PAIR_CHOICE, label="Target model")
                    drafter = gr.Dropdown(drafter_choices(), value=PAIR_CHOICE, label="Drafter (model, lookup, early-exit:L)")
                with gr.Accordion("Replay a saved run (no model needed)", open=False):
                    upload = gr.File(label="specviz run (.json)", file_types=[".json"])
            with gr.Column(scale=3, min_width=480):
                status = gr.Markdown("Ready. Press **Run**.", elem_id="sv-status")
                gr.HTML(render.LEGEND)
                tokens = gr.HTML(render.tokens_html([]), elem_id="sv-tokens")
                with gr.Tabs():
                    with gr.Tab("Charts"):
                        with gr.Row():
                            fig_accept = gr.Plot(show_label=False)
                            fig_length = gr.Plot(show_label=False)
                        with gr.Row():
                            fig_throughput = gr.Plot(show_label=False)
                            fig_position = gr.Plot(show_label=False)
                        fig_split = gr.Plot(show_label=False)
                    with gr.Tab("Iteration inspector"):
                        iteration = gr.Slider(0, 1, value=0, step=1, label="Iteration", interactive=False)
                        inspect_html = gr.HTML(render.inspector_html(None))
                        inspect_fig = gr.Plot(show_label=False)
                    with gr.Tab("Summary"):
                        summary = gr.Markdown("", elem_id="sv-summary")
                        download = gr.File(label="This run's events (JSON): download, or load it back under Replay")
        runs = gr.State(None)

        outputs = [status, tokens, fig_accept, fig_length, fig_position, fig_throughput, fig_split, summary,
                   iteration, inspect_html, inspect_fig, download, runs]
        inputs = [pair, target, drafter, prompt, chat, gamma, temperature, top_k, top_p, max_new, seed, with_vanilla]
        run_event = run_btn.click(run_decoding, inputs, outputs, api_name="run", concurrency_limit=1,
                                  concurrency_id="decode")
        stop_btn.click(None, None, None, cancels=[run_event])
        upload.upload(replay, [upload], outputs, api_name="replay", concurrency_limit=4)
        iteration.change(inspector, [runs, iteration], [inspect_html, inspect_fig], api_visibility="private",
                         show_progress="hidden")
        pair.change(pair_details, [pair], [pair_md, gamma], api_visibility="private")
        demo.load(lambda: (f"Ready. Models run on **{device_label()}**. Press **Run**."), None, [status],
                  api_visibility="private")
    demo.queue(max_size=32, default_concurrency_limit=1)
    return demo


def device_label() -> str:
    from specviz.loading import pick_device, pick_dtype

    dev = pick_device(DEVICE)
    return f"{dev.type} ({str(pick_dtype(DTYPE, dev)).replace('torch.', '')})"


def launch_kwargs() -> dict:
    return {"theme": gr.themes.Soft(), "css_paths": [str(ASSETS / "specviz.css")], "footer_links": ["gradio"]}


def preload(pair: str = DEFAULT_PAIR) -> None:
    """Load the default pair's weights in the background so the first Run is quick."""
    try:
        build_pipeline(REGISTRY, pair=pair, device=DEVICE, dtype=DTYPE).warm_up(max_gamma=16)
    except SpecvizError as e:
        print(f"[specviz] preload of {pair} failed: {e}")


demo = build_demo()

if __name__ == "__main__":
    if os.environ.get("SPECVIZ_PRELOAD", "1") == "1":
        threading.Thread(target=preload, daemon=True).start()
    server = os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0")
    if os.environ.get("SPACES_ZERO_GPU"):  # ZeroGPU runs handlers in forked GPU workers: decode there
        demo.launch(server_name=server, **launch_kwargs())
    else:
        demo.launch(server_name=server, prevent_thread_lock=True, **launch_kwargs())
        try:
            RUNNER.serve_forever()  # decode on the main thread, where torch's CPU threads are effective
        except KeyboardInterrupt:
            demo.close()
