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

import torch

from .acceptance import verify
from .drafters import Drafter
from .errors import SpecvizError
from .events import Correction, IterationEvent, StartEvent, SummaryEvent
from .lm import CachedLM, Timer
from .sampling import SamplingConfig, logits_to_probs, make_generator, sample

TOP_N = 5  # how many top tokens each event keeps per distribution (for the inspector)


@dataclass
class DecodeConfig:
    gamma: int = 4
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = 0

    def __post_init__(self) -> None:
        if int(self.gamma) != self.gamma or self.gamma < 1:
            raise SpecvizError(f"gamma must be a whole number >= 1, got {self.gamma}")
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            raise SpecvizError(f"max new tokens must be a whole number >= 1, got {self.max_new_tokens}")
        self.gamma, self.max_new_tokens = int(self.gamma), int(self.max_new_tokens)


class TokenText:
    """Text of one token in context: what it adds to the decoded string (spaces, newlines and
    special tokens kept), which single-token decoding gets wrong for SentencePiece vocabularies."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def piece(self, context: list[int], token: int) -> str:
        ctx = list(context[-3:])
        before = self.tok.decode(ctx, skip_special_tokens=False)
        after = self.tok.decode(ctx + [token], skip_special_tokens=False)
        if after.startswith(before):
            return after[len(before):]
        return self.tok.decode([token], skip_special_tokens=False)

    def pieces(self, context: list[int], tokens: list[int]) -> list[str]:
        out, ctx = [], list(context[-3:])
        for t in tokens:
            out.append(self.piece(ctx, t))
            ctx = ctx[-2:] + [t]
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def encode_prompt(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of a prompt: through the chat template when asked and available, else plain."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise SpecvizError("the prompt is empty")
    if chat and getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        ids = enc["input_ids"] if hasattr(enc, "keys") else enc
        return [int(i) for i in ids]
    ids = tokenizer.encode(prompt, add_special_tokens=True)
    if not ids:
        raise SpecvizError("the prompt encodes to no tokens")
    return [int(i) for i in ids]


def eos_ids(tokenizer, model: torch.nn.Module | None = None) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(tokenizer, "eos_token_id", None),
                getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return ids


def _top(probs: torch.Tensor, texts: TokenText, context: list[int], n: int = TOP_N) -> list[list]:
    vals, idx = torch.topk(probs.float(), min(n, probs.shape[-1]))
    return [[int(i), texts.piece(context, int(i)), round(float(v), 6)] for v, i in zip(vals, idx) if v > 0]


class _Run:
    """Bookkeeping shared by both decoders: the sequence, stopping, totals, events."""

    def __init__(self, mode: str, target: CachedLM, tokenizer, prompt_ids: list[int],
                 cfg: DecodeConfig, drafter: Drafter | None, info: dict | None):
        if not prompt_ids:
            raise SpecvizError("the prompt is empty")
        ctx = target.context_length
        if len(prompt_ids) >= ctx:
            raise SpecvizError(f"the prompt is {len(prompt_ids)} tokens; the model's context is {ctx}")
        self.mode, self.target, self.cfg, self.drafter = mode, target, cfg, drafter
        self.texts = TokenText(tokenizer)
        self.eos = eos_ids(tokenizer, target.model)
        self.prompt_len = len(prompt_ids)
        self.ids = list(prompt_ids)
        self.limit = min(cfg.max_new_tokens, ctx - len(prompt_ids))
        self.gen = make_generator(cfg.seed)
        self.info = info or {}
        self.iterations = 0
        self.proposed = 0
        self.accepted = 0
        self.draft_ms = 0.0
        self.verify_ms = 0.0
        self.by_position: list[list[int]] = []
        self.stop_reason = ""
        self.prefill_ms = 0.0
        self.paused = 0.0  # seconds the consumer held the stream between events (not ours to count)
        self.t0 = time.perf_counter()

    def clock_ms(self) -> float:
        """Time since the run started, less the time its consumer spent between events."""
        return (time.perf_counter() - self.t0 - self.paused) * 1000.0

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_len

    def start(self) -> StartEvent:
        self.target.reset()
        with Timer(self.target.device) as t:
            if self.prompt_len > 1:
                self.target.feed(self.ids[:-1], keep_logits=1)
            if self.drafter is not None:
                self.drafter.reset(self.ids)
        return StartEvent(
            mode=self.mode,
            drafter=self.drafter.describe() if self.drafter else {"kind": "none", "name": "vanilla"},
            sampling=self.cfg.sampling.to_dict(), gamma=self.cfg.gamma if self.drafter else 0,
            max_new_tokens=self.limit, seed=self.cfg.seed, prompt_ids=list(self.ids),
            prompt_text=self.texts.tok.decode(self.ids, skip_special_tokens=False),
            target=self.info.get("target", {}), draft=self.info.get("draft", {}), prefill_ms=t.ms)

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
        prefill = self.prefill_ms
        it = max(self.iterations, 1)
        return SummaryEvent(
            mode=self.mode, output_ids=self.ids[self.prompt_len:],
            text=self.texts.decode(self.ids[self.prompt_len:]), new_tokens=new,
            iterations=self.iterations, proposed=self.proposed, accepted=self.accepted,
            acceptance_rate=(self.accepted / self.proposed) if self.proposed else None,
            mean_accepted=self.accepted / it, tokens_per_iteration=new / it,
            tokens_per_second=new / (wall / 1000.0) if wall > 0 else 0.0,
            decode_tokens_per_second=new / ((wall - prefill) / 1000.0) if wall > prefill else 0.0,
            wall_ms=wall, prefill_ms=prefill, draft_ms=self.draft_ms, verify_ms=self.verify_ms,
            stop_reason=self.stop_reason or "stopped", accepted_by_position=self.by_position,
            consumer_ms=self.paused * 1000.0)


def speculative_step(run: _Run, gamma: int) -> IterationEvent:
    """One iteration: propose, verify in one pass, accept/resample, roll back."""
    target, drafter, sampling, gen = run.target, run.drafter, run.cfg.sampling, run.gen
    context = list(run.ids)
    # 1. propose (never more than can still be emitted: the target adds one token itself)
    g_max = max(0, min(gamma, run.room() - 1))
    proposal = drafter.propose(context, g_max, sampling, gen)
    tokens = proposal.tokens[:g_max]
    g = len(tokens)
    q_rows = proposal.q_rows[:g] if proposal.q_rows is not None else None
    # 2. one target pass over the pending token(s) + the proposals
    with Timer(target.device) as tv:
        logits = target.feed(context[target.cached:] + tokens, keep_logits=g + 1)
    p_rows = logits_to_probs(logits, sampling)
    # 3. accept / reject / resample or bonus
    verdict = verify(tokens, p_rows, q_rows, gen)
    k = verdict.accepted
    emitted = run.accept(tokens[:k] + [verdict.next_token])
    # 4. roll back: keep the context and the kept proposals; the last emitted token is pending
    target.rollback(len(run.ids) - 1)
    drafter.commit(run.ids)
    drafter.observe(g, k)

    raw = logits.softmax(dim=-1)
    texts = run.texts
    proposed_text = texts.pieces(context, tokens)
    run.iterations += 1
    run.proposed += g
    run.accepted += k
    run.draft_ms += proposal.draft_ms
    run.verify_ms += tv.ms
    for i, d in enumerate(verdict.draws):
        if d is None:
            break
        if i == len(run.by_position):
            run.by_position.append([0, 0])
        run.by_position[i][1] += 1
        run.by_position[i][0] += int(i < k)
    nxt = verdict.next_token
    ctx_k = context + tokens[:k]
    return IterationEvent(
        index=run.iterations - 1, drafter=drafter.name, gamma=g_max,
        reason=proposal.reason, proposed=tokens, proposed_text=proposed_text,
        q=[float(q_rows[i, x]) if q_rows is not None else 1.0 for i, x in enumerate(tokens)],
        p=[float(p_rows[i, x]) for i, x in enumerate(tokens)],
        q_raw=list(proposal.q_raw[:g]), p_raw=[float(raw[i, x]) for i, x in enumerate(tokens)],
        accept_prob=verdict.accept_probs, draws=verdict.draws, accepted=k,
        correction=Correction(nxt, texts.piece(ctx_k, nxt), verdict.kind if g else "sample",
                              float(verdict.p_next[nxt]), _top(verdict.p_next, texts, ctx_k)),
        # only the positions the rule examined: the rest were conditioned on a refused token
        target_top=[_top(raw[i], texts, context + tokens[:i]) for i in range(k + 1)],
        emitted=emitted, emitted_text=texts.pieces(context, emitted),
        draft_ms=proposal.draft_ms, verify_ms=tv.ms, tokens_total=run.generated,
        proposed_total=run.proposed, accepted_total=run.accepted,
        elapsed_ms=run.clock_ms())


def vanilla_step(run: _Run) -> IterationEvent:
    """One plain decoding step: one target pass, one token."""
    target, context = run.target, list(run.ids)
    with Timer(target.device) as tv:
        logits = target.feed(context[target.cached:], keep_logits=1)
    p = logits_to_probs(logits[-1], run.cfg.sampling)
    tok = sample(p, run.gen)
    emitted = run.accept([tok])
    run.iterations += 1
    run.verify_ms += tv.ms
    texts = run.texts
    raw = logits[-1].softmax(dim=-1)
    return IterationEvent(
        index=run.iterations - 1, drafter="vanilla", gamma=0, reason="plain decoding",
        proposed=[], proposed_text=[], q=[], p=[], q_raw=[], p_raw=[], accept_prob=[], draws=[],
        accepted=0, correction=Correction(tok, texts.piece(context, tok), "sample", float(p[tok]),
                                          _top(p, texts, context)),
        target_top=[_top(raw, texts, context)], emitted=emitted,
        emitted_text=texts.pieces(context, emitted), draft_ms=0.0, verify_ms=tv.ms,
        tokens_total=run.generated, proposed_total=0, accepted_total=0,
        elapsed_ms=run.clock_ms())


def _decode(run: _Run, step) -> Iterator:
    if run.drafter is not None and getattr(run.drafter, "wants_costs", False):
        # measured once per model and process, outside the run's clock
        run.drafter.costs = run.target.verify_costs(run.cfg.gamma + 1, run.ids)
        run.t0 = time.perf_counter()
    start = run.start()
    run.prefill_ms = start.prefill_ms
    events = [start]
    while True:
        for ev in events:  # time the consumer spends between events is not decoding time
            held = time.perf_counter()
            yield ev
            run.paused += time.perf_counter() - held
        if run.stop_reason:
            break
        events = [step(run)]
    yield run.summary()


def speculative_decode(target: CachedLM, drafter: Drafter, tokenizer, prompt_ids: list[int],
                       cfg: DecodeConfig, info: dict | None = None) -> Iterator:
    """Speculative decoding; yields StartEvent, IterationEvent..., SummaryEvent."""
    run = _Run("speculative", target, tokenizer, prompt_ids, cfg, drafter, info)
    return _decode(run, lambda r: speculative_step(r, cfg.gamma))


def vanilla_decode(target: CachedLM, tokenizer, prompt_ids: list[int], cfg: DecodeConfig,
                   info: dict | None = None) -> Iterator:
    """Plain decoding with the same settings and the same event stream."""
    run = _Run("vanilla", target, tokenizer, prompt_ids, cfg, None, info)
    return _decode(run, vanilla_step)

