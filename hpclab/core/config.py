"""RunConfig: every knob of one training run, validated before any engine starts.

The fields are generated from the knob table, :mod:`hpclab.core.knobs`: each field's type and
default come from its row, its one-line help is the field's ``metadata["help"]`` (the CLI shows
the same words) and its row is ``metadata["knob"]``. Each value is checked against its row, then
the rules between knobs (:mod:`hpclab.core.config_rules`) run, so a config that exists is valid.

The config is flat, and sections are a property of each knob, not nested objects:
``RunConfig(batch_per_worker=128)``, ``cfg.lr_schedule``, and the same flat names in notebooks,
in the records on disk (``to_dict``) and on the command line (``--batch-per-worker``). A knob
that moves to another section breaks none of them; ``cfg.section("straggler")`` reads one
section's values. Plain dicts cross to the engines (`to_dict`), never this object, so engines
need nothing from the client's session.

Derived numbers (global batch, scaled peak LR, steps per epoch) are computed here, in one place,
by the pure rules in :mod:`hpclab.core.scaling`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpclab.core import scaling
from hpclab.core.catalog import (
    EVAL_POINTS,
    GENERATED_VALIDATION_FRACTION,
    MAX_TOTAL_STEPS,
    STAGED_SIZES,
)
from hpclab.core.config_rules import check_workers, validate
from hpclab.core.errors import ConfigError
from hpclab.core.knobs import KNOBS, Knob, fail
from hpclab.core.plan import RunPlan, plan_run

#: The knobs a RunConfig holds, in field order.
#: (What Horovod reads once at hvd.init() is the Lab's: hpclab.core.engine_settings.)
FIELDS: tuple[Knob, ...] = KNOBS


def _with_knob_fields(cls: type) -> type:
    """``cls`` as a frozen dataclass with one field per row of FIELDS (type, default, help)."""
    cls.__annotations__ = {k.name: k.type for k in FIELDS}
    for k in FIELDS:
        setattr(cls, k.name, field(default=k.default, metadata={"help": k.help, "knob": k}))
    return dataclass(frozen=True)(cls)


@_with_knob_fields
class RunConfig:
    """One training run. All sizes are per worker unless the name says global; every field is a
    row of the knob table (hpclab.core.knobs, docs/knobs.md)."""

    def __post_init__(self) -> None:
        # Normalise list-valued fields coming from JSON/CLI into tuples (hashable, frozen).
        for name in ("image_shape", "tags"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for k in FIELDS:  # each value on its own, then the rules between knobs
            k.check(getattr(self, k.name))
        validate(self)

    def section(self, name: str) -> dict[str, Any]:
        """The values of one section of the knob table (hpclab.core.knobs.SECTIONS), by name."""
        rows = [k for k in FIELDS if k.section == name]
        if not rows:
            sections = sorted({k.section for k in FIELDS})
            raise ConfigError(
                f"RunConfig has no section {name!r}; sections: {', '.join(sections)}."
            )
        return {k.name: getattr(self, k.name) for k in rows}

    # -- derived numbers ------------------------------------------------------------------------
    def global_batch(self, workers: int) -> int:
        """Samples per optimizer step across all ranks."""
        return self.batch_per_worker * check_workers(workers, self)

    def local_batches(self, workers: int) -> list[int]:
        """Each rank's batch: rank 0's ``batch_skew`` % larger, the others share the rest of the
        global batch evenly (uneven batch shares: load imbalance on purpose, hpclab.core.pop)."""
        B, n = self.batch_per_worker, check_workers(workers)
        first = round(B * (1 + self.batch_skew / 100)) if n > 1 else B
        rest, extra = divmod(B * n - first, max(n - 1, 1))
        return [first] + [rest + (r < extra) for r in range(n - 1)]

    def peak_lr(self, workers: int) -> float:
        """The scaled learning rate reached after warm-up (see :func:`hpclab.core.scaling.scaled_lr`)."""
        return scaling.scaled_lr(
            self.base_lr, self.global_batch(workers), self.base_batch, self.lr_scaling
        )

    def train_size(self) -> int:
        """Training samples in the whole (unsharded) training set."""
        if self.dataset in STAGED_SIZES:
            return STAGED_SIZES[self.dataset][0]
        return self.num_samples - self.validation_size()

    def validation_size(self) -> int:
        if self.dataset in STAGED_SIZES:
            return STAGED_SIZES[self.dataset][1]
        return int(round(self.num_samples * GENERATED_VALIDATION_FRACTION))

    def steps_per_epoch(self, workers: int) -> int:
        """Optimizer steps per epoch: each rank sees train_size / workers samples."""
        return max(1, self.train_size() // self.global_batch(workers))

    def total_steps(self, workers: int) -> int:
        """Optimizer steps of the run; a ConfigError above MAX_TOTAL_STEPS (checked on the
        client before any rank starts: Lab.run, the panel and the CLI all ask for it)."""
        spe = self.steps_per_epoch(workers)
        steps = max(1, int(math.ceil(self.epochs * spe)))
        steps = min(steps, self.max_steps) if self.max_steps else steps
        if steps > MAX_TOTAL_STEPS:
            raise ConfigError(
                f"RunConfig.epochs={self.epochs:g} x {spe:,} steps per epoch (global batch "
                f"{self.global_batch(workers):,}) is {steps:,} optimizer steps; at most "
                f"{MAX_TOTAL_STEPS:,} are allowed: fewer epochs, a larger batch, or max_steps."
            )
        return steps

    def eval_interval(self, workers: int) -> int:
        """Steps between evaluations on the fixed held-out subset; 0 when off (eval_samples 0,
        or synthetic data, which has no validation set). Auto (eval_every 0) spreads
        ``EVAL_POINTS`` over the run, so steps to a target are exact to 1/EVAL_POINTS of it."""
        if not self.eval_samples or self.dataset == "synthetic":
            return 0
        return self.eval_every or max(1, math.ceil(self.total_steps(workers) / EVAL_POINTS))

    def warmup_start_lr(self, workers: int) -> float | None:
        """The LR warm-up starts from; None when the global batch is no larger than base_batch
        (nothing to warm up: see :func:`hpclab.core.scaling.warmup_start_lr`)."""
        return scaling.warmup_start_lr(
            self.peak_lr(workers), self.global_batch(workers), self.base_batch
        )

    def warmup_steps(self, workers: int) -> int:
        """Steps of the warm-up ramp: 0 when there is nothing to warm up."""
        if self.warmup_start_lr(workers) is None:
            return 0
        return int(round(self.warmup_epochs * self.steps_per_epoch(workers)))

    def lr_at(self, step: int, workers: int) -> float:
        """Learning rate used for optimizer step `step` (0-based)."""
        start = self.warmup_start_lr(workers)
        return scaling.lr_at_step(
            step,
            start_lr=self.peak_lr(workers) if start is None else start,
            peak_lr=self.peak_lr(workers),
            warmup_steps=self.warmup_steps(workers),
            total_steps=self.total_steps(workers),
            schedule=self.lr_schedule,
        )

    def warmup_text(self, workers: int) -> str:
        """What warm-up does in this run, in words (the panel and the CLI print it)."""
        steps, start = self.warmup_steps(workers), self.warmup_start_lr(workers)
        if steps:
            return f"warm-up {steps} steps from lr {start:.4g} up to {self.peak_lr(workers):.4g}"
        if self.warmup_epochs > 0 and start is None:
            return (
                f"no warm-up (global batch {self.global_batch(workers)} is not larger than "
                f"base_batch {self.base_batch}: nothing to warm up)"
            )
        return "no warm-up"

    def derived(self, workers: int) -> dict:
        """The numbers worth printing before a run starts (a ConfigError if ``workers`` does not
        fit the config: every run asks for them before any rank starts)."""
        if self.straggler_rank >= check_workers(workers):
            fail(
                "straggler_rank",
                self.straggler_rank,
                f"-1 (none) or a rank of this {workers}-worker run (0 to {workers - 1})",
            )
        if min(self.local_batches(workers)) < 1:
            fail("batch_skew", self.batch_skew, "a skew that leaves every rank a batch of >= 1")
        if self.sdc_target != "none" and self.sdc_rank >= workers:
            fail(
                "sdc_rank",
                self.sdc_rank,
                f"a rank of this {workers}-worker run (0 to {workers - 1})",
            )
        if self.sdc_target != "none" and self.sdc_step >= self.total_steps(workers):
            fail(
                "sdc_step",
                self.sdc_step,
                f"a step of this run (0 to {self.total_steps(workers) - 1})",
            )
        return {
            "workers": workers,
            "global_batch": self.global_batch(workers),
            "peak_lr": self.peak_lr(workers),
            "steps_per_epoch": self.steps_per_epoch(workers),
            "total_steps": self.total_steps(workers),
            "warmup_steps": self.warmup_steps(workers),
            "warmup_start_lr": self.warmup_start_lr(workers)
            if self.warmup_steps(workers)
            else None,
            "eval_every": self.eval_interval(workers),
            "train_samples_per_worker": self.train_size() // workers,
        }

    def for_workers(self, workers: int) -> RunPlan:
        """What this config becomes on ``workers`` ranks (:class:`hpclab.core.plan.RunPlan`):
        computed and checked once, before any engine starts; the ranks receive it."""
        return plan_run(self, workers)

    def label(self, workers: int | None = None) -> str:
        """A short human label for legends: the name, or the knobs that usually differ;
        with `workers`, followed by the worker count (`b64 linear+wu1 ×2`). The one place a
        run's label is made. `+wu<epochs>` appears only when the run ramps: with `workers`
        known, a global batch no larger than base_batch has no warm-up and no such label."""
        if self.name:
            core = self.name
        else:
            opt = f"{self.optimizer} " if self.optimizer in ("lars", "lamb", "adam") else ""
            ramps = self.warmup_epochs > 0 if workers is None else self.warmup_steps(workers) > 0
            warm = f"+wu{self.warmup_epochs:g}" if ramps else ""
            sched = "" if self.lr_schedule == "constant" else f" {self.lr_schedule}"
            prec = "" if self.precision == "float32" else f" {self.precision.replace('mixed_', '')}"
            if self.precision == "mixed_float16" and not self.loss_scaling:
                prec += " unscaled"
            core = f"b{self.batch_per_worker} {opt}{self.lr_scaling}{warm}{sched}{prec}"
        return core if workers is None else f"{core} ×{workers}"

    # -- (de)serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["image_shape"] = list(self.image_shape)
        d["tags"] = list(self.tags)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"RunConfig has no field {unknown[0]!r}; known fields: {', '.join(sorted(known))}."
            )
        return cls(**dict(data))

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (validated like a new config)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ConfigError(f"RunConfig has no field {unknown[0]!r}.")
        return dataclasses.replace(self, **changes)


def field_names() -> list[str]:
    return [k.name for k in FIELDS]
