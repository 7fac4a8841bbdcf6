"""What a run looks like to the drawing code: :class:`RunFacts`, read from any run-like object.

Every chart reads runs through :func:`run_facts`, which accepts a live :class:`hpclab.cluster.run.Run`, a
:class:`hpclab.records.store.RunRecord` read from disk, a run folder path, or any object with
``history``/``epochs``/``config``/``workers`` — and turns missing pieces into empty ones (a run
that just started has no rows; old records miss columns). The column helpers here are just as
tolerant: a missing column is all-NaN, never a KeyError.

Pure data: pandas and NumPy only; no plotly, no widgets, no threads.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from hpclab.core.config import RunConfig
from hpclab.records.store import RunRecord, load_run, settle_engine_settings

# x-axis choices: history/epoch column → axis title shown to the user
X_AXES = {"step": "step", "samples": "samples seen", "time_s": "wall time (s)"}

# What a property of a missing or partial record raises when it cannot answer yet: an absent
# attribute, a missing key, None or text where a number belongs, a config that no longer
# validates (ConfigError is a ValueError). Anything else is a bug and keeps its traceback.
_UNANSWERED = (AttributeError, LookupError, TypeError, ValueError)


def text(value: Any) -> str:
    """Text from configs, escaped for HTML and for plotly's HTML-like labels (shows literally)."""
    return html.escape(str(value), quote=False)


@dataclass
class RunFacts:
    """The numbers the charts need from one run, read duck-typed from a Run or RunRecord."""

    label: str
    run_id: str
    workers: int
    global_batch: int | None
    config: dict
    status: str
    summary: dict
    derived: dict
    history: pd.DataFrame = field(repr=False)
    epochs: pd.DataFrame = field(repr=False)
    path: str | None = None
    lab: dict = field(default_factory=dict)  # config.json "lab": how the engines were started

    @property
    def threads_per_worker(self) -> int | None:
        """Intra-op threads per rank (a `Lab` argument, not a RunConfig field); None if unknown."""
        return self.lab.get("threads_per_worker")

    @property
    def engine_settings(self) -> dict:
        """What Horovod read at ``hvd.init()`` (the Lab's EngineSettings as a dict: cycle_time_ms,
        fusion_mb, timeline, groups); {} for a record that names none."""
        return dict(self.lab.get("engine_settings") or {})


def _frame(value: Any) -> pd.DataFrame:
    if isinstance(value, pd.DataFrame):
        return value
    if value is None:
        return pd.DataFrame()
    return pd.DataFrame(list(value))


def attr_or(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.name``, or `default` when it is None or a property cannot answer yet."""
    try:
        value = getattr(obj, name)
    except _UNANSWERED:
        return default
    return default if value is None else value


def run_facts(run_like: Any) -> RunFacts:
    """Normalise a Run, a RunRecord (or anything with ``history``/``epochs``/``config``/
    ``workers``) or a run folder path into :class:`RunFacts`. Missing pieces become empty."""
    if isinstance(run_like, RunFacts):
        return run_like
    if isinstance(run_like, (str, os.PathLike)):
        run_like = load_run(run_like)
    meta = attr_or(run_like, "meta", {}) or {}
    summary = dict(attr_or(run_like, "summary", {}) or {})
    cfg = attr_or(run_like, "config", {}) or {}
    cfg_obj = cfg if hasattr(cfg, "to_dict") else None
    config = cfg.to_dict() if cfg_obj is not None else dict(cfg)
    # a config from before EngineSettings: its two Horovod settings move to the lab's (the rule
    # of hpclab.records.store.settle_engine_settings), so it loads as a RunConfig
    meta = settle_engine_settings({**meta, "config": config})
    config = meta["config"]
    workers = attr_or(run_like, "workers", None) or summary.get("world_size") or 1
    try:
        workers = max(1, int(workers))
    except (TypeError, ValueError):
        workers = 1
    derived = dict(meta.get("derived") or {})
    if not derived:
        try:
            if cfg_obj is None:
                cfg_obj = RunConfig.from_dict(config)
            derived = cfg_obj.for_workers(workers).derived()
        except (ValueError, TypeError):
            derived = {}
    gb = derived.get("global_batch") or summary.get("global_batch")
    if gb is None and isinstance(config.get("batch_per_worker"), int):
        gb = config["batch_per_worker"] * workers
    run_id = str(
        attr_or(run_like, "run_id", "") or meta.get("run_id") or summary.get("run_id") or ""
    )
    label = attr_or(run_like, "label", None)
    if callable(label):
        label = label()
    if not isinstance(label, str) or not label:
        try:
            if cfg_obj is None:
                cfg_obj = RunConfig.from_dict(config)
            label = cfg_obj.label(workers)
        except (ValueError, TypeError):
            label = run_id or "run"
    status = attr_or(run_like, "status", None) or summary.get("status") or "unknown"
    path = attr_or(run_like, "path", None)
    return RunFacts(
        label=label,
        run_id=run_id,
        workers=workers,
        global_batch=int(gb) if gb else None,
        config=config,
        status=str(status),
        summary=summary,
        derived=derived,
        history=_frame(attr_or(run_like, "history", None)),
        epochs=_frame(attr_or(run_like, "epochs", None)),
        path=str(path) if path is not None else None,
        lab=dict(meta.get("lab") or {}),
    )


def as_run(run: Any) -> Any:
    """A run folder path → its RunRecord; a live Run → its snapshot; anything else unchanged."""
    if isinstance(run, (str, os.PathLike)):
        return load_run(run)
    if isinstance(run, (RunRecord, RunFacts)):
        return run
    snapshot = getattr(run, "record", None)
    return snapshot() if callable(snapshot) else run


def facts_of(runs: Iterable[Any]) -> list[RunFacts]:
    """:class:`RunFacts` of each run (Runs, RunRecords, run folder paths, or one of them)."""
    if isinstance(runs, (str, os.PathLike)) or hasattr(runs, "history"):
        runs = [runs]
    return [run_facts(as_run(r)) for r in runs]


# ---------------------------------------------------------------------------------------------
# columns → arrays (tolerant: a run that just started has no rows, old records miss columns)
# ---------------------------------------------------------------------------------------------


def column(df: pd.DataFrame, name: str) -> np.ndarray:
    """Column `name` as float64 (NaN where missing or not a number); all-NaN if absent."""
    if name not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def rank_matrix(df: pd.DataFrame, workers: int) -> np.ndarray:
    """The `rank_samples_per_sec` list column as an (rows, ranks) float array."""
    n = len(df)
    cells = df["rank_samples_per_sec"].tolist() if "rank_samples_per_sec" in df.columns else []
    width = max([workers] + [len(c) for c in cells if isinstance(c, (list, tuple, np.ndarray))])
    out = np.full((n, width), np.nan)
    for i, cell in enumerate(cells):
        if isinstance(cell, (list, tuple, np.ndarray)):
            try:  # numbers and None (-> NaN): the live case, ~100x faster than pandas per cell
                vals = np.array(cell, dtype=float)
            except (TypeError, ValueError):  # anything else a record may hold becomes NaN
                coerced = pd.to_numeric(pd.Series(list(cell), dtype=object), errors="coerce")
                vals = coerced.to_numpy(dtype=float, na_value=np.nan)
            out[i, : len(vals)] = vals
    return out


def ema(values: Sequence[float], smoothing: float) -> np.ndarray:
    """Exponential moving average s_t = a·s_(t-1) + (1−a)·y_t with a = `smoothing` (0 = off).

    Same length as the input; NaN inputs stay NaN (gaps) and do not disturb the average.
    """
    y = np.asarray(values, dtype=float)
    a = float(smoothing)
    if not 0.0 <= a < 1.0:
        raise ValueError(
            f"smoothing must be from 0 to below 1; you passed smoothing={smoothing!r}."
        )
    if a == 0.0 or y.size == 0:
        return y.copy()
    out = np.full_like(y, np.nan)
    state = math.nan
    for i, v in enumerate(y):
        if math.isfinite(v):
            state = v if not math.isfinite(state) else a * state + (1.0 - a) * v
            out[i] = state
    return out


def check_x(x: str) -> str:
    """`x` if it names an x axis (see X_AXES), else a ValueError that lists the choices."""
    if x not in X_AXES:
        raise ValueError(
            f"x must be one of {', '.join(repr(k) for k in X_AXES)}; you passed x={x!r}."
        )
    return x


def history_x(facts: RunFacts, x: str) -> np.ndarray:
    """x values of the history rows: step, samples seen or wall time."""
    h = facts.history
    if x == "samples" and "samples" not in h.columns:
        return column(h, "step") * (facts.global_batch or np.nan)
    return column(h, x)


def epoch_x(facts: RunFacts, x: str) -> np.ndarray:
    """x values of the epoch rows (samples = step × global batch when not recorded)."""
    e = facts.epochs
    if x == "samples" and "samples" not in e.columns:
        return column(e, "step") * (facts.global_batch or np.nan)
    return column(e, x)


def span(xs: np.ndarray) -> np.ndarray:
    """[min, max] of the finite values (empty when there are none): where a reference line runs."""
    finite = xs[np.isfinite(xs)]
    return np.array([finite.min(), finite.max()]) if finite.size else np.array([])


def last_finite(values: np.ndarray) -> float:
    """The last finite value, or NaN."""
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if finite.size else math.nan
