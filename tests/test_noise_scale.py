"""The gradient noise scale against a known answer (hpclab issue 11, item 5).

McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", arXiv:1812.06162,
appendix A: B_simple = tr Σ / |G|², estimated from squared gradient norms at two batch sizes.

The known answer: softmax regression (model ``linear``) at its zero initialisation on
class-conditional Gaussians (data set ``blobs``), where |G|² and tr Σ are a closed form
(:func:`hpclab.core.metrics.softmax_zero_noise_components`). The chain of checks:

1. the closed form equals the moments of per-sample gradients that TensorFlow computes for the
   ``linear`` model with the trainer's loss (the derivation is right);
2. the estimator's formulas recover |G|² and tr Σ from simulated per-sample gradients (the
   formulas are right);
3. a real 2-rank run (MPI engines, Horovod) lands within 25 % of the closed form (the trainer
   measures the right norms at the right batch sizes).
"""

import math
import time

import numpy as np
import pytest

from hpclab.core.catalog import DATASETS, MODELS, NUM_CLASSES, models_for
from hpclab.core.config import RunConfig
from hpclab.core.metrics import (
    NoiseScale,
    noise_components,
    softmax_zero_noise_components,
    softmax_zero_noise_scale,
)
from hpclab.rank import data

SEED = 0


def _cfg(**kw):
    return RunConfig(dataset="blobs", model="linear", **kw).to_dict()


def _finite_sample_components(x, y, num_classes):
    """Exact (|G|², tr Σ) at zero weights when the arrays themselves are the population:
    G = mean of x_i (p − e_{y_i})ᵀ (and of p − e_{y_i} for the bias); E|g|² = (1 − 1/C)(mean |x_i|²
    + 1), as in :func:`softmax_zero_noise_components`."""
    x = np.asarray(x, np.float64)
    p = np.full(num_classes, 1.0 / num_classes)
    onehot = np.eye(num_classes)[y]
    g_kernel = x.T @ (p - onehot) / len(x)
    g_bias = (p - onehot).mean(axis=0)
    g_sq = float((g_kernel**2).sum() + (g_bias**2).sum())
    mean_sq = (1 - 1 / num_classes) * (float((x**2).sum(axis=1).mean()) + 1.0)
    return g_sq, mean_sq - g_sq


# -- the blobs data set and the linear model ------------------------------------------------------


def test_blobs_and_linear_are_in_the_catalogue():
    assert "blobs" in DATASETS and "linear" in MODELS
    assert "linear" in models_for("blobs") and "mlp" in models_for("blobs")
    assert "linear" in models_for("mnist1d") and "linear" in models_for("cifar10")
    RunConfig(dataset="blobs", model="linear")  # a valid pair


def test_blobs_parameters_are_seeded():
    means, sigma = data.blobs_parameters(SEED)
    assert means.shape == (NUM_CLASSES, data.BLOBS_DIM) == (10, 40)
    np.testing.assert_allclose(np.linalg.norm(means, axis=1), data.BLOBS_MEAN_NORM)
    assert sigma == data.BLOBS_SIGMA
    np.testing.assert_array_equal(means, data.blobs_parameters(SEED)[0])
    assert not np.allclose(means, data.blobs_parameters(SEED + 1)[0])
    assert 50 < softmax_zero_noise_scale(means, sigma) < 300  # between usual per-rank batches


def test_blobs_arrays_split_balance_and_statistics():
    cfg = RunConfig(dataset="blobs", model="linear", num_samples=20005, seed=SEED)
    a = data.load_arrays(cfg.to_dict(), "/nonexistent")  # in memory: no data dir needed
    assert a.x_train.shape == (cfg.train_size(), 40) and a.x_val.shape == (
        cfg.validation_size(),
        40,
    )
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int32
    assert (a.num_classes, a.input_shape) == (10, (40,))
    for y in (a.y_train, a.y_val):  # balanced: class counts differ by at most one
        counts = np.bincount(y, minlength=10)
        assert counts.max() - counts.min() <= 1
    assert len(set(a.y_train[:10].tolist())) > 1  # shuffled, not sorted by class
    means, sigma = data.blobs_parameters(SEED)
    for c in range(10):
        xc = a.x_train[a.y_train == c]
        np.testing.assert_allclose(xc.mean(axis=0), means[c], atol=5 * sigma / math.sqrt(len(xc)))
        assert (xc - means[c]).std() == pytest.approx(sigma, rel=0.02)
    again = data.load_arrays(cfg.to_dict(), "/nonexistent")
    np.testing.assert_array_equal(a.x_train, again.x_train)
    other = data.load_arrays(cfg.replace(seed=SEED + 1).to_dict(), "/nonexistent")
    assert not np.array_equal(a.x_train, other.x_train)


@pytest.fixture(scope="module")
def tf_float32():
    tf = pytest.importorskip("tensorflow")
    from hpclab.rank.optimizers import set_precision

    set_precision("float32")
    return tf


def test_linear_model_starts_at_zero_with_float32_logits(tf_float32):
    from hpclab.rank.models import build_model

    model = build_model("linear", (40,), 10, seed=7)
    assert model.count_params() == 40 * 10 + 10
    assert all(not np.any(w) for w in model.get_weights())  # zero whatever the seed
    out = model(np.random.default_rng(0).normal(size=(4, 40)).astype(np.float32))
    assert out.dtype == tf_float32.float32 and not np.any(out.numpy())  # softmax uniform
    assert build_model("linear", (28, 28, 1), 10).count_params() == 784 * 10 + 10


# -- 1. the closed form is the truth ----------------------------------------------------------------


def test_closed_form_matches_tensorflow_per_sample_gradients(tf_float32):
    """Per-sample gradients of the trainer's loss on the ``linear`` model at zero weights, from
    TensorFlow: their mean and mean squared norm over many samples are the closed form."""
    tf = tf_float32
    from hpclab.rank.models import build_model

    cfg = _cfg(num_samples=50000, seed=SEED)
    a = data.load_arrays(cfg, "/nonexistent")
    x = np.concatenate([a.x_train, a.x_val])
    y = np.concatenate([a.y_train, a.y_val])
    model = build_model("linear", a.input_shape, a.num_classes)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)  # the trainer's

    @tf.function
    def per_sample_grads(xb, yb):
        def one(args):
            xi, yi = args
            with tf.GradientTape() as tape:
                loss = loss_fn(yi[None], model(xi[None]))
            return tf.concat([tf.reshape(g, [-1]) for g in tape.gradient(loss, model.weights)], 0)

        return tf.vectorized_map(one, (xb, yb))

    grads = np.concatenate(
        [per_sample_grads(x[i : i + 5000], y[i : i + 5000]).numpy() for i in range(0, len(x), 5000)]
    ).astype(np.float64)
    assert grads.shape == (len(x), 410)

    # The trainer's batch gradient is the mean of the per-sample gradients (loss averaged).
    with tf.GradientTape() as tape:
        batch_loss = loss_fn(y[:256], model(x[:256]))
    batch = np.concatenate([g.numpy().ravel() for g in tape.gradient(batch_loss, model.weights)])
    np.testing.assert_allclose(batch, grads[:256].mean(axis=0), atol=1e-6)

    # Finite-sample moments of TensorFlow's gradients = the finite-sample formula, exactly.
    g_mean = grads.mean(axis=0)
    g_sq_tf = float(g_mean @ g_mean)
    trace_tf = float((grads**2).sum(axis=1).mean()) - g_sq_tf
    g_sq_fs, trace_fs = _finite_sample_components(x, y, 10)
    assert g_sq_tf == pytest.approx(g_sq_fs, rel=1e-4)
    assert trace_tf == pytest.approx(trace_fs, rel=1e-5)

    # ... and, as N grows, the population closed form. |Ĝ|² over N samples is biased up by
    # tr Σ / N (appendix A again, with B = N): remove it, then compare.
    g_sq, trace = softmax_zero_noise_components(*data.blobs_parameters(SEED))
    n = len(x)
    assert g_sq_tf - trace_tf / n == pytest.approx(g_sq, rel=0.02)
    assert trace_tf == pytest.approx(trace, rel=0.01)
    assert (trace_tf / (g_sq_tf - trace_tf / n)) == pytest.approx(trace / g_sq, rel=0.03)


def test_closed_form_by_hand_two_classes_in_one_dimension():
    # C = 2, d = 1, μ = ±1, σ = 0: x̄ = 0, |G|² = (1 + 1)/4 = 1/2;
    # E|g|² = (1 − 1/2)(1 + 0 + 1) = 1, tr Σ = 1/2, B_simple = 1.
    g_sq, trace = softmax_zero_noise_components(np.array([[1.0], [-1.0]]), 0.0)
    assert (g_sq, trace) == (pytest.approx(0.5), pytest.approx(0.5))
    # σ = 2 adds d σ² = 4 to E|x|²: E|g|² = 3, tr Σ = 2.5, B_simple = 5.
    assert softmax_zero_noise_scale(np.array([[1.0], [-1.0]]), 2.0) == pytest.approx(5.0)


# -- 2. the estimator's formulas ----------------------------------------------------------------------


def test_estimator_recovers_components_from_simulated_per_sample_gradients():
    """Per-sample gradients g_i ~ N(G, Σ) with a full covariance Σ = A Aᵀ, drawn one by one; two
    ranks of B_small each, |G_small|² averaged over the ranks and |G_big|² the norm of their mean
    (what the trainer measures around the allreduce). Averaged over many steps, the estimates are
    |G|² and tr Σ (McCandlish et al. 2018, eqs. A.2-A.3: unbiased for any distribution)."""
    rng = np.random.default_rng(1812)
    dim, ranks, b_small, steps = 100, 2, 16, 4000
    b_big = ranks * b_small
    G = rng.normal(size=dim) * 0.2
    A = rng.normal(size=(dim, dim)) / math.sqrt(dim)
    g_sq_true, trace_true = float(G @ G), float(np.trace(A @ A.T))  # B_simple ≈ 25: bracketed
    assert b_small < trace_true / g_sq_true < b_big

    per_sample = G + rng.normal(size=(steps, ranks, b_small, dim)) @ A.T
    local = per_sample.mean(axis=2)  # each rank's batch gradient
    small_sq = (local**2).sum(axis=2).mean(axis=1)
    big_sq = (local.mean(axis=1) ** 2).sum(axis=1)
    g_sq_hat, trace_hat = noise_components(small_sq, big_sq, b_small, b_big)
    # (relative standard errors over seeds: 0.5 %, 0.4 %, 0.25 %; tolerances ~6 σ)
    assert g_sq_hat.mean() == pytest.approx(g_sq_true, rel=0.03)
    assert trace_hat.mean() == pytest.approx(trace_true, rel=0.02)
    # The naive norms are biased: |G_big|² alone overstates |G|² by tr Σ / B_big.
    assert big_sq.mean() == pytest.approx(g_sq_true + trace_true / b_big, rel=0.015)
    assert big_sq.mean() > 1.5 * g_sq_true

    # The trainer's EMA (decay 0.95: about the last 40 steps) scatters by ~7 % around the truth
    # in this low-dimensional problem; its trajectory, averaged, sits on it.
    ns = NoiseScale(b_small, b_big)
    values = [ns.update(float(s), float(b)) for s, b in zip(small_sq, big_sq)]
    assert ns.value == pytest.approx(trace_true / g_sq_true, rel=0.3)
    assert np.mean(values[100:]) == pytest.approx(trace_true / g_sq_true, rel=0.05)


def test_noise_scale_ema_on_constant_then_switched_input():
    """A constant input gives its B_simple from the first update (the EMA starts at the first
    estimate, not at zero: no start-up bias); after a switch, |G|² and tr Σ each relax to the new
    values geometrically, by the decay d per update."""
    b_small, b_big, d = 16, 64, 0.9

    def norms(g_sq, trace):
        return g_sq + trace / b_small, g_sq + trace / b_big

    ns = NoiseScale(b_small, b_big, decay=d)
    for _ in range(5):
        assert ns.update(*norms(1.0, 50.0)) == pytest.approx(50.0)
    for k in range(1, 60):
        value = ns.update(*norms(2.0, 40.0))
        g_sq = 2.0 + (1.0 - 2.0) * d**k
        trace = 40.0 + (50.0 - 40.0) * d**k
        assert value == pytest.approx(trace / g_sq)
    assert ns.count == 64 and ns.value == pytest.approx(20.0, rel=0.02)


# -- 3. a real 2-rank run --------------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.slow
def test_two_rank_run_estimates_the_true_noise_scale(lab):
    """Weights held at ~0 (a tiny LR: 400 steps move them by ~1e-5), every step sampled
    (``steps_per_call=1``): B_small = 64 and B_big = 128 bracket the true B_simple ≈ 108."""
    cfg = RunConfig(
        dataset="blobs",
        model="linear",
        num_samples=40000,  # 32000 for training: 250 steps of 2 x 64 an epoch
        batch_per_worker=64,
        epochs=1.6,
        optimizer="sgd",
        momentum=0.0,
        base_lr=1e-7,
        base_batch=128,
        lr_scaling="none",
        warmup_epochs=0,
        steps_per_call=1,
        seed=SEED,
    )
    t0 = time.perf_counter()
    run = lab.run(cfg)
    summary = run.wait(timeout=300)
    elapsed = time.perf_counter() - t0
    # (loss ≈ ln 10, yet not `collapsed`: the tiny weights already point the right way, so the
    # argmax classifies well above chance)
    assert run.status == "finished" and summary["steps"] == 400

    means, sigma = data.blobs_parameters(SEED)
    g_sq, trace = softmax_zero_noise_components(means, sigma)
    true = trace / g_sq
    a = data.load_arrays(cfg.to_dict(), "/nonexistent")
    g_sq_fs, trace_fs = _finite_sample_components(a.x_train, a.y_train, a.num_classes)
    finite = trace_fs / g_sq_fs

    estimate = summary["noise_scale"]
    # Run-long means of the two norms, from the history (each row averages its window's steps).
    h = run.history.dropna(subset=["grad_norm_small_sq", "grad_norm_big_sq"])
    steps = np.diff(np.concatenate([[0], h["step"].to_numpy()]))
    small = np.average(h["grad_norm_small_sq"], weights=steps)
    big = np.average(h["grad_norm_big_sq"], weights=steps)
    g_sq_run, trace_run = noise_components(small, big, 64, 128)
    print(
        f"\nB_simple: true {true:.1f} (training arrays {finite:.1f}), EMA estimate {estimate:.1f} "
        f"({estimate / true - 1:+.1%}), run-long {trace_run / g_sq_run:.1f} "
        f"({trace_run / g_sq_run / true - 1:+.1%}); |G|² {g_sq:.4f} vs {g_sq_run:.4f}, "
        f"tr Σ {trace:.2f} vs {trace_run:.2f}; {len(h)} rows; run {elapsed:.1f} s"
    )
    assert estimate == pytest.approx(true, rel=0.25)
    assert trace_run / g_sq_run == pytest.approx(true, rel=0.25)
    # The two measured norms themselves: E|G_B|² = |G|² + tr Σ / B at B = 64 and 128.
    assert small == pytest.approx(g_sq + trace / 64, rel=0.05)
    assert big == pytest.approx(g_sq + trace / 128, rel=0.05)
