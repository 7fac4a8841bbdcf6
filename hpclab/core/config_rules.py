"""The rules between knobs a RunConfig must satisfy: every message names the field, the value
passed and what is allowed (a :class:`hpclab.core.errors.ConfigError`, raised on the client
before any engine starts).

Each knob's own bounds and choices are rows of the knob table (:mod:`hpclab.core.knobs`), checked
before these rules run; here live only the rules that read two or more knobs, each once, with
the reason beside it.
"""

from __future__ import annotations

from typing import Any

from hpclab.core.catalog import is_user_model, models_for
from hpclab.core.errors import ConfigError
from hpclab.core.filedata import is_file_dataset
from hpclab.core.knobs import fail, is_int


def check_workers(workers: Any, cfg=None) -> int:
    """``workers`` as a number of ranks, checked against ``cfg``'s hybrid groups if given."""
    if not is_int(workers) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1; you passed workers={workers!r}.")
    if cfg is not None and cfg.update == "hybrid" and workers % cfg.groups:
        fail("groups", cfg.groups, f"a divisor of workers ({workers}) with update 'hybrid'")
    return workers


def validate(cfg) -> None:
    """The rules between knobs of ``cfg``, whose values each passed their own row already."""
    if cfg.batch_skew and cfg.shuffle == "global":  # a global deal cuts equal slices
        fail("batch_skew", cfg.batch_skew, "0 with shuffle 'global' (its slices are equal)")
    _sdc(cfg)
    if cfg.staleness and cfg.update != "sync":
        fail("staleness", cfg.staleness, "0 with update other than 'sync'")
    if cfg.staleness and cfg.precision == "mixed_float16":  # scaled by another step's scale
        fail("staleness", cfg.staleness, "0 with precision 'mixed_float16' (loss scaling)")
    if cfg.update != "sync":
        for name, plain in (("batch_skew", 0.0), ("fp16_allreduce", False)):
            if getattr(cfg, name) != plain:  # (uneven replicas; float16 models)
                fail(name, getattr(cfg, name), f"{plain!r} with update {cfg.update!r}")
    if cfg.skip_allreduce and (cfg.update != "sync" or cfg.sdc_target != "none"):
        # a measuring device for synchronous steps; the SDC lesson judges replicas kept equal
        fail("skip_allreduce", cfg.skip_allreduce, "False unless update is 'sync' without SDC")
    if cfg.update == "crossbow" and cfg.optimizer != "sgd":  # the momentum is the average's
        fail("optimizer", cfg.optimizer, "'sgd' with update 'crossbow' (momentum acts on z)")
    for name, plain in (("augment", "none"), ("shards", "iid"), ("shuffle", "local")):
        if getattr(cfg, name) != plain and cfg.dataset == "synthetic":  # one random batch
            fail(
                name,
                getattr(cfg, name),
                f"{plain!r} with dataset 'synthetic' (its batch is random)",
            )
    if is_file_dataset(cfg.dataset):  # checked against its files where the run starts
        return
    for name, plain in (("input", "auto"), ("stage", "shared")):
        if getattr(cfg, name) != plain:  # (the catalogue's data lives in memory)
            fail(name, getattr(cfg, name), f"{plain!r} unless dataset is a folder of files")
    fits = models_for(cfg.dataset)
    if cfg.model not in fits and not is_user_model(cfg.model):  # (yours: checked on the ranks)
        fail("model", cfg.model, f"a model for dataset {cfg.dataset!r}: one of {', '.join(fits)}")
    if cfg.validation_size() < 1 or cfg.train_size() < cfg.batch_per_worker:
        fail(
            "batch_per_worker",
            cfg.batch_per_worker,
            f"no larger than the training set ({cfg.train_size()} samples)",
        )


def _sdc(cfg) -> None:
    """The fault injection and its detector (hpclab.rank.features.sdc)."""
    if cfg.rollback and not cfg.spike_factor:
        fail("rollback", cfg.rollback, "False unless spike_factor > 0 (the detector triggers it)")
    if cfg.sdc_target == "activations" and cfg.precision != "float32":  # 16-bit activations
        fail("sdc_target", cfg.sdc_target, "'weights' or 'gradients' with a mixed precision")
    if cfg.sdc_target == "activations" and cfg.xla:  # the flip wraps a layer's activation
        fail("sdc_target", cfg.sdc_target, "'weights' or 'gradients' with xla=True")
