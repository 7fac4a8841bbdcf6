"""hpclab.core.metrics: throughput statistics, scaling efficiency and the gradient-noise-scale estimator
(fast: no TF, no MPI).

References:

* Throughput the way Horovod's synthetic benchmark reports it
  (horovod/examples/tensorflow2/tensorflow2_synthetic_benchmark.py): drop the warm-up iterations,
  then `np.mean(img_secs)` ± `1.96 * np.std(img_secs)` (population σ).
* Scaling efficiency E(N) = T_N / (N · T_1).
* McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", arXiv:1812.06162,
  appendix A: for a batch of B independent examples, E|G_B|² = |G|² + tr Σ / B, so two batch
  sizes give unbiased estimates of |G|² and tr Σ, and B_simple = tr Σ / |G|².

The estimator is checked against cases whose answer is known by construction: exact
expectations built from a chosen |G|² and tr Σ, and a seeded Monte-Carlo with Gaussian gradient
noise of known covariance.
"""

import math
import statistics

import numpy as np
import pytest

from hpclab.core import metrics
from hpclab.core.metrics import NoiseScale, Throughput, noise_components, throughput_stats

# -- throughput ----------------------------------------------------------------------------------


def test_throughput_skips_warmup_count_then_mean_and_196_sigma():
    values = [50.0, 900.0, 1000.0, 1100.0, 1040.0, 960.0]  # first two are warm-up
    kept = values[2:]
    t = throughput_stats(values, skip=2)
    assert t.n == 4
    assert t.mean == pytest.approx(statistics.fmean(kept))
    assert t.ci95 == pytest.approx(1.96 * statistics.pstdev(kept))


def test_throughput_skip_as_a_fraction():
    values = [1.0, 2.0] + [10.0 + i for i in range(18)]  # 20 values, default skip 10 % -> 2
    t = throughput_stats(values)
    assert t.n == 18
    assert t.mean == pytest.approx(statistics.fmean(values[2:]))
    # 0.25 of 8 values -> drop 2
    t = throughput_stats([0.0, 0.0, 4.0, 4.0, 6.0, 6.0, 4.0, 6.0], skip=0.25)
    assert (t.n, t.mean, t.ci95) == (6, 5.0, pytest.approx(1.96 * 1.0))


def test_throughput_keeps_at_least_one_interval_and_ignores_missing_values():
    t = throughput_stats([1.0, 2.0, 7.0], skip=10)
    assert (t.n, t.mean, t.ci95) == (1, 7.0, 0.0)
    # None / NaN / inf (a window without samples) are dropped before the warm-up is counted
    t = throughput_stats([None, 1.0, float("nan"), 3.0, float("inf"), 5.0], skip=1)
    assert (t.n, t.mean) == (2, 4.0)
    empty = throughput_stats([])
    assert empty.n == 0 and math.isnan(empty.mean) and math.isnan(empty.ci95)


def test_throughput_reads_as_a_sentence():
    assert str(Throughput(12345.6, 78.9, 5)) == "12,346 ± 79 samples/s (n=5)"


# -- scaling efficiency --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "t_n,t_1,n,expected",
    [
        (190.0, 100.0, 2, 190 / 200),  # 95 % of perfect
        (400.0, 100.0, 4, 1.0),  # perfect linear scaling
        (100.0, 100.0, 4, 0.25),  # no gain at all from 4 workers
        (100.0, 100.0, 1, 1.0),
    ],
)
def test_efficiency_by_definition(t_n, t_1, n, expected):
    assert metrics.efficiency(t_n, t_1, n) == pytest.approx(expected)


@pytest.mark.parametrize(
    "t_n,t_1,n",
    [(100.0, 0.0, 2), (100.0, -1.0, 2), (100.0, 50.0, 0), (None, 50.0, 2), (1, None, 2)],
)
def test_efficiency_is_nan_when_undefined(t_n, t_1, n):
    assert math.isnan(metrics.efficiency(t_n, t_1, n))


# -- gradient noise scale: exact expectations ------------------------------------------------------


def _expected_sq_norm(g_sq, trace, batch):
    """McCandlish et al. 2018, appendix A: E|G_B|² = |G|² + tr Σ / B."""
    return g_sq + trace / batch


@pytest.mark.parametrize(
    "g_sq,trace,b_small,b_big",
    [(2.5, 40.0, 8, 64), (0.01, 3.0, 32, 256), (1.0, 1.0, 1, 2), (4.0, 1000.0, 64, 128)],
)
def test_estimator_recovers_known_components(g_sq, trace, b_small, b_big):
    small = _expected_sq_norm(g_sq, trace, b_small)
    big = _expected_sq_norm(g_sq, trace, b_big)
    got_g_sq, got_trace = noise_components(small, big, b_small, b_big)
    assert got_g_sq == pytest.approx(g_sq)
    assert got_trace == pytest.approx(trace)
    ns = NoiseScale(b_small, b_big)
    for _ in range(3):
        ns.update(small, big)
    assert ns.value == pytest.approx(trace / g_sq)  # B_simple = tr Σ / |G|²
    assert ns.count == 3


def test_b_simple_by_hand():
    # |G|² = 2.5, tr Σ = 40, B = 8 and 64: |G_8|² = 2.5 + 5 = 7.5, |G_64|² = 2.5 + 0.625 = 3.125
    ns = NoiseScale(8, 64)
    assert ns.update(7.5, 3.125) == pytest.approx(16.0)


def test_ema_averages_numerator_and_denominator_separately():
    """One noisy step can give a negative |G|² estimate; averaging tr Σ and |G|² separately
    before dividing (as the paper advises) keeps B_simple meaningful."""
    b_small, b_big, d = 8, 32, 0.5
    steps = [(4.0, 2.5), (5.0, 1.0)]  # the second gives |G|² = (32·1 − 8·5)/24 = −1/3
    g_sq = [(b_big * big - b_small * small) / (b_big - b_small) for small, big in steps]
    trace = [(small - big) / (1 / b_small - 1 / b_big) for small, big in steps]
    assert g_sq[1] < 0
    ema_g = d * g_sq[0] + (1 - d) * g_sq[1]
    ema_t = d * trace[0] + (1 - d) * trace[1]
    ns = NoiseScale(b_small, b_big, decay=d)
    for small, big in steps:
        ns.update(small, big)
    assert ns.value == pytest.approx(ema_t / ema_g)
    ratio_of_last_step = trace[1] / g_sq[1]
    assert ratio_of_last_step < 0 < ns.value


def test_estimator_edge_cases():
    assert all(math.isnan(x) for x in noise_components(1.0, 1.0, 64, 64))  # one batch size only
    assert all(math.isnan(x) for x in noise_components(1.0, 1.0, 64, 8))
    ns = NoiseScale(64, 64)
    assert math.isnan(ns.update(2.0, 1.0)) and ns.count == 0  # no estimate, nothing counted
    ns = NoiseScale(8, 32)
    assert math.isnan(ns.update(5.0, 1.0))  # |G|² estimate negative so far: no B_simple yet
    assert math.isnan(NoiseScale(8, 32).value)  # nothing measured


# -- gradient noise scale: Monte-Carlo with a known answer -----------------------------------------


def test_estimator_on_simulated_data_parallel_gradients():
    """Gaussian per-example gradients g_i = G + ξ_i, ξ_i ~ N(0, Σ), Σ diagonal with known trace.

    Four ranks of 16 examples each: a rank's local gradient is the mean of its 16 (B_small = 16),
    the allreduced gradient the mean of all 64 (B_big = 64). |G_small|² is averaged over ranks, as
    the engine does. The sum of 16 Gaussian draws is drawn directly as one Gaussian with Σ/16.
    """
    rng = np.random.default_rng(20181216)
    dim, ranks, b_small, steps = 200, 4, 16, 4000
    b_big = ranks * b_small
    g_sq_true, trace_true = 1.0, 32.0  # B_simple = 32, between the two batch sizes
    G = rng.normal(size=dim)
    G *= math.sqrt(g_sq_true) / np.linalg.norm(G)
    var = rng.uniform(0.2, 1.8, size=dim)
    var *= trace_true / var.sum()  # per-coordinate noise variances, tr Σ = 32

    local_noise = rng.normal(size=(steps, ranks, dim)) * np.sqrt(var / b_small)
    local = G + local_noise  # each rank's gradient over its 16 examples
    global_ = local.mean(axis=1)  # allreduce (average) over ranks: 64 examples
    small_sq = (local**2).sum(axis=2).mean(axis=1)
    big_sq = (global_**2).sum(axis=1)

    g_sq_hat, trace_hat = noise_components(small_sq, big_sq, b_small, b_big)  # vectorised
    for est, truth in ((g_sq_hat, g_sq_true), (trace_hat, trace_true)):
        sem = est.std() / math.sqrt(steps)
        assert abs(est.mean() - truth) < 4 * sem, (est.mean(), truth, sem)
        assert est.mean() == pytest.approx(truth, rel=0.02)
    assert trace_hat.mean() / g_sq_hat.mean() == pytest.approx(trace_true / g_sq_true, rel=0.02)

    ns = NoiseScale(b_small, b_big, decay=0.995)  # what the engine runs, step by step
    for s, b in zip(small_sq, big_sq):
        ns.update(float(s), float(b))
    assert ns.count == steps
    assert ns.value == pytest.approx(trace_true / g_sq_true, rel=0.05)
