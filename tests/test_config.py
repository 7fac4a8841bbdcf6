"""RunConfig validation, serialisation and derived numbers (fast: no TF, no MPI)."""

import dataclasses
import math

import pytest

from hpclab import ConfigError, RunConfig
from hpclab.cluster.lab import Lab

# (field, bad value, words the message must contain besides the field and value)
BAD = [
    ("dataset", "imagenet", "one of"),
    ("dataset", 3, "one of"),
    ("model", "vgg", "one of"),
    ("model", "resnet20", "a model for dataset 'mnist1d'"),  # images model on 1-D data
    ("optimizer", "rmsprop", "one of"),
    ("lr_scaling", "quadratic", "one of"),
    ("lr_schedule", "step", "one of"),
    ("precision", "fp8", "one of"),
    ("precision", "float16", "one of"),
    ("batch_per_worker", 0, "integer"),
    ("batch_per_worker", -4, "integer"),
    ("batch_per_worker", 64.0, "integer"),
    ("batch_per_worker", "64", "integer"),
    ("batch_per_worker", True, "integer"),
    ("batch_per_worker", 40000, "training set"),  # larger than the data
    ("base_batch", 0, "integer"),
    ("epochs", 0, "> 0"),
    ("epochs", float("nan"), "finite"),
    ("epochs", "six", "finite"),
    ("base_lr", 0.0, "> 0"),
    ("base_lr", -0.1, "> 0"),
    ("base_lr", float("inf"), "finite"),
    ("warmup_epochs", -1, ">= 0"),
    ("momentum", 1.0, "<= 0.999999"),
    ("momentum", -0.5, ">= 0"),
    ("weight_decay", -1e-4, ">= 0"),
    ("lars_eta", 0.0, "> 0"),
    ("num_samples", 10, "integer from 100"),
    ("steps_per_call", -1, "integer from 0"),
    ("steps_per_call", 1001, "to 1000"),
    ("xla", "on", "True or False"),
    ("grad_allreduce", "ring", "'grouped', 'per_tensor'"),
    ("publish_every_s", -1, ">= 0"),
    ("max_steps", -1, "integer >= 0"),
    ("seed", -1, "integer from 0"),
    ("fp16_allreduce", "yes", "True or False"),
    ("noise_scale", 1, "True or False"),
    ("image_shape", (32, 32), "three integers"),
    ("image_shape", (32, 0, 3), "three integers"),
    ("name", 5, "string"),
    ("tags", ("ok", 3), "list of strings"),
    ("augment", "always", "'none', 'online', 'offline'"),
    ("augment_cost", 0, "integer from 1"),
    ("augment_cost", 10_001, "to 10000"),
]


def test_augmenting_synthetic_data_is_refused_not_ignored():
    with pytest.raises(ValueError, match="with dataset 'synthetic'.*you passed augment='online'"):
        RunConfig(dataset="synthetic", model="resnet20", augment="online")


@pytest.mark.parametrize("field,value,words", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_bad_values_name_field_value_and_rule(field, value, words):
    with pytest.raises(ValueError) as info:
        RunConfig(**{field: value})
    msg = str(info.value)
    assert field in msg
    assert repr(value) in msg
    assert words in msg


def test_unknown_field_is_named():
    with pytest.raises(ConfigError, match="no field 'batchsize'"):
        RunConfig.from_dict({"batchsize": 32})
    with pytest.raises(ConfigError, match="no field 'lr'"):
        RunConfig().replace(lr=0.1)


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"workers": 0}, "workers"),
        ({"workers": 2.0}, "workers"),
        ({"workers": "2"}, "workers"),
        ({"workers": 10_000}, "workers"),
        ({"launcher": "pbs"}, "launcher"),
        ({"threads_per_worker": 0}, "threads_per_worker"),
        ({"start_timeout": -5}, "start_timeout"),
    ],
)
def test_bad_lab_arguments_fail_before_any_engine_starts(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Lab(**kwargs)  # would take seconds if it started engines; it must fail first


def test_round_trip_through_plain_dict():
    cfg = RunConfig(
        batch_per_worker=32, lr_scaling="sqrt", image_shape=(8, 8, 1), tags=("sweep-a",), name="x"
    )
    d = cfg.to_dict()
    assert isinstance(d["image_shape"], list)
    assert RunConfig.from_dict(d) == cfg


def test_every_field_has_help():
    """The explanation beside each field is its metadata["help"]; the CLI shows it as help."""
    for f in dataclasses.fields(RunConfig):
        assert f.metadata.get("help", "").strip(), f"RunConfig.{f.name} has no metadata['help']"


def test_frozen():
    with pytest.raises(AttributeError):
        RunConfig().epochs = 3


@pytest.mark.parametrize(
    "rule,workers,expected",
    [
        ("none", 4, 0.05),
        ("linear", 4, 0.05 * 256 / 64),
        ("sqrt", 4, 0.05 * math.sqrt(256 / 64)),
        ("linear", 1, 0.05),
        ("linear", 2, 0.1),
    ],
)
def test_peak_lr_follows_the_rule(rule, workers, expected):
    cfg = RunConfig(batch_per_worker=64, base_batch=64, base_lr=0.05, lr_scaling=rule)
    assert cfg.for_workers(workers).global_batch == 64 * workers
    assert cfg.for_workers(workers).peak_lr == pytest.approx(expected, rel=1e-12)


def test_warmup_ramps_per_step_then_holds():
    cfg = RunConfig(
        num_samples=10000,
        batch_per_worker=50,
        base_batch=50,
        base_lr=0.1,
        lr_scaling="linear",
        warmup_epochs=1,
        epochs=3,
    )
    w = 2
    spe = cfg.for_workers(w).steps_per_epoch
    assert spe == 8000 // 100
    assert cfg.for_workers(w).warmup_steps == spe
    lrs = [cfg.for_workers(w).lr_at(s) for s in range(cfg.for_workers(w).total_steps)]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[spe // 2] == pytest.approx(0.1 + (0.2 - 0.1) * (spe // 2) / spe)
    assert all(b > a for a, b in zip(lrs[:spe], lrs[1:spe]))  # strictly increasing ramp
    assert lrs[spe:] == [pytest.approx(0.2)] * (len(lrs) - spe)


def test_cosine_schedule_ends_near_zero():
    cfg = RunConfig(lr_schedule="cosine", warmup_epochs=0, lr_scaling="none", epochs=2)
    n = cfg.for_workers(1).total_steps
    assert cfg.for_workers(1).lr_at(0) == pytest.approx(cfg.base_lr)
    assert cfg.for_workers(1).lr_at(n - 1) < 0.01 * cfg.base_lr


def test_steps_and_max_steps():
    cfg = RunConfig(num_samples=20000, batch_per_worker=64, epochs=6)
    assert cfg.for_workers(2).steps_per_epoch == 16000 // 128
    assert cfg.for_workers(2).total_steps == 6 * (16000 // 128)
    assert cfg.replace(max_steps=10).for_workers(2).total_steps == 10


def test_label_names_the_knobs():
    assert RunConfig(batch_per_worker=256, lr_scaling="sqrt").label() == "b256 sqrt+wu1"
    assert RunConfig(optimizer="lars", warmup_epochs=0).label() == "b64 lars linear"
    # without a worker count a label says what the run asks for; with one, what it does
    assert RunConfig(lr_scaling="none").label() == "b64 none+wu1"
    assert RunConfig(lr_scaling="none").label(4) == "b64 none+wu1 ×4"  # global 256 > 64: ramps
    assert RunConfig(lr_scaling="none").label(1) == "b64 none ×1"  # global 64: nothing to warm up
    assert RunConfig(lr_schedule="poly").label() == "b64 linear+wu1 poly"
    assert "bfloat16" in RunConfig(precision="mixed_bfloat16").label()
    assert (
        RunConfig(precision="mixed_float16", loss_scaling=False)
        .label()
        .endswith("float16 unscaled")
    )
    assert RunConfig(name="mine").label() == "mine"


def test_a_step_bomb_and_a_publish_flood_are_refused_with_their_limits():
    from hpclab.core.catalog import MAX_TOTAL_STEPS, MIN_PUBLISH_EVERY_S

    bomb = RunConfig(num_samples=10_000_000, batch_per_worker=1, epochs=10_000)
    with pytest.raises(ConfigError, match=f"at most {MAX_TOTAL_STEPS:,} are allowed"):
        bomb.for_workers(2).derived()
    capped = bomb.replace(max_steps=1000)  # the same run cut by max_steps is fine
    assert capped.for_workers(2).total_steps == 1000
    limit = int(MAX_TOTAL_STEPS / RunConfig(num_samples=10_000_000).for_workers(1).steps_per_epoch)
    assert (
        RunConfig(num_samples=10_000_000, epochs=limit).for_workers(1).total_steps
        <= MAX_TOTAL_STEPS
    )
    with pytest.raises(ConfigError, match="publish_every_s=0.01"):
        RunConfig(publish_every_s=0.01)
    assert RunConfig(publish_every_s=0).publish_every_s == 0
    assert RunConfig(publish_every_s=MIN_PUBLISH_EVERY_S).publish_every_s == MIN_PUBLISH_EVERY_S


@pytest.mark.parametrize(
    "batch, skew, workers, expected",
    [
        (64, 50, 2, [96, 32]),
        (64, 50, 3, [96, 48, 48]),
        (10, 25, 3, [12, 9, 9]),  # 30 - 12 = 18 shared by two
        (64, 30, 1, [64]),  # one worker: nobody to take from
        (64, 0, 4, [64] * 4),
    ],
)
def test_uneven_batch_shares_keep_the_global_batch(batch, skew, workers, expected):
    cfg = RunConfig(batch_per_worker=batch, batch_skew=skew)
    assert list(cfg.for_workers(workers).local_batches) == expected
    assert sum(expected) == cfg.for_workers(workers).global_batch


def test_a_skew_that_leaves_a_rank_no_batch_is_refused_before_any_engine_starts():
    cfg = RunConfig(batch_per_worker=4, batch_skew=90)  # rank 0: 8 of 8 on two workers
    with pytest.raises(ConfigError, match=r"RunConfig.batch_skew .* every rank a batch"):
        cfg.for_workers(2).derived()
    with pytest.raises(ConfigError, match="batch_skew must be 0 with shuffle 'global'"):
        RunConfig(batch_skew=20, shuffle="global")


def test_model_averaging_and_staleness_rules_name_the_field_and_what_is_allowed():
    with pytest.raises(ConfigError, match="RunConfig.update must be one of 'sync', 'local_sgd'"):
        RunConfig(update="async")
    with pytest.raises(ConfigError, match="average_every must be an integer from 1"):
        RunConfig(update="local_sgd", average_every=0)
    with pytest.raises(ConfigError, match="batch_skew must be 0.0 with update 'local_sgd'"):
        RunConfig(update="local_sgd", batch_skew=10.0)
    with pytest.raises(ConfigError, match="optimizer must be 'sgd' with update 'crossbow'"):
        RunConfig(update="crossbow")
    with pytest.raises(ConfigError, match="staleness must be 0 with update other than 'sync'"):
        RunConfig(update="local_sgd", staleness=2)
    with pytest.raises(ConfigError, match="staleness must be an integer from 0 to 64"):
        RunConfig(staleness=65)
    with pytest.raises(ConfigError, match="staleness must be 0 with precision 'mixed_float16'"):
        RunConfig(staleness=2, precision="mixed_float16")
    assert RunConfig(update="crossbow", optimizer="sgd", staleness=0).update == "crossbow"


def test_hybrid_groups_must_divide_the_workers_of_the_run():
    """Checked against the run's workers (every run asks cfg.derived before any rank starts)."""
    hybrid = RunConfig(update="hybrid", groups=2)
    assert hybrid.for_workers(4).derived()["global_batch"] == 4 * hybrid.batch_per_worker
    with pytest.raises(ConfigError, match=r"groups must be a divisor of workers \(6\)"):
        hybrid.replace(groups=4).for_workers(6).derived()
    with pytest.raises(ConfigError, match="groups must be an integer from 1"):
        RunConfig(update="hybrid", groups=0)
    assert (
        RunConfig(groups=3).for_workers(4).derived()["workers"] == 4
    )  # (groups matter to hybrid runs only)
