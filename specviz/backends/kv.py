"""A KV cache layer with room to grow.

transformers' ``DynamicLayer`` appends with ``torch.cat``: every step copies the whole cache of every
layer (at 300 tokens of context ~50 us a layer on this project's CPUs, several percent of a 135M
model's step). ``RoomyLayer`` keeps keys and values in buffers with room for ``CHUNK`` more
positions: appending writes the new rows in place, cropping (a rejected draft) only moves the end,
and attention gets views of the first n positions. The positions past the end stay allocated, so the
exact mode's attention can read a padded key block there without a copy (their contents are masked).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

CHUNK = 256  # positions of room added when a buffer is full


class RoomyLayer(DynamicLayer):
    """``DynamicLayer`` semantics (keys/values of shape (batch, heads, n, head_dim)), stored in place."""

    _kbuf: torch.Tensor | None = None
    _vbuf: torch.Tensor | None = None
    _n = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:  # fresh or reset: no buffers yet
            self.lazy_initialization(key_states, value_states)
        n, add = self._n, key_states.shape[-2]
        if self._kbuf is None or n + add > self._kbuf.shape[-2]:
            room = -(-(n + add + CHUNK) // CHUNK) * CHUNK
            kbuf = key_states.new_zeros(*key_states.shape[:-2], room, key_states.shape[-1])
            vbuf = value_states.new_zeros(*value_states.shape[:-2], room, value_states.shape[-1])
            if n:
                kbuf[..., :n, :] = self._kbuf[..., :n, :]
                vbuf[..., :n, :] = self._vbuf[..., :n, :]
            self._kbuf, self._vbuf = kbuf, vbuf
        self._kbuf[..., n:n + add, :] = key_states
        self._vbuf[..., n:n + add, :] = value_states
        self._n = n + add
        self.keys, self.values = self._kbuf[..., :self._n, :], self._vbuf[..., :self._n, :]
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the number of positions to remove as a negative number")
        if tokens_to_remove == 0 or not self.is_initialized or self._kbuf is None:
            return
        self._n = max(0, self._n + tokens_to_remove)
        self.keys, self.values = self._kbuf[..., :self._n, :], self._vbuf[..., :self._n, :]

    def reset(self) -> None:
        super().reset()
        self._kbuf = self._vbuf = None
        self._n = 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("specviz decodes one sequence: the cache is not batched")

    batch_select_indices = batch_repeat_interleave


def roomy(cache) -> None:
    """Give a ``DynamicCache`` in-place growth: its full-attention layers become ``RoomyLayer``s
    (sliding-window layers, which drop old positions, are left as they are)."""
    for layer in getattr(cache, "layers", []):
        if type(layer) is DynamicLayer:
            layer.__class__ = RoomyLayer


def room(key: torch.Tensor, span: int) -> torch.Tensor | None:
    """``key`` (a view of the first n positions of a ``RoomyLayer`` buffer) widened to ``span``
    positions without a copy, where the buffer has them; else None."""
    if key.dim() != 4 or key.stride(-1) != 1 or key.stride(-2) != key.shape[-1]:
        return None
    capacity = key.stride(1) // key.shape[-1] if key.shape[1] > 1 else key.stride(0) // key.shape[-1]
    if capacity < span or key.stride(0) < key.shape[1] * key.stride(1):
        return None
    end = key.storage_offset() + (key.shape[0] - 1) * key.stride(0) + (key.shape[1] - 1) * key.stride(1) + span * key.shape[-1]
    if end * key.element_size() > key.untyped_storage().nbytes():
        return None
    return key.as_strided((key.shape[0], key.shape[1], span, key.shape[-1]), key.stride())
