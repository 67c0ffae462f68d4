import math

import pytest

from specviz.theory import accepted_length_pmf, best_gamma, expected_tokens, predicted_speedup


def test_expected_tokens_closed_form_matches_pmf():
    for a in (0.0, 0.3, 0.8, 0.99):
        for g in (1, 4, 8):
            pmf = accepted_length_pmf(a, g)
            assert math.isclose(sum(pmf), 1.0)
            mean = sum((k + 1) * pk for k, pk in enumerate(pmf))  # k kept + the target's own token
            assert math.isclose(mean, expected_tokens(a, g))


def test_edges():
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.0, 4) == 1
    assert predicted_speedup(0.0, 4, 0.0, 1.0) == 1.0
    with pytest.raises(ValueError):
        expected_tokens(1.5, 2)


def test_paper_example():
    # Leviathan et al. Fig./Table: a = 0.8, gamma = 4 gives ~3.36 tokens per iteration
    assert math.isclose(expected_tokens(0.8, 4), 3.3616, rel_tol=1e-4)
    assert math.isclose(predicted_speedup(0.8, 4, 0.05, 1.0), 3.3616 / 1.2, rel_tol=1e-4)


def test_best_gamma_grows_with_acceptance_and_shrinks_with_cost():
    g_lo, _ = best_gamma(0.5, 0.1)
    g_hi, _ = best_gamma(0.9, 0.1)
    assert g_hi > g_lo
    g_cheap, _ = best_gamma(0.8, 0.01)
    g_dear, _ = best_gamma(0.8, 0.3)
    assert g_cheap > g_dear


def test_best_gamma_with_verify_cost_table():
    v = [1.0, 1.1, 1.1, 1.2, 1.6, 1.6, 1.7, 1.8, 1.8]
    g, s = best_gamma(0.7, 0.0, v, max_gamma=8)
    assert s == max(predicted_speedup(0.7, k, 0.0, v[k]) for k in range(1, 9))
