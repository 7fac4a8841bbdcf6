"""RunPlan: what a run's knobs mean on a given number of ranks, computed and checked once.

A :class:`~hpclab.core.config.RunConfig` says what a person asked for; the plan says what that
becomes on ``workers`` ranks: each rank's batch, the global batch, the peak learning rate and its
warm-up, steps per epoch and in all, when to evaluate. ``cfg.for_workers(n)`` builds it on the
client before any engine starts (so every error names a knob while nothing runs yet); the ranks
receive it as a plain dict (``to_dict``) beside the config and read it, never recompute it.

The rules behind the numbers live in :mod:`hpclab.core.scaling`: the LR rules (linear, Goyal et
al. 2017, arXiv:1706.02677; sqrt), gradual warm-up from the small-batch LR, and the schedules
after it. This module only applies them once, to one config on one world size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpclab.core import scaling
from hpclab.core.catalog import EVAL_POINTS, MAX_TOTAL_STEPS, RANK_LISTS_MAX
from hpclab.core.config_rules import check_workers, fail
from hpclab.core.errors import ConfigError

#: Above RANK_LISTS_MAX ranks: at least this many steps of training per full validation.
FULL_EVAL_MIN_STEPS = 32


@dataclass(frozen=True)
class RunPlan:
    """One run on ``workers`` ranks. Sizes are samples; steps are optimizer steps (0-based)."""

    workers: int
    local_batches: tuple[int, ...]  # each rank's batch (rank 0's differs under batch_skew)
    global_batch: int  # samples per optimizer step across all ranks
    peak_lr: float  # the scaled LR reached after warm-up
    warmup_start_lr: float | None  # where warm-up starts; None when there is no ramp
    warmup_steps: int  # 0 when the global batch is no larger than base_batch
    lr_schedule: str  # what follows warm-up: constant, cosine or poly
    warmup_epochs: float  # as asked (the ramp is skipped where there is nothing to warm up)
    base_batch: int  # the global batch base_lr was tuned for
    steps_per_epoch: int
    total_steps: int
    eval_every: int  # steps between held-out evaluations; 0 when off
    train_samples_per_worker: int

    # -- when the whole validation set is evaluated ---------------------------------------------
    def full_eval_due(self, step: int) -> bool:
        """Whether the epoch ending at optimizer step ``step`` evaluates the whole validation
        set. Always up to RANK_LISTS_MAX ranks (every lesson) and at the run's end. Above, an
        epoch of fewer than FULL_EVAL_MIN_STEPS steps (64 ranks on the workshop data: 8) does so
        only every ceil(FULL_EVAL_MIN_STEPS / steps_per_epoch) epochs, so that evaluation, a
        collective every rank pays, does not outweigh training; the other epochs' rows carry
        NaN, which every view and record skips."""
        if step >= self.total_steps or self.workers <= RANK_LISTS_MAX:
            return True
        every = -(-FULL_EVAL_MIN_STEPS // self.steps_per_epoch)
        return (step // self.steps_per_epoch) % every == 0

    # -- the learning rate ---------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """LR of optimizer step ``step`` (:func:`hpclab.core.scaling.lr_at_step`)."""
        return scaling.lr_at_step(step, **self.lr_params())

    def lr_table(self) -> np.ndarray:
        """The whole schedule, one float32 per step: the reference the ranks' in-graph
        schedule (``hpclab.rank.optimizers.StepSchedule``, a function of the step) is tested
        against. O(total_steps): for tests and short runs, not for the ranks."""
        return scaling.lr_schedule_array(**self.lr_params())

    def lr_params(self) -> dict:
        """The schedule's arguments (:func:`hpclab.core.scaling.lr_at_step`'s keywords)."""
        start = self.peak_lr if self.warmup_start_lr is None else self.warmup_start_lr
        return dict(
            start_lr=start,
            peak_lr=self.peak_lr,
            warmup_steps=self.warmup_steps,
            total_steps=self.total_steps,
            schedule=self.lr_schedule,
        )

    # -- words and numbers for people ----------------------------------------------------------
    def warmup_text(self) -> str:
        """What warm-up does in this run, in words (the panel and the CLI print it)."""
        if self.warmup_steps:
            return (
                f"warm-up {self.warmup_steps} steps from lr {self.warmup_start_lr:.4g} "
                f"up to {self.peak_lr:.4g}"
            )
        if self.warmup_epochs > 0 and self.global_batch <= self.base_batch:
            return (
                f"no warm-up (global batch {self.global_batch} is not larger than "
                f"base_batch {self.base_batch}: nothing to warm up)"
            )
        return "no warm-up"

    def derived(self) -> dict:
        """The numbers worth printing before a run starts (and stored in its record)."""
        return {
            "workers": self.workers,
            "global_batch": self.global_batch,
            "peak_lr": self.peak_lr,
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "warmup_start_lr": self.warmup_start_lr,
            "eval_every": self.eval_every,
            "train_samples_per_worker": self.train_samples_per_worker,
        }

    # -- crossing to the ranks -----------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["local_batches"] = list(self.local_batches)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunPlan:
        return cls(**{**data, "local_batches": tuple(data["local_batches"])})


def plan_run(cfg, workers: int) -> RunPlan:
    """The plan of ``cfg`` (a RunConfig) on ``workers`` ranks, or a ConfigError naming the knob
    that does not fit this world size (checked on the client before any rank starts)."""
    n = check_workers(workers, cfg)
    if cfg.straggler_rank >= n:
        fail(
            "straggler_rank",
            cfg.straggler_rank,
            f"-1 (none) or a rank of this {n}-worker run (0 to {n - 1})",
        )
    local = _local_batches(cfg.batch_per_worker, cfg.batch_skew, n)
    if min(local) < 1:
        fail("batch_skew", cfg.batch_skew, "a skew that leaves every rank a batch of >= 1")
    global_batch = cfg.batch_per_worker * n
    peak = scaling.scaled_lr(cfg.base_lr, global_batch, cfg.base_batch, cfg.lr_scaling)
    start = scaling.warmup_start_lr(peak, global_batch, cfg.base_batch)
    if cfg.train_size() < global_batch and "/" in cfg.dataset:  # a file dataset: too small
        fail(
            "batch_per_worker",
            cfg.batch_per_worker,
            f"at most {cfg.train_size() // n} on {n} ranks: the dataset's {cfg.train_size()} "
            "training records must fill one global batch (ranks x batch)",
        )
    per_epoch = max(1, cfg.train_size() // global_batch)
    total = _total_steps(cfg, per_epoch, global_batch)
    warmup = 0 if start is None else int(round(cfg.warmup_epochs * per_epoch))
    if cfg.sdc_target != "none":
        if cfg.sdc_rank >= n:
            fail("sdc_rank", cfg.sdc_rank, f"a rank of this {n}-worker run (0 to {n - 1})")
        if cfg.sdc_step >= total:
            fail("sdc_step", cfg.sdc_step, f"a step of this run (0 to {total - 1})")
    return RunPlan(
        workers=n,
        local_batches=tuple(local),
        global_batch=global_batch,
        peak_lr=peak,
        warmup_start_lr=start if warmup else None,
        warmup_steps=warmup,
        lr_schedule=cfg.lr_schedule,
        warmup_epochs=cfg.warmup_epochs,
        base_batch=cfg.base_batch,
        steps_per_epoch=per_epoch,
        total_steps=total,
        eval_every=_eval_every(cfg, total),
        train_samples_per_worker=cfg.train_size() // n,
    )


def _local_batches(batch: int, skew_percent: float, n: int) -> list[int]:
    """Each rank's batch: rank 0's ``skew_percent`` % larger, the others share the rest of the
    global batch evenly (uneven batch shares: load imbalance on purpose, hpclab.core.pop)."""
    first = round(batch * (1 + skew_percent / 100)) if n > 1 else batch
    rest, extra = divmod(batch * n - first, max(n - 1, 1))
    return [first] + [rest + (r < extra) for r in range(n - 1)]


def _total_steps(cfg, per_epoch: int, global_batch: int) -> int:
    steps = max(1, int(math.ceil(cfg.epochs * per_epoch)))
    steps = min(steps, cfg.max_steps) if cfg.max_steps else steps
    if steps > MAX_TOTAL_STEPS:
        raise ConfigError(
            f"RunConfig.epochs={cfg.epochs:g} x {per_epoch:,} steps per epoch (global batch "
            f"{global_batch:,}) is {steps:,} optimizer steps; at most "
            f"{MAX_TOTAL_STEPS:,} are allowed: fewer epochs, a larger batch, or max_steps."
        )
    return steps


def _eval_every(cfg, total_steps: int) -> int:
    """Steps between evaluations on the fixed held-out subset; 0 when off (eval_samples 0, or
    synthetic data, which has no validation set). Auto (eval_every 0) spreads ``EVAL_POINTS``
    over the run, so steps to a target are exact to 1/EVAL_POINTS of it."""
    if not cfg.eval_samples or cfg.dataset == "synthetic":
        return 0
    return cfg.eval_every or max(1, math.ceil(total_steps / EVAL_POINTS))
