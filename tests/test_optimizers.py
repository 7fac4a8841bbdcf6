"""LARS, LAMB, TableSchedule, build_optimizer and set_precision (real TF on CPU, no MPI).

The TensorFlow optimizers are checked step by step against the NumPy references in
hpclab.core.scaling (lars_update_reference, lamb_update_reference).
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from hpclab.core import scaling
from hpclab.core.config import RunConfig
from hpclab.rank.optimizers import (
    DEFAULT_EXCLUDE,
    LAMB,
    LARS,
    TableSchedule,
    build_optimizer,
    set_precision,
)


@pytest.fixture(autouse=True)
def float32_policy():
    set_precision("float32")
    yield
    set_precision("float32")


def _dense(kernel, bias):
    """A Dense(3) on 4 inputs with the given weights; variable names dense*/kernel:0, .../bias:0."""
    layer = tf.keras.layers.Dense(3)
    layer.build((None, 4))
    layer.kernel.assign(kernel)
    layer.bias.assign(bias)
    return layer


def _grads(layer, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(layer(x) - y))
    return tape.gradient(loss, [layer.kernel, layer.bias])


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=(4, 3)).astype(np.float32)
    bias = rng.normal(size=(3,)).astype(np.float32)
    x = tf.constant(rng.normal(size=(8, 4)).astype(np.float32))
    y = tf.constant(rng.normal(size=(8, 3)).astype(np.float32))
    return kernel, bias, x, y


def test_real_keras_variable_names_are_excluded_by_default():
    layer = _dense(np.zeros((4, 3), np.float32), np.zeros(3, np.float32))
    assert layer.kernel.name.endswith("kernel:0") and layer.bias.name.endswith("bias:0")
    bn = tf.keras.layers.BatchNormalization()
    bn.build((None, 4))
    conv = tf.keras.layers.Conv1D(2, 3)
    conv.build((None, 10, 1))
    opt = LARS(0.1)
    assert opt._adapts(layer.kernel) and opt._adapts(conv.kernel)
    for var in (layer.bias, conv.bias, bn.gamma, bn.beta):
        assert not opt._adapts(var), var.name
    assert "bias" in DEFAULT_EXCLUDE and "gamma" in DEFAULT_EXCLUDE


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_lars_two_steps_match_reference(problem, weight_decay):
    kernel, bias, x, y = problem
    layer = _dense(kernel, bias)
    lr, momentum, eta = 0.5, 0.9, 0.01
    opt = LARS(lr, momentum=momentum, weight_decay=weight_decay, eta=eta)
    ref = {
        "kernel": (kernel.astype(np.float64), np.zeros_like(kernel, np.float64)),
        "bias": (bias.astype(np.float64), np.zeros_like(bias, np.float64)),
    }
    for _ in range(2):  # the second step carries the velocity of the first
        gk, gb = _grads(layer, x, y)
        for key, g, excluded in (("kernel", gk, False), ("bias", gb, True)):
            w, v = ref[key]
            w, v, trust = scaling.lars_update_reference(
                w,
                g.numpy(),
                v,
                lr=lr,
                momentum=momentum,
                weight_decay=weight_decay,
                eta=eta,
                excluded=excluded,
            )
            ref[key] = (w, v)
            if excluded:
                assert trust == 1.0
            else:
                assert trust != pytest.approx(1.0, abs=1e-3)  # a non-trivial trust ratio
        opt.apply_gradients([(gk, layer.kernel), (gb, layer.bias)])
        np.testing.assert_allclose(layer.kernel.numpy(), ref["kernel"][0], atol=1e-6, rtol=1e-6)
        np.testing.assert_allclose(layer.bias.numpy(), ref["bias"][0], atol=1e-6, rtol=1e-6)
    trusts = opt.last_trust_ratios()
    assert trusts[layer.bias.name] == 1.0
    assert trusts[layer.kernel.name] != pytest.approx(1.0, abs=1e-3)


def test_lars_trust_ratio_reported_matches_reference(problem):
    kernel, bias, x, y = problem
    layer = _dense(kernel, bias)
    opt = LARS(0.1, momentum=0.9, weight_decay=0.001, eta=0.001)
    gk, gb = _grads(layer, x, y)
    _, _, trust = scaling.lars_update_reference(
        kernel,
        gk.numpy(),
        np.zeros_like(kernel),
        lr=0.1,
        momentum=0.9,
        weight_decay=0.001,
        eta=0.001,
    )
    opt.apply_gradients([(gk, layer.kernel), (gb, layer.bias)])
    assert opt.last_trust_ratios()[layer.kernel.name] == pytest.approx(trust, rel=1e-5)


def test_lars_zero_weights_use_trust_one(problem):
    _, _, x, y = problem
    layer = _dense(np.zeros((4, 3), np.float32), np.zeros(3, np.float32))
    opt = LARS(0.1, momentum=0.9, weight_decay=0.01, eta=0.001)
    gk, gb = _grads(layer, x, y)
    assert np.linalg.norm(gk.numpy()) > 0
    opt.apply_gradients([(gk, layer.kernel), (gb, layer.bias)])
    # ||w|| = 0 -> trust 1: a plain momentum-SGD first step, w = -lr * g.
    np.testing.assert_allclose(layer.kernel.numpy(), -0.1 * gk.numpy(), atol=1e-7)
    assert opt.last_trust_ratios()[layer.kernel.name] == 1.0


def test_lars_with_schedule_and_inside_tf_function(problem):
    kernel, bias, x, y = problem
    layer = _dense(kernel, bias)
    opt = LARS(TableSchedule([0.2, 0.4]), momentum=0.0, eta=0.01)

    @tf.function
    def step():
        gk, gb = _grads(layer, x, y)
        opt.apply_gradients([(gk, layer.kernel), (gb, layer.bias)])
        return gk

    w0 = kernel.astype(np.float64)
    gk = step().numpy()
    w1, _, _ = scaling.lars_update_reference(
        w0, gk, 0 * w0, lr=0.2, momentum=0.0, weight_decay=0.0, eta=0.01
    )
    np.testing.assert_allclose(layer.kernel.numpy(), w1, atol=1e-6)
    gk = step().numpy()
    w2, _, _ = scaling.lars_update_reference(
        w1, gk, 0 * w0, lr=0.4, momentum=0.0, weight_decay=0.0, eta=0.01
    )
    np.testing.assert_allclose(layer.kernel.numpy(), w2, atol=1e-6)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_lamb_two_steps_match_reference(problem, weight_decay):
    kernel, bias, x, y = problem
    layer = _dense(kernel, bias)
    hp = dict(lr=0.05, beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay=weight_decay)
    opt = LAMB(
        hp["lr"],
        beta_1=hp["beta_1"],
        beta_2=hp["beta_2"],
        epsilon=hp["epsilon"],
        weight_decay=weight_decay,
    )
    ref = {
        k: (w.astype(np.float64), np.zeros(w.shape), np.zeros(w.shape))
        for k, w in (("kernel", kernel), ("bias", bias))
    }
    for t in (1, 2):
        gk, gb = _grads(layer, x, y)
        for key, g, excluded in (("kernel", gk, False), ("bias", gb, True)):
            w, m, v = ref[key]
            w, m, v, trust = scaling.lamb_update_reference(
                w, g.numpy(), m, v, t=t, excluded=excluded, **hp
            )
            ref[key] = (w, m, v)
            assert (trust == 1.0) == excluded
        opt.apply_gradients([(gk, layer.kernel), (gb, layer.bias)])
        np.testing.assert_allclose(layer.kernel.numpy(), ref["kernel"][0], atol=1e-6, rtol=1e-5)
        np.testing.assert_allclose(layer.bias.numpy(), ref["bias"][0], atol=1e-6, rtol=1e-5)


def test_lamb_zero_weights_use_trust_one(problem):
    _, _, x, y = problem
    layer = _dense(np.zeros((4, 3), np.float32), np.zeros(3, np.float32))
    opt = LAMB(0.01)
    gk, gb = _grads(layer, x, y)
    opt.apply_gradients([(gk, layer.kernel), (gb, layer.bias)])
    assert opt.last_trust_ratios()[layer.kernel.name] == 1.0
    # trust 1, first Adam step: r = g / (|g| + eps) ~ sign(g)
    np.testing.assert_allclose(layer.kernel.numpy(), -0.01 * np.sign(gk.numpy()), atol=1e-6)


def test_optimizer_configs_round_trip():
    for opt in (
        LARS(0.3, momentum=0.8, weight_decay=1e-4, eta=0.002),
        LAMB(0.01, beta_1=0.8, weight_decay=0.01),
    ):
        clone = type(opt).from_config(opt.get_config())
        assert clone.get_config() == opt.get_config()
        assert clone.weight_decay_rate == opt.weight_decay_rate
        assert clone.weight_decay is None  # the base class must not decay a second time


def test_table_schedule_equals_run_config_lr_at():
    cfg = RunConfig(
        num_samples=2000,
        batch_per_worker=32,
        base_batch=32,
        base_lr=0.1,
        lr_scaling="linear",
        warmup_epochs=1.0,
        epochs=3,
        lr_schedule="cosine",
    )
    workers = 2
    plan = cfg.for_workers(workers)
    sched = TableSchedule(plan.lr_table())
    total, warm = plan.total_steps, plan.warmup_steps
    assert warm == 25 and total == 75
    for step in (0, 1, 7, warm - 1, warm, warm + 1, 50, total - 1):
        assert float(sched(step)) == pytest.approx(plan.lr_at(step), rel=1e-6, abs=1e-7)
    assert float(sched(0)) == pytest.approx(0.1)  # warm-up starts at base_lr
    assert float(sched(total + 100)) == float(sched(total - 1))  # clamped past the end
    assert float(sched(tf.constant(3, tf.int64))) == pytest.approx(
        cfg.for_workers(workers).lr_at(3)
    )


def test_table_schedule_drives_optimizer_per_step():
    """optimizer.iterations (updates already applied) indexes the table: step s uses table[s]."""
    table = [0.1, 0.2, 0.4]
    var = tf.Variable(0.0)
    opt = tf.keras.optimizers.SGD(TableSchedule(table))
    deltas = []
    for _ in range(4):
        before = float(var.numpy())
        opt.apply_gradients([(tf.constant(1.0), var)])
        deltas.append(before - float(var.numpy()))
    np.testing.assert_allclose(deltas, [0.1, 0.2, 0.4, 0.4], rtol=1e-6)


def _cfg(**kw):
    return RunConfig(**kw).to_dict()


@pytest.mark.parametrize(
    "name,cls",
    [
        ("sgd", tf.keras.optimizers.SGD),
        ("momentum", tf.keras.optimizers.SGD),
        ("lars", LARS),
        ("lamb", LAMB),
        ("adam", tf.keras.optimizers.Adam),
    ],
)
def test_build_optimizer_each_name(name, cls):
    opt = build_optimizer(
        _cfg(optimizer=name, momentum=0.8, weight_decay=1e-4, lars_eta=0.002), 0.05
    )
    assert isinstance(opt, cls)
    assert float(opt.learning_rate) == pytest.approx(0.05)
    if name == "sgd":
        assert opt.momentum == 0.0
    if name == "momentum":
        assert opt.momentum == 0.8
    if name == "lars":
        assert (opt.momentum, opt.eta, opt.weight_decay_rate) == (0.8, 0.002, 1e-4)
    if name in ("lamb", "adam"):
        assert opt.beta_1 == 0.8
    # one real step on a tiny model
    layer = _dense(np.ones((4, 3), np.float32), np.ones(3, np.float32))
    gk, gb = _grads(layer, tf.ones((2, 4)), tf.zeros((2, 3)))
    opt.apply_gradients([(gk, layer.kernel), (gb, layer.bias)])
    assert np.all(np.isfinite(layer.kernel.numpy()))


def test_build_optimizer_keras_weight_decay_skips_bias():
    opt = build_optimizer(_cfg(optimizer="momentum", weight_decay=0.1), 0.5)
    layer = _dense(np.ones((4, 3), np.float32), np.ones(3, np.float32))
    zeros = [tf.zeros_like(layer.kernel), tf.zeros_like(layer.bias)]
    opt.apply_gradients(zip(zeros, [layer.kernel, layer.bias]))
    np.testing.assert_allclose(layer.kernel.numpy(), 1 - 0.5 * 0.1)  # decoupled: lr * wd * w
    np.testing.assert_allclose(layer.bias.numpy(), 1.0)  # bias excluded
    assert build_optimizer(_cfg(optimizer="momentum"), 0.5).weight_decay is None


def test_build_optimizer_mixed_float16_wraps_loss_scaling():
    opt = build_optimizer(_cfg(optimizer="lars", precision="mixed_float16"), 0.1)
    assert isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer)
    assert opt.dynamic
    assert isinstance(opt.inner_optimizer, LARS)
    for precision in ("float32", "mixed_bfloat16"):
        assert not isinstance(
            build_optimizer(_cfg(precision=precision), 0.1),
            tf.keras.mixed_precision.LossScaleOptimizer,
        )
    # loss_scaling=False: float16 without the scaler, to show what it prevents
    plain = build_optimizer(
        _cfg(optimizer="lars", precision="mixed_float16", loss_scaling=False), 0.1
    )
    assert isinstance(plain, LARS)


def test_build_optimizer_rejects_unknown_name():
    cfg = _cfg()
    cfg["optimizer"] = "rmsprop"
    with pytest.raises(ValueError, match="optimizer='rmsprop'"):
        build_optimizer(cfg, 0.1)


def test_set_precision_sets_global_policy_and_rejects_others():
    set_precision("mixed_bfloat16")
    assert tf.keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    set_precision("float32")
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    with pytest.raises(ValueError, match="precision='fp8'"):
        set_precision("fp8")


def test_lamb_reference_first_step_is_sign_like():
    """Sanity of the NumPy reference itself: step 1 with zero decay moves ||w|| * unit(r)."""
    w = np.array([3.0, 4.0])
    g = np.array([1.0, -2.0])
    new_w, _, _, trust = scaling.lamb_update_reference(
        w, g, 0 * w, 0 * w, t=1, lr=0.1, beta_1=0.9, beta_2=0.999, epsilon=0.0, weight_decay=0.0
    )
    r = np.sign(g)
    assert trust == pytest.approx(5.0 / math.sqrt(2))
    np.testing.assert_allclose(new_w, w - 0.1 * trust * r)
