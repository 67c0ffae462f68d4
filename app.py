"""specviz: watch speculative decoding happen. Layout and wiring only: every computation is in
specviz/ (which never imports gradio); a handler turns specviz's frames into component updates."""

from __future__ import annotations

import html
import os
import sys
import threading
import time
from pathlib import Path

import gradio as gr
import yaml

from specviz import drafters
from specviz.backends.transformers import is_loaded, pick_device, pick_dtype
from specviz.costs import REFERENCE
from specviz.engine import DecodeConfig
from specviz.errors import SpecvizError
from specviz.exports import Exports
from specviz.mainthread import TICK, Interrupted, MainThreadRunner, StopFlags
from specviz.pipeline import build_pipeline, resolve_pair
from specviz.registry import load_registry
from specviz.view import menus, tokens
from specviz.view.frames import CHART_NAMES, Frame, FrameMaker, inspector_frame, live_run, replay_frames
from specviz.view.menus import typed_seed
from specviz.view.text import lab_stopped, md, md_text, progress_line, waiting_status

try:  # ZeroGPU on Hugging Face Spaces; a no-op everywhere else
    import spaces

    gpu = spaces.GPU(duration=180)
except ImportError:  # pragma: no cover - depends on the host
    def gpu(fn):
        return fn

ZERO_GPU = bool(os.environ.get("SPACES_ZERO_GPU"))
ASSETS = Path(__file__).resolve().parent / "assets"
REGISTRY = load_registry()
EXAMPLES = yaml.safe_load((ASSETS / "examples.yaml").read_text())
DEVICE, DTYPE = os.environ.get("SPECVIZ_DEVICE", "auto"), os.environ.get("SPECVIZ_DTYPE", "auto")
PAIR_CHOICE = "(the pair's)"
# Every event that decodes: its handler starts at once and waits its turn in RUNNER's queue (which shows
# the visitor their place and sees Stop). gradio gives all events of one concurrency_id the lowest
# limit among them, so each of them must name the same limit: one event left at the default (1) made
# a second tab's Run wait, unseen and deaf to Stop, in gradio's own queue. 16 visitors wait in view (a
# classroom pressing Run together); gradio's 40 worker threads leave 24 for everything else.
DECODE_EVENTS = dict(concurrency_id="decode", concurrency_limit=16)
RUNNER = MainThreadRunner()  # the one decode queue; runs on the main thread when app.py is the program
EXPORTS = Exports()
STOPS = StopFlags()  # (session, "run" | "lab") -> the flag its Stop button sets


def clamped(slider: gr.Slider) -> gr.Slider:
    """The slider, its number box clamping what the visitor types to the range. gradio's own raises on a
    value out of range, before any handler: every change then answered HTTP 500 (the API snippet's
    refresh, a Run) while the box showed the clamped value. The clamp sits on the class, not the
    instance: a run that changes a slider's range (the inspector's Iteration) makes gradio keep a fresh
    `Slider(**kwargs)` for the session, which an instance patch would not reach. (Not a subclass: a
    subclass of a gradio component makes gradio write a type stub beside app.py at every start.) Every
    slider on this page is made through here."""
    if gr.Slider.preprocess is not _clamped_preprocess:
        gr.Slider.preprocess = _clamped_preprocess
    return slider


# gradio's own, kept on the clamp too: a second import of this module (gradio's reload mode) finds the
# clamp already on the class, and must not wrap it in itself
_SLIDER_PREPROCESS = getattr(gr.Slider.preprocess, "unclamped", gr.Slider.preprocess)


def _clamped_preprocess(self: gr.Slider, payload):
    if isinstance(payload, (int, float)) and not isinstance(payload, bool):
        if self.minimum is not None:  # the page's box already shows the clamped value itself
            payload = max(payload, self.minimum)
        if self.maximum is not None:
            payload = min(payload, self.maximum)
    return _SLIDER_PREPROCESS(self, payload)


_clamped_preprocess.unclamped = _SLIDER_PREPROCESS


def choice_details(pair: str, target: str | None, drafter: str | None) -> str:
    """The pair's text for the page's menus as they stand ((the pair's) for its own)."""
    return menus.choice_details(REGISTRY, pair, _custom(target), _custom(drafter))


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "local"


def _error(message: str, ran: bool = True) -> dict:
    gr.Warning(html.escape(message))  # the toast renders HTML: a replay's or a URL's text must stay text
    stale = "" if ran else " Nothing ran: anything shown below is from an earlier run."
    end = "" if message.rstrip().endswith((".", "!", "?")) or not stale else "."
    return {C["status"]: f"**Error:** {md(message.rstrip(), 400)}{end}{stale}"}


def _custom(choice: str | None) -> str | None:
    """A target or drafter picked in the page, or None for the pair's own."""
    return choice if choice and choice != PAIR_CHOICE else None


def _chosen(pair, target, drafter, prompt) -> tuple[str | None, str | None, str | None]:
    """The page's choice as build_pipeline takes it: (pair, target, drafter); checks the prompt."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise SpecvizError("the prompt is empty: type one or pick an example")
    custom_target, custom_drafter = _custom(target), _custom(drafter)
    return (None if custom_target else pair), custom_target, custom_drafter


def _cleared() -> dict:
    """The page with no run on it: what a run or replay shows first, so that no panel it has not drawn
    yet (the summary, the time split, the inspector, the file) passes for its result."""
    out = {C[k]: None for k in ("export", "result", "runs") + tuple(f"fig_{n}" for n in CHART_NAMES)}
    html_, fig = inspector_frame(None, 1)
    out.update({C["tokens"]: tokens.tokens_html([]), C["output"]: "", C["summary"]: "",
                C["inspect_html"]: html_, C["inspect_fig"]: fig,
                C["iteration"]: gr.update(minimum=1, maximum=2, value=1, interactive=False)})
    return out


def _updates(frame: Frame | None) -> dict:
    if frame is None:
        return {}
    return {C[k]: (gr.update(**v) if k == "iteration" else v) for k, v in frame.updates().items()}


@gpu
def run_decoding(pair, target, drafter, prompt, chat, gamma, temperature, top_k, top_p, max_new_tokens,
                 seed, costs, with_vanilla, backend="specviz", vllm_url="", request: gr.Request = None):
    """Stream one run into the page; waits its turn in the decode queue it shares with the API."""
    session = _session(request)
    halt = STOPS.open(session, "run")
    ran = False  # once the engine yields its first event, the page is cleared: what it shows is this run's
    try:
        cfg = DecodeConfig.from_settings(gamma, temperature, top_k, top_p, max_new_tokens, typed_seed(seed),
                                         REFERENCE if costs == "reference" else None)
        pair, custom_target, custom_drafter = _chosen(pair, target, drafter, prompt)
        spec = resolve_pair(REGISTRY, pair, custom_target, custom_drafter, cfg.gamma)
        if halt.is_set():
            yield {C["status"]: STOPPED_EARLY}
            return
        # specviz's engine: the pair is made ready on the decode thread, in this run's own turn (make),
        # so a load (~20 s) never goes before the runs that queued earlier and this run does not queue twice
        pipe = None
        if backend and backend != "specviz":
            if custom_drafter:  # vLLM would run the pair's own method and silently drop the choice
                raise SpecvizError(f"vLLM runs the pair's own drafting ({menus.drafter_label(REGISTRY.pair(pair))}), "
                                   f"not {custom_drafter}: set Drafter to {PAIR_CHOICE}")
            for item in vllm_backend(pair, backend, vllm_url):
                if halt.is_set():
                    yield {C["status"]: STOPPED_EARLY}
                    return
                if isinstance(item, str):
                    yield {C["status"]: item}
                else:
                    pipe = item
            if pipe is None:
                raise SpecvizError("the vLLM backend ended without starting")

        def make():
            ready = pipe
            if ready is None:
                yield {C["status"]: preparing(spec)}
                ready = build_pipeline(REGISTRY, pair=pair, target=custom_target, drafter=custom_drafter,
                                       device=DEVICE, dtype=DTYPE, gamma=cfg.gamma)
            yield {C["status"]: "● prefilling the prompt…"}  # the earlier run stays until this prompt is accepted
            yield from live_run(ready, prompt, cfg, chat=bool(chat), with_vanilla=bool(with_vanilla))
        maker = FrameMaker(lambda s, v: EXPORTS.save(session, s, v))
        # ticks: a load can take a while, and Stop must answer at once (the decoder still finishes it first)
        stream = RUNNER.turns(make, on_wait=lambda ahead, eta: {C["status"]: waiting(ahead, eta)}, tick_s=0.5)
        for item in stream:
            if halt.is_set():  # Stop: draw what ran, decode no further (closing the stream ends it)
                yield _updates(maker.stopped()) or {C["status"]: STOPPED_EARLY}
                break
            if item is TICK:
                yield gr.skip()
                continue
            update = item if isinstance(item, dict) else _updates(maker.add(item))
            if not ran and not isinstance(item, dict):  # the engine's first event: the prompt was accepted,
                ran = True  # so the earlier run goes: no panel this run has not drawn yet passes for its result
                update = {**_cleared(), **update}
            if update:
                yield update
    except SpecvizError as e:
        on_vllm = backend not in (None, "", "specviz")
        yield _error(str(e) + (" (the page keeps serving: choose specviz's engine under Backend)" if on_vllm else ""),
                     ran)
    except MemoryError:
        yield _error("out of memory: try a smaller pair, fewer new tokens or a shorter prompt", ran)
    except Exception as e:  # keep serving whatever happened; say what it was
        oom = type(e).__name__ == "OutOfMemoryError"
        yield _error("the GPU ran out of memory: try a smaller pair or fewer new tokens" if oom
                     else f"unexpected error: {type(e).__name__}: {e}", ran)
    finally:
        halt.close()


STARTING = threading.Event()  # set while the start-up preload holds the decode queue
STARTED_AT = [time.monotonic()]  # when that preload began


def waiting(ahead: int, eta_s: float | None) -> str:
    """The waiting line, saying so when all that is ahead is the server's start-up (not another visitor)."""
    startup = STARTING.is_set() and ahead <= 1
    return waiting_status(ahead, eta_s, time.monotonic() - STARTED_AT[0] if startup else None)


VLLM: dict[tuple, object] = {}  # (pair, url) -> a VLLMBackend, started once per process


def vllm_backend(pair, backend: str, url: str):
    """Status lines while a vLLM backend starts (or connects), then the backend itself."""
    from specviz.backends.vllm import start_or_connect

    if pair is None:
        raise SpecvizError("vLLM runs registry pairs: pick a pair, not a separate target")
    for item in start_or_connect(pair, url if backend == "vllm-url" else None, VLLM):
        yield f"● {md(item, 300)}" if isinstance(item, str) else item


STOPPED_EARLY = "■ stopped before anything ran"


def preparing(spec) -> str:
    """The status line while a run's pair is made ready: the models it still loads, or its drafter."""
    for name in [spec.target] + ([spec.draft_model] if spec.draft_model else []):
        model = REGISTRY.model(name)
        if not is_loaded(model, DEVICE, DTYPE):
            where = "from the Hugging Face Hub" if model.offline_source() is None else "its weights"
            return f"● loading {md(name)} ({md(where)}; ~20 s on a CPU the first time)…"
    return f"● preparing the {md(str(spec.drafter.get('kind', 'pair')))} drafter…"


def stop(request: gr.Request = None) -> None:
    """Stop: the session's run sees it before its next step and draws the stopped page itself
    (what ran, summarised, charted and exported). The run stays the only writer of its outputs, so
    no frame of it can land after that page, and it ends as a normal event: gradio's ``cancels``
    races the run's last update and can leave every output marked "Error"."""
    STOPS.stop(_session(request), "run")


def stop_lab(request: gr.Request = None) -> None:
    """Stop for the Lab's experiment (see ``stop``)."""
    STOPS.stop(_session(request), "lab")


def wire_stop(button: gr.Button, handler, status, events: list) -> None:
    if ZERO_GPU:  # handlers decode in forked GPU workers, which never see STOPS: cancel them instead
        button.click(lambda: "■ stopped", None, [status], cancels=events, api_visibility="private")
    else:
        button.click(handler, None, None, api_visibility="private", show_progress="hidden", queue=False)


def replay(file, request: gr.Request = None):
    """Replay a run the visitor uploaded, without any model: iterations appear as they did, sped up."""
    if file is None:
        return
    path = file if isinstance(file, str) else getattr(file, "path", None) or getattr(file, "name", None)
    try:
        spec, vanilla, meta = EXPORTS.load_upload(path, gr.utils.get_upload_folder())
    except ValueError as e:
        yield _error(f"cannot replay this file: {e}", ran=False)
        return
    try:
        yield {**_cleared(), C["status"]: "► replaying a saved run…"}
        for frame in replay_frames(spec, vanilla, meta.get("saved", "undated")):
            yield _updates(frame)
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
        # a crafted file can pass the loader's checks and still hold values no run makes (running
        # totals beyond the tokens, a token list where a text belongs): a message, not a crash
        yield _error(f"cannot replay this file past this point: {type(e).__name__}: {e}")


def inspect(runs, number):
    return inspector_frame((runs or {}).get("spec"), number)


INTRO = """# specviz · speculative decoding, live
A small **draft** proposes γ tokens; the **target** checks them all in **one** forward pass, keeps each
with probability min(1, p/q), replaces the first refused one with a draw from norm(max(0, p − q)), and adds a
**bonus** token when all pass. The output is *exactly* the target's. Press **Run** and watch every iteration."""

C: dict[str, gr.components.Component] = {}  # the page's outputs by name (a Frame's field names)
SCROLL_TO_STATUS = ("(...a) => {document.getElementById('sv-status')?.scrollIntoView({block: 'start', "
                    "behavior: 'smooth'}); return a;}")


def try_case(kind: str):
    """A one-click case worth watching: (button, (pair, prompt, temperature, gamma)), or None."""
    if kind == "copy":
        pair, label, prompt, temp = REGISTRY.default(), "Try: a copy-heavy summary (long accepted runs)", 1, 0.0
    else:
        pair = next((p.name for p, offline in REGISTRY.ordered_pairs()
                     if offline and p.drafter.get("kind") == "early_exit"), None)
        if pair is None:
            return None
        label, prompt, temp = "Try: early exit (rejections and resampling)", 0, 0.8
    return (gr.Button(label, size="sm", elem_id=f"sv-try-{kind}"),
            (pair, EXAMPLES[prompt]["prompt"], temp, REGISTRY.pair(pair).gamma))


def build_demo() -> gr.Blocks:
    default_pair = REGISTRY.default()
    gamma0 = REGISTRY.pair(default_pair).gamma
    with gr.Blocks(title="specviz: speculative decoding, live", delete_cache=(900, 3600)) as demo:
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=2, min_width=320):
                pair = gr.Dropdown(menus.pair_choices(REGISTRY), value=default_pair, label="Model pair (models.yaml)")
                pair_md = gr.Markdown(menus.pair_details(REGISTRY, default_pair))
                # at most 6 lines tall (a longer prompt scrolls inside): Run stays above the fold of a
                # 1280 x 720 projector, where a 10-line example pushed it below
                prompt = gr.Textbox(value=EXAMPLES[1]["prompt"], lines=5, max_lines=6, label="Prompt", elem_id="sv-prompt")
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="sv-run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="sv-stop")
                gr.Examples([[e["prompt"]] for e in EXAMPLES], inputs=[prompt], cache_examples=False,
                            label="Examples: chat, summary, code, maths, translation",
                            example_labels=[e["kind"] for e in EXAMPLES])
                with gr.Row():
                    tries = [b for b in (try_case("copy"), try_case("reject")) if b is not None]
                with gr.Row():
                    gamma = clamped(gr.Slider(1, 16, value=gamma0, step=1, label="γ (max draft tokens per iteration)"))
                    max_new = clamped(gr.Slider(8, 512, value=96, step=8, label="Max new tokens"))
                with gr.Row():
                    temperature = clamped(gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)"))
                    seed = gr.Number(value=0, label="Seed")  # no precision: a typed 1.5 is refused, not rounded
                with gr.Row():
                    top_k = gr.Number(value=0, label="Top-k (0 = off)")
                    top_p = clamped(gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p (1 = off)"))
                with gr.Row():
                    chat = gr.Checkbox(value=True, label="Chat template")
                    with_vanilla = gr.Checkbox(value=True, label="Then run vanilla decoding to compare")
                costs = gr.Radio([("measured on this machine", "measured"), ("reference (reproducible)", "reference")],
                                 value="measured", label="Cost profile for the lookup drafter's lengths")
                with gr.Accordion("Choose target and drafter separately", open=False):
                    target = gr.Dropdown([PAIR_CHOICE] + menus.model_choices(REGISTRY, REGISTRY.models), value=PAIR_CHOICE,
                                         label="Target model")
                    drafter = gr.Dropdown([PAIR_CHOICE] + drafters.choices([]) + menus.model_choices(REGISTRY, REGISTRY.models), value=PAIR_CHOICE,
                                          label="Drafter (model, lookup, early-exit:L)")
                with gr.Accordion("Backend: specviz's engine or vLLM", open=False):
                    backend = gr.Radio([("specviz engine (p and q for every token)", "specviz"),
                                        ("vLLM, started here (needs setup.sh --vllm)", "vllm"),
                                        ("vLLM at a URL", "vllm-url")], value="specviz", label="Backend",
                                       elem_id="sv-backend")
                    vllm_url = gr.Textbox("http://127.0.0.1:8000, http://127.0.0.1:8001",
                                          label="vLLM URL(s): speculative[, vanilla] (for vLLM at a URL)")
                with gr.Accordion("Replay a saved run (no model needed)", open=False):
                    upload = gr.File(label="specviz run (.json)", file_types=[".json"])
                api_panel(demo, pair, target, drafter, prompt, chat, gamma, temperature, top_p, max_new, seed, top_k, costs)
            with gr.Column(scale=3, min_width=480):
                C["status"] = gr.Markdown("Ready. Press **Run**.", elem_id="sv-status")
                gr.HTML(tokens.LEGEND)
                hide = gr.Checkbox(value=False, label="Hide discarded drafts", elem_id="sv-hide")
                C["tokens"] = gr.HTML(tokens.tokens_html([]), elem_id="sv-tokens")
                with gr.Tabs(overflow_behavior="wrap"):  # a phone shows every tab, on two rows if need be
                    with gr.Tab("Output"):
                        C["output"] = gr.HTML("", elem_id="sv-output")
                    with gr.Tab("Charts"):
                        with gr.Row():
                            C["fig_accept"], C["fig_length"] = gr.Plot(show_label=False), gr.Plot(show_label=False)
                        with gr.Row():
                            C["fig_throughput"], C["fig_position"] = gr.Plot(show_label=False), gr.Plot(show_label=False)
                        C["fig_split"] = gr.Plot(show_label=False)
                    with gr.Tab("Iteration inspector"):
                        C["iteration"] = clamped(gr.Slider(1, 2, value=1, step=1, label="Iteration", interactive=False,
                                                            elem_id="sv-iteration"))
                        C["inspect_html"] = gr.HTML(tokens.inspector_html(None))
                        C["inspect_fig"] = gr.Plot(show_label=False)
                    with gr.Tab("Summary"):
                        C["summary"] = gr.Markdown("", elem_id="sv-summary")
                        C["export"] = gr.File(label="This run's events (JSON): download, or load it back under Replay")
                        C["result"] = gr.JSON(visible=False)
        C["runs"] = gr.State(None)
        lab_tab(dict(pair=pair, target=target, drafter=drafter, prompt=prompt, chat=chat, temperature=temperature, seed=seed))

        outputs = list(C.values())
        inputs = [pair, target, drafter, prompt, chat, gamma, temperature, top_k, top_p, max_new, seed, costs,
                  with_vanilla, backend, vllm_url]
        run_kw = dict(show_progress="hidden", **DECODE_EVENTS)
        run_event = run_btn.click(run_decoding, inputs, outputs, api_name="run", js=SCROLL_TO_STATUS, **run_kw)
        runs = [run_event]
        for button, values in tries:  # one click: set the inputs, then run
            runs.append(button.click(lambda v=values: v, None, [pair, prompt, temperature, gamma],
                                     api_visibility="private", js=SCROLL_TO_STATUS)
                        .then(run_decoding, inputs, outputs, api_visibility="private", **run_kw))
        wire_stop(stop_btn, stop, C["status"], runs)
        upload.upload(replay, [upload], outputs, api_name="replay", concurrency_limit=4)
        C["iteration"].change(inspect, [C["runs"], C["iteration"]], [C["inspect_html"], C["inspect_fig"]],
                              api_visibility="private", show_progress="hidden")
        hide.change(None, [hide], None, js="(v) => {document.getElementById('sv-tokens')?.classList.toggle('sv-hide-drafts', v);}")
        pair.change(lambda p, t, d: (choice_details(p, t, d), REGISTRY.pair(p).gamma), [pair, target, drafter],
                    [pair_md, gamma], api_visibility="private")
        for box in (target, drafter):
            box.change(choice_details, [pair, target, drafter], [pair_md], api_visibility="private")
        demo.load(lambda: f"Ready. Models run on **{device_label()}**. Press **Run**.", None, [C["status"]],
                  api_visibility="private")
    demo.queue(max_size=32, default_concurrency_limit=1)
    calm_queue(demo)
    return demo


QUEUE_POLL_S = 0.02  # gradio's queue looks for new events this often when it is free (its own: 0.001)
PROGRESS_POLL_S = 0.1  # and for progress to send (its own: 0.01); the page streams its own updates


def calm_queue(demo: gr.Blocks) -> None:
    """Slow down gradio's idle polling. Its queue wakes its event loop every millisecond while no event
    waits, and every 10 ms for progress: ~7% of a core with nothing to do (measured: 26 of 380 CPU ticks
    beside a 3.8 s decode; 3 with these polls), on a 2-core free Space too. In one process, a plain step
    on the main thread with the server up ran at 16.6-17.8 tok/s against 19.8 before it started, and
    19.0-20.5 with these polls. The cost: a click waits up to 20 ms more before its run starts."""
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free") and hasattr(queue, "progress_update_sleep_when_free"):
        queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_POLL_S)
        queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, PROGRESS_POLL_S)


def lab_tab(inputs: dict) -> None:
    """The Lab: each experiment a button; streamed progress, a chart, the takeaway, Stop, JSON export.
    ``inputs``: the page's pair/target/drafter/prompt/chat/temperature/seed components."""
    from functools import partial

    from specviz.lab import EXPERIMENTS, experiment
    from specviz.lab.broken import BROKEN
    from specviz.lab.common import GLOSSARY, Progress, Settings

    def run_lab(name, variant, pair, target, drafter, prompt, chat, temperature, seed, request: gr.Request = None):
        session = _session(request)
        # another experiment started in this tab replaces the one running: it would wait behind it in
        # the decode queue, and both draw in the same place, so the first would go on unseen
        STOPS.stop(session, "lab")
        halt = STOPS.open(session, "lab")
        title = md(EXPERIMENTS[name][1]) if name in EXPERIMENTS else md(str(name))
        drawn = False  # whether this experiment has drawn a chart yet
        try:
            # the previous experiment's chart, takeaway and file go first: a Stop or an error before this
            # one draws must not leave them on the page as if they were its result
            loading = f"● loading the pair for **{title}**…"
            yield loading, None, "", None
            mod = experiment(name)
            pair, custom_target, custom_drafter = _chosen(pair, target, drafter, prompt)
            load = partial(build_pipeline, REGISTRY, pair=pair, target=custom_target, drafter=custom_drafter,
                           device=DEVICE)
            s = Settings(prompt=prompt, chat=bool(chat), seed=typed_seed(seed), temperature=float(temperature or 0),
                         variant=variant)
            pipe = None  # the loaded pair, for the done line

            def make():  # on the decode thread, in this experiment's own turn (a load never jumps the line)
                nonlocal pipe
                yield loading  # again, after any wait for the decoder
                pipe = load(dtype=DTYPE)
                yield from mod.run(pipe, s, load)
            # ticks: a step can take a while (a load, a second copy of the target, a sweep's point), and
            # Stop must answer at once, not when that step ends (the decoder still finishes it first)
            stream = RUNNER.turns(make, on_wait=waiting, tick_s=0.5)
            done = None  # the latest progress: (steps done, of how many)
            for item in stream:
                if halt.is_set():  # Stop: the partial chart stays; compute no further
                    what, note = lab_stopped(drawn, done)
                    yield f"■ stopped: **{title}** ({what})", gr.skip(), note, gr.skip()
                    break
                if item is TICK:
                    yield gr.skip(), gr.skip(), gr.skip(), gr.skip()
                elif isinstance(item, str):
                    yield item, gr.skip(), gr.skip(), gr.skip()
                elif isinstance(item, Progress):
                    fig = mod.figure(item.partial) if item.partial is not None else gr.skip()
                    drawn = drawn or item.partial is not None
                    done = (item.done, item.total)
                    yield progress_line(item.fraction, item.done, item.total, item.message), fig, gr.skip(), gr.skip()
                else:
                    path = EXPORTS.save_json(_session(request), f"specviz-lab-{name}", {  # bounded, private
                        "experiment": name, "pair": pipe.name, "settings": s.to_json(),
                        "result": item.to_json(), "takeaway": mod.takeaway(item), "glossary": GLOSSARY})
                    yield (f"■ done: **{title}** on {md(pipe.name)}", mod.figure(item),
                           md_text(mod.takeaway(item), 4000), path)
        except SpecvizError as e:
            yield f"**Error:** {md(str(e), 400)}", gr.skip(), gr.skip(), gr.skip()
        finally:
            halt.close()

    def lab_handler(name):
        """run_lab for one experiment, with a signature gradio reads (a partial would not receive the
        visitor's gr.Request: every lab run would share one session's exports and Stop flag)."""
        def handler(variant, pair, target, drafter, prompt, chat, temperature, seed, request: gr.Request = None):
            yield from run_lab(name, variant, pair, target, drafter, prompt, chat, temperature, seed, request)
        handler.__name__ = f"run_lab_{name}"
        return handler

    with gr.Tabs(overflow_behavior="wrap"):
        with gr.Tab("Lab", elem_id="sv-lab"):
            gr.Markdown("### The Lab: test the explainers' claims on this pair, this prompt, this hardware\n"
                        "Each experiment takes a minute or so on a CPU: every timed run is repeated three times, "
                        "alternated with vanilla decoding, and the fastest of each compared. Settings: the pair, "
                        "prompt, chat, temperature (the distribution checks use 0.7 when it is 0) and seed chosen "
                        "above.")
            with gr.Row():
                buttons = {n: gr.Button(f"{i + 1}. {t}", elem_id=f"sv-lab-{n}", size="sm")
                           for i, (n, (_, t, _)) in enumerate(EXPERIMENTS.items())}
            with gr.Row():
                broken_at = list(EXPERIMENTS).index("same_outputs")  # the one experiment that draws a broken rule
                variant = gr.Dropdown([(v.replace("_", " "), v) for v in BROKEN], value="raw_q",
                                      label=f"Break it, for {broken_at + 1}. {EXPERIMENTS['same_outputs'][1]} only: "
                                            "the broken rule drawn in its chart (all are tested)")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="sv-lab-stop", size="sm")
            status = gr.Markdown("Pick an experiment.", elem_id="sv-lab-status")
            plot = gr.Plot(show_label=False, elem_id="sv-lab-plot")
            note = gr.Markdown("", elem_id="sv-lab-takeaway")
            export = gr.File(label="This experiment's result (JSON)")
            keys = ["pair", "target", "drafter", "prompt", "chat", "temperature", "seed"]
            events = []
            for name, btn in buttons.items():
                events.append(btn.click(lab_handler(name), [variant] + [inputs[k] for k in keys],
                                        [status, plot, note, export], api_name=f"lab_{name}",
                                        show_progress="hidden", **DECODE_EVENTS))
            wire_stop(stop_btn, stop_lab, status, events)


def device_label() -> str:
    dev = pick_device(DEVICE)
    return f"{dev.type} ({str(pick_dtype(DTYPE, dev)).replace('torch.', '')})"


def launch_kwargs() -> dict:
    from specviz.api import routes  # the OpenAI-compatible API (/v1/...), on this same server

    return {"theme": gr.themes.Soft(), "css_paths": [str(ASSETS / "specviz.css")], "footer_links": ["gradio"],
            "js": (ASSETS / "specviz.js").read_text(encoding="utf-8"),  # the token view follows a live run
            "app_kwargs": {"routes": routes(lambda: REGISTRY, RUNNER, DEVICE, DTYPE)}}


API_INTRO = """This server also speaks the **OpenAI API** at this page's address + `/v1`: chat and text
completions (streamed or not) and the model list. Add a `speculative` object (`draft_model`: `auto`, `lookup`,
`early-exit:L` or a model; `num_speculative_tokens`: γ) to decode speculatively, or leave it out for plain
decoding; `usage.speculative` says what speculation did. The API and this page share the loaded models and take
turns in one decode queue. These calls use the settings above:"""


def api_panel(demo, pair, target, drafter, prompt, chat, gamma, temperature, top_p, max_new, seed, top_k, costs) -> None:
    """The page's pointer to the API: a copyable curl and Python call with the current settings."""
    from specviz.api.snippets import page_draft_model, request_body, snippets

    with gr.Accordion("Call it from code: OpenAI-compatible API at /v1", open=False):
        gr.Markdown(API_INTRO)
        curl = gr.Code(language="shell", label="curl", interactive=False, elem_id="sv-api-curl")
        python = gr.Code(language="python", label="Python (pip install openai)", interactive=False)
    inputs = [pair, target, drafter, prompt, chat, gamma, temperature, top_p, max_new, seed, top_k, costs]

    def show(pair_, target_, drafter_, prompt_, chat_, gamma_, temperature_, top_p_, max_new_, seed_, top_k_, costs_,
             request: gr.Request = None):
        try:
            model, draft = page_draft_model(REGISTRY, pair_, _custom(target_), _custom(drafter_))
            body = request_body(model, prompt_, bool(chat_), draft, gamma_, temperature_, top_p_, max_new_, seed_, top_k_,
                                costs_)
        except (SpecvizError, TypeError, ValueError):
            return gr.skip(), gr.skip()
        headers = getattr(request, "headers", None) or {}
        base = f"{headers.get('x-forwarded-proto', 'http')}://{headers.get('host', 'localhost:7860')}"
        return snippets(base, body, bool(os.environ.get("SPECVIZ_API_KEY")))

    gr.on([demo.load] + [c.change for c in inputs], show, inputs, [curl, python], api_visibility="private",
          show_progress="hidden", queue=False)


def preload(pair: str = REGISTRY.default(), await_server: bool = False) -> None:
    """Load the default pair's weights in the background so the first Run is quick, then measure
    its cost profile in the decode queue: on the thread that runs decode (a worker thread's
    profile came out 3-5% off), and never beside a first Run, whose timings it would skew.
    ``await_server``: wait until the main thread serves the decode queue, and load there too."""
    STARTED_AT[0] = time.monotonic()
    STARTING.set()
    try:
        while await_server and not RUNNER.serving:
            time.sleep(0.05)
        pipe = RUNNER.call(build_pipeline, REGISTRY, pair=pair, device=DEVICE, dtype=DTYPE)

        def warm():
            pipe.warm_up(max_gamma=16)
            yield pair
        for _ in RUNNER.turns(warm):
            pass
    except SpecvizError as e:
        print(f"[specviz] preload of {pair} failed: {e}")
    except Interrupted:  # the app is stopping (Ctrl-C, SIGTERM) before the preload ended: nothing to report
        pass
    finally:
        STARTING.clear()


def exit_on_sigterm() -> None:
    """SIGTERM (a Space restarting, `kill`, systemd) ends the app as Ctrl-C does: Python's default
    ends the process without its exit handlers, and the vLLM servers the page started (each in its own
    process group) outlived it, holding their ports and memory."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


demo = build_demo()

if __name__ == "__main__":
    exit_on_sigterm()
    if os.environ.get("SPECVIZ_PRELOAD", "1") == "1":
        threading.Thread(target=preload, kwargs={"await_server": not ZERO_GPU}, daemon=True).start()
    server = os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0")
    if ZERO_GPU:  # ZeroGPU runs handlers in forked GPU workers: decode there
        demo.launch(server_name=server, **launch_kwargs())
    else:
        demo.launch(server_name=server, prevent_thread_lock=True, **launch_kwargs())
        asked = os.environ.get("GRADIO_SERVER_PORT", "")
        if asked.isdigit() and demo.server_port != int(asked):  # gradio moves on to a free port without a word
            print(f"specviz: port {asked} is taken (an earlier app still running?); serving on {demo.server_port} "
                  "instead", file=sys.stderr, flush=True)
        try:
            RUNNER.serve_forever()  # decode on the main thread, where torch's CPU threads are effective
        except KeyboardInterrupt:
            demo.close()
        except SystemExit:  # SIGTERM (exit_on_sigterm): close, then exit with its status, handlers run
            demo.close()
            raise
