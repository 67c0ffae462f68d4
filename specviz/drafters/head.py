"""A trained draft head (after EAGLE, Li et al. 2024): a small network that reads the target's own
last hidden state and the token just chosen, and predicts the target's next hidden state, hence its
next token. Chained on its own predictions it drafts several tokens, each for a few percent of a
target step: no second model, no second KV cache, and it drafts where nothing can be copied.

The head: ``f = fc([h; embed(x)])``, one gated MLP block with a residual, an RMSNorm; its logits are
the target's own output embedding (tied or not) restricted to the ``vocab`` the head was trained to
predict (the tokens the target writes; FR-Spec, Zhao et al. 2025, calls this a frequency-ranked
subset). ``f`` plays the part of the next hidden state for the next draft step. Weights come from
``scripts/train_draft_head.py`` (the target's greedy answers to prompts the benchmark leaves out) as
a safetensors file: no pickle, shapes checked against the target before use.

The hidden states come for free: a forward hook on the target's final norm keeps the rows of the
last pass (prefill or verify), and ``harvest`` tells which positions they were. The state that
predicted the newest token is the one the head starts from.

Combined with prompt lookup and the datastore (``lookup: true``, the default), each iteration
proposes whichever source promises the most tokens per unit of measured cost, as the recycling
drafter does: a head token's chance to be kept is learned during the run per band of the head's
own probability for it, from a prior measured on held-out answers. q is the head's softmax over its
vocabulary (zero elsewhere) after the run's temperature, top-k and top-p, so under sampling the
acceptance rule sees a real q; under greedy it is one-hot. Either way the rule is exact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..backends.base import Timer
from ..errors import SpecvizError
from ..sampling import logits_to_probs, sample
from .base import Proposal
from .lookup import BandedLookupDrafter, BesideLookupKind, band_of

FORMAT = "specviz-draft-head-1"
ASSETS = Path(__file__).resolve().parent.parent.parent / "assets"  # where the shorthand `head` looks
BANDS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.95)  # lower edges of the bands of the head's top probability
FLOOR = 0.08  # stop drafting once the chance that every head token so far is kept falls below this


def band(p: float) -> int:
    return band_of(p, BANDS)


class DraftHead(torch.nn.Module):
    """fc([h; e]) -> + gated MLP (residual) -> RMSNorm: the next hidden state's stand-in."""

    def __init__(self, hidden: int, ff: int, eps: float = 1e-5):
        super().__init__()
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.n1 = torch.nn.RMSNorm(hidden, eps=eps)
        self.gate = torch.nn.Linear(hidden, ff, bias=False)
        self.up = torch.nn.Linear(hidden, ff, bias=False)
        self.down = torch.nn.Linear(ff, hidden, bias=False)
        self.n2 = torch.nn.RMSNorm(hidden, eps=eps)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        z = self.fc(torch.cat([h, e], -1))
        y = self.n1(z)
        z = z + self.down(F.silu(self.gate(y)) * self.up(y))
        return self.n2(z)

    @torch.inference_mode()
    def step(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """``forward`` for one row at inference, its matrix-vector products from compact weights
        (``RowProduct``: int8 on a CPU, else float16; the target's pass pushes the head out of the
        caches, so a step's time is mostly reading its weights), gate and up in one product, the
        norms in float32."""
        w = getattr(self, "_compact", None)
        if w is None or w[0].w.device != h.device:
            w = self._compact = (RowProduct(self.fc.weight.to(h.device)),
                                 RowProduct(torch.cat([self.gate.weight, self.up.weight]).to(h.device)),
                                 RowProduct(self.down.weight.to(h.device)))
        fc, gu, down = w
        z = fc(torch.cat([h, e], -1))
        g, u = gu(self.n1(z)).chunk(2, -1)
        return self.n2(z + down(F.silu(g) * u))


def _int8_kernel_works() -> bool:
    """Whether torch's weight-only int8 product (``_weight_int8pack_mm``, bfloat16 activations)
    runs here and computes a product: checked once on a small case against float32."""
    global _INT8_OK
    if _INT8_OK is None:
        _INT8_OK = False
        if os.environ.get("SPECVIZ_HEAD_INT8", "1") != "0" and hasattr(torch, "_weight_int8pack_mm"):
            try:
                g = torch.Generator().manual_seed(0)
                w, x = torch.randn(64, 96, generator=g), torch.randn(96, generator=g)
                got = RowProduct(w, int8=True)(x)
                want = w @ x
                _INT8_OK = bool(((got - want).norm() / want.norm()) < 0.02)
            except (RuntimeError, NotImplementedError):
                _INT8_OK = False
    return _INT8_OK


_INT8_OK: bool | None = None


class RowProduct:
    """``w @ x`` for one float32 row ``x``, with ``w`` stored compactly: on a CPU, int8 with one
    scale per output row (torch's weight-only int8 kernel, ``x`` in bfloat16: 0.6 ms against float16's
    0.9 for the head's 6,144-token vocabulary product with cold caches on an Intel Xeon, 1.1 ms against
    1.7 for a whole head step after a target pass); elsewhere, or where that kernel is missing, in
    float16. The draft is whatever the head computes, so its precision moves q, never the output's law."""

    def __init__(self, w: torch.Tensor, int8: bool | None = None):
        w = w.detach().float()
        if int8 is None:
            int8 = w.device.type == "cpu" and _int8_kernel_works()
        self.int8 = int8
        if int8:
            s = (w.abs().amax(1) / 127).clamp_min(1e-12).bfloat16()
            self.w = torch.round(w / s.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            self.s = s
        else:
            self.w = w.half().contiguous()

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.w.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.int8:
            return torch._weight_int8pack_mm(x.bfloat16()[None], self.w, self.s)[0].float()
        # F.linear, not ``w @ x``: torch's float16 matrix-vector kernel took 2.3x as long on an Intel Xeon
        return F.linear(x.half()[None], self.w)[0].float()


def chains(states: list[torch.Tensor], tokens: list[torch.Tensor], k: int):
    """Training chains from teacher-forced passes: for each sequence, ``states[i][t]`` is the target's
    final hidden state at position t and ``tokens[i][t]`` the token there. Returns (h_t,
    x_{t+1..t+k+1}, h_{t+1..t+k}) for every t with a full chain."""
    h0, xx, ht = [], [], []
    for H, X in zip(states, tokens):
        H = H.float()
        T = len(X) - k - 1
        if T <= 0:
            continue
        t = torch.arange(T)
        h0.append(H[:T])
        xx.append(torch.stack([X[t + 1 + j] for j in range(k + 1)], 1))
        ht.append(torch.stack([H[t + 1 + j] for j in range(k)], 1))
    return torch.cat(h0), torch.cat(xx), torch.cat(ht)


def unrolled(head: DraftHead, embed: torch.Tensor, out_rows: torch.Tensor, vocab: torch.Tensor,
             h: torch.Tensor, x: torch.Tensor, target: torch.Tensor):
    """The head run as drafting runs it, from (h_t, x_{t+1}) on its own predicted states for
    ``target.shape[1]`` steps. Returns (loss, per step: (top probability, chain alive before, hit))."""
    remap = torch.full((embed.shape[0],), -100, dtype=torch.long)
    remap[vocab] = torch.arange(len(vocab))
    loss, steps = 0.0, []
    alive = torch.ones(len(h), dtype=torch.bool)
    for j in range(target.shape[1]):
        h = head(h, embed[x[:, j]])
        logits = h @ out_rows.T
        w = (j + 1) ** -0.5
        loss = loss + w * (F.cross_entropy(logits, remap[x[:, j + 1]], ignore_index=-100)
                           + 5.0 * F.smooth_l1_loss(h, target[:, j]))
        top, arg = logits.detach().softmax(-1).max(-1)
        hit = vocab[arg] == x[:, j + 1]
        steps.append((top, alive.clone(), hit))
        alive = alive & hit
    return loss, steps


def fit(head: DraftHead, embed: torch.Tensor, out_rows: torch.Tensor, vocab: torch.Tensor, data, epochs: int,
        lr: float = 2e-3, batch: int = 256, generator: torch.Generator | None = None, each_epoch=None,
        bf16: bool = False) -> None:
    """Train ``head`` on ``data`` = chains(...) with AdamW and a one-cycle schedule. ``bf16``: the
    forward pass under torch's CPU autocast (matrix products in bfloat16; the weights and the
    optimizer's state stay float32): 1.65x faster per epoch on this project's AMD EPYC, with the
    same held-out accuracy as float32 on a check."""
    h0, xx, ht = data
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    per_epoch = max(1, len(h0) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * per_epoch, pct_start=0.05)
    for ep in range(epochs):
        head.train()
        perm = torch.randperm(len(h0), generator=generator)
        for b in range(per_epoch):
            j = perm[b * batch:(b + 1) * batch]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss, _ = unrolled(head, embed, out_rows, vocab, h0[j], xx[j], ht[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        head.eval()
        if each_epoch is not None:
            each_epoch(ep)


def priors(steps) -> list[list[float]]:
    """Keep-chance priors per band of the top probability, from ``unrolled``'s steps on held-out
    chains: the first step, and later steps after a kept one (shrunk toward the band's middle)."""
    out = []
    for part in (steps[:1], steps[1:]):
        top = torch.cat([s[0][s[1]] for s in part])
        hit = torch.cat([s[2][s[1]] for s in part])
        b = torch.tensor([band(float(v)) for v in top], dtype=torch.long)
        row = []
        for i in range(len(BANDS)):
            sel = b == i
            mid = (BANDS[i] + (BANDS[i + 1] if i + 1 < len(BANDS) else 1.0)) / 2
            row.append(round((float(hit[sel].sum()) + mid * 20) / (int(sel.sum()) + 20), 3))
        out.append(row)
    return out


def save_head(path: str | Path, head: DraftHead, vocab: torch.Tensor, **meta) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()}
    tensors["vocab"] = vocab.to(torch.int32).contiguous()
    meta = {"format": FORMAT, "hidden": str(head.fc.out_features), "ff": str(head.gate.out_features),
            **{k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}}
    save_file(tensors, str(path), metadata=meta)


def load_head(path: str | Path, hidden: int, vocab_size: int) -> tuple[DraftHead, torch.Tensor, dict]:
    """(head in float32, vocab ids, metadata); SpecvizError where the file is not a head for this target."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises several kinds; all mean "not readable"
        raise SpecvizError(f"could not read draft head {path}: {e}") from None
    if meta.get("format") != FORMAT:
        raise SpecvizError(f"{path} is not a specviz draft head (format {meta.get('format')!r})")
    try:
        h, ff = int(meta["hidden"]), int(meta["ff"])
    except (KeyError, ValueError):
        raise SpecvizError(f"draft head {path}: its metadata lacks hidden/ff sizes") from None
    if h != hidden:
        raise SpecvizError(f"draft head {path} was trained for hidden size {h}; the target has {hidden}")
    head = DraftHead(h, ff)
    vocab = tensors.pop("vocab", None)
    want = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if want != got:
        raise SpecvizError(f"draft head {path}: tensors {got} do not match the architecture {want}")
    if vocab is None or vocab.ndim != 1 or not len(vocab) or int(vocab.min()) < 0 or int(vocab.max()) >= vocab_size:
        raise SpecvizError(f"draft head {path}: its vocabulary does not fit the target's {vocab_size} tokens")
    head.load_state_dict({k: v.float() for k, v in tensors.items()})
    head.eval().requires_grad_(False)
    return head, vocab.long(), meta


class HiddenTap:
    """Keeps the output of the target's final norm from its latest forward pass (one per model)."""

    def __init__(self, norm: torch.nn.Module):
        self.last: torch.Tensor | None = None
        norm.register_forward_hook(self._hook)

    def _hook(self, module, args, output) -> None:
        self.last = output.detach()

    @classmethod
    def of(cls, model: torch.nn.Module) -> "HiddenTap":
        tap = getattr(model, "_svz_hidden_tap", None)
        if tap is None:
            decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
            norm = getattr(decoder, "norm", None)
            if not isinstance(norm, torch.nn.Module):
                raise SpecvizError("a draft head needs a target with a final norm (model.get_decoder().norm)")
            tap = cls(norm)
            model._svz_hidden_tap = tap
        return tap


class HeadDrafter(BandedLookupDrafter):
    """A trained draft head chained on its own predictions, optionally with prompt lookup + datastore."""

    kind = "head"
    # chance a head token is kept, per band of the head's top probability there: the first of a chain,
    # and a later one after a kept one (measured by scripts/train_draft_head.py on held-out answers)
    PRIOR_FIRST = (0.12, 0.3, 0.5, 0.7, 0.87, 0.97)
    PRIOR_NEXT = (0.12, 0.3, 0.5, 0.7, 0.87, 0.97)
    BANDS = BANDS
    # The first token's prior by its relation to lookup's matches, from the prior without them:
    # measured with scripts/agreement_stats.py on held-out answers (--skip 3): where a match starts
    # with the head's token it was kept at least 41% of the time in every band (the estimate in the
    # lowest bands was 15-39%); where it differs from a prompt/output match, 0.64 times the estimate;
    # where it differs from datastore matches only, 0.75 times.
    HEAD_RELATIONS = {"agree": lambda p: max(p, 0.45), "differ_context": lambda p: 0.64 * p,
                      "differ_store": lambda p: 0.75 * p}

    def __init__(self, target_model: torch.nn.Module, head: DraftHead, vocab: torch.Tensor, vocab_size: int,
                 lookup: bool = True, max_ngram: int = 4, min_ngram: int = 1, datastore=None,
                 priors: tuple | None = None, label: str = "draft head"):
        self.vocab, self.vocab_size, self.lookup = vocab, vocab_size, lookup
        self.tap = HiddenTap.of(target_model)
        self.embed = target_model.get_input_embeddings().weight.detach()
        out = target_model.get_output_embeddings()
        weight = getattr(out, "weight", None)
        if weight is None or weight.shape[0] < int(vocab.max()) + 1:
            raise SpecvizError("a draft head needs the target's output embedding (one row per token)")
        self.head = head.to(self.embed.device)  # any target dtype and device: the head works in float32 beside it
        self.out_rows = RowProduct(weight.detach()[vocab])  # the head's logits over its vocabulary
        self.index = torch.full((vocab_size,), -1, dtype=torch.long)  # token id -> row in the head's vocab
        self.index[vocab] = torch.arange(len(vocab))
        if priors is not None:
            self.PRIOR_FIRST, self.PRIOR_NEXT = tuple(priors[0]), tuple(priors[1])
        super().__init__(max_ngram, min_ngram, True, datastore=datastore)  # calls reset()
        self.own_label = label
        parts = [f"{label} ({len(vocab):,}-token vocabulary)"]
        if lookup:
            parts.append(self.name)
        self.name = " + ".join(parts)

    def reset(self, prompt_ids: list[int]) -> None:
        super().reset(prompt_ids)
        self._rel_kept = {rel: [[0.0, 0.0] for _ in self.BANDS] for rel in self.HEAD_RELATIONS}
        self._rel: str | None = None  # the relation of the last head chain's first token
        self._rows: torch.Tensor | None = None  # hidden states of the latest verify pass
        self._rows_ids: list[int] = []  # the sequence it scored (row j: position start + j)
        self._start = 0
        self._prompt: tuple[list[int], torch.Tensor] | None = None  # the prompt's, kept for rewinds
        last = self.tap.last
        if last is not None and len(prompt_ids) > 1 and last.shape[-2] == len(prompt_ids) - 1:
            self._prompt = (list(prompt_ids), last[0, -1].clone())  # the prefill the engine just ran

    def harvest(self, ids: list[int], logits: torch.Tensor) -> None:
        last = self.tap.last
        if last is not None and last.shape[-2] == logits.shape[0]:
            self._rows, self._rows_ids, self._start = last[0], list(ids), len(ids) - logits.shape[0]
        else:
            self._rows = None

    def state(self, ids: list[int]) -> torch.Tensor | None:
        """The target's hidden state at the position before the last token of ``ids`` (the one
        that predicted it), if the latest pass (or the prefill) computed it over the same prefix."""
        pos = len(ids) - 2
        if self._prompt is not None and ids == self._prompt[0]:
            return self._prompt[1]
        if self._rows is None or pos < self._start or pos >= self._start + self._rows.shape[0]:
            return None
        if self._rows_ids[: pos + 1] != ids[: pos + 1]:
            return None
        return self._rows[pos - self._start]

    def step(self, h: torch.Tensor, x: int, sampling):
        """One head step from state ``h`` after token ``x``: (next state, the head's softmax over
        its vocabulary, q over the target's vocabulary or None under greedy, q's top probability)."""
        h = self.head.step(h.float(), self.embed[x].float())
        sub = self.out_rows(h).cpu()  # the head's logits over its vocabulary, stored as its own layers
        soft = torch.softmax(sub, -1)
        if sampling.greedy:
            return h, soft, None, float(soft.max())
        full = torch.full((self.vocab_size,), float("-inf"))
        full[self.vocab] = sub
        q = logits_to_probs(full, sampling)
        return h, soft, q, float(q.max())

    def relation(self, first: int | None, found: list) -> str | None:
        """How the head's first token relates to lookup's matches: None (no head token or no
        match), "agree" (a match starts with it), else "differ_context" (it differs from a match
        in the prompt or output) or "differ_store" (only from datastore matches)."""
        if first is None or not found:
            return None
        if any(toks[0] == first for _, toks, _ in found):
            return "agree"
        return "differ_context" if any(key[0] == "context" for key, _, _ in found) else "differ_store"

    def first_chance(self, b: int, rel: str | None) -> float:
        """The chance the head's first token is kept, per band of its top probability and its
        relation to lookup's matches (``HEAD_RELATIONS``), learned during the run."""
        if rel is None:
            return self.keep_chance(b, True)
        return self.chance(self._rel_kept[rel][b], self.HEAD_RELATIONS[rel](self.PRIOR_FIRST[b]))

    def counts(self, j: int, b: int) -> list[float]:
        if j == 0 and self._rel is not None:  # the first token's counts by its relation to lookup
            return self._rel_kept[self._rel][b]
        return super().counts(j, b)

    @torch.inference_mode()
    def propose(self, ids, max_tokens, sampling, generator) -> Proposal:
        """Lookup's best match, or a head chain where that promises more tokens per unit of cost.

        The head's first step comes first: whether its most likely token is also the first token
        of a lookup match moves both sources' estimates (where they agree, that token is kept far
        more often than either estimate says; where they differ, less often).

        Every choice is made from what is known before the token it concerns is drawn: whether the
        head drafts at all and whether a chain goes on to position j depend on q_j (its top
        probability and most likely token) and on earlier tokens, never on the token drawn at j.
        Choosing after seeing a sampled token would skew the drafted tokens away from q and the
        output away from p."""
        if self.fixed_chain:
            return self._chain(ids, max_tokens, sampling, generator)
        with Timer(torch.device("cpu")) as t:
            h = self.state(ids) if max_tokens > 0 else None
            first = None
            if h is not None:
                h, soft, q, top = self.step(h, ids[-1], sampling)
                first = int(self.vocab[int(soft.argmax())])  # from q alone, before any draw
            found = self.candidates(ids, max_tokens) if max_tokens > 0 and self.lookup else []
            scored = []  # lookup's (value, g, tokens, key, reason, E) per source
            for key, toks, what in found:
                if first is not None:
                    key = key + ("agree" if toks[0] == first else "differ",)
                g, val, e, a1, ac = self.value(key, len(toks))
                agree = ", the head agrees" if key[-1] == "agree" else ""
                scored.append((val, g, toks[:g], key, f"{what}{agree}, est. keep first {a1:.2f}, then {ac:.2f}", e))
            best = max(scored, key=lambda c: c[0], default=None)
            rel = self.relation(first, found)
            copy = [c for c in scored if c[3][0] == "context" and c[3][-1] == "agree" and c[1] > 0]
            if copy:  # the head's token starts a copy from the prompt or output, which goes on further
                best, h = copy[0], None
            head_val = 0.0
            if h is not None:
                a1, ac = self.first_chance(band(top), rel), self.keep_chance(band(top), False)
                e = 1.0
                for g in range(1, max_tokens + 1):  # the chain's worth as judged from its first q
                    e += a1 * ac ** (g - 1)
                    head_val = max(head_val, e / self.cost(g))
            self._last, self._bands, self._rel = None, [], None
            out: list[int] = []
            q_rows: list[torch.Tensor] = []
            raw: list[float] = []
            if max_tokens <= 0:
                reason = "no room left"
            elif h is not None and head_val > 1.0 and (best is None or best[1] == 0 or head_val > best[0]):
                e, alive = 1.0, 1.0
                self._rel = rel

                def worth_it(j: int, b: int) -> bool:  # decided from q_j (its band), before drawing from it
                    nonlocal e, alive
                    k = alive * (self.first_chance(b, rel) if j == 0 else self.keep_chance(b))
                    if j and (k < FLOOR or (e + k) / self.cost(j + 1) <= e / self.cost(j)):
                        return False
                    alive, e = k, e + k
                    return True
                out, q_rows, raw = self._draw_chain(h, ids[-1], (h, soft, q, top), max_tokens, sampling, generator,
                                                    worth_it)
                said = {"agree": ", lookup agrees", "differ_context": ", lookup differs",
                        "differ_store": ", the datastore differs"}.get(rel or "", "")
                reason = (f"draft head (its first token at probability {raw[0]:.2f}{said}): proposing {len(out)} "
                          f"(expects {e:.2f} tokens for {self.cost(len(out)):.2f}x a step)")
            elif best is None:
                reason = "no head state or match: plain step"
            elif best[1] == 0:
                reason = best[4] + ": no length pays off, plain step"
            else:
                val, g, out, key, what, e = best
                self._last = key
                raw = [1.0] * g
                reason = what + f": proposing {g} (expects {e:.2f} tokens for {e / val:.2f}x a step)"
        return Proposal(out, torch.stack(q_rows) if q_rows else None, raw, reason, t.ms)

    def _draw_chain(self, h: torch.Tensor, x: int, first: tuple | None, max_tokens: int, sampling, generator,
                    worth_it: Callable[[int, int], bool] | None = None) -> tuple[list[int], list, list[float]]:
        """The head's chain from state ``h`` after token ``x``: up to ``max_tokens`` tokens, each the
        head's most likely one (greedy) or drawn from its q, while ``worth_it(j, band of q_j)`` (asked
        before token j is drawn) holds. ``first``: the first step's result where it was computed
        already. Returns (tokens, q rows, the head's probability of each token); records their bands."""
        out: list[int] = []
        q_rows: list[torch.Tensor] = []
        raw: list[float] = []
        for j in range(max_tokens):
            h, soft, q, top = first if j == 0 and first is not None else self.step(h, out[-1] if j else x, sampling)
            b = band(top)
            if worth_it is not None and not worth_it(j, b):
                break
            i = int(soft.argmax()) if q is None else int(self.index[sample(q, generator)])
            out.append(int(self.vocab[i]))
            raw.append(float(soft[i]))
            if q is not None:
                q_rows.append(q)
            self._bands.append(b)
        return out, q_rows, raw

    def _chain(self, ids, max_tokens, sampling, generator) -> Proposal:
        with Timer(torch.device("cpu")) as t:
            self._last, self._bands, self._rel = None, [], None
            h = self.state(ids) if max_tokens > 0 else None
            out, q_rows, raw = [], [], []
            if h is not None:
                out, q_rows, raw = self._draw_chain(h, ids[-1], None, max_tokens, sampling, generator)
            reason = (f"draft head, fixed length: proposing {len(out)}" if out else
                      "no room left" if max_tokens <= 0 else "no head state: plain step")
        return Proposal(out, torch.stack(q_rows) if q_rows else None, raw, reason, t.ms)

    def describe(self) -> dict:
        d = super().describe()
        d.update(kind=self.kind, name=self.name, lookup=self.lookup, head_vocab=len(self.vocab),
                 head_products="int8" if self.out_rows.int8 else "float16")
        return d


class HeadKind(BesideLookupKind):
    name = "head"
    aliases = ("head", "draft-head", "eagle")
    choices = ("head", "head:only")
    source = "a draft head trained on the target's hidden states (+ the prompt, output and datastore)"

    def forms(self, target: str) -> tuple[str, ...]:
        """Only where a trained head for ``target`` ships in assets/ (the shorthand's default)."""
        return self.choices if os.path.isfile(ASSETS / f"draft-head-{target}.safetensors") else ()

    def check(self, spec: dict, where: str, base: Path | None = None) -> dict:
        if "weights" in spec:
            path = Path(os.path.expanduser(str(spec["weights"])))
            spec["weights"] = str(path if path.is_absolute() or base is None else base / path)
        return super().check(spec, where, base)

    def build(self, spec, target, draft) -> HeadDrafter:
        weights = spec.get("weights") or str(ASSETS / f"draft-head-{target.name}.safetensors")
        if not spec.get("weights") and not os.path.isfile(weights):
            raise SpecvizError(f"no trained draft head for {target.name} (looked for {weights}); "
                               "train one with scripts/train_draft_head.py or give `weights`")
        model = target.model
        hidden = int(getattr(getattr(model, "config", None), "hidden_size", 0) or 0)
        head, vocab, meta = load_head(weights, hidden, len(target.tokenizer))
        if meta.get("model") not in (None, target.name):
            raise SpecvizError(f"draft head {weights} was trained for {meta.get('model')}, not {target.name}")
        priors = None
        if "priors" in meta:
            try:
                priors = json.loads(meta["priors"])
                assert len(priors) == 2 and all(len(p) == len(BANDS) for p in priors)
            except (ValueError, AssertionError, TypeError):
                raise SpecvizError(f"draft head {weights}: unreadable priors") from None
        return HeadDrafter(model, head, vocab, len(target.tokenizer), bool(spec.get("lookup", True)), int(spec.get("max_ngram", 4)),
                           int(spec.get("min_ngram", 1)), datastore=self.datastore(spec, target), priors=priors)
