"""The run plan (hpclab/core/plan.py): a config on N ranks, computed once and read one way."""

import math

import pytest

from hpclab import ConfigError, RunConfig
from hpclab.core.plan import RunPlan, plan_run


def test_the_workshop_run_on_four_ranks_follows_goyal_et_al():
    """64 a rank on 4 ranks: global batch 256, linear rule 0.05 x 256/64 = 0.2, warmed up over
    one epoch from the small-batch LR 0.05; 32,768 training samples (20 % of 40,960 held out)
    make 128 steps an epoch, 6 epochs 768 steps, auto evaluation every ceil(768/40) steps."""
    plan = RunConfig().for_workers(4)
    assert plan.local_batches == (64, 64, 64, 64) and plan.global_batch == 256
    assert plan.peak_lr == pytest.approx(0.2) and plan.warmup_start_lr == pytest.approx(0.05)
    assert (plan.steps_per_epoch, plan.total_steps, plan.warmup_steps) == (128, 768, 128)
    assert plan.eval_every == math.ceil(768 / 40) and plan.train_samples_per_worker == 8192
    assert plan.lr_at(0) == pytest.approx(0.05) and plan.lr_at(64) == pytest.approx(0.125)
    assert plan.lr_at(128) == plan.lr_at(767) == pytest.approx(0.2)


@pytest.mark.parametrize("rule, peak", [("none", 0.05), ("linear", 0.4), ("sqrt", 0.05 * 8**0.5)])
def test_lr_rules_scale_the_peak_with_the_global_batch(rule, peak):
    plan = RunConfig(lr_scaling=rule).for_workers(8)
    assert plan.peak_lr == pytest.approx(peak)


def test_no_warm_up_where_the_global_batch_is_the_base_batch():
    cfg = RunConfig(base_batch=128)
    plan = cfg.for_workers(2)
    assert plan.warmup_steps == 0 and plan.warmup_start_lr is None
    assert "not larger than base_batch 128" in plan.warmup_text()
    assert RunConfig(warmup_epochs=0).for_workers(4).warmup_text() == "no warm-up"


def test_a_skewed_batch_keeps_the_global_batch():
    plan = RunConfig(batch_skew=90).for_workers(2)
    assert plan.local_batches == (122, 6) and sum(plan.local_batches) == plan.global_batch
    three = RunConfig(batch_skew=1).for_workers(3)
    assert three.local_batches == (65, 64, 63)


def test_the_lr_table_is_lr_at_for_every_step():
    plan = RunConfig(lr_schedule="cosine", epochs=3).for_workers(2)
    table = plan.lr_table()
    assert len(table) == plan.total_steps
    for step in (0, 1, plan.warmup_steps, plan.total_steps // 2, plan.total_steps - 1):
        assert table[step] == pytest.approx(plan.lr_at(step), rel=1e-6)


def test_max_steps_caps_the_run_and_auto_evaluation_follows():
    plan = RunConfig(max_steps=50).for_workers(2)
    assert plan.total_steps == 50 and plan.eval_every == math.ceil(50 / 40)
    assert RunConfig(eval_samples=0).for_workers(2).eval_every == 0


@pytest.mark.parametrize(
    "knobs, workers, field",
    [
        (dict(straggler_rank=2), 2, "straggler_rank"),
        (dict(batch_skew=99, batch_per_worker=1), 2, "batch_skew"),
        (dict(sdc_target="weights", sdc_rank=3), 2, "sdc_rank"),
        (dict(sdc_target="weights", sdc_step=10_000), 2, "sdc_step"),
        (dict(update="hybrid", groups=2, average_every=4), 3, "groups"),
    ],
)
def test_a_knob_that_does_not_fit_the_world_is_named_before_any_rank_starts(knobs, workers, field):
    with pytest.raises(ConfigError, match=field):
        RunConfig(**knobs).for_workers(workers)


@pytest.mark.parametrize("workers", [0, -1, 1.5, "2"])
def test_workers_must_be_a_count(workers):
    with pytest.raises(ConfigError, match="workers must be an integer"):
        plan_run(RunConfig(), workers)


def test_the_plan_crosses_to_the_ranks_as_a_plain_dict():
    plan = RunConfig(batch_skew=30, lr_schedule="poly").for_workers(2)
    wire = plan.to_dict()
    assert isinstance(wire["local_batches"], list)
    assert RunPlan.from_dict(wire) == plan


def test_too_many_steps_are_refused_with_the_way_out():
    with pytest.raises(ConfigError, match="fewer epochs, a larger batch, or max_steps"):
        RunConfig(batch_per_worker=1, epochs=1000, num_samples=100_000).for_workers(1)


def test_above_sixteen_ranks_short_epochs_evaluate_the_whole_validation_set_every_few():
    """The workshop data on 64 ranks at 64 a rank: 32,768 / 4,096 = 8 steps an epoch, so the
    whole validation set is evaluated every ceil(32 / 8) = 4 epochs and at the run's end (step
    48 of 6 epochs); on 16 ranks (every lesson's scale) at every epoch end."""
    wide = RunConfig().for_workers(64)
    assert (wide.steps_per_epoch, wide.total_steps) == (8, 48)
    due = [s for s in range(8, 49, 8) if wide.full_eval_due(s)]
    assert due == [32, 48]
    narrow = RunConfig().for_workers(16)
    assert all(narrow.full_eval_due(s) for s in range(32, narrow.total_steps + 1, 32))
    assert narrow.steps_per_epoch == 32
    # epochs long enough on their own are all evaluated, at any width
    long = RunConfig(num_samples=200_000).for_workers(64)
    assert long.steps_per_epoch >= 32
    assert all(
        long.full_eval_due(s)
        for s in range(long.steps_per_epoch, long.total_steps + 1, long.steps_per_epoch)
    )
