"""Rank 0's live telemetry: incremental messages to the client, the full record on disk.

ipyparallel's datapub keeps only the latest value per engine and the client polls it every
0.2 s, so a message the client does not poll in time is gone. Each message therefore carries

* ``seq``, and the rows (and epoch rows) made since the message ``RESEND`` messages back, each
  table with ``*_at``, the position of its first row in the order rank 0 made them: only what
  is new, with a bounded resend, so a message's size does not grow with the run (a client that
  misses fewer than ``RESEND`` messages in a row loses nothing live);
* ``rows_total`` / ``epochs_total``, how many rows exist.

Every row also goes, as it is made, to the run folder (``TELEMETRY_FILES``, JSON lines), so a
client that fell further behind (a paused notebook) reads the rows it missed from there, in
order (:mod:`hpclab.cluster.intake`): nothing is lost, and rank 0 keeps only a ring of the
newest rows in memory, however long the run.

Above ``RANK_LISTS_MAX`` ranks a row's per-rank lists (``rank_*``) become ``<key>_min``,
``_median`` and ``_max`` plus ``slowest_rank`` (the rank with the lowest samples/s) in the row;
the full lists go to the run folder as float64 records (:func:`hpclab.records.rank_lists.read`):
a row stays ~2 KB at 1,024 ranks instead of ~70 KB, and rank 0 pickles no O(world) message
while its peers wait in the next allreduce.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hpclab.core.catalog import RANK_LISTS_MAX, TELEMETRY_FILES


def rank_lists(row: dict) -> list[str]:
    """The row's per-rank list keys, in row order."""
    return [k for k, v in row.items() if k.startswith("rank_") and isinstance(v, list)]


def rank_matrix(row: dict, keys: list[str], world: int) -> np.ndarray:
    """The per-rank lists of ``keys`` as a ``[len(keys), world]`` float array (None -> NaN)."""
    out = np.full((len(keys), world), np.nan)
    for i, key in enumerate(keys):
        values = np.array(row[key][:world], dtype=float)  # (numbers and None only)
        out[i, : values.size] = values
    return out


def compact(row: dict, keys: list[str], matrix: np.ndarray) -> dict:
    """``row`` with each per-rank list of ``keys`` (``matrix``, one row per key) replaced by its
    min / median / max, and ``slowest_rank``: the rank with the lowest
    ``rank_samples_per_sec`` (None if unknown)."""
    out = {k: v for k, v in row.items() if k not in keys}
    for key, values in zip(keys, matrix):
        finite = values[np.isfinite(values)]
        for name, fn in (("min", np.min), ("median", np.median), ("max", np.max)):
            out[f"{key}_{name}"] = float(fn(finite)) if finite.size else math.nan
    slowest = None
    if "rank_samples_per_sec" in keys:
        rates = matrix[keys.index("rank_samples_per_sec")]
        ok = np.isfinite(rates)
        slowest = int(np.where(ok, rates, np.inf).argmin()) if ok.any() else None
    out["slowest_rank"] = slowest
    return out


def _numpy_scalar(value):
    """A NumPy scalar in a row as the Python number it holds. Under NumPy 2's promotion rules
    (NEP 50; the py312 stack) float32 telemetry stays float32 through Python arithmetic, where
    NumPy 1 widened it to float64 (a ``float`` subclass that ``json`` writes as is)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class TelemetryLog:
    """Rank 0's full record in the run folder: rows and epoch rows as JSON lines (one write a
    row, line-buffered, so a client reading behind sees whole lines), and per-rank lists."""

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)
        paths = {name: self.folder / rel for name, rel in TELEMETRY_FILES.items()}
        paths["rows"].parent.mkdir(parents=True, exist_ok=True)
        self.paths = paths
        # a fresh log for every run in this folder (a resumed run starts its positions at 0)
        self.rows = open(paths["rows"], "w", buffering=1, encoding="utf-8")
        self.epochs = open(paths["epochs"], "w", buffering=1, encoding="utf-8")
        self.ranks = None
        self.rank_keys: list[str] | None = None
        self.error: str | None = None  # why the log stopped taking rows (a full disk), if it did
        for stale in (paths["ranks"], paths["ranks_meta"]):
            stale.unlink(missing_ok=True)

    def add(self, table: str, row: dict) -> None:
        if self.error is None:
            self._guard(
                lambda: getattr(self, table).write(json.dumps(row, default=_numpy_scalar) + "\n")
            )

    def _guard(self, write) -> None:
        """A full disk or a deleted run folder ends the log, never the run: training goes on,
        the client keeps the rows it received in memory (and says so), and the log's readers
        stop at its last whole line."""
        try:
            write()
        except OSError as exc:
            self.error = f"{exc.strerror or exc}: {exc.filename or self.folder}"

    def add_ranks(self, step: int, keys: list[str], matrix: np.ndarray) -> None:
        """One row's per-rank lists: [step, *matrix row 0, *matrix row 1, ...] as float64."""
        if self.error is None:
            self._guard(lambda: self._add_ranks(step, keys, matrix))

    def _add_ranks(self, step: int, keys: list[str], matrix: np.ndarray) -> None:
        if self.ranks is None:
            self.rank_keys = keys
            meta = {
                "world": matrix.shape[1],
                "keys": keys,
                "dtype": "<f8",
                "record": "step, then each key's per-rank values",
            }
            self.paths["ranks_meta"].write_text(json.dumps(meta))
            self.ranks = open(self.paths["ranks"], "ab")
        if keys != self.rank_keys:  # (a row's columns are fixed for a run)
            matrix = np.array(
                [matrix[keys.index(k)] if k in keys else matrix[0] * np.nan for k in self.rank_keys]
            )
        record = np.concatenate([[float(step)], matrix.ravel()])
        self.ranks.write(record.astype("<f8").tobytes())
        self.ranks.flush()

    def close(self) -> None:
        for f in (self.rows, self.epochs, self.ranks):
            if f is not None:
                try:
                    f.close()
                except OSError:  # the last buffered line did not fit: the log ends before it
                    pass


class Publisher:
    """Rank 0's live feed (module docstring); other ranks pass ``send=None, folder=None``."""

    ROWS_PER_MESSAGE = 32  # the rows a message may carry at most (rank 0's ring of newest rows)
    EPOCHS_PER_MESSAGE = 32
    RESEND = 4  # a message carries what is new since the message this many back

    def __init__(
        self,
        send: Callable[[dict], None] | None,
        every_s: float,
        total_steps: int,
        folder: Path | str | None = None,
        world: int = 1,
    ):
        self.send, self.every_s, self.total_steps, self.world = send, every_s, total_steps, world
        self.rows: deque[dict] = deque(maxlen=self.ROWS_PER_MESSAGE)
        self.epochs: deque[dict] = deque(maxlen=self.EPOCHS_PER_MESSAGE)
        self.row_count = self.epoch_count = 0
        self._marks: deque[tuple[int, int]] = deque(maxlen=self.RESEND)  # counts at each send
        self.log = TelemetryLog(folder) if folder is not None else None
        self.seq = 0
        self.last = float("-inf")

    @property
    def enabled(self) -> bool:
        return self.send is not None and self.every_s > 0

    def due(self, now: float) -> bool:
        return self.enabled and now - self.last >= self.every_s

    def add_row(self, row: dict) -> dict:
        """A new history row (full per-rank lists): logged, and kept for the next messages;
        the row as published (compacted above RANK_LISTS_MAX ranks)."""
        keys = rank_lists(row) if self.world > RANK_LISTS_MAX else []
        if keys:
            matrix = rank_matrix(row, keys, self.world)
            if self.log is not None:
                self.log.add_ranks(row.get("step", 0), keys, matrix)
            row = compact(row, keys, matrix)
        if self.log is not None:
            self.log.add("rows", row)
        self.rows.append(row)
        self.row_count += 1
        return row

    def add_epoch(self, row: dict) -> None:
        if self.log is not None:
            self.log.add("epochs", row)
        self.epochs.append(row)
        self.epoch_count += 1

    def _since(self, ring: deque, count: int, first: int) -> tuple[int, list]:
        """(position, rows) of the ring's rows at positions >= ``first``."""
        held_from = count - len(ring)
        at = max(first, held_from)
        return at, list(ring)[at - held_from :]

    def publish(self, state: str, step: int, now: float | None = None) -> None:
        """Send what is new; ``now`` (perf-counter) restarts the cadence, None leaves it."""
        if not self.enabled:
            return
        self.seq += 1
        rows_from, epochs_from = self._marks[0] if len(self._marks) == self.RESEND else (0, 0)
        rows_at, rows = self._since(self.rows, self.row_count, rows_from)
        epochs_at, epochs = self._since(self.epochs, self.epoch_count, epochs_from)
        self.send(
            {
                "hpclab": {
                    "seq": self.seq,
                    "state": state,
                    "rows_at": rows_at,
                    "rows": rows,
                    "epochs_at": epochs_at,
                    "epochs": epochs,
                    "rows_total": self.row_count,
                    "epochs_total": self.epoch_count,
                    "step": step,
                    "total_steps": self.total_steps,
                }
            }
        )
        self._marks.append((self.row_count, self.epoch_count))
        if now is not None:
            self.last = now

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


__all__ = ["Publisher", "TelemetryLog", "compact", "rank_lists", "rank_matrix"]
