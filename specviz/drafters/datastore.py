"""A retrieval datastore for drafting: token sequences the target wrote before, indexed by n-gram.

Given the last n tokens of the running sequence, ``Datastore.find`` returns the continuation most
often seen after them (following the majority token by token) with how strongly the stored
answers agree on its first token. Exact n-gram keys: token ids are packed into one uint64 (16 bits
each for vocabularies under 65,536, so up to 4 tokens), sorted once, searched with binary search.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SpecvizError

SEP = -1  # between stored sequences: no n-gram or continuation crosses it


@dataclass
class Match:
    tokens: list[int]  # the proposed continuation
    n: int  # length of the matched suffix
    support: int  # stored occurrences of that suffix with a continuation
    share: float  # fraction of them continuing with tokens[0]


class Datastore:
    FEW = 32  # ``_follow`` leaves numpy for plain Python once this few continuations are left

    def __init__(self, tokens: np.ndarray, max_ngram: int = 4, meta: dict | None = None):
        self.tokens = np.asarray(tokens, dtype=np.int64)
        if not self.tokens.size or self.tokens[-1] != SEP:  # every continuation ends at a separator
            self.tokens = np.append(self.tokens, SEP)
        self._list = self.tokens.tolist()  # the same tokens as Python ints, for following few matches
        self.meta = meta or {}
        vocab = int(self.tokens.max()) + 1
        self.bits = max(1, int(vocab).bit_length())
        self.max_ngram = max(1, min(max_ngram, 64 // self.bits))
        self._keys: dict[int, np.ndarray] = {}
        self._starts: dict[int, np.ndarray] = {}
        L = len(self.tokens)
        for n in range(1, self.max_ngram + 1):
            if L <= n:
                break
            win = np.lib.stride_tricks.sliding_window_view(self.tokens[:-1], n)  # a continuation follows
            ok = (win != SEP).all(axis=1) & (self.tokens[n:] != SEP)
            keys = self._pack(win[ok])
            order = np.argsort(keys, kind="stable")
            self._keys[n] = keys[order]
            self._starts[n] = (np.flatnonzero(ok) + n)[order]  # index of the continuation's first token

    def __len__(self) -> int:
        return int((self.tokens != SEP).sum())

    def _pack(self, grams: np.ndarray) -> np.ndarray:
        key = np.zeros(grams.shape[0], dtype=np.uint64)
        for j in range(grams.shape[1]):
            key = (key << np.uint64(self.bits)) | grams[:, j].astype(np.uint64)
        return key

    def find(self, ids: list[int], max_tokens: int, max_ngram: int | None = None) -> Match | None:
        """The majority continuation after the longest stored suffix of ``ids`` (None: no match)."""
        if max_tokens <= 0 or not ids:
            return None
        top = min(max_ngram or self.max_ngram, self.max_ngram, len(ids))
        limit = 1 << self.bits
        for n in range(top, 0, -1):
            keys = self._keys.get(n)
            if keys is None:
                continue
            key = 0
            for t in ids[-n:]:
                if not 0 <= t < limit:
                    break
                key = (key << self.bits) | int(t)
            else:
                lo = int(keys.searchsorted(np.uint64(key)))
                if lo < len(keys) and keys[lo] == key:
                    hi = int(keys.searchsorted(np.uint64(key), side="right"))
                    return self._follow(self._starts[n][lo:hi], n, max_tokens)
        return None

    def _follow(self, starts: np.ndarray, n: int, max_tokens: int) -> Match:
        """Follow the majority token by token from the continuations at ``starts`` (numpy while
        they are many, plain Python once they are few: the same choices either way, the most
        common next token and the smallest id among equally common ones)."""
        out: list[int] = []
        support, share = len(starts), 0.0
        pos = starts
        while len(out) < max_tokens and len(pos) > self.FEW:
            nxt = self.tokens[pos]
            keep = nxt != SEP
            pos, nxt = pos[keep], nxt[keep]
            if not pos.size:
                return Match(out, n, support, share)
            values, counts = np.unique(nxt, return_counts=True)
            best = int(np.argmax(counts))
            if not out:
                share = float(counts[best]) / support
            elif counts[best] * 2 < pos.size:  # no majority further on: stop here
                return Match(out, n, support, share)
            out.append(int(values[best]))
            pos = pos[nxt == values[best]] + 1
        tokens, pos = self._list, pos.tolist()
        while len(out) < max_tokens:
            live = [(p, tokens[p]) for p in pos if tokens[p] != SEP]
            if not live:
                break
            counts = Counter(t for _, t in live)
            most = max(counts.values())
            token = min(t for t, c in counts.items() if c == most)
            if not out:
                share = most / support
            elif most * 2 < len(live):  # no majority further on: stop here
                break
            out.append(token)
            pos = [p + 1 for p, t in live if t == token]
        return Match(out, n, support, share)


def save_datastore(path: str | Path, sequences: list[list[int]], **meta) -> None:
    flat: list[int] = []
    for seq in sequences:
        flat.extend(int(t) for t in seq)
        flat.append(SEP)
    arr = np.asarray(flat, dtype=np.int32)
    np.savez_compressed(path, tokens=arr, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))


_LOADED: dict[str, Datastore] = {}


def load_datastore(path: str | Path, max_ngram: int = 4) -> Datastore:
    key = f"{Path(path).resolve()}:{max_ngram}"
    if key in _LOADED:
        return _LOADED[key]
    try:
        with np.load(path) as data:
            tokens = data["tokens"].astype(np.int64)
            meta = json.loads(bytes(data["meta"]).decode()) if "meta" in data else {}
    except (OSError, ValueError, KeyError) as e:
        raise SpecvizError(f"could not read datastore {path}: {e}") from None
    store = Datastore(tokens, max_ngram, meta)
    _LOADED[key] = store
    return store
