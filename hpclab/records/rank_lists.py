"""The full per-rank lists of a run of more than RANK_LISTS_MAX ranks, read from its folder.

Above ``RANK_LISTS_MAX`` ranks a history row carries each per-rank figure as min / median / max
and the slowest rank's id (:mod:`hpclab.rank.publisher`); rank 0 writes the lists themselves to
``TELEMETRY_FILES["ranks"]``: one float64 record a row, the row's step then each key's values for
every rank, the keys and the world size in ``TELEMETRY_FILES["ranks_meta"]``. Memory-mapped, so
reading the lists of one row of a 1,024-rank, ten-hour run touches only that row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpclab.core.catalog import TELEMETRY_FILES


@dataclass(frozen=True)
class RankLists:
    """``steps[i]`` is row i's step; ``values[i, k, r]`` rank r's figure ``keys[k]`` in row i."""

    keys: list[str]
    steps: np.ndarray
    values: np.ndarray

    def column(self, key: str) -> np.ndarray:
        """``[rows, world]``: one per-rank figure (e.g. ``rank_samples_per_sec``) over the run."""
        if key not in self.keys:
            raise KeyError(f"per-rank key {key!r} is not recorded; the keys are {self.keys}.")
        return self.values[:, self.keys.index(key), :]


def read(run_path: Path | str) -> RankLists | None:
    """The run's per-rank lists, or None if it wrote none (RANK_LISTS_MAX ranks or fewer)."""
    folder = Path(run_path)
    try:
        meta = json.loads((folder / TELEMETRY_FILES["ranks_meta"]).read_text())
    except (OSError, ValueError):
        return None
    world, keys = int(meta["world"]), list(meta["keys"])
    width = 1 + len(keys) * world
    path = folder / TELEMETRY_FILES["ranks"]
    rows = path.stat().st_size // (8 * width)  # (a torn last record is left out)
    if rows == 0:
        return RankLists(keys, np.zeros(0), np.zeros((0, len(keys), world)))
    data = np.memmap(path, dtype=meta.get("dtype", "<f8"), mode="r", shape=(rows, width))
    return RankLists(keys, data[:, 0], data[:, 1:].reshape(rows, len(keys), world))


__all__ = ["RankLists", "read"]
