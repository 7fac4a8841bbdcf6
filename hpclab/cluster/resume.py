"""Resuming a run from its latest checkpoint: what the client checks before any engine works.

``lab.run(resume=run)`` (or ``hpclab run --resume RUN_ID``) continues a stopped, preempted,
failed or abandoned run in its own folder from its newest readable checkpoint
(:mod:`hpclab.rank.checkpoint`): same history file, and the summary's ``resumed`` list says
from which step and after what. The same state, the same step and the same data order give the
same weights as a run never interrupted — hence every knob that shapes the training must be
the one recorded, and the same number of workers (each rank's shard and batch follow from it).
Only the knobs in :data:`FREE` may differ: they label the run or set how it reports, and none
reaches the weights.

Bit for bit holds where every rank's state is rank 0's: synchronous SGD (``update="sync"``).
Under local SGD, hybrid groups and Crossbow each rank keeps its own model and optimizer state
between averages, and a checkpoint holds rank 0's: every rank resumes from it (a model average
and rank 0's momentum for all), so the run goes on but its weights differ from an uninterrupted
run's; the ``resumed`` entry says ``exact: false`` and a warning says why.

On another number of workers (``rescale=``, after a lost rank or on a new allocation) the run
goes on by one of two rules, chosen by the user and written in the ``resumed`` entry:
``keep_global_batch`` keeps the global batch (so the peak LR and the steps per epoch) and gives
each rank ``global / workers`` samples a step; ``keep_per_rank_batch`` keeps each rank's batch,
so the global batch changes and the run's ``lr_scaling`` rule re-derives the peak LR and its
warm-up (Goyal et al. 2017, arXiv:1706.02677), and the steps per epoch change: the resume
starts at the step that has seen as many samples as the checkpoint's. Neither is bit for bit
an uninterrupted run: the shards, the batches and the summation order of the allreduce differ.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError
from hpclab.rank import checkpoint
from hpclab.records.store import RESULTS, RunRecord, RunStore, load_run

#: Knobs a resume may change: labels and reporting (checkpoint_every only moves call
#: boundaries, which change no step's arithmetic).
FREE = (
    "name",
    "tags",
    "publish_every_s",
    "checkpoint_every",
    "checkpoint_minutes",
    "checkpoint_keep",
)
#: How a resume on another number of workers re-derives the run (the user chooses one).
RESCALES = ("keep_global_batch", "keep_per_rank_batch")

log = logging.getLogger(__name__)


@dataclass
class Resume:
    """A resume the client has checked: the config to run, the checkpoint, the record."""

    record: RunRecord
    cfg: RunConfig
    checkpoint: Path
    from_step: int
    resumed: list[dict]  # every resume of this run so far, this one last
    start_step: int | None = None  # on another number of workers: the step it starts at
    workers: int | None = None  # on another number of workers: that number

    def open_store(self, client: dict) -> RunStore:
        """The run's own folder, reopened at the checkpoint's step (RunStore.reopen); on another
        number of workers its config.json names the new workers and derived numbers."""
        store = RunStore(self.record.path.parent, self.record.path.name)
        meta = {"client": client, "config": self.cfg.to_dict(), "resumed": self.resumed}
        if self.workers is not None:
            meta["workers"] = self.workers
            meta["derived"] = self.cfg.for_workers(self.workers).derived()
        store.reopen(self.from_step, meta)
        return store


def run_folder(target, runs_dir: Path) -> Path:
    """The folder ``resume=`` names: a Run's or RunRecord's path, a folder, or a run id under
    ``runs_dir``."""
    if hasattr(target, "path"):
        return Path(target.path)
    if not isinstance(target, (str, os.PathLike)):
        raise ConfigError(
            "Lab.run(resume=...) takes a Run, a RunRecord, a run id or a run folder; you "
            f"passed {type(target).__name__}."
        )
    path = Path(target)
    return path if (path / "config.json").is_file() else Path(runs_dir) / str(target)


def prepare(
    target, cfg: RunConfig | None, workers: int, runs_dir: Path, rescale: str | None = None
) -> Resume:
    """Check a resume of ``target`` with ``cfg`` (None: the recorded one) on ``workers``; on
    another number of workers than recorded, ``rescale`` (one of :data:`RESCALES`) says how.
    A ConfigError in one sentence if the run cannot go on so."""
    path = run_folder(target, runs_dir)
    try:
        record = load_run(path)
    except FileNotFoundError:
        raise ConfigError(f"there is no run to resume at {path} (no config.json in it).") from None
    rid, status = record.run_id, record.status
    if status in RESULTS:
        raise ConfigError(
            f"run {rid} ended {status}; only a stopped, failed or abandoned run can be resumed."
        )
    if status == "running":
        raise ConfigError(f"run {rid} is still running; stop it before resuming it.")
    recorded = RunConfig.from_dict(record.config)
    if cfg is not None and not isinstance(cfg, RunConfig):
        raise ConfigError(f"Lab.run needs a RunConfig or None; you passed {type(cfg).__name__}.")
    rescaling = rescale is not None and workers != record.workers
    if rescale is not None and rescale not in RESCALES:
        raise ConfigError(
            f"rescale={rescale!r} is not a rule for a resume on other workers; the rules: "
            f"{', '.join(RESCALES)}."
        )
    expected = (
        rescaled_config(recorded, record.workers, workers, rescale) if rescaling else recorded
    )
    asked = expected if cfg is None else cfg
    if rescaling and asked.batch_per_worker == recorded.batch_per_worker:
        asked = asked.replace(batch_per_worker=expected.batch_per_worker)  # the rule sets it
    differ = differences(
        expected.to_dict(),
        asked.to_dict(),
        record.workers,
        record.workers if rescaling else workers,
    )
    if differ:
        hint = (
            ""
            if rescaling or workers == record.workers
            else (f" (on other workers, choose rescale= one of {', '.join(RESCALES)})")
        )
        raise ConfigError(
            f"run {rid} cannot resume with another setting ({'; '.join(differ)}): a resume "
            f"needs the recorded knobs and workers{hint}."
        )
    found = checkpoint.latest(path)
    if found is None:
        raise ConfigError(
            f"run {rid} has no checkpoint to resume from (start runs with checkpoint_every > 0)."
        )
    from_step = int(checkpoint.read_meta(found)["step"])
    summary = record.summary
    entry = {
        "from_step": from_step,
        "previous_status": status,
        "stop_reason": summary.get("stop_reason"),
        "detail": summary.get("stop_detail") or summary.get("error"),
        "exact": asked.update == "sync" and not rescaling,  # (module doc)
    }
    start_step = None
    if rescaling:
        entry["rescale"] = rescaled_entry(
            recorded, asked, (record.workers, workers), rescale, from_step
        )
        start_step = entry["rescale"]["start_step"]
        log.warning(
            "run %s resumes on %d workers instead of %d by %s: not bit for bit the weights of "
            "an uninterrupted run (other shards, batches and allreduce order)",
            rid,
            workers,
            record.workers,
            rescale,
        )
    elif not entry["exact"]:
        log.warning(
            "run %s uses update=%r: every rank resumes from rank 0's model and optimizer state "
            "(the ranks' own states between averages are not checkpointed), so its weights "
            "will differ from an uninterrupted run's",
            rid,
            asked.update,
        )
    earlier = record.meta.get("resumed") or []
    return Resume(
        record,
        asked,
        found,
        from_step,
        [*earlier, entry],
        start_step=start_step,
        workers=workers if rescaling else None,
    )


def rescaled_config(recorded: RunConfig, was: int, now: int, rule: str) -> RunConfig:
    """The config a resume on ``now`` workers instead of ``was`` runs by ``rule``."""
    if rule == "keep_per_rank_batch":
        return recorded
    global_batch = recorded.for_workers(was).global_batch
    if global_batch % now:
        raise ConfigError(
            f"rescale='keep_global_batch' needs the global batch {global_batch} to split evenly "
            f"over {now} workers; use rescale='keep_per_rank_batch' or a worker count dividing it."
        )
    return recorded.replace(batch_per_worker=global_batch // now)


def rescaled_entry(
    recorded: RunConfig, asked: RunConfig, world: tuple[int, int], rule: str, from_step: int
) -> dict:
    """What the record says of a resume on other workers: the rule, the world, batch and LR
    before and after, and the step the run starts at (as many samples seen as at the
    checkpoint's step, ``from_step``)."""
    was, now = world
    before, after = recorded.for_workers(was), asked.for_workers(now)
    return {
        "rule": rule,
        "workers": [was, now],
        "batch_per_worker": [recorded.batch_per_worker, asked.batch_per_worker],
        "global_batch": [before.global_batch, after.global_batch],
        "peak_lr": [before.peak_lr, after.peak_lr],
        "steps_per_epoch": [before.steps_per_epoch, after.steps_per_epoch],
        "start_step": from_step * before.global_batch // after.global_batch,
    }


def differences(recorded: dict, asked: dict, recorded_workers: int, workers: int) -> list[str]:
    """'field recorded X, asked Y' for every knob outside FREE that differs, and the workers."""
    out = [
        f"{k} recorded {recorded.get(k)!r}, asked {asked.get(k)!r}"
        for k in asked
        if k not in FREE and recorded.get(k) != asked.get(k)
    ]
    if recorded_workers != workers:
        out.append(f"workers recorded {recorded_workers}, asked {workers}")
    return out


__all__ = [
    "FREE",
    "RESCALES",
    "Resume",
    "differences",
    "prepare",
    "rescaled_config",
    "rescaled_entry",
    "run_folder",
]
