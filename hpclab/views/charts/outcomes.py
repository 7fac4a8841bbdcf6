"""What one run achieved: final accuracy, throughput, and steps/time to a target accuracy.

Pure functions on :class:`hpclab.views.charts.facts.RunFacts` (and on an epochs DataFrame), shared by the
comparison table and the sweep charts. The target defaults to 90 % of the best final validation
accuracy among the runs compared; steps-to-target vs batch size is the measure Shallue et al.
2018 ("Measuring the Effects of Data Parallelism on Neural Network Training", arXiv:1811.03600)
use to find the three regimes of data parallelism.

NumPy and pandas only; nothing here draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from hpclab.core.metrics import throughput_stats
from hpclab.views.charts.facts import RunFacts, column, facts_of

TARGET_FRACTION = 0.9  # default target: 90 % of the best final validation accuracy


def evaluations(f: RunFacts) -> pd.DataFrame:
    """The run's held-out accuracy over steps: ``step``, ``time_s``, ``val_accuracy``.

    The step-granular evaluations on the fixed held-out subset (history rows with a finite
    ``eval_accuracy``, every ``RunConfig.eval_every`` steps) when the run has them, so steps to a
    target are exact to that interval; else the epoch-end validations (older records, or
    ``eval_samples=0``), exact only to an epoch."""
    h = f.history
    acc = column(h, "eval_accuracy")
    if np.isfinite(acc).any():
        keep = np.isfinite(acc)
        return pd.DataFrame(
            {
                "step": column(h, "step")[keep],
                "time_s": column(h, "time_s")[keep],
                "val_accuracy": acc[keep],
            }
        )
    return f.epochs


def _first_reaching(epochs: pd.DataFrame, target: float) -> int | None:
    acc = column(epochs, "val_accuracy")
    hits = np.flatnonzero(np.isfinite(acc) & (acc >= target))
    return int(hits[0]) if hits.size else None


def steps_to_target(epochs: pd.DataFrame, target: float) -> int | None:
    """Optimizer steps at the first row of `epochs` (an epochs frame or :func:`evaluations`)
    whose val_accuracy ≥ target; None if never."""
    i = _first_reaching(epochs, target)
    if i is None:
        return None
    step = column(epochs, "step")[i]
    return int(step) if math.isfinite(step) else None


def time_to_target(epochs: pd.DataFrame, target: float) -> float | None:
    """Wall time (s) since training began at the first row of `epochs` (see
    :func:`steps_to_target`) whose val_accuracy ≥ target; None if never."""
    i = _first_reaching(epochs, target)
    if i is None:
        return None
    t = column(epochs, "time_s")[i]
    return float(t) if math.isfinite(t) else None


def finite(value: Any) -> float | None:
    """`value` as a finite float, or None (missing, NaN, inf or not a number)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def final_val_accuracy(f: RunFacts) -> float | None:
    """The summary's val_accuracy, else the last epoch row's (a run still going)."""
    v = finite(f.summary.get("val_accuracy"))
    if v is None:
        acc = column(f.epochs, "val_accuracy")
        acc = acc[np.isfinite(acc)]
        v = float(acc[-1]) if acc.size else None
    return v


def throughput(f: RunFacts) -> tuple[float | None, float | None]:
    """(global samples/s, ±95 % half-width): the summary's, else from the history rows."""
    mean, ci = (
        finite(f.summary.get("samples_per_sec")),
        finite(f.summary.get("samples_per_sec_ci95")),
    )
    if mean is None:
        stats = throughput_stats(column(f.history, "samples_per_sec"))
        mean, ci = finite(stats.mean), finite(stats.ci95)
    return mean, ci


def steps_done(f: RunFacts) -> float | None:
    """Optimizer steps the run did (summary, history or epochs, whichever says most)."""
    candidates = [
        finite(f.summary.get("steps")),
        *(
            finite(np.nanmax(c)) if np.isfinite(c).any() else None
            for c in (column(f.history, "step"), column(f.epochs, "step"))
        ),
    ]
    found = [c for c in candidates if c]
    return max(found) if found else None


def time_done(f: RunFacts) -> float | None:
    """Training seconds the run did (history or epochs; else the summary's train_time_s)."""
    candidates = [
        finite(np.nanmax(c)) if np.isfinite(c).any() else None
        for c in (column(f.history, "time_s"), column(f.epochs, "time_s"))
    ]
    found = [c for c in candidates if c] or [
        c for c in [finite(f.summary.get("train_time_s"))] if c
    ]
    return max(found) if found else None


def default_target(runs: Iterable[Any]) -> float | None:
    """90 % of the best final validation accuracy, rounded down to 2 decimals (None if no run
    has one)."""
    accs = [a for a in (final_val_accuracy(f) for f in facts_of(runs)) if a is not None]
    if not accs:
        return None
    return math.floor(TARGET_FRACTION * max(accs) * 100 + 1e-9) / 100


def describe_target(target: float | None, runs: Iterable[Any] = ()) -> str:
    """A sentence saying which target accuracy is used and where it came from."""
    if target is None:
        return "No target accuracy: no run has a validation accuracy yet."
    accs = [a for a in (final_val_accuracy(f) for f in facts_of(runs)) if a is not None]
    if accs and target == default_target(runs):
        return (
            f"Target: validation accuracy ≥ {target:.2f} ({TARGET_FRACTION:.0%} of the best "
            f"final validation accuracy, {max(accs):.3f}, rounded down)."
        )
    return f"Target: validation accuracy ≥ {target:.3g}."


def failed(f: RunFacts) -> bool:
    """The run ended failed or diverged (its numbers are not a result)."""
    return f.status in ("failed", "diverged")
