"""specviz: speculative decoding you can see.

The engine (``specviz.engine``) yields one event per iteration; the Gradio app, the CLI
(``python -m specviz``) and the benchmark all consume those events.  Nothing here imports gradio.
"""

__version__ = "0.1.0"
