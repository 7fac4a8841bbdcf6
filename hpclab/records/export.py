"""CSV export of a run's tables: its history (one row per telemetry window) or its epochs.

``run.to_csv()`` (a live :class:`~hpclab.cluster.run.Run` or a :class:`~hpclab.records.store.RunRecord` read from
disk) and ``compare(...).to_csv()`` come here, and the HTML report embeds the same CSV text as
download links, so a spreadsheet, R or a plotting script gets exactly the numbers the charts drew.
List-valued columns (``rank_samples_per_sec``: one value per rank) become one column per rank
(``rank_samples_per_sec_0``, ``_1``, …), which every spreadsheet can read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

TABLES = ("history", "epochs")


def flat(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with every list-valued column spread into one column per element."""
    out = {}
    for name in frame.columns:
        col = frame[name]
        # only a column of Python objects can hold lists (a numeric column is read as is)
        if col.dtype == object and col.map(lambda v: isinstance(v, (list, tuple))).any():
            width = int(col.map(lambda v: len(v) if isinstance(v, (list, tuple)) else 0).max())
            for i in range(width):
                out[f"{name}_{i}"] = col.map(
                    lambda v, i=i: v[i] if isinstance(v, (list, tuple)) and i < len(v) else None
                )
        else:
            out[name] = col
    return pd.DataFrame(out, index=frame.index)


def frame_csv(frame: pd.DataFrame, path: str | os.PathLike | None = None) -> str | Path:
    """`frame` as CSV text, or written to `path` (then the path is returned)."""
    text = flat(frame).to_csv(index=False)
    if path is None:
        return text
    path = Path(path)
    path.write_text(text)
    return path


def run_csv(run: Any, table: str = "history", path: str | os.PathLike | None = None) -> str | Path:
    """One of a run's tables (`history` or `epochs`) as CSV text, or written to `path`."""
    if table not in TABLES:
        raise ValueError(f"table must be one of {', '.join(TABLES)}; you passed table={table!r}.")
    return frame_csv(getattr(run, table), path)


__all__ = ["TABLES", "flat", "frame_csv", "run_csv"]
