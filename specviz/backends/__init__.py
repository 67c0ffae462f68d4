"""Targets: the model a speculative run verifies with, behind the small :class:`Target` protocol.

``base`` defines the protocol (all the engine, ``check`` and ``exactness`` may use);
``transformers`` implements it for a transformers causal LM with a KV cache (and, on CPUs,
``cpu_kernels`` makes its verify passes cheaper). Another runtime is one more module here.
"""

from .base import Target, Timer

__all__ = ["Target", "Timer"]
