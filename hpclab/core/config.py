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

What the config becomes on N ranks (global batch, scaled peak LR, steps, warm-up, evaluation
points, the LR table) is its run plan, ``cfg.for_workers(n)`` (:mod:`hpclab.core.plan`),
computed once before any engine starts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpclab.core.catalog import GENERATED_VALIDATION_FRACTION, STAGED_SIZES
from hpclab.core.config_rules import validate
from hpclab.core.errors import ConfigError
from hpclab.core.filedata import describe, is_file_dataset
from hpclab.core.knobs import KNOBS
from hpclab.core.plan import RunPlan, plan_run


def _with_knob_fields(cls: type) -> type:
    """``cls`` as a frozen dataclass with one field per row of KNOBS (type, default, help)."""
    cls.__annotations__ = {k.name: k.type for k in KNOBS}
    for k in KNOBS:
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
        if is_file_dataset(self.dataset):  # a folder: the same path wherever the ranks start
            object.__setattr__(self, "dataset", os.path.abspath(os.path.expanduser(self.dataset)))
        for k in KNOBS:  # each value on its own, then the rules between knobs
            k.check(getattr(self, k.name))
        validate(self)

    def section(self, name: str) -> dict[str, Any]:
        """The values of one section of the knob table (hpclab.core.knobs.SECTIONS), by name."""
        rows = [k for k in KNOBS if k.section == name]
        if not rows:
            sections = sorted({k.section for k in KNOBS})
            raise ConfigError(
                f"RunConfig has no section {name!r}; sections: {', '.join(sections)}."
            )
        return {k.name: getattr(self, k.name) for k in rows}

    # -- sizes, and what the config becomes on N ranks -------------------------------------------
    def train_size(self) -> int:
        """Training samples in the whole (unsharded) training set."""
        if is_file_dataset(self.dataset):  # (a ConfigError if its description is not readable)
            return describe(self.dataset)["train_records"]
        if self.dataset in STAGED_SIZES:
            return STAGED_SIZES[self.dataset][0]
        return self.num_samples - self.validation_size()

    def validation_size(self) -> int:
        if is_file_dataset(self.dataset):
            return describe(self.dataset)["validation_records"]
        if self.dataset in STAGED_SIZES:
            return STAGED_SIZES[self.dataset][1]
        return int(round(self.num_samples * GENERATED_VALIDATION_FRACTION))

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
            ramps = self.warmup_epochs > 0
            if ramps and workers is not None:
                try:
                    ramps = self.for_workers(workers).warmup_steps > 0
                except ConfigError:  # a label never refuses: a record of another world size
                    pass
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
    return [k.name for k in KNOBS]
