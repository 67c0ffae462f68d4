"""Targets: the model a speculative run verifies with, behind the small :class:`Target` protocol.

``base`` defines the protocol (all the engine, ``check`` and ``exactness`` may use);
``transformers`` implements it for a transformers causal LM with a KV cache (on float32 CPUs
``exact`` makes a token's logits the same in a pass of any length, and its verify passes cheaper;
``cpu_kernels`` is the fallback where that mode is off). Another runtime is one more module here.
"""

from .base import Target, Timer

__all__ = ["Target", "Timer"]
