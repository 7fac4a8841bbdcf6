"""Learning-rate rules for large-batch training, as pure functions (no TensorFlow).

* Linear scaling rule and gradual warm-up: Goyal et al. 2017, "Accurate, Large Minibatch SGD:
  Training ImageNet in 1 Hour", arXiv:1706.02677 — lr = base_lr * B / B_base, reached by a linear
  ramp that starts at the small-batch LR base_lr (sec. 2.2). The ramp always starts at
  peak * B_base / B (:func:`warmup_start_lr`): base_lr under the linear rule, and a ramp *up* under
  every rule; a global batch no larger than B_base has nothing to warm up.
* Polynomial decay after warm-up, lr = peak * (1 - progress)^2: the LARS paper's schedule
  (You et al. 2017, sec. 6, "polynomial (power=2) decay").
* Square-root scaling: lr = base_lr * sqrt(B / B_base) (Krizhevsky 2014, arXiv:1404.5997; the
  variance argument of Hoffer et al. 2017, arXiv:1705.08741).
* LARS trust ratio: You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks",
  arXiv:1708.03888, in the classic-momentum form of the TensorFlow Model Garden optimizer.

The engine's TensorFlow code and the tests both use these, so the number a widget shows before
a run is the number the run uses.
"""

from __future__ import annotations

import math

import numpy as np

from hpclab.core.catalog import LR_SCALINGS as RULES


def scaled_lr(base_lr: float, global_batch: int, base_batch: int, rule: str) -> float:
    """Peak learning rate for `global_batch` given `base_lr` tuned at `base_batch`."""
    ratio = global_batch / base_batch
    if rule == "none":
        return base_lr
    if rule == "linear":  # Goyal et al. 2017, eq. (1) context: "multiply the LR by k"
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    raise ValueError(f"lr_scaling must be one of {', '.join(RULES)}; you passed {rule!r}.")


def warmup_start_lr(peak_lr: float, global_batch: int, base_batch: int) -> float | None:
    """Where the warm-up ramp starts: peak_lr * base_batch / global_batch; None if there is
    nothing to warm up (global_batch <= base_batch: the batch is no larger than the one the LR
    was tuned at).

    Goyal et al. 2017 (sec. 2.2) ramp from the small-batch LR eta to k * eta for a batch k times
    larger; under the linear rule peak / k *is* eta = base_lr. Dividing the peak by k whatever the
    rule gives that start under the linear rule and, under the others, a start below base_lr, so
    the ramp always goes up (sqrt: from base_lr / sqrt(k); none: from base_lr / k). Horovod's
    ``LearningRateWarmupCallback`` ramps from lr / size, the same rule when the base batch is one
    worker's batch.
    """
    if global_batch <= base_batch:
        return None
    return peak_lr * base_batch / global_batch


def lr_at_step(
    step: int,
    *,
    start_lr: float,
    peak_lr: float,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "constant",
) -> float:
    """LR for 0-based optimizer step `step`.

    Warm-up (Goyal et al. 2017, sec. 2.2 "gradual warmup"): a linear ramp per step from
    `start_lr` at step 0 to peak_lr at step `warmup_steps` (:func:`warmup_start_lr` gives the
    start; `warmup_steps` 0 means no ramp). Afterwards the LR stays at peak_lr ("constant"),
    follows a half-cosine to 0 at `total_steps` ("cosine", Loshchilov & Hutter 2016,
    arXiv:1608.03983), or decays as peak * (1 - progress)^2 ("poly", You et al. 2017).
    """
    if warmup_steps > 0 and step < warmup_steps:
        return start_lr + (peak_lr - start_lr) * step / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    if schedule == "cosine":
        return 0.5 * peak_lr * (1.0 + math.cos(math.pi * progress))
    if schedule == "poly":
        return peak_lr * (1.0 - progress) ** 2
    return peak_lr


def lr_schedule_array(total_steps: int, **kwargs) -> np.ndarray:
    """The whole schedule as float32 array (the engine looks LRs up by step in-graph)."""
    return np.array(
        [lr_at_step(s, total_steps=total_steps, **kwargs) for s in range(total_steps)],
        dtype=np.float32,
    )


def lars_trust_ratio(w_norm: float, g_norm: float, eta: float) -> float:
    """eta * ||w|| / ||g||, or 1 when either norm is zero (Model Garden's convention)."""
    if w_norm > 0 and g_norm > 0:
        return eta * w_norm / g_norm
    return 1.0


def lars_update_reference(
    w: np.ndarray,
    g: np.ndarray,
    v: np.ndarray,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    eta: float,
    excluded: bool = False,
) -> tuple[np.ndarray, np.ndarray, float]:
    """One LARS step in NumPy, the reference the TensorFlow optimizer is tested against.

    Classic-momentum LARS (You et al. 2017, Algorithm 1; TF Model Garden `LARS`):
        g <- g + wd * w                       (skipped for excluded variables)
        trust = eta * ||w|| / ||g||           (1 if a norm is 0 or the variable is excluded)
        v <- momentum * v + lr * trust * g
        w <- w - v
    Returns (new_w, new_v, trust).
    """
    w = np.asarray(w, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if excluded:
        trust = 1.0
    else:
        g = g + weight_decay * w
        trust = lars_trust_ratio(float(np.linalg.norm(w)), float(np.linalg.norm(g)), eta)
    v_new = momentum * v + lr * trust * g
    return w - v_new, v_new, trust


def lamb_update_reference(
    w: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    *,
    t: int,
    lr: float,
    beta_1: float,
    beta_2: float,
    epsilon: float,
    weight_decay: float,
    excluded: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """One LAMB step in NumPy, the reference `hpclab.rank.optimizers.LAMB` is tested against.

    You et al. 2019, "Large Batch Optimization for Deep Learning", arXiv:1904.00962, Algorithm 2
    (scaling function phi = identity), with `t` the 1-based step used for bias correction:
        m <- b1 m + (1 - b1) g ;  v <- b2 v + (1 - b2) g^2
        r = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * w     (no wd if excluded)
        trust = ||w|| / ||r||                  (1 if a norm is 0 or the variable is excluded)
        w <- w - lr * trust * r
    Returns (new_w, new_m, new_v, trust).
    """
    w = np.asarray(w, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    m = beta_1 * np.asarray(m, dtype=np.float64) + (1.0 - beta_1) * g
    v = beta_2 * np.asarray(v, dtype=np.float64) + (1.0 - beta_2) * g * g
    r = (m / (1.0 - beta_1**t)) / (np.sqrt(v / (1.0 - beta_2**t)) + epsilon)
    if excluded:
        trust = 1.0
    else:
        r = r + weight_decay * w
        w_norm, r_norm = float(np.linalg.norm(w)), float(np.linalg.norm(r))
        trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
    return w - lr * trust * r, m, v, trust
