"""Measurement math, no TensorFlow: throughput, scaling efficiency, gradient noise scale.

* Throughput is reported the Horovod-benchmark way (horovod/examples/tensorflow2/
  tensorflow2_synthetic_benchmark.py): skip warm-up iterations, then mean ± 1.96 σ.
* Scaling efficiency E(N) = T_N / (N · T_1) for throughputs T (weak scaling: fixed per-rank batch).
* Gradient noise scale B_simple (McCandlish et al. 2018, "An Empirical Model of Large-Batch
  Training", arXiv:1812.06162, appendix A.1): from squared gradient norms measured at two batch
  sizes. Data parallelism gives both for free: B_small = per-rank batch (local gradient before the
  allreduce) and B_big = global batch (after it). Its known answer: the true B_simple of softmax
  regression at zero weights on class-conditional Gaussians, in closed form
  (:func:`softmax_zero_noise_components`; the ``linear`` model on the ``blobs`` data set).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Throughput:
    mean: float
    ci95: float  # 1.96 · standard deviation of the per-interval figures
    n: int  # intervals counted after warm-up

    def __str__(self) -> str:
        return f"{self.mean:,.0f} ± {self.ci95:,.0f} samples/s (n={self.n})"


def throughput_stats(
    values: Sequence[float],
    skip: int | float = 0.1,
    weights: Sequence[float] | None = None,
) -> Throughput:
    """Mean ± 1.96σ of per-interval throughputs after dropping the warm-up.

    `skip` is a count of leading intervals, or a fraction of them when < 1 (at least one interval
    is always kept if any exist). `weights` (one per value, e.g. each interval's seconds) weight
    the mean and σ; with durations as weights the mean is total samples over total seconds.
    """
    w_all = [1.0] * len(values) if weights is None else list(weights)
    if len(w_all) != len(values):
        raise ValueError(f"{len(values)} values but {len(w_all)} weights.")
    pairs = [
        (float(v), float(w))
        for v, w in zip(values, w_all)
        if v is not None and math.isfinite(float(v)) and w is not None and float(w) > 0
    ]
    if not pairs:
        return Throughput(float("nan"), float("nan"), 0)
    k = int(len(pairs) * skip) if isinstance(skip, float) and skip < 1 else int(skip)
    k = min(k, len(pairs) - 1)
    kept = np.asarray([v for v, _ in pairs[k:]])
    w = np.asarray([w for _, w in pairs[k:]])
    mean = float(np.average(kept, weights=w))
    std = float(np.sqrt(np.average((kept - mean) ** 2, weights=w)))
    return Throughput(mean, 1.96 * std, int(kept.size))


def efficiency(t_n: float | None, t_1: float | None, n: int) -> float:
    """Scaling efficiency E(N) = T_N / (N · T_1); 1.0 is perfect linear scaling.

    NaN when a throughput is missing (None, as a failed run records it), T_1 is not positive or
    N < 1. Used by the comparison charts and the benchmark suite alike.
    """
    if t_n is None or t_1 is None or not t_1 > 0 or n < 1:
        return float("nan")
    return t_n / (n * t_1)


def noise_components(
    g_small_sq: float, g_big_sq: float, b_small: int, b_big: int
) -> tuple[float, float]:
    """Unbiased estimates (|G|², tr Σ) from squared gradient norms at two batch sizes.

    McCandlish et al. 2018, eqs. (A.2)-(A.3):
        |G|²  ≈ (B_big·|G_big|² − B_small·|G_small|²) / (B_big − B_small)
        tr Σ ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)
    """
    if b_big <= b_small:
        return float("nan"), float("nan")
    g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


class NoiseScale:
    """Running B_simple = EMA(tr Σ) / EMA(|G|²).

    The two estimates are individually very noisy (|G|² can come out negative on one step), so
    numerator and denominator are averaged separately before dividing, as the paper advises.
    """

    def __init__(self, b_small: int, b_big: int, decay: float = 0.95):
        self.b_small, self.b_big, self.decay = b_small, b_big, decay
        self._g2 = None
        self._trace = None
        self.count = 0

    def update(self, g_small_sq: float, g_big_sq: float) -> float:
        g2, trace = noise_components(g_small_sq, g_big_sq, self.b_small, self.b_big)
        if not (math.isfinite(g2) and math.isfinite(trace)):
            return self.value
        if self._g2 is None:
            self._g2, self._trace = g2, trace
        else:
            d = self.decay
            self._g2 = d * self._g2 + (1 - d) * g2
            self._trace = d * self._trace + (1 - d) * trace
        self.count += 1
        return self.value

    @property
    def value(self) -> float:
        if self._g2 is None or self._g2 <= 0:
            return float("nan")
        return self._trace / self._g2


def softmax_zero_noise_components(means: np.ndarray, sigma: float) -> tuple[float, float]:
    """True (|G|², tr Σ) of softmax regression at zero weights on class-conditional Gaussians.

    The problem (the ``blobs`` data set with the ``linear`` model): C balanced classes,
    x | y=c ~ N(μ_c, σ² I) in d dimensions (``means`` is [C, d]), logits z = Kᵀx + b with kernel K
    (d x C) and bias b both zero, loss ℓ = −log softmax(z)_y. The batch loss is the mean of the
    per-sample losses, so a batch gradient is the mean of B per-sample gradients g, and
    E|G_B|² = |G|² + tr Σ / B with G = E[g], tr Σ = E|g|² − |G|² (McCandlish et al. 2018,
    arXiv:1812.06162, appendix A). Derivation:

    * ∂ℓ/∂z = p − e_y with p = softmax(0) = 1/C (uniform), so g_K = x (p − e_y)ᵀ, g_b = p − e_y.
    * Mean: E[e_y] = 1/C = p, so G_b = 0; E[x e_yᵀ] = (1/C) Σ_c μ_c e_cᵀ and E[x] pᵀ =
      (1/C) Σ_c x̄ e_cᵀ with x̄ = (1/C) Σ_c μ_c, so G_K = (1/C) Σ_c (x̄ − μ_c) e_cᵀ and
      |G|² = (1/C²) Σ_c |x̄ − μ_c|².
    * Second moment: |p − e_y|² = (C − 1)/C² + (1 − 1/C)² = 1 − 1/C for every y, and
      |x (p − e_y)ᵀ|²_F = |x|² |p − e_y|², so E|g|² = (1 − 1/C)(E|x|² + 1) with
      E|x|² = (1/C) Σ_c |μ_c|² + d σ².

    B_simple = tr Σ / |G|² (:func:`softmax_zero_noise_scale`).
    """
    means = np.asarray(means, dtype=np.float64)
    c, d = means.shape
    g_sq = float(((means.mean(axis=0) - means) ** 2).sum()) / c**2
    mean_sq_x = float((means**2).sum(axis=1).mean()) + d * float(sigma) ** 2
    return g_sq, (1.0 - 1.0 / c) * (mean_sq_x + 1.0) - g_sq


def softmax_zero_noise_scale(means: np.ndarray, sigma: float) -> float:
    """The true B_simple = tr Σ / |G|² of :func:`softmax_zero_noise_components`'s problem."""
    g_sq, trace = softmax_zero_noise_components(means, sigma)
    return trace / g_sq
