"""The critical-batch fit (hpclab/core/critical_batch.py; McCandlish et al. 2018): it recovers
known parameters from noisy synthetic steps within its stated uncertainty, and refuses input that
cannot determine the curve with one sentence naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from hpclab.core.critical_batch import best_per_batch, fit_critical_batch
from hpclab.core.errors import ConfigError

BATCHES = np.array([32, 64, 128, 256, 512, 1024, 2048], dtype=float)
S_MIN, B_CRIT = 200.0, 300.0


def _steps(batches, noise, rng):
    exact = S_MIN * (1 + B_CRIT / batches)
    return exact * np.exp(rng.normal(0.0, noise, batches.size))


def test_exact_points_give_the_parameters_and_the_samples_curve():
    fit = fit_critical_batch(BATCHES, S_MIN * (1 + B_CRIT / BATCHES))
    assert fit.s_min == pytest.approx(S_MIN, rel=1e-6)
    assert fit.b_crit == pytest.approx(B_CRIT, rel=1e-6)
    assert fit.e_min == pytest.approx(S_MIN * B_CRIT, rel=1e-6)
    # E = B·S and (S/S_min − 1)(E/E_min − 1) = 1 (McCandlish et al. 2018, eq. 2.11)
    s, e = fit.predict_steps(BATCHES), fit.predict_samples(BATCHES)
    np.testing.assert_allclose(e, BATCHES * s, rtol=1e-9)
    np.testing.assert_allclose((s / fit.s_min - 1) * (e / fit.e_min - 1), 1.0, rtol=1e-9)
    assert fit.predict_steps(B_CRIT) == pytest.approx(2 * S_MIN, rel=1e-6)
    assert fit.rel_rms < 1e-9 and "B_crit = 300" in fit.describe()


def test_the_stated_uncertainty_covers_the_truth_as_often_as_it_claims():
    """Over many noisy draws (5 % relative noise), B_crit lands within two of its own standard
    errors of the truth about 95 % of the time, and within three nearly always."""
    rng = np.random.default_rng(0)
    z = []
    for _ in range(300):
        fit = fit_critical_batch(BATCHES, _steps(BATCHES, 0.05, rng))
        z.append((fit.b_crit - B_CRIT) / fit.b_crit_se)
    z = np.abs(np.array(z))
    assert np.mean(z < 2) > 0.85, np.mean(z < 2)
    assert np.mean(z < 3) > 0.95, np.mean(z < 3)


def test_one_noisy_fit_recovers_both_parameters_within_three_standard_errors():
    fit = fit_critical_batch(BATCHES, _steps(BATCHES, 0.05, np.random.default_rng(7)))
    assert abs(fit.b_crit - B_CRIT) < 3 * fit.b_crit_se
    assert abs(fit.s_min - S_MIN) < 3 * fit.s_min_se
    assert 0 < fit.b_crit_se < 0.5 * fit.b_crit  # informative, not vacuous
    band = fit.steps_se(BATCHES)
    assert band.shape == BATCHES.shape and np.all(band > 0)


def test_b_crit_is_compared_with_b_simple_and_the_ratio_stated():
    fit = fit_critical_batch(BATCHES, _steps(BATCHES, 0.05, np.random.default_rng(1)))
    near = fit.compare_b_simple(B_CRIT)
    assert near["ratio"] == pytest.approx(fit.b_crit / B_CRIT)
    far = fit.compare_b_simple(B_CRIT / 10)
    assert far["ratio"] > 5 and "larger than B_simple" in far["sentence"]
    with pytest.raises(ConfigError, match="b_simple must be"):
        fit.compare_b_simple(0.0)


@pytest.mark.parametrize(
    "batches, steps, words",
    [
        ([64, 128], [300, 200], "at least 3 different"),
        ([64, 64, 128], [300, 310, 200], "at least 3 different"),
        ([64, 128, 256], [300, 200], "same length"),
        ([64, 128, 256], [300, None, 150], "steps must all be finite"),
        ([64, -128, 256], [300, 200, 150], "batches must all be finite"),
        ([64, 128, 256], [100, 120, 150], "must fall as the batch grows"),
        ([64, 128, 256], [400, 190, 90], "fall as fast as 1/B or faster"),
    ],
)
def test_degenerate_input_is_refused_with_one_sentence(batches, steps, words):
    with pytest.raises(ConfigError, match=words):
        fit_critical_batch(batches, steps)


def test_best_per_batch_picks_the_fewest_steps_and_flags_the_grid_edge():
    rows = [
        (64, 0.05, 500), (64, 0.1, 400), (64, 0.2, 450),  # bracketed
        (128, 0.1, 300), (128, 0.2, 250), (128, 0.4, None),  # best at the top that reached
        (256, 0.1, None), (256, 0.2, None),  # never reached: left out
    ]  # fmt: skip
    best = best_per_batch(rows)
    assert [(b.batch, b.lr, b.steps, b.at_edge) for b in best] == [
        (64, 0.1, 400.0, False),
        (128, 0.2, 250.0, False),
    ]
    edge = best_per_batch([(64, 0.05, 300), (64, 0.1, 400)])
    assert edge[0].at_edge and edge[0].tried == 2
