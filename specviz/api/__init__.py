"""An OpenAI-compatible API on the page's own server: one model cache, one decode queue.

``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming or not) and ``GET /v1/models``.
A request may add ``"speculative": {"draft_model": MODEL | "lookup[:N]" | "early-exit:L" | "auto" |
null, "num_speculative_tokens": N}``; without it (or with null) decoding is plain. Usage counts
tokens as plain decoding would, plus ``usage.speculative``: what speculation did.

Mount: ``demo.launch(app_kwargs={"routes": routes(lambda: REGISTRY, RUNNER)})`` (any Starlette or
FastAPI app takes the same list). Nothing here imports gradio.

Environment: ``SPECVIZ_API_KEY`` (requests then need ``Authorization: Bearer <key>``),
``SPECVIZ_API_MAX_TOKENS`` (default 1024), ``SPECVIZ_API_MAX_PROMPT_CHARS`` (default 20000),
``SPECVIZ_API_MAX_QUEUE`` (default 16: runs queued, the page's included, before a 429).
"""

from .errors import ApiError
from .requests import Limits
from .server import routes
from .snippets import snippets

__all__ = ["ApiError", "Limits", "routes", "snippets"]
