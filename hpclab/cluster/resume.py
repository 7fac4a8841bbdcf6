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
FREE = ("name", "tags", "publish_every_s", "checkpoint_every")

log = logging.getLogger(__name__)


@dataclass
class Resume:
    """A resume the client has checked: the config to run, the checkpoint, the record."""

    record: RunRecord
    cfg: RunConfig
    checkpoint: Path
    from_step: int
    resumed: list[dict]  # every resume of this run so far, this one last

    def open_store(self, client: dict) -> RunStore:
        """The run's own folder, reopened at the checkpoint's step (RunStore.reopen)."""
        store = RunStore(self.record.path.parent, self.record.path.name)
        meta = {"client": client, "config": self.cfg.to_dict(), "resumed": self.resumed}
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


def prepare(target, cfg: RunConfig | None, workers: int, runs_dir: Path) -> Resume:
    """Check a resume of ``target`` with ``cfg`` (None: the recorded one) on ``workers``; a
    ConfigError in one sentence if the run cannot go on so."""
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
    asked = recorded if cfg is None else cfg
    if not isinstance(asked, RunConfig):
        raise ConfigError(f"Lab.run needs a RunConfig or None; you passed {type(cfg).__name__}.")
    differ = differences(recorded.to_dict(), asked.to_dict(), record.workers, workers)
    if differ:
        raise ConfigError(
            f"run {rid} cannot resume with another setting ({'; '.join(differ)}): a resume "
            "needs the recorded knobs and workers."
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
        "exact": asked.update == "sync",  # (module doc: one state for every rank)
    }
    if not entry["exact"]:
        log.warning(
            "run %s uses update=%r: every rank resumes from rank 0's model and optimizer state "
            "(the ranks' own states between averages are not checkpointed), so its weights "
            "will differ from an uninterrupted run's",
            rid,
            asked.update,
        )
    earlier = record.meta.get("resumed") or []
    return Resume(record, asked, found, from_step, [*earlier, entry])


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


__all__ = ["FREE", "Resume", "differences", "prepare", "run_folder"]
