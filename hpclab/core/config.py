"""RunConfig: every knob of one training run, validated before any engine starts.

One frozen dataclass, a short explanation beside each field (the nanoGPT way), kept as the
field's ``metadata["help"]`` so the CLI shows the same words. Plain dicts cross to the
engines (`to_dict`), never this object, so engines need nothing from the client's session.
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
from hpclab.core.config_rules import check_workers, fail, validate
from hpclab.core.errors import ConfigError


def knob(default: Any, help: str) -> Any:
    """A RunConfig field with its one-line explanation (`hpclab run --help` shows it)."""
    return field(default=default, metadata={"help": help})


_HELD_OUT = f"{GENERATED_VALIDATION_FRACTION:.0%} held out for validation"


@dataclass(frozen=True)
class RunConfig:
    """One training run. All sizes are per worker unless the name says global."""

    # -- data and model -------------------------------------------------------------------
    dataset: str = knob(
        "mnist1d", "the data: generated (mnist1d, blobs, synthetic) or staged in data/"
    )
    num_samples: int = knob(40960, f"mnist1d/blobs/synthetic: samples generated ({_HELD_OUT})")
    image_shape: tuple = knob((32, 32, 3), "synthetic: H, W, C of the random images")
    synthetic_classes: int = knob(10, "synthetic: label classes (1000 = ImageNet's head)")
    model: str = knob("cnn1d", "the network; it must accept the dataset's input (1-D or images)")
    # -- batch and learning rate --------------------------------------------------------------
    batch_per_worker: int = knob(64, "samples per rank per step; global batch = this x workers")
    epochs: float = knob(6, "passes over the training set (fractions allowed)")
    optimizer: str = knob("momentum", "the update rule (lars and lamb for large batches)")
    base_lr: float = knob(0.05, "learning rate that works at `base_batch`")
    base_batch: int = knob(64, "the global batch `base_lr` was tuned for")
    lr_scaling: str = knob("linear", "how the peak LR follows the global batch")
    warmup_epochs: float = knob(
        1.0, "linear ramp up to the peak LR from peak x base_batch / global batch (Goyal et al.)"
    )
    lr_schedule: str = knob("constant", "what follows warm-up: constant, cosine or poly (LARS)")
    momentum: float = knob(0.9, "momentum / lars / lamb(beta1) / adam(beta1)")
    weight_decay: float = knob(0.0, "L2 coefficient (decoupled for lamb, in-gradient for lars)")
    lars_eta: float = knob(0.001, "LARS trust coefficient (You et al. 2017)")
    # -- numerics and communication ----------------------------------------------------------------
    precision: str = knob("float32", "the compute dtype (mixed_* keep float32 weights)")
    loss_scaling: bool = knob(
        True, "mixed_float16: dynamic loss scaling (off: see what underflows)"
    )
    fp16_allreduce: bool = knob(False, "Horovod: compress gradients to float16 for the allreduce")
    # -- engine behaviour ----------------------------------------------------------------------
    steps_per_call: int = knob(0, "optimizer steps per compiled call (0 = auto, ~0.15 s a call)")
    xla: bool = knob(False, "XLA-compile forward and backward (pays off on GPUs; see docs)")
    grad_allreduce: str = knob(
        "grouped", "grouped (one fused op) or per_tensor (overlaps backprop)"
    )
    hvd_cycle_time_ms: float = knob(0.1, "Horovod: background cycle between collectives (ms)")
    hvd_fusion_mb: float = knob(64.0, "Horovod: tensor-fusion buffer (MB; 0 = no fusion)")
    # -- where the time goes (hpclab.core.pop) ------------------------------------------------------
    straggler_rank: int = knob(-1, "the rank slowed on purpose (-1 = none)")
    straggler_slowdown: float = knob(
        0.0, "straggler: % of its speed lost (30: its compute takes 1/0.7 = 1.43x as long)"
    )
    straggler_ms: float = knob(0.0, "straggler: extra milliseconds of compute every step")
    batch_skew: float = knob(0.0, "rank 0's batch this % larger, the others' smaller (same total)")
    validation: str = knob(
        "sharded", "held-out evaluation: sharded over ranks, or rank0 alone (the others wait)"
    )
    augment: str = knob(
        "none", "input augmentation: none, online (every batch, in the step) or offline (once)"
    )
    augment_cost: int = knob(1, "augmentation work: noise passes per batch (same statistics)")
    shards: str = knob("iid", "rank shards: iid, or by_label (sorted by class first: non-iid)")
    shuffle: str = knob("local", "each epoch: local (own shard) or global (all data dealt anew)")
    timeline_steps: int = knob(
        0, "record Horovod's timeline over this many steps after the first call (0 = off)"
    )
    # -- beyond synchronous SGD (hpclab.rank.features.averaging) ----------------------------------------
    update: str = knob(
        "sync",
        "sync (average gradients), local_sgd (average models), hybrid (sync groups, models "
        "averaged across them) or crossbow (SMA)",
    )
    average_every: int = knob(
        1, "local_sgd, hybrid: steps between model averages (H; 1 = sync SGD)"
    )
    groups: int = knob(1, "hybrid: synchronous groups of consecutive ranks (divides workers)")
    staleness: int = knob(0, "apply the averaged gradient of this many steps ago (asynchrony)")
    # -- silent data corruption (hpclab.rank.features.sdc) ----------------------------------------------
    sdc_target: str = knob("none", "flip one bit of: none, weights, gradients or activations")
    sdc_layer: int = knob(0, "SDC: which layer with weights (0 = the first conv/dense layer)")
    sdc_bit: int = knob(30, "SDC: the float32 bit flipped (31 sign, 30-23 exponent, 22-0 mantissa)")
    sdc_rank: int = knob(0, "SDC: the rank whose tensor is hit")
    sdc_step: int = knob(10, "SDC: the optimizer step hit (0-based; weights flip just before it)")
    spike_factor: float = knob(
        0.0, "loss-spike detector: fire when a step's loss > this x its running mean (0 = off)"
    )
    rollback: bool = knob(False, "on a loss spike, every rank restores its last good state")
    publish_every_s: float = knob(0.5, "live telemetry cadence in seconds (0 = telemetry off)")
    noise_scale: bool = knob(True, "estimate the gradient noise scale (McCandlish et al. 2018)")
    time_split: bool = knob(
        True, "time each step's parts in the graph (hpclab.core.pop; on with a straggler)"
    )
    eval_every: int = knob(0, "steps between evaluations on the held-out subset (0 = auto: 40)")
    eval_samples: int = knob(2048, "held-out samples evaluated every eval_every steps (0 = off)")
    max_steps: int = knob(0, "stop after this many steps (0 = run all epochs)")
    seed: int = knob(0, "data generation, shuffling and weight init")
    name: str = knob("", "optional label shown in legends and run listings")
    tags: tuple = knob((), "free-form labels (e.g. the sweep a run belongs to)")

    def __post_init__(self) -> None:
        # Normalise list-valued fields coming from JSON/CLI into tuples (hashable, frozen).
        for name in ("image_shape", "tags"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        validate(self)

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
    return [f.name for f in dataclasses.fields(RunConfig)]
