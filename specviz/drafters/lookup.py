"""Prompt lookup (n-gram) drafting, cost-aware, optionally backed by a datastore of the target's
own earlier answers (:mod:`specviz.drafters.datastore`)."""

from __future__ import annotations

import copy
import os
from collections import Counter
from pathlib import Path

import torch

from ..backends.base import Timer
from ..errors import SpecvizError
from .base import Drafter, DrafterKind, Proposal, whole
from .datastore import load_datastore


class NgramIndex:
    """Where each n-gram (n <= ``max_n``) of a growing token sequence starts, for the starts that
    have a continuation (the token after the n-gram). ``sync`` indexes only what changed since the
    last call: tokens appended are added; where the sequence parts from the indexed one (a rewind to
    the prompt, another prompt), the entries past the common prefix are taken off first. So a lookup
    is a dictionary read instead of a scan of the whole sequence."""

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.ids: list[int] = []
        self.pos: list[dict[tuple, list[int]]] = [{} for _ in range(max_n + 1)]

    def sync(self, ids: list[int]) -> None:
        seq = self.ids
        m = len(seq)
        if m > len(ids) or ids[:m] != seq:
            c = 0
            for a, b in zip(ids, seq):
                if a != b:
                    break
                c += 1
            self._truncate(c)
            m = c
        seq.extend(ids[m:])
        for c in range(max(m, 1), len(seq)):  # c: the continuation's index
            for n in range(1, min(self.max_n, c) + 1):
                self.pos[n].setdefault(tuple(seq[c - n:c]), []).append(c - n)

    def _truncate(self, length: int) -> None:
        """Forget the tokens from ``length`` on: their starts are the last ones of their lists."""
        seq = self.ids
        for c in range(len(seq) - 1, max(length, 1) - 1, -1):
            for n in range(1, min(self.max_n, c) + 1):
                key = tuple(seq[c - n:c])
                starts = self.pos[n][key]
                starts.pop()
                if not starts:
                    del self.pos[n][key]
        del seq[length:]

    def starts(self, n: int, gram: list[int]) -> list[int]:
        return self.pos[n].get(tuple(gram), []) if n <= self.max_n else []


class PromptLookupDrafter(Drafter):
    """Prompt lookup (n-gram) drafting: find the most recent earlier occurrence of the sequence's
    last n tokens (longest n first) and propose what followed it.  q is one-hot.

    With a ``datastore`` (the target's own earlier answers, :mod:`specviz.datastore`) it also looks
    the suffix up there and proposes whichever of the two sources promises more.

    Adaptive (cost-aware): the proposal length g maximises the expected tokens per unit of time,
    E(g) / v(g), where E(g) = 1 + a1 (1 - ac^g) / (1 - ac) with a1 the estimated chance that the
    first token of the match is kept (learned during the run per source and n-gram length, and for
    the datastore per agreement band, from a prior) and ac the chance each further token is kept
    given the previous one was, and v(g) the measured cost of verifying g proposals relative to a
    plain step.  When no g beats a plain step (E/v <= 1), or there is no match, nothing is
    proposed: that iteration costs what vanilla decoding costs.
    """

    kind = "prompt_lookup"
    wants_costs = True
    # Priors (first token kept, each further token kept after a kept one), measured with
    # scripts/lookup_stats.py on greedy answers to prompts the benchmark leaves out.
    # Context matches, by matched length (the n-gram plus how far the match extends back):
    PRIOR_CONTEXT = {1: (0.25, 0.68), 2: (0.50, 0.74), 3: (0.64, 0.78), 4: (0.76, 0.79),
                     6: (0.78, 0.86), 10: (0.94, 0.94)}
    # datastore matches, by n and by how many stored answers agree on the first token
    PRIOR_STORE = {(1, "lo"): (0.13, 0.45), (1, "mid"): (0.14, 0.4), (1, "hi"): (0.14, 0.4),
                   (2, "lo"): (0.14, 0.45), (2, "mid"): (0.26, 0.45), (2, "hi"): (0.38, 0.45),
                   (3, "lo"): (0.15, 0.35), (3, "mid"): (0.22, 0.35), (3, "hi"): (0.38, 0.4),
                   (4, "lo"): (0.17, 0.45), (4, "mid"): (0.26, 0.45), (4, "hi"): (0.47, 0.6)}
    PRIOR_WEIGHT = 3.0
    MAX_MATCH = 16
    # The first token's prior where another drafter (a draft head) proposes too, by whether its
    # first token is the match's, from the prior without it: measured with
    # scripts/agreement_stats.py on greedy answers to prompts the benchmark leaves out (--skip 3):
    # where the head agrees, a context match's first token was kept 82% of the time and a
    # datastore match's 56% (estimated 54% and 22% without the relation); where it differs, 0.87
    # and 0.32 times the estimate.
    RELATIONS = {"agree": lambda kind, p: max(p, 0.8 if kind == "context" else 0.55),
                 "differ": lambda kind, p: p * (0.87 if kind == "context" else 0.32)}

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, adaptive: bool = True, vote: bool = True,
                 datastore=None):
        if not 1 <= min_ngram <= max_ngram:
            raise SpecvizError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.adaptive, self.vote = adaptive, vote
        self.datastore = datastore
        store = f", datastore of {len(datastore):,} tokens" if datastore is not None else ""
        self.name = f"prompt lookup (n={min_ngram}..{max_ngram}{', adaptive' if adaptive else ''}{store})"
        self.costs: list[float] | None = None  # v[g], set by the engine from a measurement
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self._first: dict[tuple, list[float]] = {}  # match kind -> [kept, examined] of first tokens
        self._cont: dict[tuple, list[float]] = {}  # the same for tokens after a kept one
        self._last: tuple | None = None
        self._index: NgramIndex | None = None

    def find(self, ids: list[int], max_tokens: int) -> tuple[list[int], int]:
        """The continuation of a match of the longest suffix n-gram that has one, and n."""
        tokens, n, _ = self.match(ids, max_tokens)
        return tokens, n

    def match(self, ids: list[int], max_tokens: int) -> tuple[list[int], int, int]:
        """(continuation, n, matched length): the longest suffix n-gram (n <= max_ngram) that
        occurred before, and what followed it.

        Among several earlier occurrences, those followed by the most common next token win (a
        common phrase beats a one-off), then the one whose preceding tokens match the suffix for
        longest (matched length, up to ``MAX_MATCH``), then the most recent."""
        if not isinstance(ids, list):
            ids = [int(t) for t in ids]
        L = len(ids)
        index = self._index
        if index is None or index.max_n < self.max_ngram:
            index = self._index = NgramIndex(self.max_ngram)
        index.sync(ids)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            hits = index.starts(n, ids[L - n:])  # ascending; the suffix itself is not among them
            if hits:
                if len(hits) > 1 and self.vote:
                    counts = Counter(ids[h + n] for h in hits)
                    most = max(counts.values())
                    hits = [h for h in hits if counts[ids[h + n]] == most]
                best, best_len = hits[-1], -1
                for h in hits[:-65:-1]:  # the 64 most recent, most recent first
                    m = n
                    while m < self.MAX_MATCH and h - (m - n) - 1 >= 0 and ids[h - (m - n) - 1] == ids[L - m - 1]:
                        m += 1
                    if m > best_len:
                        best, best_len = h, m
                start = best + n
                return list(ids[start: start + max_tokens]), n, best_len
        return [], 0, 0

    @staticmethod
    def band(share: float) -> str:
        return "hi" if share >= 0.8 else "mid" if share >= 0.5 else "lo"

    @classmethod
    def length_band(cls, length: int) -> int:
        return max(b for b in cls.PRIOR_CONTEXT if b <= max(1, length))

    def estimates(self, key: tuple) -> tuple[float, float]:
        """(a1, ac): posterior means of the first-token and continuation acceptance for a match
        of kind ``key``: ("context", length band) or ("store", n, agreement band), optionally
        followed by how another drafter's first token relates to the match's (``RELATIONS``)."""
        rel = key[-1] if key[-1] in self.RELATIONS else None
        if key[0] == "store":
            prior, prior_cont = self.PRIOR_STORE[(min(key[1], 4), key[2])]
        else:
            prior, prior_cont = self.PRIOR_CONTEXT[key[1]]
        if rel is not None:
            prior = self.RELATIONS[rel](key[0], prior)
        kept, seen = self._first.get(key, [0.0, 0.0])
        a1 = (kept + prior * self.PRIOR_WEIGHT) / (seen + self.PRIOR_WEIGHT)
        ck, cs = self._cont.get(key, [0.0, 0.0])
        ac = (ck + prior_cont * self.PRIOR_WEIGHT) / (cs + self.PRIOR_WEIGHT)
        return a1, ac

    def cost(self, g: int) -> float:
        """v(g): a verify pass over g proposals, in plain steps (1.0 until the engine measures it)."""
        costs = self.costs
        return costs[g] if costs and g < len(costs) else (costs[-1] if costs else 1.0)

    def value(self, key: tuple, available: int) -> tuple[int, float, float, float, float]:
        """(g, E(g)/v(g), E(g), a1, ac) for the best length g (g = 0: nothing pays)."""
        a1, ac = self.estimates(key)
        best_g, best_val, best_e = 0, 1.0, 1.0
        for g in range(1, available + 1):
            e = 1.0 + a1 * (g if ac >= 1 else (1 - ac ** g) / (1 - ac))
            v = self.cost(g)
            if e / v > best_val:
                best_g, best_val, best_e = g, e / v, e
        return best_g, best_val, best_e, a1, ac

    def candidates(self, ids: list[int], max_tokens: int) -> list[tuple[tuple, list[int], str]]:
        """(key, tokens, description) of each source's match."""
        out = []
        tokens, n, length = self.match(ids, max_tokens)
        if tokens:
            more = f", matching {length} tokens back" if length > n else ""
            out.append((("context", self.length_band(length)), tokens, f"{n}-gram match{more}"))
        if self.datastore is not None:
            m = self.datastore.find(ids, max_tokens, self.max_ngram)
            if m is not None and m.tokens:
                out.append((("store", m.n, self.band(m.share)), m.tokens,
                            f"datastore {m.n}-gram match ({m.share:.0%} of {m.support} agree)"))
        return out

    def propose(self, ids, max_tokens, sampling, generator) -> Proposal:
        with Timer(torch.device("cpu")) as t:
            found = self.candidates(ids, max_tokens) if max_tokens > 0 else []
            tokens: list[int] = []
            self._last = None
            if not found:
                reason = "no n-gram match: plain step" if max_tokens > 0 else "no room left"
            elif not self.adaptive:
                key, tokens, what = found[0]
                self._last = key
                reason = f"{what}, proposing {len(tokens)}"
            else:
                scored = [(self.value(key, len(toks)), key, toks, what) for key, toks, what in found]
                (g, val, e, a1, ac), key, toks, what = max(scored, key=lambda s: s[0][1])
                why = f"{what}, est. keep first {a1:.2f}, then {ac:.2f}"
                if g == 0:
                    reason = why + ": no length pays off, plain step"
                else:
                    tokens, self._last = toks[:g], key
                    reason = why + f": proposing {g} (expects {e:.2f} tokens for {e / val:.2f}x a step)"
        return Proposal(tokens, None, [1.0] * len(tokens), reason, t.ms)

    def fixed(self) -> "PromptLookupDrafter":
        if not self.adaptive:
            return self
        return PromptLookupDrafter(self.max_ngram, self.min_ngram, adaptive=False, vote=self.vote,
                                   datastore=self.datastore)

    def observe(self, proposed: int, accepted: int) -> None:
        if not proposed or self._last is None:
            return
        first = self._first.setdefault(self._last, [0.0, 0.0])
        first[1] += 1
        first[0] += accepted >= 1
        if accepted >= 1:
            cont = self._cont.setdefault(self._last, [0.0, 0.0])
            cont[1] += min(accepted, proposed - 1)
            cont[0] += accepted - 1

    def label(self) -> str:
        return "lookup + datastore" if self.datastore is not None else "lookup"

    def describe(self) -> dict:
        d = {"kind": self.kind, "name": self.name, "max_ngram": self.max_ngram,
             "min_ngram": self.min_ngram, "adaptive": self.adaptive}
        if self.datastore is not None:
            d["datastore_tokens"] = len(self.datastore)
        return d


class LookupKind(DrafterKind):
    name = "prompt_lookup"
    aliases = ("lookup", "prompt-lookup", "prompt_lookup")
    choices = ("lookup",)

    def forms(self, target: str) -> tuple[str, ...]:
        return ("lookup", "lookup:N")
    source = "the prompt and output so far"

    def parse(self, arg: str) -> dict:
        return {"kind": self.name, "max_ngram": whole(arg or 4, "lookup n-gram size")}

    def check(self, spec: dict, where: str, base: Path | None = None) -> dict:
        for key in ("max_ngram", "min_ngram"):
            if key in spec and not (isinstance(spec[key], int) and spec[key] >= 1):
                raise SpecvizError(f"{where}: {key} must be a whole number >= 1")
        if "datastore" in spec:
            path = Path(os.path.expanduser(str(spec["datastore"])))
            spec["datastore"] = str(path if path.is_absolute() or base is None else base / path)
        return spec

    def build(self, spec, target, draft) -> Drafter:
        store = None
        vocab = len(target.tokenizer)
        if spec.get("datastore"):
            store = load_datastore(spec["datastore"])
            made_for = store.meta.get("vocab_size")
            if made_for is not None and made_for != vocab:
                raise SpecvizError(f"datastore {spec['datastore']} was built for a vocabulary of "
                                   f"{made_for} tokens; {target.name} has {vocab}")
        return PromptLookupDrafter(int(spec.get("max_ngram", 4)), int(spec.get("min_ngram", 1)),
                                   bool(spec.get("adaptive", True)), datastore=store)

    def peer(self, drafter, gamma, draft):
        return {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": 2}


def band_of(p: float, edges: tuple[float, ...]) -> int:
    """The band of ``p`` among ascending lower ``edges`` (the first edge is the floor)."""
    b = 0
    for i, lo in enumerate(edges):
        if p >= lo:
            b = i
    return b


class BandedLookupDrafter(PromptLookupDrafter):
    """Lookup + datastore beside a drafter of its own (recycling, a draft head) whose tokens' keep
    chances are learned per band of a confidence: the first token of a chain and a later one after
    a kept one apart, each starting from a prior worth PRIOR_WEIGHT observations."""

    BANDS: tuple[float, ...] = (0.0,)  # lower edges of the confidence bands
    PRIOR_FIRST: tuple[float, ...] = (0.5,)
    PRIOR_NEXT: tuple[float, ...] = (0.5,)
    own_label = "own drafter"  # the short name of its own drafter ("draft head", "recycling")
    fixed_chain = False  # True: the Lab's fixed-γ copy (fixed()), its own chain alone, as far as asked

    def fixed(self) -> "BandedLookupDrafter":
        """Its own chain alone, as many tokens as asked where it can: no lookup, no length choice."""
        d = copy.copy(self)
        d.fixed_chain, d.lookup = True, False
        d.name = self.name.split(" + ")[0] + ", alone, fixed length"
        d.reset([])
        return d

    def label(self) -> str:
        return self.own_label + (" + " + super().label() if self.lookup else "")

    def reset(self, prompt_ids: list[int]) -> None:
        super().reset(prompt_ids)
        self._kept = [[[0.0, 0.0] for _ in self.BANDS] for _ in range(2)]  # [first?][band]: kept, examined
        self._bands: list[int] = []  # the bands of the last own chain (empty: lookup drafted)

    def keep_chance(self, b: int, first: bool = False) -> float:
        return self.chance(self._kept[first][b], (self.PRIOR_FIRST if first else self.PRIOR_NEXT)[b])

    def chance(self, stats: list[float], prior: float) -> float:
        """A keep chance from (kept, examined) counts and a prior worth PRIOR_WEIGHT observations."""
        kept, seen = stats
        return (kept + prior * self.PRIOR_WEIGHT) / (seen + self.PRIOR_WEIGHT)

    def counts(self, j: int, b: int) -> list[float]:
        """The (kept, examined) counts that position ``j`` of the last own chain, in band ``b``, adds to."""
        return self._kept[j == 0][b]

    def observe(self, proposed: int, accepted: int) -> None:
        if self._bands:
            for j, b in enumerate(self._bands[:proposed]):
                if j > accepted:
                    break
                stats = self.counts(j, b)
                stats[1] += 1
                stats[0] += j < accepted
            return
        super().observe(proposed, accepted)


class BesideLookupKind(DrafterKind):
    """The kind of a BandedLookupDrafter: `name` drafts beside lookup, `name:only` alone."""

    def parse(self, arg: str) -> dict:
        if arg in ("", "lookup"):
            return {"kind": self.name}
        if arg == "only":
            return {"kind": self.name, "lookup": False}
        return self.parse_more(arg)

    def parse_more(self, arg: str) -> dict:
        raise SpecvizError(f"drafter {self.name} takes 'only' or nothing, got {arg!r}")

    def check(self, spec: dict, where: str, base: Path | None = None, flags: tuple[str, ...] = ("lookup",)) -> dict:
        for key in flags:
            if key in spec and not isinstance(spec[key], bool):
                raise SpecvizError(f"{where}: {key} must be true or false")
        return LookupKind().check(dict(spec), where, base)

    def datastore(self, spec: dict, target):
        """The lookup half's datastore (None without one, or when lookup is off)."""
        if spec.get("datastore") and spec.get("lookup", True):
            return LookupKind().build({"datastore": spec["datastore"]}, target, None).datastore
        return None

    def peer(self, drafter, gamma, draft):
        return LookupKind().peer(drafter, gamma, draft)
