"""The retrieval datastore: exact n-gram search, majority continuations, files, and the drafter
that combines it with prompt lookup (still exact against vanilla decoding)."""

import numpy as np
import pytest

from specviz.drafters.datastore import SEP, Datastore, load_datastore, save_datastore
from specviz.drafters import PromptLookupDrafter
from specviz.engine import DecodeConfig, encode_prompt, speculative_decode, vanilla_decode
from specviz.errors import SpecvizError
from specviz.backends.transformers import CachedLM
from specviz.pipeline import build_drafter as make_drafter
from specviz.registry import parse


def store_of(*seqs, max_ngram=4):
    flat = []
    for s in seqs:
        flat += list(s) + [SEP]
    return Datastore(np.array(flat), max_ngram)


def test_longest_suffix_and_majority_continuation():
    d = store_of([5, 6, 7, 8, 9], [5, 6, 7, 1, 2], [3, 5, 6, 7, 8, 4])
    m = d.find([0, 5, 6, 7], 5)
    assert (m.n, m.support, m.tokens[0]) == (3, 3, 8) and m.share == pytest.approx(2 / 3)
    m = d.find([99, 6, 7], 5)  # "99 6 7" unseen: falls back to "6 7"
    assert m.n == 2 and m.tokens[0] == 8
    assert d.find([4], 3) is None  # "4" only ever ends a sequence: nothing follows it
    assert d.find([77], 3) is None
    assert d.find([5, 6], 0) is None and d.find([], 3) is None


def test_continuation_stops_at_sequence_ends_and_without_majority():
    d = store_of([1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4, 7])
    m = d.find([1, 2], 10)
    assert m.tokens[:2] == [3, 4] and m.share == 1.0
    assert len(m.tokens) == 2  # 5, 6, 7 after "3 4": no majority, stop
    assert store_of([1, 2, 3]).find([1], 10).tokens == [2, 3]  # never crosses the separator


def test_keys_are_exact_for_large_vocabularies():
    big = 150_000  # 18 bits per id: at most 3 ids per 64-bit key
    d = store_of([big, big - 1, 7, 8], [big - 1, big, 7, 9])
    assert d.max_ngram == 3
    assert d.find([big, big - 1, 7], 2).tokens == [8]
    assert d.find([big - 1, big, 7], 2).tokens == [9]
    assert d.find([big + 5], 2) is None


def test_following_in_python_chooses_as_numpy_does(monkeypatch):
    """``_follow`` switches from numpy to plain Python once few continuations are left: all numpy
    and all Python give the same continuation, support and share on random stores (ties between
    equally common tokens go to the smaller id either way)."""
    import random

    rng = random.Random(3)
    checked = 0
    for vocab in (2, 3, 7, 40):
        seqs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 25))] for _ in range(60)]
        d = store_of(*seqs)
        for _ in range(60):
            ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
            k = rng.randrange(1, 12)
            monkeypatch.setattr(Datastore, "FEW", 0)
            in_python = d.find(ids, k)
            monkeypatch.setattr(Datastore, "FEW", 10**9)
            in_numpy = d.find(ids, k)
            assert (in_python is None) == (in_numpy is None)
            if in_numpy is not None:
                assert in_python.__dict__ == in_numpy.__dict__
                checked += 1
    assert checked > 100


def test_roundtrip_file_and_bad_file(tmp_path):
    path = tmp_path / "store.npz"
    save_datastore(path, [[1, 2, 3], [4, 5]], vocab_size=50)
    d = load_datastore(path)
    assert len(d) == 5 and d.meta["vocab_size"] == 50
    assert d.find([1, 2], 4).tokens == [3]
    (tmp_path / "bad.npz").write_text("not a datastore")
    with pytest.raises(SpecvizError, match="could not read datastore"):
        load_datastore(tmp_path / "bad.npz")


def test_drafter_uses_the_store_when_the_context_has_nothing():
    store = store_of(*[[10, 11, 12, 13, 14, 15]] * 6)
    d = PromptLookupDrafter(max_ngram=3, datastore=store)
    d.costs = [1.0] * 8  # free verification: propose all the match offers
    p = d.propose([1, 2, 10, 11, 12], 4, None, None)
    assert p.tokens == [13, 14, 15] and "datastore 3-gram" in p.reason and "100% of 6" in p.reason
    d.observe(3, 0)
    assert d._first[("store", 3, "hi")] == [0.0, 1.0]
    # after that refusal, a 3-gram match in the context itself looks more promising
    p = d.propose([10, 11, 12, 99, 10, 11, 12], 4, None, None)
    assert p.tokens[0] == 99 and "datastore" not in p.reason


def test_greedy_identical_with_datastore_drafter(target_model, tok):
    target = CachedLM(target_model, len(tok))
    cfg = DecodeConfig(gamma=6, max_new_tokens=40)
    prompts = ["hello hello hello world", "The cat sat on the mat. The cat", "abc abc abc abc"]
    answers = []
    for prompt in prompts:  # the store: the target's own answers, as the build script makes it
        ids = encode_prompt(tok, prompt, True)
        answers.append(ids[-4:] + list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids)
    store = store_of(*answers)
    reasons = []
    for prompt in prompts + ["x", "1, 2, 3, 4"]:
        ids = encode_prompt(tok, prompt, True)
        expected = list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids
        drafter = PromptLookupDrafter(3, datastore=store)
        events = list(speculative_decode(target, drafter, tok, ids, cfg))
        assert events[-1].output_ids == expected, prompt
        reasons += [e.reason for e in events if e.event == "iteration" and e.proposed]
    assert any("datastore" in r for r in reasons)  # the store's proposals were verified too


def test_registry_resolves_the_path_and_checks_the_vocabulary(tmp_path, target_model, tok):
    save_datastore(tmp_path / "s.npz", [[1, 2, 3]], vocab_size=len(tok) + 1)
    data = {"models": {"m": {"sources": [{"hub": "a/b"}]}},
            "pairs": {"p": {"target": "m", "drafter": {"kind": "prompt_lookup", "datastore": "s.npz"}}}}
    reg = parse(data, tmp_path)
    assert reg.pair("p").drafter["datastore"] == str(tmp_path / "s.npz")

    class Target:
        name, model, tokenizer = "m", target_model, tok

    with pytest.raises(SpecvizError, match="built for a vocabulary"):
        make_drafter(reg.pair("p").drafter, Target, None)
    data["pairs"]["p"]["drafter"] = {"kind": "early_exit", "layers": 2, "datastore": "s.npz"}
    with pytest.raises(SpecvizError, match="only a prompt_lookup"):
        parse(data, tmp_path)


def test_lookup_prefers_the_occurrence_that_matches_further_back():
    d = PromptLookupDrafter(max_ngram=2, adaptive=False)
    # "7 8" occurs twice, both followed by 9; the older one is preceded by "5 6" like the suffix
    ids = [5, 6, 7, 8, 9, 1, 2, 3, 4, 7, 8, 9, 0, 5, 6, 7, 8]
    tokens, n, length = d.match(ids, 3)
    assert n == 2 and length == 4 and tokens == [9, 1, 2]
    assert d.length_band(length) == 4 and d.length_band(1) == 1 and d.length_band(30) == 10
    d.costs = [1.0] * 11
    d.adaptive = True
    assert "matching 4 tokens back" in d.propose(ids, 3, None, None).reason
