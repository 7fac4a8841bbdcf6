"""The critical batch: steps and samples to a target as functions of the batch, fitted.

McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training",
arXiv:1812.06162, eq. 2.11 and Fig. 6: with the learning rate tuned *per batch*, the optimizer
steps S and the training samples E = B·S needed to reach a given loss or accuracy trade off as ::

    S(B) = S_min (1 + B_crit / B)          E(B) = E_min (1 + B / B_crit)      E_min = S_min · B_crit

so (S / S_min − 1)(E / E_min − 1) = 1. Below B_crit doubling the batch nearly halves the steps
(perfect scaling); above it the steps hardly fall while the samples double. B_crit is the batch
where both cost twice their minimum. The paper predicts B_crit ≈ B_noise ≈ B_simple = tr Σ / |G|²
(the gradient noise scale, :func:`hpclab.core.metrics`), only approximately: the ratio of a
fitted B_crit to a measured B_simple is a measurement, stated whatever it is.

Steps to target read from runs whose LR was *not* tuned per batch (one scaling rule for every
batch) trace that rule, not this curve (Shallue et al. 2018, arXiv:1811.03600, sec. 4.3):
:func:`best_per_batch` picks each batch's best learning rate from a grid and says when the best
sits at the grid's edge (the tuning may be incomplete there).

The fit is least squares on *relative* residuals (steps to target scatter in proportion to their
size), with the covariance of the two parameters from the residuals (``curve_fit`` with
``absolute_sigma=False``); uncertainties are one standard error, propagated to derived numbers to
first order (the delta method). NumPy and SciPy only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hpclab.core.errors import ConfigError

MIN_POINTS = 3  # two parameters, plus one degree of freedom for their uncertainty


@dataclass(frozen=True)
class CriticalBatchFit:
    """S(B) = S_min (1 + B_crit / B) fitted to measured (batch, steps) pairs (module doc).

    ``s_min_se``/``b_crit_se`` are one standard error; ``covariance`` is of (S_min, B_crit).
    ``rel_rms`` is the root-mean-square relative residual of the points fitted."""

    s_min: float
    b_crit: float
    s_min_se: float
    b_crit_se: float
    covariance: np.ndarray = field(repr=False)
    batches: tuple[float, ...]
    steps: tuple[float, ...]
    rel_rms: float

    @property
    def e_min(self) -> float:
        """Fewest samples to the target (the small-batch limit): S_min · B_crit."""
        return self.s_min * self.b_crit

    def predict_steps(self, batch) -> np.ndarray | float:
        """S(B) = S_min (1 + B_crit / B)."""
        b = np.asarray(batch, dtype=float)
        out = self.s_min * (1.0 + self.b_crit / b)
        return float(out) if out.ndim == 0 else out

    def predict_samples(self, batch) -> np.ndarray | float:
        """E(B) = B · S(B) = E_min (1 + B / B_crit)."""
        b = np.asarray(batch, dtype=float)
        out = self.e_min * (1.0 + b / self.b_crit)
        return float(out) if out.ndim == 0 else out

    def steps_se(self, batch) -> np.ndarray | float:
        """One standard error of S(B), to first order in the parameters' covariance."""
        b = np.asarray(batch, dtype=float)
        grad = np.stack([1.0 + self.b_crit / b, self.s_min / b])  # dS/dS_min, dS/dB_crit
        var = np.einsum("i...,ij,j...->...", grad, self.covariance, grad)
        out = np.sqrt(np.maximum(var, 0.0))
        return float(out) if out.ndim == 0 else out

    def compare_b_simple(self, b_simple: float) -> dict:
        """B_crit beside a measured gradient noise scale B_simple: their ratio (with its standard
        error) and a sentence that states it whatever it is."""
        b_simple = _positive("b_simple", b_simple)
        ratio = self.b_crit / b_simple
        ratio_se = self.b_crit_se / b_simple
        if abs(ratio - 1.0) <= 2 * ratio_se:
            verdict = "agree within two standard errors"
        elif ratio > 1:
            verdict = "B_crit is larger than B_simple by more than two standard errors"
        else:
            verdict = "B_crit is smaller than B_simple by more than two standard errors"
        return {
            "b_crit": self.b_crit,
            "b_crit_se": self.b_crit_se,
            "b_simple": b_simple,
            "ratio": ratio,
            "ratio_se": ratio_se,
            "sentence": (
                f"B_crit = {self.b_crit:,.0f} ± {self.b_crit_se:,.0f} and B_simple = "
                f"{b_simple:,.0f}: ratio {ratio:.2f} ± {ratio_se:.2f}; {verdict} (McCandlish "
                "et al. 2018 expect B_crit ≈ B_simple only roughly)."
            ),
        }

    def describe(self) -> str:
        """One sentence: the fitted numbers with their standard errors."""
        return (
            f"S_min = {self.s_min:,.0f} ± {self.s_min_se:,.0f} steps, B_crit = "
            f"{self.b_crit:,.0f} ± {self.b_crit_se:,.0f}, E_min = {self.e_min:,.0f} samples "
            f"(fitted to {len(self.batches)} batches from {min(self.batches):,.0f} to "
            f"{max(self.batches):,.0f}; relative rms residual {self.rel_rms:.1%})"
        )


def _positive(name: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(f"{name} must be a finite number > 0; you passed {value!r}.")
    return v


def _checked_points(batches: Sequence, steps: Sequence) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(list(batches), dtype=float)
    s = np.asarray(list(steps), dtype=float)
    if b.ndim != 1 or b.shape != s.shape:
        raise ConfigError(
            f"batches and steps must be two lists of the same length; you passed {b.size} "
            f"batches and {s.size} steps."
        )
    for name, v in (("batches", b), ("steps", s)):
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ConfigError(
                f"{name} must all be finite and > 0 (a batch that never reached the target has "
                f"no steps to fit: leave it out); you passed {v.tolist()!r}."
            )
    if np.unique(b).size < MIN_POINTS:
        raise ConfigError(
            f"batches must hold at least {MIN_POINTS} different batch sizes to fit S_min and "
            f"B_crit with an uncertainty; you passed {sorted(set(b.tolist()))!r}."
        )
    return b, s


def fit_critical_batch(batches: Sequence, steps: Sequence) -> CriticalBatchFit:
    """Least-squares fit of S(B) = S_min (1 + B_crit / B) to steps-to-target per batch.

    ``steps`` should be read at the best learning rate of each batch (:func:`best_per_batch`).
    Raises ConfigError, naming what is wrong, when the points cannot determine the curve: fewer
    than three batches, a non-positive value, steps that do not fall as the batch grows (no
    curve with B_crit > 0 fits) or that fall as fast as 1/B or faster (every batch measured is
    below B_crit: S_min is not determined; measure larger batches).
    """
    from scipy.optimize import curve_fit

    b, s = _checked_points(batches, steps)
    # The model is linear in (S_min, S_min·B_crit): S = a + c / B. Solve that first (relative
    # weights), which both checks the shape and starts the nonlinear fit.
    design = np.stack([np.ones_like(b), 1.0 / b], axis=1) / s[:, None]
    (a, c), *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    if c <= 0:
        raise ConfigError(
            f"steps must fall as the batch grows for a critical batch to exist; steps "
            f"{s.tolist()!r} at batches {b.tolist()!r} do not (every batch is past B_crit, or "
            "the learning rate was not tuned per batch)."
        )
    if a <= 0:
        raise ConfigError(
            f"steps {s.tolist()!r} at batches {b.tolist()!r} fall as fast as 1/B or faster: "
            "every batch is below B_crit, so S_min is not determined; add larger batches."
        )

    def model(batch, s_min, b_crit):
        return s_min * (1.0 + b_crit / batch)

    params, cov = curve_fit(model, b, s, p0=(a, c / a), sigma=s, absolute_sigma=False)
    s_min, b_crit = (float(p) for p in params)
    residual = (s - model(b, s_min, b_crit)) / s
    if not np.all(np.isfinite(cov)):  # the two parameters are not separately determined
        raise ConfigError(
            f"steps {s.tolist()!r} at batches {b.tolist()!r} do not determine S_min and B_crit "
            "separately; measure batches on both sides of the bend."
        )
    return CriticalBatchFit(
        s_min=s_min,
        b_crit=b_crit,
        s_min_se=float(math.sqrt(cov[0, 0])),
        b_crit_se=float(math.sqrt(cov[1, 1])),
        covariance=np.asarray(cov, dtype=float),
        batches=tuple(b.tolist()),
        steps=tuple(s.tolist()),
        rel_rms=float(np.sqrt(np.mean(residual**2))),
    )


@dataclass(frozen=True)
class BestLR:
    """One batch's best learning rate from a grid: the fewest steps to target."""

    batch: int
    lr: float
    steps: float
    at_edge: bool  # the best LR is the grid's smallest or largest: the optimum may lie outside
    tried: int  # learning rates tried at this batch


def best_per_batch(rows: Iterable[tuple[float, float, float | None]]) -> list[BestLR]:
    """From (batch, lr, steps to target or None) rows, each batch's best LR, by batch.

    A batch whose runs all missed the target is left out (it has no steps to fit); ``at_edge``
    warns that the grid did not bracket the best LR (Shallue et al. 2018 tune per batch over a
    grid wide enough to bracket it)."""
    by_batch: dict[float, list[tuple[float, float | None]]] = {}
    for batch, lr, steps in rows:
        by_batch.setdefault(float(batch), []).append((float(lr), steps))
    out = []
    for batch in sorted(by_batch):
        tried = sorted(by_batch[batch])
        reached = [
            (s, lr) for lr, s in tried if s is not None and math.isfinite(float(s)) and float(s) > 0
        ]
        if not reached:
            continue
        steps, lr = min(reached)
        lrs = [lr_ for lr_, _ in tried]
        at_edge = len(lrs) > 1 and lr in (lrs[0], lrs[-1])
        out.append(BestLR(int(batch), lr, float(steps), at_edge, len(lrs)))
    return out


__all__ = ["CriticalBatchFit", "fit_critical_batch", "BestLR", "best_per_batch", "MIN_POINTS"]
