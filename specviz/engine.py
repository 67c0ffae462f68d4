"""Speculative and vanilla decoding as generators of events.

Both share one shape: ``StartEvent``, then one ``IterationEvent`` per iteration, then a
``SummaryEvent``.  Closing the generator early (a Stop button) simply ends the run.

The speculative iteration, as numbered steps:
  1. the drafter proposes up to gamma tokens (maybe none: then this is a plain target step);
  2. the target scores the pending token + all proposals in one forward pass (KV cache kept);
  3. the acceptance rule keeps a prefix and draws the resampled or bonus token
     (:func:`specviz.acceptance.verify`);
  4. rejected positions are cropped off both KV caches; the drafter hears how it did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch

from .acceptance import verify_logits
from .backends.base import Target
from .costs import check_profile
from .drafters.base import Drafter
from .errors import SpecvizError
from .events import Correction, IterationEvent, StartEvent, SummaryEvent, lone_surrogate
from .sampling import SamplingConfig, logits_to_probs, make_generator, sample
from .trace import PositionTally

# A verify pass scores gamma + 1 tokens; the exact mode keeps a token's bits in passes of up to 32
# (backends/exact.py, MAX_ROWS), so gamma stops at 31 everywhere (page, CLI, API, bench, lab).
MAX_GAMMA = 31
MAX_SEED = 2 ** 64 - 1  # torch.Generator's seed range (it reads a negative seed as 2 ** 64 + seed)

TOP_N = 5  # how many top tokens each event keeps per distribution (for the inspector)


@dataclass
class DecodeConfig:
    """Everything a run's output depends on besides the models and the prompt.

    ``costs``: a pinned cost profile (v[g] = verify cost of g + 1 tokens over a 1-token pass) for
    cost-aware drafters; None measures this machine's. With the same seed and the same profile
    a sampled run reproduces its output on any machine with the same numerics."""

    gamma: int = 4
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = 0
    costs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        self.gamma = _whole(self.gamma, "gamma", 1, MAX_GAMMA)
        self.max_new_tokens = _whole(self.max_new_tokens, "max new tokens")
        if self.seed is not None:
            self.seed = _whole(self.seed, "seed", 0, MAX_SEED)
        if self.costs is not None:
            costs = check_profile(list(self.costs))
            self.costs = tuple(float(c) / float(costs[0]) for c in costs)

    @classmethod
    def from_settings(cls, gamma, temperature, top_k, top_p, max_new_tokens, seed, costs=None) -> "DecodeConfig":
        """From loosely typed front-end values (numbers as floats or strings): one place that
        validates them and says what is wrong."""
        def num(x, what):
            try:
                return float(x)
            except (TypeError, ValueError):
                raise SpecvizError(f"{what} must be a number, got {x!r}") from None

        sampling = SamplingConfig(num(temperature, "temperature"), _whole(top_k, "top-k", 0),
                                  num(top_p, "top-p"))
        return cls(gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling,
                   seed=None if seed is None or seed == "" else seed, costs=costs)


def _whole(x, what: str, minimum: int = 1, maximum: int | None = None) -> int:
    try:
        n = int(x) if isinstance(x, int) else int(float(x))
        ok = isinstance(x, int) or float(x) == n
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok or n < minimum or maximum is not None and n > maximum:
        span = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise SpecvizError(f"{what} must be a whole number {span}, got {x!r}")
    return n


class TokenText:
    """Text of one token in context: what it adds to the decoded string (spaces, newlines and
    special tokens kept), which single-token decoding gets wrong for SentencePiece vocabularies."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def piece(self, context: list[int], token: int) -> str:
        return self.alternatives(context, [token])[0]

    def alternatives(self, context: list[int], tokens: list[int]) -> list[str]:
        """The pieces of several candidate tokens after the same context (its text decoded once)."""
        ctx = list(context[-3:])
        before = self.tok.decode(ctx, skip_special_tokens=False)
        out = []
        for token in tokens:
            after = self.tok.decode(ctx + [token], skip_special_tokens=False)
            out.append(after[len(before):] if after.startswith(before)
                       else self.tok.decode([token], skip_special_tokens=False))
        return out

    def pieces(self, context: list[int], tokens: list[int]) -> list[str]:
        out, ctx = [], list(context[-3:])
        for t in tokens:
            out.append(self.piece(ctx, t))
            ctx = ctx[-2:] + [t]
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def check_prompt(prompt) -> str:
    """The prompt, refused when it is no text or only whitespace."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise SpecvizError("the prompt is empty")
    at = lone_surrogate(prompt)
    if at is not None:  # the tokenizer's own words were a TypeError about its input types
        raise SpecvizError(f"the prompt holds text that is not valid Unicode at character {at + 1} "
                           "(a lone surrogate, half of a character)")
    return prompt


def check_fits(prompt_ids: list[int], context: int) -> None:
    """A prompt must leave room in the model's context for at least one new token."""
    if len(prompt_ids) >= context:
        raise SpecvizError(f"the prompt is {len(prompt_ids)} tokens; the model's context is {context}")


def encode_prompt(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of a prompt: through the chat template when asked and available, else plain."""
    check_prompt(prompt)
    if chat and getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        ids = enc["input_ids"] if hasattr(enc, "keys") else enc
        return [int(i) for i in ids]
    ids = tokenizer.encode(prompt, add_special_tokens=True)
    if not ids:
        raise SpecvizError("the prompt encodes to no tokens")
    return [int(i) for i in ids]


def _tops(rows: torch.Tensor | np.ndarray, n: int = TOP_N) -> list[list[tuple[int, float]]]:
    """Each row's top ``n`` tokens (id, probability), zeros left out, from one top-k over the rows."""
    n = min(n, rows.shape[-1])
    if isinstance(rows, np.ndarray):
        idx = np.argpartition(-rows, n - 1, axis=-1)[:, :n]
        vals = np.take_along_axis(rows, idx, -1)
        order = np.argsort(-vals, axis=-1, kind="stable")
        vals, idx = np.take_along_axis(vals, order, -1).tolist(), np.take_along_axis(idx, order, -1).tolist()
    else:
        vals, idx = (t.tolist() for t in torch.topk(rows, n, dim=-1))
    return [[(i, round(v, 6)) for i, v in zip(ids, vs) if v > 0] for vs, ids in zip(vals, idx)]


def _named(tops: list[list[tuple[int, float]]], texts: TokenText, contexts: list[list[int]]) -> list[list[list]]:
    """``_tops``' rows as [id, text after its context, probability]."""
    return [[[i, t, v] for (i, v), t in zip(row, texts.alternatives(ctx, [i for i, _ in row]))]
            for row, ctx in zip(tops, contexts)]


class RawStats:
    """What the inspector shows of the target's raw distribution (its softmax at temperature 1):
    per iteration, the top tokens of the rows the rule examined and the probability of each proposed
    token. Nothing in decoding needs them, and right after a target pass a softmax, a top-k and a
    gather over its logits cost ~0.5 ms (their code and data pushed out of the caches by the pass's
    weights: scripts/cold_ops.py), about 1% of an iteration. So an iteration keeps its logits and
    computes them when its event is first read (a consumer's time, as its texts are); those still
    unread when the run ends are computed after its clock stops, and no more than ``MAX_ROWS`` rows
    (~200 MB for a 49k vocabulary) are kept unread at once: beyond that the oldest are computed then."""

    MAX_ROWS = 1024

    def __init__(self):
        self.pending: dict[int, dict] = {}  # insertion order: oldest first
        self.rows = 0

    def add(self, logits: torch.Tensor, n_top: int, tokens: list[int]) -> dict:
        """Keep ``logits`` (its first ``n_top`` rows get top tokens; ``tokens[i]`` is read from row i)."""
        slot = {"logits": logits, "n_top": n_top, "tokens": list(tokens)}
        self.pending[id(slot)] = slot
        self.rows += logits.shape[0]
        while self.rows > self.MAX_ROWS:
            self._compute(next(iter(self.pending.values())))
        return slot

    def get(self, slot: dict) -> tuple[list, list[float]]:
        """(top tokens per examined row, p at each proposed token) of one iteration."""
        if "tops" not in slot:
            self._compute(slot, in_numpy=True)  # the reader's thread: no torch operator there (_softmax)
        return slot["tops"], slot["p_raw"]

    def flush(self) -> None:
        for slot in list(self.pending.values()):
            self._compute(slot)

    def _compute(self, slot: dict, in_numpy: bool = False) -> None:
        """``in_numpy``: read by a consumer, in its thread. Otherwise (the decode thread, where torch's
        softmax and top-k take ~0.3 ms against numpy's ~1.4 for 5 rows of 49k) in torch."""
        logits = slot.pop("logits")
        self.pending.pop(id(slot), None)
        self.rows -= logits.shape[0]
        tokens = slot["tokens"]
        if in_numpy:
            raw = _softmax(logits)
            slot["p_raw"] = raw[np.arange(len(tokens)), tokens].tolist()
        else:
            raw = logits.float().softmax(dim=-1)
            slot["p_raw"] = _at(raw, tokens)
        slot["tops"] = _tops(raw[: slot["n_top"]])


def _softmax(logits: torch.Tensor) -> np.ndarray:
    """The rows' softmax in numpy. It runs in the consumer's thread (a web server's worker), and a
    torch operator there, even once, made every later target pass on the decode thread ~30% slower
    on a 2-core CPU, vanilla ones included (mainthread.py, scripts/page_speed_probe.py). numpy's
    elementwise and reduction kernels start no threads. fp32 on the CPU: a view, no copy."""
    x = logits.detach()
    x = (x if x.dtype == torch.float32 else x.float()).cpu().numpy()
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _correction(token: int, kind: str, p: torch.Tensor, texts: TokenText, context: list[int],
                one_hot: bool = False) -> Correction:
    """The target's own token, its text and its distribution's top tokens decoded on first read.
    ``one_hot``: p is one-hot on ``token`` (greedy), so that is its only top token (no top-k over it)."""
    top = [(token, 1.0)] if one_hot else _tops(p[None].float())[0]
    tail = context[-3:]
    return Correction.later(lambda: {"text": texts.piece(tail, token), "top": _named([top], texts, [tail])[0]},
                            token=token, kind=kind, p=1.0 if one_hot else float(p[token]))


class Run:
    """Bookkeeping shared by both decoders: the sequence, stopping, totals, events.

    ``start()`` prefills the prompt; each ``speculative_step``/``vanilla_step`` is one iteration;
    ``rewind()`` goes back to just after the prompt (``check`` samples first tokens that way)."""

    def __init__(self, mode: str, target: Target, tokenizer, prompt_ids: list[int],
                 cfg: DecodeConfig, drafter: Drafter | None = None, info: dict | None = None):
        if not prompt_ids:
            raise SpecvizError("the prompt is empty")
        check_fits(prompt_ids, target.context_length)
        self.mode, self.target, self.cfg, self.drafter = mode, target, cfg, drafter
        self.texts = TokenText(tokenizer)
        self.eos = set(target.eos_ids)
        self.prompt_ids = list(prompt_ids)
        self.ids = list(prompt_ids)
        self.limit = min(cfg.max_new_tokens, target.context_length - len(prompt_ids))
        self.gen = make_generator(cfg.seed)
        self.info = info or {}
        self.iterations = 0
        self.proposed = 0
        self.accepted = 0
        self.draft_ms = 0.0
        self.verify_ms = 0.0
        self.positions = PositionTally()
        self.stop_reason = ""
        self.prefill_ms = 0.0
        self.costs: dict = {}
        self.stats = RawStats()  # the inspector's raw probabilities, computed when read
        self.paused = 0.0  # seconds the consumer held the stream between events (not ours to count)
        self.t0 = time.perf_counter()

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def clock_ms(self) -> float:
        """Time since the run started, less the time its consumer spent between events."""
        return (time.perf_counter() - self.t0 - self.paused) * 1000.0

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_len

    def use_cost_profile(self) -> None:
        """Hand a cost-aware drafter its cost profile: the pinned one, else this machine's
        (measured once per model and process, outside the run's clock)."""
        if self.drafter is None or not self.drafter.wants_costs:
            return
        if self.cfg.costs is not None:
            v, source = list(self.cfg.costs), "pinned"
        else:
            v, source = self.target.cost_profile(self.cfg.gamma + 1, self.ids), "measured on this machine"
            self.t0 = time.perf_counter()
        self.drafter.costs = v
        self.costs = {"source": source, "v": [float(x) for x in v]}  # unrounded: pinned again, it repeats the run

    def start(self) -> StartEvent:
        self.target.reset()
        with self.target.timer() as t:
            if self.prompt_len > 1:
                self.target.feed(self.ids[:-1], keep_logits=1)
            if self.drafter is not None:
                self.drafter.reset(self.ids)
        self.prefill_ms = t.ms
        return StartEvent(
            mode=self.mode,
            drafter=self.drafter.describe() if self.drafter else {"kind": "none", "name": "vanilla"},
            sampling=self.cfg.sampling.to_dict(), gamma=self.cfg.gamma if self.drafter else 0,
            max_new_tokens=self.limit, seed=self.cfg.seed, prompt_ids=list(self.ids),
            prompt_text=self.texts.tok.decode(self.ids, skip_special_tokens=False),
            target=self.info.get("target", {}) or self.target.describe(),
            draft=self.info.get("draft", {}) if self.drafter is not None else {},  # vanilla decoding drafts nothing
            prefill_ms=t.ms, costs=self.costs)

    def rewind(self) -> None:
        """Back to the state right after ``start()``: the prompt prefilled, nothing generated."""
        self.ids = list(self.prompt_ids)
        self.stop_reason = ""
        self.target.rollback(self.prompt_len - 1)
        if self.drafter is not None:
            self.drafter.commit(self.ids)

    def room(self) -> int:
        return self.limit - self.generated

    def accept(self, tokens: list[int]) -> list[int]:
        """Append what the iteration emits, cut at EOS and at the token limit; sets stop_reason."""
        out: list[int] = []
        for t in tokens[: self.room()]:
            out.append(t)
            if t in self.eos:
                self.stop_reason = "eos"
                break
        self.ids.extend(out)
        if not self.stop_reason and self.room() <= 0:
            self.stop_reason = "max_new_tokens" if self.generated >= self.cfg.max_new_tokens else "context"
        return out

    def summary(self) -> SummaryEvent:
        wall = self.clock_ms()
        new = self.generated
        examined = self.positions.examined
        return SummaryEvent(
            mode=self.mode, output_ids=self.ids[self.prompt_len:],
            text=self.texts.decode(self.ids[self.prompt_len:]), new_tokens=new,
            iterations=self.iterations, proposed=self.proposed, accepted=self.accepted, examined=examined,
            acceptance_rate=(self.accepted / self.proposed) if self.proposed else None,
            alpha=(self.accepted / examined) if examined else None,
            tokens_per_iteration=new / max(self.iterations, 1),
            tokens_per_second=new / (wall / 1000.0) if wall > 0 else 0.0,
            wall_ms=wall, prefill_ms=self.prefill_ms, draft_ms=self.draft_ms, verify_ms=self.verify_ms,
            stop_reason=self.stop_reason or "stopped", accepted_by_position=self.positions.rows(),
            consumer_ms=self.paused * 1000.0)


def _cut_at_eos(tokens: list[int], eos: set[int]) -> int:
    """How many proposals matter: up to and including the first EOS (nothing after it is emitted)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return i + 1
    return len(tokens)


def speculative_step(run: Run, gamma: int) -> IterationEvent:
    """One iteration: propose, verify in one pass, accept/resample, roll back."""
    target, drafter, sampling, gen = run.target, run.drafter, run.cfg.sampling, run.gen
    context = list(run.ids)
    # 1. propose (never more than can still be emitted: the target adds one token itself;
    #    never past an EOS, after which nothing would be emitted or counted)
    g_max = max(0, min(gamma, run.room() - 1))
    proposal = drafter.propose(context, g_max, sampling, gen)
    tokens = proposal.tokens[:g_max]
    tokens = tokens[:_cut_at_eos(tokens, run.eos)]
    g = len(tokens)
    reason = proposal.reason
    if g < len(proposal.tokens):  # the drafter's reason counts what it proposed; say what was sent
        why = [w for w, cut in (("γ" if g_max == gamma else "the tokens left to generate", len(proposal.tokens) > g_max),
                                ("the end-of-sequence token", g < min(len(proposal.tokens), g_max))) if cut]
        reason = f"{reason}; of its {len(proposal.tokens)}, only the first {g} verified (cut at {' and '.join(why)})"
    q_rows = proposal.q_rows[:g] if proposal.q_rows is not None else None
    # 2. one target pass over the pending token(s) + the proposals
    with target.timer() as tv:
        logits = target.feed(context[target.cached:] + tokens, keep_logits=g + 1)
    drafter.harvest(context + tokens, logits)  # the rows just computed, for drafters that learn from them
    # 3. accept / reject / resample or bonus, on p = logits_to_probs(logits, sampling)
    verdict, p_at = verify_logits(tokens, logits, q_rows, sampling, gen)
    k = verdict.accepted
    emitted = run.accept(tokens[:k] + [verdict.next_token])
    # 4. roll back: keep the context and the kept proposals; the last emitted token is pending
    target.rollback(len(run.ids) - 1)
    drafter.commit(run.ids)
    drafter.observe(g, k)

    run.iterations += 1
    run.proposed += g
    run.accepted += k
    run.draft_ms += proposal.draft_ms
    run.verify_ms += tv.ms
    run.positions.add(verdict.draws, k)
    nxt, texts, tail = verdict.next_token, run.texts, context[-3:]
    # top tokens only at the positions the rule examined: the rest were conditioned on a refused token
    stats, slot = run.stats, run.stats.add(logits, k + 1, tokens)

    def fill() -> dict:
        tops, p_raw = stats.get(slot)
        return {"proposed_text": texts.pieces(tail, tokens), "emitted_text": texts.pieces(tail, emitted),
                "target_top": _named(tops, texts, [tail + tokens[:i] for i in range(k + 1)]), "p_raw": p_raw}

    return IterationEvent.later(
        fill,
        index=run.iterations - 1, drafter=drafter.name, gamma=g_max, reason=reason, proposed=tokens,
        q=_at(q_rows, tokens) if q_rows is not None else [1.0] * g, p=p_at,
        q_raw=list(proposal.q_raw[:g]),
        accept_prob=verdict.accept_probs, draws=verdict.draws, accepted=k,
        correction=_correction(nxt, verdict.kind if g else "sample", verdict.p_next, texts, tail + tokens[:k],
                               one_hot=sampling.greedy),
        emitted=emitted, draft_ms=proposal.draft_ms, verify_ms=tv.ms, tokens_total=run.generated,
        proposed_total=run.proposed, accepted_total=run.accepted, elapsed_ms=run.clock_ms())


def _at(rows: torch.Tensor, tokens: list[int]) -> list[float]:
    """rows[i, tokens[i]] for each i, as floats."""
    if not tokens:
        return []
    return rows[: len(tokens)].gather(1, torch.tensor(tokens)[:, None]).view(-1).tolist()


def vanilla_step(run: Run) -> IterationEvent:
    """One plain decoding step: one target pass, one token."""
    target, context = run.target, list(run.ids)
    with target.timer() as tv:
        logits = target.feed(context[target.cached:], keep_logits=1)
    p = logits_to_probs(logits[-1], run.cfg.sampling)
    tok = sample(p, run.gen)
    emitted = run.accept([tok])
    run.iterations += 1
    run.verify_ms += tv.ms
    texts, tail = run.texts, context[-3:]
    stats, slot = run.stats, run.stats.add(logits[-1:], 1, [])
    return IterationEvent.later(
        lambda: {"proposed_text": [], "emitted_text": texts.pieces(tail, emitted),
                 "target_top": _named(stats.get(slot)[0], texts, [tail])},
        index=run.iterations - 1, drafter="vanilla", gamma=0, reason="plain decoding",
        proposed=[], q=[], p=[], q_raw=[], p_raw=[], accept_prob=[], draws=[], accepted=0,
        correction=_correction(tok, "sample", p, texts, context, one_hot=run.cfg.sampling.greedy), emitted=emitted,
        draft_ms=0.0,
        verify_ms=tv.ms, tokens_total=run.generated, proposed_total=0, accepted_total=0,
        elapsed_ms=run.clock_ms())


def _decode(run: Run, step) -> Iterator:
    run.use_cost_profile()
    events = [run.start()]
    while True:
        for ev in events:  # time the consumer spends between events is not decoding time
            held = time.perf_counter()
            yield ev
            run.paused += time.perf_counter() - held
        if run.stop_reason:
            break
        events = [step(run)]
    summary = run.summary()
    run.stats.flush()  # after the clock stopped (display, not decoding): no event holds logits after the run
    yield summary


def speculative_decode(target: Target, drafter: Drafter, tokenizer, prompt_ids: list[int],
                       cfg: DecodeConfig, info: dict | None = None) -> Iterator:
    """Speculative decoding; yields StartEvent, IterationEvent..., SummaryEvent."""
    run = Run("speculative", target, tokenizer, prompt_ids, cfg, drafter, info)
    return _decode(run, lambda r: speculative_step(r, cfg.gamma))


def vanilla_decode(target: Target, tokenizer, prompt_ids: list[int], cfg: DecodeConfig,
                   info: dict | None = None) -> Iterator:
    """Plain decoding with the same settings and the same event stream."""
    run = Run("vanilla", target, tokenizer, prompt_ids, cfg, None, info)
    return _decode(run, vanilla_step)
