"""hpclab.core.scaling: LR rules, the warm-up schedule and LARS reference math (fast: no TF, no MPI).

Expected values come from the papers' formulas evaluated here on independent inputs, never
copied from the code under test:

* Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour",
  arXiv:1706.02677: linear scaling (sec. 2.1, "multiply the learning rate by k"; for ResNet-50
  "η = 0.1 · kn/256") and gradual warm-up (sec. 2.2, a constant increase per iteration until the
  scaled rate is reached).
* The square-root rule lr = base_lr · sqrt(B / B_base) (Krizhevsky 2014, arXiv:1404.5997).
* You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks",
  arXiv:1708.03888: the LARS local LR (trust ratio) η·‖w‖/‖∇L(w)‖, with the weight decay added
  to the gradient first in the classic-momentum form of the TensorFlow Model Garden optimizer;
  a zero norm gives trust 1 there, and excluded variables (biases, batch norm) skip both.
"""

import math

import numpy as np
import pytest

from hpclab.core import scaling
from hpclab.core.catalog import LR_SCALINGS
from hpclab.core.config import RunConfig

# -- LR rules ------------------------------------------------------------------------------------


def _rule_by_formula(rule, base_lr, global_batch, base_batch):
    k = global_batch / base_batch
    return {"none": base_lr, "linear": base_lr * k, "sqrt": base_lr * math.sqrt(k)}[rule]


@pytest.mark.parametrize("rule", ["none", "linear", "sqrt"])
@pytest.mark.parametrize(
    "base_lr,global_batch,base_batch",
    [(0.1, 256, 256), (0.1, 8192, 256), (0.05, 512, 32), (0.05, 96, 32), (0.2, 16, 64)],
)
def test_scaled_lr_follows_the_rule(rule, base_lr, global_batch, base_batch):
    expected = _rule_by_formula(rule, base_lr, global_batch, base_batch)
    assert scaling.scaled_lr(base_lr, global_batch, base_batch, rule) == pytest.approx(expected)


def test_scaled_lr_hand_values_from_the_papers():
    # Goyal et al. 2017: η = 0.1 · kn / 256; their 8k minibatch gives 0.1 · 32 = 3.2.
    assert scaling.scaled_lr(0.1, 8192, 256, "linear") == pytest.approx(3.2)
    # sqrt: a 4x larger batch doubles the LR, a 16x larger one quadruples it.
    assert scaling.scaled_lr(0.05, 128, 32, "sqrt") == pytest.approx(0.1)
    assert scaling.scaled_lr(0.05, 512, 32, "sqrt") == pytest.approx(0.2)
    # none: the batch does not matter.
    assert scaling.scaled_lr(0.05, 4096, 32, "none") == 0.05


def test_every_catalogued_rule_is_implemented_and_others_are_refused():
    for rule in LR_SCALINGS:
        assert scaling.scaled_lr(0.1, 64, 32, rule) > 0
    with pytest.raises(ValueError, match="you passed 'cubic'"):
        scaling.scaled_lr(0.1, 64, 32, "cubic")


# -- warm-up and what follows it -------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule,global_batch,base_batch", [("linear", 512, 64), ("sqrt", 1024, 64), ("linear", 128, 64)]
)
def test_warmup_ramps_linearly_from_base_lr_to_the_peak(rule, global_batch, base_batch):
    """Goyal et al. sec. 2.2: start at the small-batch LR, add the same amount every step,
    reach the scaled LR after the warm-up, then hold it (constant schedule)."""
    base_lr, warmup, total = 0.05, 10, 25
    peak = _rule_by_formula(rule, base_lr, global_batch, base_batch)
    increment = (peak - base_lr) / warmup
    lrs = [
        scaling.lr_at_step(
            s, start_lr=base_lr, peak_lr=peak, warmup_steps=warmup, total_steps=total
        )
        for s in range(total)
    ]
    for step in range(warmup):
        assert lrs[step] == pytest.approx(base_lr + increment * step)
    assert lrs[0] == pytest.approx(base_lr)
    assert lrs[warmup:] == pytest.approx([peak] * (total - warmup))
    assert all(b >= a - 1e-12 for a, b in zip(lrs, lrs[1:])), "a warm-up must never go down"


def test_no_warmup_starts_at_the_peak():
    lrs = [
        scaling.lr_at_step(s, start_lr=0.1, peak_lr=0.8, warmup_steps=0, total_steps=5)
        for s in range(5)
    ]
    assert lrs == [0.8] * 5


def test_cosine_after_warmup_halves_at_midpoint_and_ends_near_zero():
    """Half-cosine from the peak to 0 over the steps after warm-up (Loshchilov & Hutter 2016,
    arXiv:1608.03983, without restarts): lr = peak · (1 + cos(π · t / T)) / 2."""
    base_lr, peak, warmup, total = 0.1, 0.4, 4, 24
    span = total - warmup
    for step in range(warmup, total):
        t = step - warmup
        expected = peak * (1 + math.cos(math.pi * t / span)) / 2
        got = scaling.lr_at_step(
            step,
            start_lr=base_lr,
            peak_lr=peak,
            warmup_steps=warmup,
            total_steps=total,
            schedule="cosine",
        )
        assert got == pytest.approx(expected)
    mid = scaling.lr_at_step(
        warmup + span // 2,
        start_lr=base_lr,
        peak_lr=peak,
        warmup_steps=warmup,
        total_steps=total,
        schedule="cosine",
    )
    assert mid == pytest.approx(peak / 2)


def test_schedule_array_is_the_per_step_function():
    kwargs = dict(start_lr=0.05, peak_lr=0.4, warmup_steps=7, schedule="cosine")
    table = scaling.lr_schedule_array(30, **kwargs)
    assert table.dtype == np.float32 and table.shape == (30,)
    expected = [scaling.lr_at_step(s, total_steps=30, **kwargs) for s in range(30)]
    np.testing.assert_allclose(table, expected, rtol=1e-6)


def test_runconfig_warmup_at_and_above_base_batch_goes_up_to_the_scaled_peak():
    # 2 workers x 64 = global 128 = 4 x base_batch 32: linear peak = 4 x base_lr.
    cfg = RunConfig(batch_per_worker=64, base_batch=32, base_lr=0.05, lr_scaling="linear")
    w = 2
    lrs = [cfg.for_workers(w).lr_at(s) for s in range(cfg.for_workers(w).total_steps)]
    assert lrs[0] == pytest.approx(0.05)
    assert max(lrs) == pytest.approx(0.05 * 128 / 32)
    assert all(b >= a - 1e-12 for a, b in zip(lrs, lrs[1:]))


def _every_lr(cfg: RunConfig, workers: int) -> list[float]:
    return [cfg.for_workers(workers).lr_at(s) for s in range(cfg.for_workers(workers).total_steps)]


@pytest.mark.parametrize("rule", ["none", "linear", "sqrt"])
@pytest.mark.parametrize("per_worker", [16, 64, 256])  # global 32 < 128, = 128, 512 > 128
def test_runconfig_lr_of_every_step_below_at_and_above_base_batch(rule, per_worker):
    """The LR of every step, pinned by formula for batches below, at and above base_batch.

    Above: a linear ramp from peak x B_base / B (Goyal et al. 2017 sec. 2.2: from the small-batch
    LR; for the linear rule exactly base_lr) up to the peak, then the peak. At or below: nothing
    to warm up, so every step runs at the peak and the label carries no `+wu`."""
    workers, base_batch, base_lr = 2, 128, 0.2
    cfg = RunConfig(
        batch_per_worker=per_worker,
        base_batch=base_batch,
        base_lr=base_lr,
        lr_scaling=rule,
        warmup_epochs=1.0,
        epochs=3,
        num_samples=20000,
    )
    B = per_worker * workers
    peak = _rule_by_formula(rule, base_lr, B, base_batch)
    lrs = _every_lr(cfg, workers)
    spe = 16000 // B
    assert cfg.for_workers(workers).total_steps == 3 * spe
    if B <= base_batch:
        assert (
            cfg.for_workers(workers).warmup_steps == 0
            and cfg.for_workers(workers).warmup_start_lr is None
        )
        assert lrs == pytest.approx([peak] * len(lrs))
        assert "+wu" not in cfg.label(workers)
        return
    start = peak * base_batch / B
    assert cfg.for_workers(workers).warmup_steps == spe and cfg.for_workers(
        workers
    ).warmup_start_lr == pytest.approx(start)
    expected = [start + (peak - start) * s / spe for s in range(spe)] + [peak] * (2 * spe)
    assert lrs == pytest.approx(expected)
    if rule == "linear":
        assert lrs[0] == pytest.approx(base_lr)  # Goyal et al.: from the small-batch LR
    assert all(b >= a - 1e-12 for a, b in zip(lrs, lrs[1:])), "a warm-up never goes down"
    assert "+wu1" in cfg.label(workers)


def test_poly_decay_after_warmup_is_the_lars_papers_power_two():
    """You et al. 2017 (sec. 6): lr = peak * (1 - t / T)^2 over the steps after warm-up."""
    peak, warmup, total = 1.6, 5, 25
    lrs = [
        scaling.lr_at_step(
            s, start_lr=0.05, peak_lr=peak, warmup_steps=warmup, total_steps=total, schedule="poly"
        )
        for s in range(total)
    ]
    assert lrs[warmup] == pytest.approx(peak)
    for s in range(warmup, total):
        assert lrs[s] == pytest.approx(peak * (1 - (s - warmup) / (total - warmup)) ** 2)
    assert lrs[warmup + 10] == pytest.approx(peak / 4)  # halfway: a quarter of the peak


# -- LARS ----------------------------------------------------------------------------------------


def test_trust_ratio_and_its_zero_norm_convention():
    # You et al. 2017: η · ‖w‖ / ‖g‖.  ‖(3, 4)‖ = 5, ‖(0, 0.5)‖ = 0.5 -> 0.001 · 10 = 0.01.
    assert scaling.lars_trust_ratio(5.0, 0.5, 0.001) == pytest.approx(0.01)
    assert scaling.lars_trust_ratio(2.0, 8.0, 0.02) == pytest.approx(0.005)
    # A zero norm (fresh zero-initialised weights, or a zero gradient): trust 1, as in Model Garden.
    assert scaling.lars_trust_ratio(0.0, 3.0, 0.001) == 1.0
    assert scaling.lars_trust_ratio(3.0, 0.0, 0.001) == 1.0
    assert scaling.lars_trust_ratio(0.0, 0.0, 0.001) == 1.0


def test_lars_step_by_hand_with_weight_decay():
    w = np.array([3.0, 4.0])
    g = np.array([0.0, 0.5])
    v = np.array([0.1, -0.2])
    lr, m, wd, eta = 0.5, 0.9, 0.01, 0.001
    # g' = g + wd·w = (0.03, 0.54); ‖w‖ = 5; ‖g'‖ = sqrt(0.03² + 0.54²)
    g_eff = np.array([0.03, 0.54])
    trust = eta * 5.0 / math.sqrt(0.03**2 + 0.54**2)
    v_new = m * v + lr * trust * g_eff
    new_w, got_v, got_trust = scaling.lars_update_reference(
        w, g, v, lr=lr, momentum=m, weight_decay=wd, eta=eta
    )
    assert got_trust == pytest.approx(trust)
    np.testing.assert_allclose(got_v, v_new)
    np.testing.assert_allclose(new_w, w - v_new)


def test_lars_step_size_does_not_depend_on_the_gradient_scale():
    """The point of LARS: without momentum history or decay, ‖Δw‖ = lr · η · ‖w‖, whatever ‖g‖."""
    rng = np.random.default_rng(0)
    w, g = rng.normal(size=20), rng.normal(size=20)
    lr, eta = 0.1, 0.002
    for scale in (1e-3, 1.0, 1e3):
        new_w, _, _ = scaling.lars_update_reference(
            w, scale * g, np.zeros(20), lr=lr, momentum=0.9, weight_decay=0.0, eta=eta
        )
        assert np.linalg.norm(new_w - w) == pytest.approx(lr * eta * np.linalg.norm(w))


def test_excluded_variable_gets_no_decay_and_trust_one():
    """Biases and batch-norm parameters (Model Garden's `exclude_from_weight_decay` /
    `exclude_from_layer_adaptation`): a plain momentum-SGD step, no decay, trust 1."""
    w, g, v = np.array([1.0, -2.0]), np.array([0.3, 0.4]), np.array([0.01, 0.02])
    lr, m = 0.2, 0.9
    new_w, new_v, trust = scaling.lars_update_reference(
        w, g, v, lr=lr, momentum=m, weight_decay=0.5, eta=0.001, excluded=True
    )
    assert trust == 1.0
    np.testing.assert_allclose(new_v, m * v + lr * g)  # g itself: no 0.5·w added
    np.testing.assert_allclose(new_w, w - (m * v + lr * g))


def test_zero_weights_and_zero_gradient_fall_back_to_trust_one():
    lr, m = 0.1, 0.9
    # zero weights, not excluded: wd·w = 0, ‖w‖ = 0 -> trust 1, a plain SGD step
    w0, g = np.zeros(3), np.array([1.0, 2.0, 2.0])
    new_w, new_v, trust = scaling.lars_update_reference(
        w0, g, np.zeros(3), lr=lr, momentum=m, weight_decay=0.1, eta=0.001
    )
    assert trust == 1.0
    np.testing.assert_allclose(new_w, -lr * g)
    # zero gradient and no decay: ‖g‖ = 0 -> trust 1; only the momentum moves the weights
    w, v = np.array([1.0, 1.0]), np.array([0.5, -0.5])
    new_w, new_v, trust = scaling.lars_update_reference(
        w, np.zeros(2), v, lr=lr, momentum=m, weight_decay=0.0, eta=0.001
    )
    assert trust == 1.0
    np.testing.assert_allclose(new_v, m * v)
    np.testing.assert_allclose(new_w, w - m * v)
