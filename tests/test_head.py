"""The trained draft head: its file (safetensors, checked), the hidden-state tap and which position
it reads, exactness (greedy equality with vanilla decoding, the sampled joint law of three tokens),
the cost-aware choice beside lookup, and the kind's errors."""

import copy

import pytest
import torch

from specviz.backends.transformers import CachedLM
from specviz.check import chi_square
from specviz.drafters import HeadDrafter, parse_drafter
from specviz.drafters.head import (FORMAT, DraftHead, HeadKind, HiddenTap, RowProduct, band, chains, fit, load_head,
                                   priors, save_head, unrolled)
from specviz.engine import DecodeConfig, encode_prompt, speculative_decode, vanilla_decode
from specviz.errors import SpecvizError
from specviz.sampling import SamplingConfig
from tests.test_distribution import ALPHA, exact_joint, sample_joint
from tests.test_engine import PROMPTS

COSTS = (1.0, 1.05, 1.1, 1.15, 1.2)


def make_head(model, seed=0, n_vocab=None):
    torch.manual_seed(seed)
    hidden = model.config.hidden_size
    head = DraftHead(hidden, 2 * hidden).eval()
    with torch.no_grad():  # a confident head, its top probability spread over 0.2-1 (every band used)
        head.fc.weight.mul_(10)
        head.down.weight.mul_(10)
        head.n2.weight.mul_(2)
    V = model.config.vocab_size
    vocab = torch.arange(3, V) if n_vocab is None else torch.randperm(V)[:n_vocab]
    return head, vocab


class Eager(HeadDrafter):
    """Trusts its head: chains run to the end (exercises verification of many head tokens)."""

    PRIOR_FIRST = PRIOR_NEXT = (0.99,) * 6


class Picky(HeadDrafter):
    """Chain length depends on the head's top probability band (exercises the stopping rule)."""

    PRIOR_FIRST = (0.1, 0.5, 0.9, 0.95, 0.99, 0.99)
    PRIOR_NEXT = (0.05, 0.3, 0.7, 0.9, 0.99, 0.99)


def drafter(cls, model, tok, lookup=False, seed=0, trained=None, **kw):
    head, vocab = trained if trained is not None else make_head(model, seed, **kw)
    return cls(model, head, vocab, len(tok), lookup=lookup)


JOINT = SamplingConfig(1.0, top_k=3)


@pytest.fixture(scope="module")
def trained(target_model, tok):
    """A head fitted in seconds to the tiny target's own greedy answers and sampled continuations
    of the joint test's prompt: its q overlaps p, so chains get past their first token and every
    position of the sampled law is exercised."""
    target = CachedLM(target_model, len(tok))
    seqs = []
    for prompt in PROMPTS:
        ids = encode_prompt(tok, prompt, True)
        seqs.append(ids + list(vanilla_decode(target, tok, ids, DecodeConfig(max_new_tokens=40)))[-1].output_ids)
    ids = encode_prompt(tok, "joint", True)
    for seed in range(60):
        cfg = DecodeConfig(max_new_tokens=8, sampling=JOINT, seed=seed)
        seqs.append(ids + list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids)
    tap = HiddenTap.of(target_model)
    states = []
    with torch.inference_mode():
        for seq in seqs:
            target_model(input_ids=torch.tensor([seq]))
            states.append(tap.last[0].clone())
    embed = target_model.get_input_embeddings().weight.detach()
    out_w = target_model.get_output_embeddings().weight.detach()
    vocab = torch.arange(3, out_w.shape[0])
    torch.manual_seed(0)
    head = DraftHead(embed.shape[1], 2 * embed.shape[1])
    data = chains(states, [torch.tensor(x) for x in seqs], 3)
    fit(head, embed, out_w[vocab], vocab, data, epochs=40, lr=1e-2, batch=64,
        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, steps = unrolled(head, embed, out_w[vocab], vocab, *data)
    return head.requires_grad_(False), vocab, steps


def test_file_round_trip_and_checks(tmp_path, target_model, tok):
    head, vocab = make_head(target_model)
    path = tmp_path / "head.safetensors"
    save_head(path, head, vocab, model="tiny", priors=[[0.5] * 6, [0.6] * 6])
    back, v2, meta = load_head(path, 64, len(tok))
    assert torch.equal(v2, vocab) and meta["format"] == FORMAT and meta["model"] == "tiny"
    x = torch.randn(64)
    assert torch.allclose(back(x, x), head(x, x).half().float(), atol=2e-2)  # stored as float16
    with pytest.raises(SpecvizError, match="hidden size 64"):
        load_head(path, 128, len(tok))
    with pytest.raises(SpecvizError, match="vocabulary"):
        load_head(path, 64, 10)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    with pytest.raises(SpecvizError, match="could not read draft head"):
        load_head(bad, 64, len(tok))
    pickled = tmp_path / "pickled.pt"
    torch.save(head.state_dict(), pickled)  # a pickle is never unpickled
    with pytest.raises(SpecvizError, match="could not read draft head"):
        load_head(pickled, 64, len(tok))
    from safetensors.torch import save_file

    other = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(other), metadata={"format": "something else"})
    with pytest.raises(SpecvizError, match="not a specviz draft head"):
        load_head(other, 64, len(tok))
    wrong = tmp_path / "wrong.safetensors"
    save_file({"vocab": vocab.int(), "fc.weight": torch.zeros(3, 3)}, str(wrong),
              metadata={"format": FORMAT, "hidden": "64", "ff": "128"})
    with pytest.raises(SpecvizError, match="do not match"):
        load_head(wrong, 64, len(tok))


def test_row_products_store_compact_weights_and_compute_the_product(monkeypatch):
    from specviz.drafters import head as hm

    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(300, 96, generator=g) * 0.05, torch.randn(96, generator=g)
    want = w @ x
    half = RowProduct(w, int8=False)
    assert half.w.dtype == torch.float16 and not half.int8
    assert torch.allclose(half(x), want, rtol=1e-2, atol=1e-3)
    if not hasattr(torch, "_weight_int8pack_mm"):
        pytest.skip("this torch has no weight-only int8 kernel")
    q = RowProduct(w, int8=True)
    assert q.w.dtype == torch.int8 and q.s.shape == (300,) and q.shape == (300, 96)
    err = (q(x) - want).norm() / want.norm()
    assert err < 0.02, err  # int8 weights with bfloat16 activations: ~1% error, not another product
    assert torch.equal(q(x), q(x))  # deterministic: the same state drafts the same q every time
    monkeypatch.setattr(hm, "_INT8_OK", None)
    monkeypatch.setenv("SPECVIZ_HEAD_INT8", "0")
    assert not RowProduct(w).int8  # the switch keeps the float16 products
    monkeypatch.setattr(hm, "_INT8_OK", None)
    monkeypatch.delenv("SPECVIZ_HEAD_INT8")
    assert RowProduct(w).int8 == hm._int8_kernel_works()


def test_head_step_follows_its_float32_forward():
    torch.manual_seed(0)
    head = DraftHead(64, 128).eval().requires_grad_(False)
    for _ in range(5):
        h, e = torch.randn(64), torch.randn(64)
        got, want = head.step(h, e), head(h, e)
        assert torch.nn.functional.cosine_similarity(got, want, 0) > 0.999


def test_tap_keeps_the_final_norm_output(target_model, tok):
    tap = HiddenTap.of(target_model)
    assert HiddenTap.of(target_model) is tap  # one hook per model, however many drafters
    ids = torch.tensor([encode_prompt(tok, "hello there", True)])
    with torch.inference_mode():
        out = target_model(input_ids=ids, output_hidden_states=True)
    assert torch.equal(tap.last, out.hidden_states[-1])


class Recording(Eager):
    def propose(self, ids, max_tokens, sampling, generator):
        self.seen.append((list(ids), self.state(ids)))
        return super().propose(ids, max_tokens, sampling, generator)


def test_head_starts_from_the_state_that_predicted_the_last_token(target_model, tok):
    """At every iteration the head reads the target's final hidden state at position len(ids) - 2,
    as a fresh full pass over the sequence computes it."""
    target = CachedLM(target_model, len(tok))
    d = drafter(Recording, target_model, tok)
    d.seen = []
    ids = encode_prompt(tok, "The cat sat on the mat.", True)
    cfg = DecodeConfig(gamma=4, max_new_tokens=30, costs=COSTS)
    list(speculative_decode(target, d, tok, ids, cfg))
    assert len(d.seen) > 3 and all(h is not None for _, h in d.seen)
    for seq, h in d.seen:
        with torch.inference_mode():
            full = target_model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]
        assert torch.allclose(h, full[len(seq) - 2], atol=1e-4), len(seq)
    # a sequence the latest pass did not compute has no state: the head does not guess
    assert d.state(seq[:-3] + [5, 6, 7]) is None


@pytest.mark.parametrize("cls,lookup", [(Eager, False), (Picky, False), (Picky, True)])
@pytest.mark.parametrize("gamma", [1, 5])
def test_greedy_identical_to_vanilla(cls, lookup, gamma, target_model, tok):
    target = CachedLM(target_model, len(tok))
    proposed = 0
    for prompt in PROMPTS:
        ids = encode_prompt(tok, prompt, True)
        cfg = DecodeConfig(gamma=gamma, max_new_tokens=40, costs=COSTS)
        expected = list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids
        events = list(speculative_decode(target, drafter(cls, target_model, tok, lookup), tok, ids, cfg))
        assert events[-1].output_ids == expected, prompt
        proposed += events[-1].proposed
    assert proposed > 0


def test_fitted_head_drafts_what_the_target_writes(trained, target_model, tok):
    """Training works: on its own data the fitted head's chains are mostly right, its priors rise
    with its confidence, and greedy runs accept most of its tokens (and stay identical)."""
    head, vocab, steps = trained
    acc = [float((s[1] & s[2]).float().mean()) for s in steps]
    assert acc[0] > 0.6 and acc[2] > 0.3, acc
    first, _ = priors(steps)
    assert first[-1] > first[0]
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, PROMPTS[0], True)
    cfg = DecodeConfig(gamma=4, max_new_tokens=40, costs=COSTS)
    end = list(speculative_decode(target, drafter(HeadDrafter, target_model, tok, trained=(head, vocab)),
                                  tok, ids, cfg))[-1]
    assert end.output_ids == list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids
    assert end.proposed >= 10 and end.accepted / end.proposed > 0.5, (end.accepted, end.proposed)


@pytest.mark.parametrize("cls,seed,lookup", [(Eager, 3, False), (Picky, 4, False), (Picky, 5, True)])
def test_joint_of_three_tokens_matches_target(cls, seed, lookup, trained, target_model, tok):
    """Sampled runs drafting from a fitted head's q (real probabilities, top-k applied): the first
    three tokens follow the target's law, also when chain lengths depend on the head's confidence
    and, beside lookup, when the choice of source depends on whether q's most likely token starts
    a match."""
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "joint", True)
    sampling = JOINT
    exact = exact_joint(target, tok, ids, sampling, 3)
    n = 1200
    head = copy.deepcopy(trained[0])
    with torch.no_grad():  # overconfident: q sharper than p, so rejections and resampling happen too
        head.n2.weight.mul_(1.6)
    counts = sample_joint(target, lambda: drafter(cls, target_model, tok, lookup, trained=(head, trained[1])), tok,
                          ids, sampling, 3, n, seed=seed)
    stat, dof, p = chi_square(counts, exact, n)
    assert p > ALPHA, (stat, dof)


def test_sampled_proposals_carry_the_heads_q(target_model, tok):
    target = CachedLM(target_model, len(tok))
    d = drafter(Eager, target_model, tok, n_vocab=40)
    ids = encode_prompt(tok, "The cat sat", True)
    cfg = DecodeConfig(gamma=3, max_new_tokens=12, sampling=SamplingConfig(0.8, top_k=5), seed=1, costs=COSTS)
    its = [e for e in speculative_decode(target, d, tok, ids, cfg) if e.event == "iteration" and e.proposed]
    assert its
    allowed = set(d.vocab.tolist())
    for e in its:
        assert set(e.proposed) <= allowed  # q is zero outside the head's vocabulary
        assert all(0 < q <= 1 for q in e.q) and "draft head" in e.reason


def test_cost_aware_choice(target_model, tok):
    d = drafter(HeadDrafter, target_model, tok)
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "abc abc abc abc", True)
    target.reset()
    target.feed(ids[:-1], keep_logits=1)
    d.reset(ids)
    d.costs = [1.0] + [50.0] * 10  # verifying costs 50 steps: nothing pays
    assert d.propose(ids, 4, SamplingConfig(0.0), None).tokens == []
    d.costs = [1.0] * 11
    p = d.propose(ids, 4, SamplingConfig(0.0), None)
    assert 1 <= len(p.tokens) <= 4 and "draft head" in p.reason
    before = d.keep_chance(band(p.q_raw[0]), first=True)
    for _ in range(30):
        d._bands = [band(p.q_raw[0])]
        d.observe(1, 0)
    assert d.keep_chance(band(p.q_raw[0]), first=True) < before


def test_agreement_with_lookup_moves_the_choice_and_the_estimates(target_model, tok):
    """Where the head's most likely first token starts a match in the prompt or output, the match's
    continuation is proposed (the copy goes on further than the head's chain); where it differs,
    each source's first-token chance is its own prior times the measured factor, learned apart
    from the unconditioned one."""
    d = drafter(HeadDrafter, target_model, tok, lookup=True)
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "The cat sat on the mat", True)
    target.reset()
    target.feed(ids[:-1], keep_logits=1)
    d.reset(ids)
    d.costs = [1.0] * 11
    _, soft, _, _ = d.step(d.state(ids), ids[-1], SamplingConfig(0.0))
    first = int(d.vocab[int(soft.argmax())])
    other = next(t for t in range(3, 50) if t != first)
    copy_of = [first, 11, 12, 13, 14, 15]
    d.candidates = lambda ids, n: [(("context", 4), copy_of[:n], "4-gram match")]
    p = d.propose(ids, 6, SamplingConfig(0.0), None)
    assert p.tokens == copy_of[:len(p.tokens)] and p.tokens and "the head agrees" in p.reason
    assert d._last == ("context", 4, "agree")
    a1_agree, _ = d.estimates(("context", 4, "agree"))
    a1_base, _ = d.estimates(("context", 4))
    a1_differ, _ = d.estimates(("context", 4, "differ"))
    assert a1_agree >= 0.8 > a1_base > a1_differ
    assert a1_differ == pytest.approx(0.87 * a1_base)
    assert d.estimates(("store", 2, "hi", "differ"))[0] == pytest.approx(0.32 * d.estimates(("store", 2, "hi"))[0])
    d.observe(len(p.tokens), 0)  # learned for the relation's key alone
    assert d.estimates(("context", 4, "agree"))[0] < a1_agree
    assert d.estimates(("context", 4))[0] == a1_base
    # a match that starts otherwise: the head's first-token chance is discounted (and learned) apart
    d.candidates = lambda ids, n: [(("context", 4), [other, 11, 12][:n], "4-gram match")]
    assert d.relation(first, d.candidates(ids, 3)) == "differ_context"
    assert d.relation(first, [(("store", 2, "hi"), [other], "")]) == "differ_store"
    assert d.relation(first, []) is None and d.relation(None, d.candidates(ids, 3)) is None
    for b in range(len(d.BANDS)):
        assert d.first_chance(b, "differ_context") == pytest.approx(0.64 * d.keep_chance(b, True))
        assert d.first_chance(b, "agree") >= max(0.45, d.keep_chance(b, True)) - 1e-9
    p = d.propose(ids, 6, SamplingConfig(0.0), None)
    if "draft head" in p.reason:
        assert "lookup differs" in p.reason and d._rel == "differ_context"
        b = d._bands[0]
        before, plain = d.first_chance(b, "differ_context"), d.keep_chance(b, True)
        d.observe(len(p.tokens), 0)
        assert d.first_chance(b, "differ_context") < before and d.keep_chance(b, True) == plain
    else:
        assert p.tokens == [other, 11, 12][:len(p.tokens)] and "differ" not in p.reason.split(",")[0]


def test_kind_parses_checks_and_builds(tmp_path, target_model, tok):
    assert parse_drafter("head", []) == {"kind": "head"}
    assert parse_drafter("head:only", []) == {"kind": "head", "lookup": False}
    with pytest.raises(SpecvizError, match="only"):
        parse_drafter("head:7", [])
    with pytest.raises(SpecvizError, match="lookup"):
        HeadKind().check({"kind": "head", "lookup": "yes"}, "pair x")
    spec = HeadKind().check({"kind": "head", "weights": "h.safetensors"}, "pair x", tmp_path)
    assert spec["weights"] == str(tmp_path / "h.safetensors")

    class Loaded:
        name, model, tokenizer = "tiny", target_model, tok

    with pytest.raises(SpecvizError, match="could not read draft head"):
        HeadKind().build(spec, Loaded, None)
    head, vocab = make_head(target_model)
    save_head(tmp_path / "h.safetensors", head, vocab, model="another-model")
    with pytest.raises(SpecvizError, match="trained for another-model"):
        HeadKind().build(spec, Loaded, None)
    save_head(tmp_path / "h.safetensors", head, vocab, model="tiny", priors=[[0.4] * 6, [0.5] * 6])
    d = HeadKind().build(spec, Loaded, None)
    assert d.PRIOR_FIRST == (0.4,) * 6 and d.describe()["kind"] == "head"
    assert d.describe()["head_products"] == ("int8" if d.out_rows.int8 else "float16")


def test_a_bfloat16_target_drafts_with_its_head_too(target_model, tok):
    """GPUs run bfloat16 (the app's default there): the head (float32) reads a bfloat16 target's
    hidden states and embedding, proposes greedy and sampled tokens with a real q, and greedy output
    equals vanilla decoding's of the same bfloat16 target, or parts from it only at a bfloat16 near tie."""
    from specviz.exactness import compare

    model = copy.deepcopy(target_model).to(torch.bfloat16)
    target = CachedLM(model, len(tok))
    assert target.describe()["dtype"] == "bfloat16"
    proposed = 0
    for prompt in PROMPTS[:3]:
        ids = encode_prompt(tok, prompt, True)
        cfg = DecodeConfig(gamma=4, max_new_tokens=30, costs=COSTS)
        expected = list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids
        end = list(speculative_decode(target, drafter(Eager, model, tok), tok, ids, cfg))[-1]
        proposed += end.proposed
        cmp = compare(target, ids, expected, end.output_ids)
        assert cmp.identical or "near tie (numerics)" in cmp.describe(), cmp.describe()
    assert proposed > 0
    cfg = DecodeConfig(gamma=3, max_new_tokens=12, sampling=SamplingConfig(0.8, top_k=5), seed=1, costs=COSTS)
    its = [e for e in speculative_decode(target, drafter(Eager, model, tok), tok, encode_prompt(tok, "The cat", True), cfg)
           if e.event == "iteration" and e.proposed]
    assert its and all(0 < q <= 1 for e in its for q in e.q)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_the_fixed_copy_chains_the_head_as_far_as_asked(gamma, target_model, tok):
    """The Lab's sweep of fixed γ ran the default pair's drafter with its own length choice: γ 8..16
    all made the same 18 iterations, and a "γ 16" run proposed 0 to 16 tokens. The fixed copy
    proposes exactly γ (or what is left), the head alone, still exactly (greedy equals vanilla, and
    sampled it drafts from the head's q); the original keeps its choice."""
    d = drafter(Picky, target_model, tok, lookup=True)
    f = d.fixed()
    assert f is not d and f.fixed_chain and not f.lookup and not d.fixed_chain and d.lookup
    assert "fixed length" in f.name and "lookup" not in f.name
    target = CachedLM(target_model, len(tok))
    for prompt in PROMPTS[:3]:
        ids = encode_prompt(tok, prompt, True)
        cfg = DecodeConfig(gamma=gamma, max_new_tokens=30, costs=COSTS)
        expected = list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids
        events = list(speculative_decode(target, f, tok, ids, cfg))
        assert events[-1].output_ids == expected, prompt
        its = [e for e in events if e.event == "iteration"]
        made = 0
        for e in its:
            left = cfg.max_new_tokens - made
            assert len(e.proposed) == min(gamma, left - 1), (e.index, e.reason)
            assert "fixed length" in e.reason or not e.proposed
            made += len(e.emitted)
    sampled = DecodeConfig(gamma=gamma, max_new_tokens=12, sampling=SamplingConfig(0.8, top_k=5), seed=1, costs=COSTS)
    its = [e for e in speculative_decode(target, f, tok, encode_prompt(tok, "The cat sat", True), sampled)
           if e.event == "iteration" and e.proposed]
    assert its and all(0 < q <= 1 for e in its for q in e.q)
    # the pair's own drafter still chooses: some iteration proposes fewer than gamma with room left
    own = [e for e in speculative_decode(target, d, tok, encode_prompt(tok, PROMPTS[0], True),
                                         DecodeConfig(gamma=6, max_new_tokens=30, costs=COSTS))
           if e.event == "iteration"]
    assert any(len(e.proposed) < 6 for e in own[:-2])


def test_the_fixed_copy_keeps_the_joint_law_of_three_tokens(trained, target_model, tok):
    """Sampled, the fixed copy's chain (its own code path) drafts from q and the output follows p."""
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "joint", True)
    exact = exact_joint(target, tok, ids, JOINT, 3)
    head = copy.deepcopy(trained[0])
    with torch.no_grad():
        head.n2.weight.mul_(1.6)
    n = 1200
    counts = sample_joint(target, lambda: drafter(Picky, target_model, tok, True, trained=(head, trained[1])).fixed(),
                          tok, ids, JOINT, 3, n, seed=6)
    stat, dof, p = chi_square(counts, exact, n)
    assert p > ALPHA, (stat, dof)
