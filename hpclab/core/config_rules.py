"""The rules a RunConfig must satisfy: every message names the field, the value passed and what
is allowed (a :class:`hpclab.core.errors.ConfigError`, raised on the client before any engine starts).

Kept apart from :mod:`hpclab.core.config` (the knobs and the numbers derived from them): one place
for what a config may be, one for what it means.
"""

from __future__ import annotations

import math
from typing import Any

from hpclab.core.catalog import (
    CHOICES,
    FLOAT32_BITS,
    MAX_AUGMENT_COST,
    MAX_STEPS_PER_CALL,
    MAX_WORKERS,
    MIN_PUBLISH_EVERY_S,
    models_for,
)
from hpclab.core.errors import ConfigError


def fail(name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"RunConfig.{name} must be {allowed}; you passed {name}={value!r}.")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _choice(cfg, name: str, choices: tuple) -> None:
    value = getattr(cfg, name)
    if not isinstance(value, str) or value not in choices:
        fail(name, value, "one of " + ", ".join(repr(c) for c in choices))


def _int_range(cfg, name: str, lo: int, hi: int | None = None) -> None:
    value = getattr(cfg, name)
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        rule = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"
        fail(name, value, rule)


def _float_range(
    cfg, name: str, lo: float, hi: float | None = None, *, lo_open: bool = False
) -> None:
    value = getattr(cfg, name)
    ok = _is_number(value) and (value > lo if lo_open else value >= lo)
    ok = ok and (hi is None or value <= hi)
    if not ok:
        bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
        rule = f"a finite number {bound}" + ("" if hi is None else f" and <= {hi:g}")
        fail(name, value, rule)


def check_workers(workers: Any, cfg=None) -> int:
    """``workers`` as a number of ranks, checked against ``cfg``'s hybrid groups if given."""
    if not _is_int(workers) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1; you passed workers={workers!r}.")
    if cfg is not None and cfg.update == "hybrid" and workers % cfg.groups:
        fail("groups", cfg.groups, f"a divisor of workers ({workers}) with update 'hybrid'")
    return workers


def validate(cfg) -> None:
    for name, allowed in CHOICES.items():
        _choice(cfg, name, allowed)
    _int_range(cfg, "augment_cost", 1, MAX_AUGMENT_COST)
    _int_range(cfg, "num_samples", 100, 10_000_000)
    _int_range(cfg, "batch_per_worker", 1, 65536)
    _int_range(cfg, "base_batch", 1, 10_000_000)
    _int_range(cfg, "steps_per_call", 0, MAX_STEPS_PER_CALL)
    _int_range(cfg, "synthetic_classes", 2, 100_000)
    _int_range(cfg, "max_steps", 0)
    _int_range(cfg, "eval_every", 0, 10_000_000)
    _int_range(cfg, "eval_samples", 0, 10_000_000)
    _int_range(cfg, "seed", 0, 2**31 - 1)
    _float_range(cfg, "epochs", 0.0, 10_000, lo_open=True)
    _float_range(cfg, "base_lr", 0.0, 100.0, lo_open=True)
    _float_range(cfg, "warmup_epochs", 0.0, 10_000)
    _float_range(cfg, "momentum", 0.0, 0.999999)
    _float_range(cfg, "weight_decay", 0.0, 1.0)
    _float_range(cfg, "lars_eta", 0.0, 10.0, lo_open=True)
    _float_range(cfg, "publish_every_s", 0.0, 3600)
    if 0 < cfg.publish_every_s < MIN_PUBLISH_EVERY_S:  # every call would publish: a flood
        fail(
            "publish_every_s",
            cfg.publish_every_s,
            f"0 (telemetry off) or from {MIN_PUBLISH_EVERY_S:g} to 3600 seconds",
        )
    _float_range(cfg, "hvd_cycle_time_ms", 0.0, 1000.0, lo_open=True)
    _float_range(cfg, "hvd_fusion_mb", 0.0, 4096.0)
    _int_range(cfg, "straggler_rank", -1, MAX_WORKERS - 1)
    _float_range(cfg, "straggler_slowdown", 0.0, 95.0)
    _float_range(cfg, "straggler_ms", 0.0, 10_000.0)
    _float_range(cfg, "batch_skew", 0.0, 90.0)
    if cfg.batch_skew and cfg.shuffle == "global":  # a global deal cuts equal slices
        fail("batch_skew", cfg.batch_skew, "0 with shuffle 'global' (its slices are equal)")
    _int_range(cfg, "timeline_steps", 0, 100_000)
    _sdc(cfg)
    _int_range(cfg, "average_every", 1, 100_000)
    _int_range(cfg, "groups", 1, MAX_WORKERS)
    _int_range(cfg, "staleness", 0, 64)
    if cfg.staleness and cfg.update != "sync":
        fail("staleness", cfg.staleness, "0 with update other than 'sync'")
    if cfg.staleness and cfg.precision == "mixed_float16":  # scaled by another step's scale
        fail("staleness", cfg.staleness, "0 with precision 'mixed_float16' (loss scaling)")
    if cfg.update != "sync":
        for name, plain in (("batch_skew", 0.0), ("fp16_allreduce", False)):
            if getattr(cfg, name) != plain:  # (uneven replicas; float16 models)
                fail(name, getattr(cfg, name), f"{plain!r} with update {cfg.update!r}")
    if cfg.update == "crossbow" and cfg.optimizer != "sgd":  # the momentum is the average's
        fail("optimizer", cfg.optimizer, "'sgd' with update 'crossbow' (momentum acts on z)")
    for name in ("fp16_allreduce", "noise_scale", "xla", "loss_scaling", "time_split", "rollback"):
        if not isinstance(getattr(cfg, name), bool):
            fail(name, getattr(cfg, name), "True or False")
    if not isinstance(cfg.name, str) or len(cfg.name) > 120:
        fail("name", cfg.name, "a string of at most 120 characters")
    if not isinstance(cfg.tags, tuple) or not all(isinstance(t, str) for t in cfg.tags):
        fail("tags", cfg.tags, "a list of strings")
    shape = cfg.image_shape
    if (
        not isinstance(shape, tuple)
        or len(shape) != 3
        or not all(_is_int(s) for s in shape)
        or not all(1 <= s <= 1024 for s in shape)
    ):
        fail("image_shape", shape, "three integers (height, width, channels), each 1..1024")
    for name, plain in (("augment", "none"), ("shards", "iid"), ("shuffle", "local")):
        if getattr(cfg, name) != plain and cfg.dataset == "synthetic":  # one random batch
            fail(
                name,
                getattr(cfg, name),
                f"{plain!r} with dataset 'synthetic' (its batch is random)",
            )
    fits = models_for(cfg.dataset)
    if cfg.model not in fits:
        fail("model", cfg.model, f"a model for dataset {cfg.dataset!r}: one of {', '.join(fits)}")
    if cfg.validation_size() < 1 or cfg.train_size() < cfg.batch_per_worker:
        fail(
            "batch_per_worker",
            cfg.batch_per_worker,
            f"no larger than the training set ({cfg.train_size()} samples)",
        )


def _sdc(cfg) -> None:
    """The fault injection and its detector (hpclab.rank.features.sdc)."""
    _int_range(cfg, "sdc_layer", 0, 10_000)
    _int_range(cfg, "sdc_bit", 0, FLOAT32_BITS - 1)
    _int_range(cfg, "sdc_rank", 0, MAX_WORKERS - 1)
    _int_range(cfg, "sdc_step", 0, 10_000_000)
    _float_range(cfg, "spike_factor", 0.0, 1e6)
    if 0 < cfg.spike_factor <= 1:  # every step above its own mean would fire
        fail("spike_factor", cfg.spike_factor, "0 (off) or a factor > 1 (e.g. 3)")
    if cfg.rollback and not cfg.spike_factor:
        fail("rollback", cfg.rollback, "False unless spike_factor > 0 (the detector triggers it)")
    if cfg.sdc_target == "activations" and cfg.precision != "float32":  # 16-bit activations
        fail("sdc_target", cfg.sdc_target, "'weights' or 'gradients' with a mixed precision")
    if cfg.sdc_target == "activations" and cfg.xla:  # the flip wraps a layer's activation
        fail("sdc_target", cfg.sdc_target, "'weights' or 'gradients' with xla=True")
