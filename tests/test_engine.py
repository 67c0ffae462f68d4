"""The engine on tiny random models: exact greedy equality, rollback, events, stopping, seeds."""

import json

import pytest
import torch

from specviz.drafters import Drafter, EarlyExitDrafter, ModelDrafter, PromptLookupDrafter, Proposal
from specviz.errors import SpecvizError
from specviz.events import IterationEvent, StartEvent, SummaryEvent
from specviz.trace import Trace, runs_from_json, runs_to_json
from specviz.engine import DecodeConfig, encode_prompt, speculative_decode, vanilla_decode
from specviz.backends.transformers import CachedLM
from specviz.sampling import SamplingConfig

PROMPTS = ["hello hello hello world", "abc abc abc abc", "The cat sat on the mat. The cat",
           "x", "1, 2, 3, 4, 5, 6, 7"]


def drafters(target_model, draft_model):
    return {
        "model": lambda: ModelDrafter(draft_model),
        "self": lambda: ModelDrafter(target_model, "the target itself"),
        "lookup": lambda: PromptLookupDrafter(max_ngram=3),
        "lookup-fixed": lambda: PromptLookupDrafter(max_ngram=2, adaptive=False),
        "early-exit": lambda: EarlyExitDrafter(target_model, 2),
    }


def vanilla_ids(target, tok, ids, cfg):
    return list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids


@pytest.mark.parametrize("kind", ["model", "self", "lookup", "lookup-fixed", "early-exit"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_identical_to_vanilla(kind, gamma, target_model, draft_model, tok):
    target = CachedLM(target_model, len(tok))
    for chat, prompt in [(True, p) for p in PROMPTS] + [(False, PROMPTS[2])]:
        ids = encode_prompt(tok, prompt, chat)
        cfg = DecodeConfig(gamma=gamma, max_new_tokens=40)
        expected = vanilla_ids(target, tok, ids, cfg)
        drafter = drafters(target_model, draft_model)[kind]()
        got = list(speculative_decode(target, drafter, tok, ids, cfg))[-1]
        assert got.output_ids == expected, (kind, gamma, prompt)


class ScriptedDrafter(Drafter):
    """Proposes the true greedy continuation with one token corrupted at a chosen position, so each
    iteration accepts exactly 0, 1, ..., gamma tokens (gamma = all kept + bonus)."""

    name = "scripted"

    def __init__(self, truth: list[int], prompt_len: int, gamma: int, vocab: int):
        self.truth, self.prompt_len, self.gamma, self.vocab = truth, prompt_len, gamma, vocab
        self.turn = 0
        self.expected: list[int] = []

    def propose(self, ids, max_tokens, sampling, generator):
        pos = len(ids) - self.prompt_len
        want = self.truth[pos: pos + max_tokens]
        bad = self.turn % (self.gamma + 1)
        self.turn += 1
        tokens = list(want)
        if bad < len(tokens):
            tokens[bad] = (tokens[bad] + 1) % self.vocab
        self.expected.append(min(bad, len(tokens)))
        return Proposal(tokens, None, [1.0] * len(tokens), "scripted")


def test_rollback_accept_none_some_all(target_model, tok):
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "rollback test", True)
    cfg = DecodeConfig(gamma=4, max_new_tokens=60)
    truth = vanilla_ids(target, tok, ids, cfg)
    drafter = ScriptedDrafter(truth, len(ids), 4, len(tok))
    events = list(speculative_decode(target, drafter, tok, ids, cfg))
    iters = [e for e in events if isinstance(e, IterationEvent)]
    assert [e.accepted for e in iters] == drafter.expected
    assert {0, 1, 2, 3, 4} <= {e.accepted for e in iters}  # none, some and all (bonus) happened
    assert any(e.correction.kind == "bonus" for e in iters)
    assert events[-1].output_ids == truth
    # the cache holds exactly the KV of the final sequence minus its pending last token
    full = ids + events[-1].output_ids
    assert target.cached == len(full) - 1
    fresh = CachedLM(target_model, len(tok))
    fresh.reset()
    fresh.feed(full[:-1])
    for a, b in zip(target.cache.layers, fresh.cache.layers):
        assert a.keys.shape == b.keys.shape
        assert torch.allclose(a.keys, b.keys, atol=1e-4) and torch.allclose(a.values, b.values, atol=1e-4)


def test_draft_cache_rolls_back(target_model, draft_model, tok):
    target = CachedLM(target_model, len(tok))
    drafter = ModelDrafter(draft_model)
    ids = encode_prompt(tok, "draft cache", True)
    out = list(speculative_decode(target, drafter, tok, ids, DecodeConfig(gamma=5, max_new_tokens=30)))[-1]
    seq = ids + out.output_ids
    assert drafter._seq == seq[: len(drafter._seq)]
    assert drafter.lm.cached == len(drafter._seq)


def check_invariants(events, max_new_tokens):
    start, iters, summary = events[0], events[1:-1], events[-1]
    assert isinstance(start, StartEvent) and isinstance(summary, SummaryEvent)
    assert all(isinstance(e, IterationEvent) for e in iters)
    emitted, proposed, accepted = [], 0, 0
    for i, e in enumerate(iters):
        g = len(e.proposed)
        assert e.index == i
        assert len(e.proposed_text) == len(e.q) == len(e.p) == len(e.accept_prob) == len(e.draws) == g
        assert g <= max(e.gamma, 0)
        assert 0 <= e.accepted <= g
        for pi, qi, a in zip(e.p, e.q, e.accept_prob):
            assert 0 <= pi <= 1 and 0 < qi <= 1
            assert abs(a - min(1.0, pi / qi)) < 1e-6
        for j, d in enumerate(e.draws):
            if j < e.accepted:
                assert d is not None and d < e.accept_prob[j]
            elif j == e.accepted:
                assert d is not None and d >= e.accept_prob[j]
            else:
                assert d is None
        kind = e.correction.kind
        assert kind == ("sample" if g == 0 else "bonus" if e.accepted == g else "resample")
        full = e.proposed[: e.accepted] + [e.correction.token]
        assert e.emitted == full[: len(e.emitted)] and len(e.emitted) >= 1
        assert len(e.emitted_text) == len(e.emitted)
        assert len(e.target_top) == e.accepted + 1  # the positions the rule examined
        emitted += e.emitted
        proposed += g
        accepted += e.accepted
        assert e.tokens_total == len(emitted)
        assert e.proposed_total == proposed and e.accepted_total == accepted
        assert e.draft_ms >= 0 and e.verify_ms > 0
    assert summary.output_ids == emitted
    assert summary.new_tokens == len(emitted) <= max_new_tokens
    assert summary.iterations == len(iters)
    assert summary.proposed == proposed and summary.accepted == accepted
    if proposed:
        assert summary.acceptance_rate == accepted / proposed
    assert sum(k for k, _ in summary.accepted_by_position) == accepted
    return iters


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 5, 0.9)])
def test_event_invariants(temperature, top_k, top_p, target_model, draft_model, tok):
    for kind, make in drafters(target_model, draft_model).items():
        target = CachedLM(target_model, len(tok))
        ids = encode_prompt(tok, "abc abc abc", True)
        cfg = DecodeConfig(gamma=4, max_new_tokens=30, sampling=SamplingConfig(temperature, top_k, top_p), seed=3)
        check_invariants(list(speculative_decode(target, make(), tok, ids, cfg)), 30)
    events = list(vanilla_decode(CachedLM(target_model, len(tok)), tok, ids, cfg))
    iters = check_invariants(events, 30)
    assert all(len(e.emitted) == 1 for e in iters)


def test_events_roundtrip_json(target_model, draft_model, tok):
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "json", True)
    cfg = DecodeConfig(gamma=3, max_new_tokens=12, sampling=SamplingConfig(1.0), seed=1)
    events = list(speculative_decode(target, ModelDrafter(draft_model), tok, ids, cfg))
    back, _, _ = runs_from_json(json.loads(json.dumps(runs_to_json(Trace.of(events)))))
    assert back.events() == events


def test_texts_are_decoded_on_first_read_and_match_the_tokens(target_model, draft_model, tok):
    """A run whose consumer reads only ids and numbers (the bench, a program) never calls the
    tokenizer per iteration; the first read of any text fills all of an event's texts, which are
    then what decoding the tokens in context gives, and copies and pickles carry them."""
    import copy
    import pickle

    from specviz.engine import TokenText

    calls = []

    class Counting:
        def __init__(self, inner):
            self.inner, self.chat_template = inner, getattr(inner, "chat_template", None)

        def decode(self, *a, **k):
            calls.append(a)
            return self.inner.decode(*a, **k)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    ids = encode_prompt(tok, "abc abc abc", True)
    cfg = DecodeConfig(gamma=3, max_new_tokens=16)
    for run in (lambda: speculative_decode(CachedLM(target_model, len(tok)), ModelDrafter(draft_model), Counting(tok),
                                           ids, cfg),
                lambda: vanilla_decode(CachedLM(target_model, len(tok)), Counting(tok), ids, cfg)):
        events = list(run())
        iters = events[1:-1]
        assert len(calls) == 2  # the prompt's text and the summary's, nothing per iteration
        assert all("_later" in e.__dict__ and "_later" in e.correction.__dict__ for e in iters)
        texts, context = TokenText(tok), list(ids)
        for e in iters:
            assert e.emitted_text == texts.pieces(context, e.emitted)
            assert "_later" not in e.__dict__ and "proposed_text" in e.__dict__
            assert e.proposed_text == texts.pieces(context, e.proposed)
            assert e.correction.text == texts.piece(context + e.proposed[: e.accepted], e.correction.token)
            assert [r[1] for r in e.correction.top] == texts.alternatives(context + e.proposed[: e.accepted],
                                                                          [r[0] for r in e.correction.top])
            for i, row in enumerate(e.target_top):
                assert [r[1] for r in row] == texts.alternatives(context + e.proposed[:i], [r[0] for r in row])
            context += e.emitted
        assert "".join(Trace.of(events).output_text) == tok.decode(events[-1].output_ids, skip_special_tokens=False)
        calls.clear()
    fresh = list(speculative_decode(CachedLM(target_model, len(tok)), ModelDrafter(draft_model), tok, ids, cfg))
    for copied in (copy.deepcopy(fresh[1]), pickle.loads(pickle.dumps(fresh[1]))):
        assert "_later" not in copied.__dict__ and copied == fresh[1]
    with pytest.raises(AttributeError):
        fresh[2].no_such_field


def test_seed_reproduces_sampled_output(target_model, draft_model, tok):
    ids = encode_prompt(tok, "seeded", True)

    def run(seed):
        cfg = DecodeConfig(gamma=4, max_new_tokens=40, sampling=SamplingConfig(1.0), seed=seed)
        return list(speculative_decode(CachedLM(target_model, len(tok)), ModelDrafter(draft_model),
                                       tok, ids, cfg))[-1].output_ids

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_stops_at_eos(target_model, tok):
    ids = encode_prompt(tok, "stop here", True)
    cfg = DecodeConfig(gamma=4, max_new_tokens=40)
    truth = vanilla_ids(CachedLM(target_model, len(tok)), tok, ids, cfg)
    stop_token = truth[7]
    target = CachedLM(target_model, len(tok), eos={stop_token})  # the target says what ends a sequence
    want = truth[: truth.index(stop_token) + 1]
    for make in (lambda: PromptLookupDrafter(), lambda: ModelDrafter(target_model)):
        out = list(speculative_decode(target, make(), tok, ids, cfg))[-1]
        assert out.output_ids == want and out.stop_reason == "eos"
    out = list(vanilla_decode(target, tok, ids, cfg))[-1]
    assert out.output_ids == want and out.stop_reason == "eos"


def test_max_new_tokens_is_exact(target_model, tok):
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "count", True)
    for n in (1, 2, 5, 13):
        out = list(speculative_decode(target, ModelDrafter(target_model), tok, ids, DecodeConfig(gamma=6, max_new_tokens=n)))[-1]
        assert out.new_tokens == n and out.stop_reason == "max_new_tokens"


def test_context_limit_caps_generation(target_model, tok):
    target = CachedLM(target_model, len(tok))  # max_position_embeddings = 512
    ids = encode_prompt(tok, "y" * 500, False)
    out = list(speculative_decode(target, PromptLookupDrafter(), tok, ids, DecodeConfig(gamma=4, max_new_tokens=100)))[-1]
    assert len(ids) + out.new_tokens == 512 and out.stop_reason == "context"
    with pytest.raises(SpecvizError, match="context"):
        speculative_decode(target, PromptLookupDrafter(), tok, encode_prompt(tok, "y" * 600, False),
                           DecodeConfig())


def test_consumer_can_stop_and_engine_restarts(target_model, draft_model, tok):
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "stop early", True)
    cfg = DecodeConfig(gamma=3, max_new_tokens=50)
    stream = speculative_decode(target, ModelDrafter(draft_model), tok, ids, cfg)
    seen = [next(stream) for _ in range(3)]
    stream.close()
    assert isinstance(seen[-1], IterationEvent)
    full = list(speculative_decode(target, ModelDrafter(draft_model), tok, ids, cfg))[-1]
    assert full.output_ids == vanilla_ids(target, tok, ids, cfg)


@pytest.mark.parametrize("kwargs,needle", [({"gamma": 0}, "gamma"), ({"gamma": 2.5}, "gamma"),
                                           ({"max_new_tokens": 0}, "max new tokens")])
def test_bad_decode_config(kwargs, needle):
    with pytest.raises(SpecvizError, match=needle):
        DecodeConfig(**kwargs)


def test_empty_prompt_is_refused(tok):
    for bad in ("", "   ", "\n"):
        with pytest.raises(SpecvizError, match="empty"):
            encode_prompt(tok, bad, True)


def test_prompt_lookup_prefers_longest_most_recent_match():
    d = PromptLookupDrafter(max_ngram=3, adaptive=False)
    ids = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 1, 2, 3]
    tokens, n = d.find(ids, 4)
    assert n == 3 and tokens == [9, 9, 5, 2]
    ids = [4, 5, 6, 1, 4, 5, 7, 2, 4, 5]  # "4 5" occurs twice before: take the later one
    tokens, n = d.find(ids, 2)
    assert n == 2 and tokens == [7, 2]
    assert d.find([1, 2, 3, 4], 3) == ([], 0)


def _match_by_scan(ids, max_ngram, min_ngram, max_tokens, max_match, vote=True):
    """The lookup rule spelled out as a scan of every earlier position (the reference)."""
    L = len(ids)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        hits = [h for h in range(L - n) if ids[h:h + n] == ids[L - n:]]
        if not hits:
            continue
        if vote and len(hits) > 1:
            nxt = [ids[h + n] for h in hits]
            most = max(nxt.count(t) for t in nxt)
            hits = [h for h in hits if nxt.count(ids[h + n]) == most]
        best, best_len = hits[-1], -1
        for h in list(reversed(hits))[:64]:
            m = n
            while m < max_match and h - (m - n) - 1 >= 0 and ids[h - (m - n) - 1] == ids[L - m - 1]:
                m += 1
            if m > best_len:
                best, best_len = h, m
        return ids[best + n: best + n + max_tokens], n, best_len
    return [], 0, 0


def test_prompt_lookup_index_follows_a_growing_rewound_and_replaced_sequence():
    """The n-gram index is kept up to date incrementally: the same matches as a full scan while the
    sequence grows, after it is cut back (a rewind), and when another sequence replaces it."""
    import random

    from specviz.drafters.lookup import NgramIndex

    rng = random.Random(0)
    checked = 0
    for vocab, (mx, mn), vote in [(3, (4, 1), True), (5, (2, 1), True), (20, (3, 2), False), (2, (1, 1), True),
                                  (3, (4, 1), False), (200, (4, 1), True)]:
        d = PromptLookupDrafter(max_ngram=mx, min_ngram=mn, adaptive=False, vote=vote)
        seq = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        for _ in range(120):
            r = rng.random()
            if r < 0.1:
                seq = seq[: rng.randrange(1, len(seq) + 1)]
            elif r < 0.15:
                seq = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
            else:
                seq = seq + [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
            k = rng.randrange(0, 12)
            assert d.match(list(seq), k) == _match_by_scan(seq, mx, mn, k, d.MAX_MATCH, vote), (seq, k)
            checked += 1
        fresh = NgramIndex(mx)
        fresh.sync(list(seq))  # what was cut back and extended again equals an index built at once
        assert d._index.ids == fresh.ids and d._index.pos == fresh.pos
    # more than 64 earlier occurrences: only the 64 most recent compete on matched length
    d = PromptLookupDrafter(max_ngram=4, adaptive=False)
    seq = [rng.randrange(2) for _ in range(1500)]
    for _ in range(30):
        seq.append(rng.randrange(2))
        assert d.match(list(seq), 10) == _match_by_scan(seq, 4, 1, 10, d.MAX_MATCH)
    assert checked == 720


def test_early_exit_view_shares_weights(target_model):
    from specviz.backends.transformers import early_exit_view

    view = early_exit_view(target_model, 2)
    assert len(view.model.layers) == 2 and len(target_model.model.layers) == 4
    assert view.lm_head.weight is target_model.lm_head.weight
    assert view.model.layers[0] is target_model.model.layers[0]
    with pytest.raises(SpecvizError, match="early-exit"):
        early_exit_view(target_model, 4)


@pytest.mark.parametrize("cap", [1024, 3])
def test_raw_probabilities_are_the_softmax_of_the_pass_whenever_read(cap, target_model, draft_model, tok,
                                                                     monkeypatch):
    """The inspector's p_raw and target_top are computed from the verify pass's logits when first
    read, or after the run for those never read, or early when more than RawStats.MAX_ROWS rows
    wait: whichever, they are the target's softmax at T=1 at those positions, and after the run no
    event holds logits."""
    from specviz.engine import RawStats

    monkeypatch.setattr(RawStats, "MAX_ROWS", cap)
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "abc abc abc", True)
    cfg = DecodeConfig(gamma=4, max_new_tokens=24, sampling=SamplingConfig(0.8), seed=5)
    stream = speculative_decode(target, ModelDrafter(draft_model), tok, ids, cfg)
    events = []
    for i, ev in enumerate(stream):
        if i == 2 and cap > 100:
            assert list(gc_slots([ev]))  # unread, mid-run: its logits wait
        if i == 3:
            ev.p_raw  # one read as it streams, the rest left for the run's end
        events.append(ev)
    iters = events[1:-1]
    assert not any(s for s in gc_slots(iters))
    context = list(ids)
    for e in iters:
        seq = context + e.proposed
        with torch.no_grad():
            raw = target_model(torch.tensor([seq])).logits[0].float().softmax(-1)
        rows = raw[len(context) - 1:]
        assert torch.allclose(torch.tensor(e.p_raw), rows[range(len(e.proposed)), e.proposed], atol=1e-5)
        assert len(e.target_top) == e.accepted + 1
        for row, top in zip(rows, e.target_top):
            want_p, want_id = row.topk(len(top))
            assert [t[0] for t in top] == want_id.tolist()
            assert torch.allclose(torch.tensor([t[2] for t in top]), want_p, atol=1e-5)
        context += e.emitted


def gc_slots(iters):
    """The logits any event's pending raw statistics still hold (none after a finished run)."""
    for e in iters:
        later = e.__dict__.get("_later")
        cells = getattr(later, "__closure__", None) or ()
        for c in cells:
            v = c.cell_contents
            if isinstance(v, dict) and "logits" in v:
                yield v["logits"]


def test_an_iterations_reason_says_when_the_engine_cut_the_proposal(target_model, tok):
    """A drafter that proposes past the end-of-sequence token, past gamma or past the tokens left:
    the event's reason no longer counts tokens that were never verified (the inspector once said
    'proposing 7' over 3 proposed tokens)."""
    ids = encode_prompt(tok, "stop here", True)
    truth = vanilla_ids(CachedLM(target_model, len(tok)), tok, ids, DecodeConfig(gamma=4, max_new_tokens=40))

    class Overeager(Drafter):
        name = "overeager"

        def propose(self, context, max_tokens, sampling, generator):
            pos = len(context) - len(ids)
            tokens = (truth[pos:] + [0] * 20)[:8]  # ignores max_tokens on purpose
            return Proposal(tokens, None, [1.0] * len(tokens), f"proposing {len(tokens)}")

    def first(cfg, eos=None):
        target = CachedLM(target_model, len(tok), **({"eos": eos} if eos else {}))
        return next(e for e in speculative_decode(target, Overeager(), tok, ids, cfg) if e.event == "iteration")

    plain = first(DecodeConfig(gamma=8, max_new_tokens=40))
    assert len(plain.proposed) == 8 and plain.reason == "proposing 8"  # nothing cut: the drafter's words
    stop = plain.proposed[3]
    e = first(DecodeConfig(gamma=8, max_new_tokens=40), eos={stop})
    n = plain.proposed.index(stop) + 1
    assert len(e.proposed) == n < 8 and e.reason == f"proposing 8; of its 8, only the first {n} verified (cut at the end-of-sequence token)"
    e = first(DecodeConfig(gamma=5, max_new_tokens=40))
    assert len(e.proposed) == 5 and e.reason == "proposing 8; of its 8, only the first 5 verified (cut at γ)"
    e = first(DecodeConfig(gamma=8, max_new_tokens=4))
    assert len(e.proposed) == e.gamma < 8  # room for max_new_tokens, less the token the target adds
    assert e.reason == f"proposing 8; of its 8, only the first {e.gamma} verified (cut at the tokens left to generate)"


def test_the_readme_drafter_example_runs_as_written(target_model, tok, monkeypatch):
    """README's "Adding a drafter" is code a reader copies: it loads, registers through KINDS, is
    found by its shorthand and decodes exactly as vanilla does."""
    import re
    import types
    from pathlib import Path

    from specviz import drafters as pkg

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"```python\n# specviz/drafters/my_drafter.py\n(.*?)```", readme, re.S)
    assert block, "README's drafter example moved: point this test at it"
    mod = types.ModuleType("specviz.drafters.my_drafter")
    mod.__package__ = "specviz.drafters"
    exec(compile(block.group(1), "README.md:my_drafter.py", "exec"), mod.__dict__)
    kind = mod.MyKind()
    monkeypatch.setitem(pkg.KINDS, kind.name, kind)
    assert "mine" in pkg.choices([])  # the app's drafter list
    spec = pkg.parse_drafter("mine", [])  # --draft mine
    assert spec == {"kind": "my_kind"} and pkg.kind("my_kind") is kind  # models.yaml's kind
    drafter = kind.build(spec, None, None)
    target = CachedLM(target_model, len(tok))
    for prompt in PROMPTS[:3]:
        ids = encode_prompt(tok, prompt, True)
        cfg = DecodeConfig(gamma=4, max_new_tokens=30)
        got = list(speculative_decode(target, drafter, tok, ids, cfg))
        assert got[-1].output_ids == vanilla_ids(target, tok, ids, cfg), prompt
        assert any(e.proposed for e in got if isinstance(e, IterationEvent))


def test_reading_an_event_in_another_thread_runs_no_torch_operator(target_model, draft_model, tok):
    """A web page reads each event's deferred fields (texts, raw probabilities) in its handler's
    thread while the run goes on. A torch operator there starts a second OpenMP team, and on a 2-core
    CPU that made every later target pass ~30% slower (the page decoded at 60% of the CLI's speed):
    the fill uses numpy."""
    import threading

    from torch.overrides import TorchFunctionMode

    class Record(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", str(func))
            if name not in ("__get__", "detach", "cpu", "numpy"):  # properties, views: no kernel runs
                self.calls.append(name)
            return func(*args, **(kwargs or {}))

    def in_a_thread(fn):
        box = {}

        def run():
            with Record() as rec:
                box["value"] = fn()
            box["calls"] = rec.calls
        t = threading.Thread(target=run)
        t.start()
        t.join()
        return box

    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "abc abc abc", True)
    cfg = DecodeConfig(gamma=4, max_new_tokens=16, sampling=SamplingConfig(0.8), seed=5)
    calls, read = [], 0
    for ev in speculative_decode(target, ModelDrafter(draft_model), tok, ids, cfg):  # decoded here
        if isinstance(ev, IterationEvent):
            box = in_a_thread(lambda: (ev.p_raw, ev.target_top, ev.proposed_text, ev.emitted_text,
                                       ev.correction.text, ev.correction.top))
            calls += box["calls"]
            read += 1
            assert len(box["value"][1]) == ev.accepted + 1
    assert read >= 2 and calls == []
    assert in_a_thread(lambda: torch.ones(3).softmax(-1))["calls"]  # the recorder sees a thread's torch calls
