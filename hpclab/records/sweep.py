"""Sweeps: one run per point of a grid of RunConfig values and worker counts, run one after another.

>>> records = lab.sweep(RunConfig(epochs=2), batch_per_worker=[32, 256, 1024],
...                     lr_scaling=["none", "linear"], workers=[1, 2])

* Every grid point is validated before the first run starts, so a typo in the last value does not
  surface an hour in: :func:`expand_grid` raises :class:`~hpclab.core.config.ConfigError` naming the
  field and the value.
* ``workers`` is the one key that is not a RunConfig field: the lab is restarted with
  ``lab.restart(workers=n)`` between sizes. Points are grouped by size and the lab's current size
  goes first, so a sweep restarts the engines at most once per other size.
* A sweep is resumable: a point whose exact config and worker count already has a *result* under
  ``lab.runs_dir`` — finished, diverged or collapsed: seeded runs that would end the same way
  again — is skipped (:class:`hpclab.records.index.Finished`) and its record reused. A stopped,
  failed or abandoned point that left a checkpoint (a sweep under a walltime, with
  ``checkpoint_every`` or ``checkpoint_minutes``) is resumed from it in its own folder
  (``lab.run(resume=...)``, :mod:`hpclab.cluster.resume`); other stopped and failed points are
  run again. That is also why a sweep does not tag its
  runs: tags are part of the config, and a tag would make an identical point look new.
* A diverged or failed run does not stop the sweep (a diverged run is a result: the learning rate
  was too high for that batch). If the engines were lost, the lab restarts them before the next
  point. Ctrl-C stops the current run collectively (its record stays, marked stopped) and ends
  the sweep.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclab.core.catalog import MAX_WORKERS
from hpclab.core.config import RunConfig, field_names
from hpclab.core.engine_settings import EngineSettings
from hpclab.core.errors import ConfigError, RunFailed
from hpclab.records.index import Finished
from hpclab.records.paths import check_staged
from hpclab.records.store import RunRecord, load_run

Progress = Callable[[int, int, RunConfig, int, str], None]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: the config, the number of workers, and its finished run if recorded."""

    config: RunConfig
    workers: int
    finished: Path | None = None  # folder of an already finished identical run (then skipped)
    resumable: Path | None = None  # folder of an unfinished identical run with a checkpoint

    @property
    def label(self) -> str:
        return self.config.label(self.workers)


# ---------------------------------------------------------------------------------------------
# pure: the grid
# ---------------------------------------------------------------------------------------------


def _values(key: str, values: Any) -> list:
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
        raise ConfigError(
            f"sweep values must be lists; you passed {key}={values!r} "
            f"(write {key}=[{values!r}] for a single value)."
        )
    values = list(values)
    if not values:
        raise ConfigError(f"sweep values must be non-empty lists; you passed {key}=[].")
    return values


def _check_workers(workers: Any) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(
            f"sweep workers must be integers from 1 to {MAX_WORKERS}; "
            f"you passed workers={workers!r}."
        )
    return workers


def expand_grid(cfg: RunConfig, **grid: list) -> list[tuple[RunConfig, int | None]]:
    """Every (config, workers) point of `grid` applied to `cfg`, validated, grouped by workers.

    Keys are RunConfig fields, plus ``workers``; values are lists. The product is taken in the
    order the keys are given (the first key varies slowest) inside each worker count, worker
    counts in the order given. Without a ``workers`` key the second item of each point is None:
    "the lab's current size". Duplicate points are kept once. Raises ConfigError, naming the
    field and the value, if any key or any point is invalid — nothing is started here.
    """
    if not isinstance(cfg, RunConfig):
        raise ConfigError(
            f"a sweep needs a RunConfig to start from; you passed {type(cfg).__name__}."
        )
    grid = dict(grid)
    workers_list = (
        [_check_workers(w) for w in _values("workers", grid.pop("workers"))]
        if "workers" in grid
        else [None]
    )
    known = set(field_names())
    for key in grid:
        if key not in known:
            raise ConfigError(
                f"RunConfig has no field {key!r}, so it cannot be swept; sweepable: "
                f"{', '.join(sorted(known))}, workers."
            )
    keys = list(grid)
    value_lists = [_values(k, grid[k]) for k in keys]
    points: list[tuple[RunConfig, int | None]] = []
    seen: set = set()
    for workers in dict.fromkeys(workers_list):
        for combo in itertools.product(*value_lists):
            point = cfg.replace(**dict(zip(keys, combo)))  # validates: ConfigError names the field
            if workers is not None:
                point.for_workers(workers)  # checks the point fits the world (ConfigError)
            key = (repr(point.to_dict()), workers)
            if key not in seen:
                seen.add(key)
                points.append((point, workers))
    return points


def plan(
    cfg: RunConfig,
    runs_dir: Path | str,
    *,
    current_workers: int,
    data_dir: Path | str | None = None,
    engine: EngineSettings | None = None,
    **grid: list,
) -> list[SweepPoint]:
    """The sweep's points in the order they will run, each marked if already finished.

    Validates everything first (ConfigError; FileNotFoundError for a missing staged dataset when
    `data_dir` is given). Points with `current_workers` go first, so the engines are restarted
    only when the size really changes.
    """
    points = [(c, current_workers if w is None else w) for c, w in expand_grid(cfg, **grid)]
    if data_dir is not None:
        for c in dict.fromkeys(c for c, _ in points):
            check_staged(c, data_dir)
    points.sort(key=lambda p: p[1] != current_workers)  # stable: keeps the grid order otherwise
    # `engine`: the lab's settings; a record made under other ones is no result for this lab
    finished = Finished(runs_dir, engine)  # one look at the records for every point
    out = []
    for c, w in points:
        done = finished.find(c.to_dict(), w)
        out.append(SweepPoint(c, w, done, None if done else finished.resumable(c.to_dict(), w)))
    return out


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------

# Fields RunConfig.label() already shows; other swept fields are named in progress lines.
_IN_LABEL = ("batch_per_worker", "optimizer", "lr_scaling", "warmup_epochs", "precision", "name")


def describe(point: SweepPoint, keys: Iterable[str] = ()) -> str:
    """`b256 linear+wu1 ×2 lars_eta=0.02 (global batch 512, peak lr 0.4)`: a progress line's
    subject; `keys` are the swept fields, named with their value unless the label shows them."""
    c, w = point.config, point.workers
    extra = "".join(
        f" {k}={getattr(c, k)!r}"
        if isinstance(getattr(c, k), str)
        else f" {k}={getattr(c, k):g}"
        if isinstance(getattr(c, k), float)
        else f" {k}={getattr(c, k)}"
        for k in keys
        if k not in _IN_LABEL
    )
    plan = c.for_workers(w)
    return f"{point.label}{extra} (global batch {plan.global_batch}, peak lr {plan.peak_lr:.3g})"


def outcome(record: RunRecord | None, status: str, elapsed: float | None = None) -> str:
    """`finished val_acc 0.930 (12.1 s)`: how a progress line ends (`elapsed`: the seconds the
    user waited for the run, start-up included; else the run's recorded wall time)."""
    if status == "skipped":
        acc = record.summary.get("val_accuracy") if record is not None else None
        return "skipped (already recorded" + (f", val_acc {acc:.3f})" if acc is not None else ")")
    summary = record.summary if record is not None else {}
    parts = [status]
    acc = summary.get("val_accuracy")
    if acc is not None:
        parts.append(f"val_acc {acc:.3f}")
    seconds = elapsed if elapsed is not None else summary.get("wall_time_s")
    if seconds is not None:
        parts.append(f"({seconds:.1f} s)")
    if status in ("failed", "diverged", "collapsed") and summary.get("error"):
        parts.append(f"— {summary['error']}")
    return " ".join(parts)


class PrintProgress:
    """The default progress: `[3/9] b256 linear+wu1 ×2 (...) … finished val_acc 0.930 (12.1 s)`."""

    def __init__(self, keys: Iterable[str] = (), file=None):
        self.keys, self.file = tuple(keys), file

    def start(self, i: int, n: int, point: SweepPoint) -> None:
        again = f" resuming {point.resumable.name} …" if point.resumable is not None else ""
        print(
            f"[{i}/{n}] {describe(point, self.keys)} …{again}",
            end="",
            flush=True,
            file=self.file or sys.stdout,
        )

    def end(
        self,
        i: int,
        n: int,
        point: SweepPoint,
        record: RunRecord | None,
        status: str,
        elapsed: float | None = None,
    ) -> None:
        out = self.file or sys.stdout
        if status == "skipped":
            print(
                f"[{i}/{n}] {describe(point, self.keys)} … {outcome(record, status)}",
                flush=True,
                file=out,
            )
        else:
            print(f" {outcome(record, status, elapsed)}", flush=True, file=out)


def run_sweep(
    lab, cfg: RunConfig, *, progress: Progress | None = None, **grid: list
) -> list[RunRecord]:
    """Run every point of `grid` on `lab`, one after another; return their records in run order.

    `progress(i, n, cfg, workers, status)` (i counts from 1) is called with status "running"
    before a run starts and with its outcome after it ends ("finished", "diverged", "collapsed", "failed",
    "stopped"), or once with "skipped" for a point already recorded. Without it, one line per run
    is printed. See the module docstring for ordering, resuming and failures.
    """
    points = plan(
        cfg,
        lab.runs_dir,
        current_workers=lab.workers,
        data_dir=lab.data_dir,
        engine=lab.engine_settings,
        **grid,
    )
    printer = PrintProgress(keys=[k for k in grid if k != "workers"]) if progress is None else None

    def report(i, point, status, record=None, elapsed=None):
        if printer is None:
            progress(i, len(points), point.config, point.workers, status)
        elif status == "running":
            printer.start(i, len(points), point)
        else:
            printer.end(i, len(points), point, record, status, elapsed)

    records: list[RunRecord] = []
    for i, point in enumerate(points, start=1):
        if point.finished is not None:
            record = load_run(point.finished)
            report(i, point, "skipped", record)
            records.append(record)
            continue
        if lab.workers != point.workers:
            lab.restart(workers=point.workers, cfg=point.config)
        elif not lab.healthy:
            lab.restart()  # the previous run lost its engines (Lab.run would too, with a warning)
        report(i, point, "running")
        t0 = time.perf_counter()
        run = _start(lab, point)
        try:
            _wait(run)
        except KeyboardInterrupt:
            run.stop(timeout=10)
            report(i, point, run.status, _record(run), time.perf_counter() - t0)
            raise
        record = _record(run)
        report(i, point, run.status, record, time.perf_counter() - t0)
        records.append(record)
    return records


def _start(lab, point: SweepPoint):
    """The point's run: its unfinished run resumed from its checkpoint if it has one the lab
    accepts (else, with a warning saying why, a fresh run)."""
    if point.resumable is not None:
        try:
            return lab.run(point.config, resume=point.resumable)
        except ConfigError as exc:
            log.warning("sweep: %s; running %s afresh", exc, point.label)
    return lab.run(point.config)


def _wait(run) -> None:
    """Block until `run` ends, whatever its status (failed and diverged are results here)."""
    try:
        run.wait()
    except RunFailed:
        pass


def _record(run) -> RunRecord:
    """The run as recorded on disk (with the derived numbers), else the in-memory snapshot."""
    try:
        return load_run(run.path)
    except FileNotFoundError:
        return run.record()


__all__ = [
    "SweepPoint",
    "expand_grid",
    "plan",
    "run_sweep",
    "check_staged",
    "describe",
    "outcome",
    "PrintProgress",
]
