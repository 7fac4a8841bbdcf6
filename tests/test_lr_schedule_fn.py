"""The ranks' LR schedule is a function of the step (StepSchedule), not a table of total_steps
floats in the traced step; it must give the numbers the table gave (RunPlan.lr_table(), the
float32 of RunPlan.lr_at) at every step, for every LR rule, warm-up and schedule (real TF on CPU,
no engines)."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from hpclab.core.catalog import LR_SCALINGS, LR_SCHEDULES
from hpclab.core.config import RunConfig
from hpclab.rank.optimizers import StepSchedule

# (batch_per_worker, base_batch, workers): global batch below, at and above base_batch, so the
# plans cover no warm-up (nothing to warm up) and a warm-up ramp; one with 1 step an epoch.
SIZES = [(32, 64, 1), (32, 64, 2), (32, 32, 4), (64, 32, 2), (250, 32, 4)]
WARMUPS = [0.0, 0.5, 1.0, 2.5]


def _plans():
    for rule, schedule, warm, (batch, base, workers) in itertools.product(
        LR_SCALINGS, LR_SCHEDULES, WARMUPS, SIZES
    ):
        cfg = RunConfig(
            num_samples=2000,
            batch_per_worker=batch,
            base_batch=base,
            base_lr=0.1,
            lr_scaling=rule,
            warmup_epochs=warm,
            epochs=3,
            lr_schedule=schedule,
        )
        yield f"{rule}-{schedule}-w{warm}-{batch}x{workers}/{base}", cfg.for_workers(workers)


PLANS = list(_plans())


def test_the_combinations_cover_warm_up_and_none():
    warm = [p for _, p in PLANS if p.warmup_steps]
    assert warm and len(warm) < len(PLANS)
    assert {p.lr_schedule for p in warm} == set(LR_SCHEDULES)


@pytest.mark.parametrize("name,plan", PLANS, ids=[n for n, _ in PLANS])
def test_the_step_function_gives_the_tables_lr_at_every_step(name, plan):
    table = plan.lr_table()
    schedule = StepSchedule(**plan.lr_params())
    steps = tf.range(plan.total_steps + 5, dtype=tf.int64)  # and past the end: the last LR
    got = schedule(steps).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got[: plan.total_steps], table)
    np.testing.assert_array_equal(got[plan.total_steps :], table[-1])
    assert float(schedule(tf.constant(-3, tf.int64))) == table[0]  # clamped at 0 too


def test_the_schedule_drives_an_optimizer_step_by_step_and_survives_its_config():
    """optimizer.iterations (updates already applied) is the step: update s uses lr_at(s)."""
    plan = RunConfig(
        num_samples=640,
        batch_per_worker=32,
        base_batch=32,
        warmup_epochs=1.0,
        epochs=2,
        lr_schedule="cosine",
    ).for_workers(2)
    schedule = StepSchedule(**plan.lr_params())
    var = tf.Variable(0.0, dtype=tf.float64)
    opt = tf.keras.optimizers.SGD(schedule)
    deltas = []
    for _ in range(plan.total_steps):
        before = float(var.numpy())
        opt.apply_gradients([(tf.constant(1.0, tf.float64), var)])
        deltas.append(before - float(var.numpy()))
    np.testing.assert_allclose(deltas, plan.lr_table(), rtol=1e-12)
    clone = StepSchedule.from_config(schedule.get_config())
    np.testing.assert_array_equal(clone(tf.range(plan.total_steps)).numpy(), plan.lr_table())


def test_a_schedule_without_steps_or_with_an_unknown_shape_is_refused():
    with pytest.raises(ValueError, match="total_steps >= 1"):
        StepSchedule(start_lr=0.1, peak_lr=0.1, warmup_steps=0, total_steps=0)
    with pytest.raises(ValueError, match="schedule must be one of"):
        StepSchedule(start_lr=0.1, peak_lr=0.1, warmup_steps=0, total_steps=5, schedule="step")
