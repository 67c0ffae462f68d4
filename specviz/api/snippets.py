"""Copyable ``curl`` and Python (openai client) calls for given settings: what the page shows."""

from __future__ import annotations

import json

from ..engine import _whole

MAX_SNIPPET_PROMPT = 2000


def request_body(model: str, prompt: str, chat: bool = True, draft_model: str | None = "auto",
                 num_speculative_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
                 max_tokens: int = 128, seed: int | None = 0, top_k: int | None = 0, costs: str | None = None) -> dict:
    """``costs``: the page's cost-profile choice ("reference" is sent; "measured" is the API's default)."""
    prompt = str(prompt or "")[:MAX_SNIPPET_PROMPT]
    body: dict = {"model": model}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body["max_tokens"] = int(max_tokens)
    body["temperature"] = float(temperature)
    if top_p is not None and float(top_p) < 1:
        body["top_p"] = float(top_p)
    if top_k and _whole(top_k, "top-k", 0) > 0:
        body["top_k"] = int(top_k)
    if seed is not None:
        body["seed"] = _whole(seed, "seed", 0)
    if draft_model:
        spec: dict = {"draft_model": draft_model}
        if num_speculative_tokens:
            spec["num_speculative_tokens"] = int(num_speculative_tokens)
        if costs == "reference":  # a seeded sampled run then repeats on any server, as on the page
            spec["costs"] = "reference"
        body["speculative"] = spec
    return body


def page_draft_model(registry, pair: str, target: str | None, drafter: str | None) -> tuple[str, str]:
    """(model, draft_model) of the API call that decodes as the page's choice does: a pair, or a
    target and drafter picked in the page (None: the pair's own). ``auto`` where the API's own
    choice for that model is that pair."""
    from ..registry import recommended_pair
    from .generate import drafter_label

    spec = registry.pair(pair)
    model = target or spec.target
    if drafter:
        return model, drafter
    if target:
        return model, "lookup"
    same = getattr(recommended_pair(registry, model), "name", None) == spec.name
    return model, "auto" if same else drafter_label(spec.drafter)


def snippets(base_url: str, body: dict, key_required: bool = False) -> tuple[str, str]:
    """(curl command, Python program) that send ``body`` to the server at ``base_url``."""
    base = base_url.rstrip("/")
    chat = "messages" in body
    endpoint = "chat/completions" if chat else "completions"
    data = json.dumps(body, ensure_ascii=False, indent=2).replace("'", "'\\''")
    auth = ' \\\n  -H "Authorization: Bearer $SPECVIZ_API_KEY"' if key_required else ""
    curl = (f"curl {base}/v1/{endpoint} \\\n  -H 'Content-Type: application/json'{auth} \\\n"
            f"  -d '{data}'")
    extra = ("speculative", "top_k")  # not parameters of OpenAI's client: sent as extra_body
    fields = {k: v for k, v in body.items() if k not in extra}
    args = "".join(f"    {k}={_py(v)},\n" for k, v in fields.items())
    more = {k: body[k] for k in extra if k in body}
    if more:
        args += f"    extra_body={_py(more)},\n"
    key = 'os.environ["SPECVIZ_API_KEY"]' if key_required else '"unused"'
    note = "" if key_required else "  # api_key: anything, unless the server sets SPECVIZ_API_KEY"
    call = "client.chat.completions.create" if chat else "client.completions.create"
    out = "reply.choices[0].message.content" if chat else "reply.choices[0].text"
    python = (("import os\n" if key_required else "") + "from openai import OpenAI\n\n"
              f"client = OpenAI(base_url={_py(base + '/v1')},\n                api_key={key}){note}\n"
              f"reply = {call}(\n{args})\n"
              f"print({out})\n"
              "print(reply.usage.speculative)  # passes, proposed, accepted, acceptance rate, timings\n")
    return curl, python


def _py(value) -> str:
    """A Python literal for a JSON value (True/False/None, not true/false/null)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return repr(value)
