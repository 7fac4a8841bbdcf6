"""Fake runs for the fast tests: real run folders on disk, and an in-memory run that calls back.

:func:`write_run` writes ``<root>/<run_id>/`` through hpclab's own writer (:class:`RunStore`), in
the format a `Lab` run leaves behind (docs/architecture.md, "Run directory"): config.json with the
config, worker count, derived numbers and the lab meta (launcher, threads per worker, ranks),
metrics.jsonl, epochs.jsonl and — unless the run is still running — summary.json. Every number
is derived from a real :class:`RunConfig`, so tests can work out what to expect by hand:

* epoch k ends at step k × steps_per_epoch and at k × `epoch_s` seconds;
* history rows are spread evenly over the steps the epochs cover, with time_s in proportion;
* the global throughput is `samples_per_sec` everywhere (rows, epochs and summary).

:class:`FakeRun` is the part of :class:`hpclab.cluster.run.Run` the live dashboard uses: DataFrames that
grow, ``on_update`` callbacks, ``status`` and ``done``.

Tests import it as ``from fakes import write_run`` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hpclab.core.config import RunConfig
from hpclab.records.store import RunStore

VERSIONS = {"tensorflow": "2.15.1", "horovod": "0.28.1"}
STARTUP_S = 4.0  # wall time before the training loop (engines, data, first trace)


def split_columns(workers: int, steps: int = 100) -> dict:
    """The time-split and POP columns of a history row, computed by the engine's own code
    (hpclab.rank.meters.time_columns) from a window where rank r computes (6 + 0.5 r) ms a step
    and waits in the allreduce for the slowest rank."""
    from hpclab.rank.meters import DETAIL, time_columns

    compute = [0.006 + 0.0005 * r for r in range(workers)]
    per_step = {"input_s": [0.0004] * workers, "compute_s": compute, "apply_s": [0.0003] * workers,
                "allreduce_s": [0.001 + max(compute) - c for c in compute]}  # fmt: skip
    call = [sum(v[r] for v in per_step.values()) + 0.0002 for r in range(workers)]
    m = np.zeros((workers, len(DETAIL)))
    for name, values in {**per_step, "call_s": call, "host_s": [0.0005] * workers}.items():
        m[:, DETAIL.index(name)] = np.asarray(values) * steps
    m[:, DETAIL.index("steps")] = steps
    m[:, DETAIL.index("wall_s")] = m[:, DETAIL.index("call_s")] + m[:, DETAIL.index("host_s")]
    return time_columns(m)


def make_history(
    cfg: RunConfig,
    workers: int,
    n: int,
    *,
    samples_per_sec: float = 10_000.0,
    epoch_s: float = 5.0,
    steps: int | None = None,
) -> list[dict]:
    """`n` telemetry rows shaped like the engine's (docs/architecture.md, "History row"), spread
    evenly over `steps` optimizer steps (default: the whole run)."""
    gb, spe = cfg.for_workers(workers).global_batch, cfg.for_workers(workers).steps_per_epoch
    steps = steps or cfg.for_workers(workers).total_steps
    share = samples_per_sec / workers
    ranks = [share * (1 + 0.02 * (r - (workers - 1) / 2)) for r in range(workers)]
    rows = []
    for i in range(1, n + 1):
        step = max(1, i * steps // n)
        progress = step / steps
        rows.append(
            {
                "step": step,
                "epoch": step / spe,
                "samples": step * gb,
                "time_s": step / spe * epoch_s,
                "loss": 2.3 * math.exp(-3 * progress) + 0.15,
                "accuracy": 0.95 - 0.85 * math.exp(-3 * progress),
                "lr": cfg.for_workers(workers).lr_at(step),
                "samples_per_sec": samples_per_sec,
                "rank_samples_per_sec": list(ranks),
                **split_columns(workers),
                "grad_norm_small_sq": 2.0,
                "grad_norm_big_sq": 1.2,
                "noise_scale": math.nan if workers == 1 else 80.0 + 4 * i,
            }
        )
    return rows


def make_epochs(
    cfg: RunConfig,
    workers: int,
    val_accs: Sequence[float],
    *,
    samples_per_sec: float = 10_000.0,
    epoch_s: float = 5.0,
) -> list[dict]:
    """One row per finished epoch (docs/architecture.md, "Epoch row"), val_accuracy as given."""
    spe = cfg.for_workers(workers).steps_per_epoch
    return [
        {
            "epoch": k,
            "step": k * spe,
            "time_s": k * epoch_s,
            "loss": 1.0 / k,
            "accuracy": a,
            "val_loss": 1.0 - a,
            "val_accuracy": a,
            "lr": cfg.for_workers(workers).peak_lr,
            "samples_per_sec": samples_per_sec,
        }
        for k, a in enumerate(val_accs, start=1)
    ]


def write_run(
    root: Path | str,
    config: RunConfig | None = None,
    *,
    workers: int = 2,
    status: str = "finished",
    val_accs: Sequence[float] = (0.6, 0.8, 0.9),
    history: int | list[dict] = 30,
    epoch_rows: list[dict] | None = None,
    samples_per_sec: float = 10_000.0,
    epoch_s: float = 5.0,
    summary: dict | None = None,
    threads_per_worker: int | None = 1,
    lab: dict | None = None,
    **fields: Any,
) -> Path:
    """Write one run folder under `root` and return its path.

    config: a RunConfig to start from (default RunConfig() with epochs = len(val_accs));
        `**fields` (RunConfig field names: batch_per_worker=..., lr_scaling=..., name=...) change it.
    workers: ranks the run used. status: "running" writes no summary.json (a run still going);
        anything else ("finished", "stopped", "failed", "diverged") is the summary's status.
    val_accs: one epoch row per value (its val_accuracy); epoch_rows: rows to write instead.
    history: how many history rows to generate over the epochs' steps, or the rows themselves.
    samples_per_sec, epoch_s: the global throughput and the seconds per epoch.
    summary: keys that replace the generated summary's.
    threads_per_worker: the Lab argument recorded under "lab" in config.json; None writes no lab
        meta at all (a record from before hpclab stored it). lab: more keys for that meta.
    """
    if config is None:
        fields.setdefault("epochs", max(1, len(val_accs)))
        cfg = RunConfig(**fields)
    else:
        cfg = config.replace(**fields) if fields else config
    meta: dict[str, Any] = {
        "config": cfg.to_dict(),
        "workers": workers,
        "derived": cfg.for_workers(workers).derived(),
    }
    if threads_per_worker is not None or lab:
        meta["lab"] = {
            "launcher": "mpi",
            "threads_per_worker": threads_per_worker,
            "ranks": [
                {
                    "rank": r,
                    "size": workers,
                    "local_rank": r,
                    "pid": 40_000 + r,
                    "host": "localhost",
                    "threads": threads_per_worker,
                    "gpus": 0,
                    "engine_id": r,
                }
                for r in range(workers)
            ],
            **(lab or {}),
        }
    store = RunStore(root)
    store.create(meta)

    spe = cfg.for_workers(workers).steps_per_epoch
    epochs = (
        epoch_rows
        if epoch_rows is not None
        else make_epochs(cfg, workers, val_accs, samples_per_sec=samples_per_sec, epoch_s=epoch_s)
    )
    steps = (
        max((int(e.get("step") or 0) for e in epochs), default=0)
        or cfg.for_workers(workers).total_steps
    )
    rows = (
        history
        if isinstance(history, list)
        else make_history(
            cfg, workers, history, samples_per_sec=samples_per_sec, epoch_s=epoch_s, steps=steps
        )
    )
    if rows:
        store.append_history(rows)
    if epochs:
        store.append_epochs(epochs)
    if status == "running":
        return store.path

    last = epochs[-1] if epochs else {}
    noise = [r["noise_scale"] for r in rows if isinstance(r.get("noise_scale"), (int, float))]
    train_time = steps / spe * epoch_s
    store.write_summary(
        {
            "run_id": store.run_id,
            "status": status,
            "val_accuracy": last.get("val_accuracy"),
            "val_loss": last.get("val_loss"),
            "train_accuracy": last.get("accuracy"),
            "samples_per_sec": samples_per_sec,
            "samples_per_sec_ci95": 0.02 * samples_per_sec,
            "rank_samples_per_sec": [samples_per_sec / workers] * workers,
            "world_size": workers,
            "global_batch": cfg.for_workers(workers).global_batch,
            "lr": cfg.for_workers(workers).peak_lr,
            "precision": cfg.precision,
            "weights_digest": ["0" * 16] * workers,
            "steps": steps,
            "epochs_done": len(epochs),
            "wall_time_s": train_time + STARTUP_S,
            "train_time_s": train_time,
            "time_split": split_columns(workers),
            "noise_scale": noise[-1] if noise else None,
            "versions": dict(VERSIONS),
            "error": None if status in ("finished", "stopped") else f"the run {status}",
            "config": cfg.to_dict(),
            **(summary or {}),
        }
    )
    return store.path


class FakeRun:
    """The part of hpclab.cluster.run.Run the dashboard uses; rows arrive when the test publishes them
    (from any thread), and every publish calls the registered callbacks like the monitor does."""

    def __init__(self, workers: int = 2, rows: int = 120, config: RunConfig | None = None):
        self.config = config or RunConfig(epochs=2)
        self.workers = workers
        self.status = "running"
        self.done = False
        self.history = pd.DataFrame()
        self.epochs = pd.DataFrame()
        self.callbacks: list = []
        self._rows = make_history(self.config, workers, rows)

    def on_update(self, callback) -> None:
        self.callbacks.append(callback)

    def publish(self, n: int) -> None:
        """Show the first `n` rows and call back."""
        self.history = pd.DataFrame(self._rows[:n])
        for cb in self.callbacks:
            cb(self)
