"""Optimizers for large-batch training as Keras 2.15 optimizers, and the numeric policy.

* ``LARS`` — layer-wise adaptive rate scaling, classic-momentum form (You, Gitman, Ginsburg 2017,
  "Large Batch Training of Convolutional Networks", arXiv:1708.03888; the same update as the
  TensorFlow Model Garden ``official/modeling/optimization/lars_optimizer.py``).
  Reference math: :func:`hpclab.core.scaling.lars_update_reference`.
* ``LAMB`` — layer-wise adaptive moments (You et al. 2019, "Large Batch Optimization for Deep
  Learning: Training BERT in 76 minutes", arXiv:1904.00962, Algorithm 2). ``tf.keras`` 2.15 has no
  LAMB built in (TensorFlow Addons had one, and is end-of-life), so this module carries its own.
  Reference math: :func:`hpclab.core.scaling.lamb_update_reference`.
* ``StepSchedule`` — the learning rate as a function of the step, the same formula as
  :func:`hpclab.core.scaling.lr_at_step` written in TensorFlow ops, so the LR a run uses is
  ``RunPlan.lr_at(s)`` (warm-up per step, Goyal et al. 2017) and the traced step holds a few
  scalars, not a table of ``total_steps`` floats. ``TableSchedule`` looks LRs up in a table.
* ``build_optimizer(cfg, learning_rate)`` — the optimizer a :class:`~hpclab.core.config.RunConfig` asks
  for, wrapped in a dynamic ``LossScaleOptimizer`` for ``mixed_float16``.
* ``set_precision(precision)`` — the global Keras mixed-precision policy.

All optimizers here subclass the Keras 2.15 "new" optimizer (``tf.keras.optimizers.Optimizer``:
``build`` / ``update_step`` / ``get_config``). Two facts of that API matter here:

* The base class applies *decoupled* weight decay (``w -= lr * wd * w``) on its own whenever
  ``self.weight_decay`` is not None. LARS folds the decay into the gradient and LAMB into the
  update direction, so both pass ``weight_decay=None`` to the base class and keep their own
  coefficient in ``self.weight_decay_rate``.
* ``update_step`` is traced once per variable (XLA-compiled when a GPU is present), so
  the name-based exclusions below are plain Python decided at trace time, at no per-step cost.

Variable names in Keras 2.15 look like ``conv1d/kernel:0``, ``conv1d/bias:0``,
``batch_normalization/gamma:0``, ``batch_normalization/beta:0`` and, in
``tf.keras.applications.ResNet50``, ``conv1_bn/gamma:0``; the default exclusion substrings match
all of these (biases and normalisation parameters get neither weight decay nor layer adaptation).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import tensorflow as tf

from hpclab.core.catalog import PRECISIONS
from hpclab.rank.keras2 import keras

# Variables whose name contains one of these substrings skip weight decay and the trust ratio
# (Model Garden / SimCLR convention: biases and batch-norm parameters).
DEFAULT_EXCLUDE = ("bias", "batch_normalization", "bn", "beta", "gamma")


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(p in name for p in patterns)


class _LayerwiseOptimizer(keras.optimizers.Optimizer):
    """Shared plumbing: own weight-decay coefficient, name exclusions, last trust ratio per var."""

    def __init__(
        self,
        name: str,
        weight_decay: float,
        exclude_from_weight_decay,
        exclude_from_layer_adaptation,
        **kwargs,
    ):
        # The base class would apply its own decoupled decay if weight_decay were set: keep None.
        kwargs.pop("weight_decay", None)
        super().__init__(name=name, weight_decay=None, **kwargs)
        self.weight_decay_rate = float(weight_decay)
        self.exclude_from_weight_decay_names = tuple(
            DEFAULT_EXCLUDE if exclude_from_weight_decay is None else exclude_from_weight_decay
        )
        # Model Garden: the layer-adaptation exclusions default to the weight-decay exclusions.
        self.exclude_from_layer_adaptation_names = tuple(
            self.exclude_from_weight_decay_names
            if exclude_from_layer_adaptation is None
            else exclude_from_layer_adaptation
        )

    def _decays(self, variable) -> bool:
        return self.weight_decay_rate != 0.0 and not _matches(
            variable.name, self.exclude_from_weight_decay_names
        )

    def _adapts(self, variable) -> bool:
        return not _matches(variable.name, self.exclude_from_layer_adaptation_names)

    def _slot(self, slots: list, variable):
        return slots[self._index_dict[self._var_key(variable)]]

    def _build_trust(self, var_list) -> None:
        # One scalar per variable: the trust ratio of the last step (1.0 for excluded variables).
        self.trust_ratios = [
            self.add_variable(
                shape=(),
                dtype=tf.float32,
                initializer="ones",
                name="trust_" + var.name.replace("/", "_").replace(":", "_"),
            )
            for var in var_list
        ]
        self._trust_names = [var.name for var in var_list]

    def last_trust_ratios(self) -> dict:
        """``{variable name: trust ratio of the last step}`` (1.0 before the first step)."""
        if not getattr(self, "_built", False):
            return {}
        return {n: float(t.numpy()) for n, t in zip(self._trust_names, self.trust_ratios)}

    @staticmethod
    def _trust(numerator_norm, denominator_norm, coefficient):
        """coefficient * ||a|| / ||b||, or 1 when either norm is zero."""
        ok = tf.logical_and(numerator_norm > 0, denominator_norm > 0)
        ratio = coefficient * tf.math.divide_no_nan(numerator_norm, denominator_norm)
        return tf.where(ok, ratio, tf.ones_like(ratio))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "learning_rate": self._serialize_hyperparameter(self._learning_rate),
                "weight_decay": self.weight_decay_rate,
                "exclude_from_weight_decay": list(self.exclude_from_weight_decay_names),
                "exclude_from_layer_adaptation": list(self.exclude_from_layer_adaptation_names),
            }
        )
        return config


class LARS(_LayerwiseOptimizer):
    """Layer-wise Adaptive Rate Scaling, classic momentum (You et al. 2017, arXiv:1708.03888).

    Per variable ``w`` with gradient ``g`` and velocity ``v`` (Model Garden's classic-momentum
    form; :func:`hpclab.core.scaling.lars_update_reference` is the NumPy twin the tests compare with)::

        g <- g + weight_decay * w              (skipped for exclude_from_weight_decay)
        trust = eta * ||w|| / ||g||            (1 if a norm is 0, or exclude_from_layer_adaptation)
        v <- momentum * v + lr * trust * g
        w <- w - v

    Args:
        learning_rate: float or ``tf.keras.optimizers.schedules.LearningRateSchedule``.
        momentum: velocity decay.
        weight_decay: L2 coefficient added to the gradient (so it is also trust-scaled).
        eta: trust coefficient (the paper's η, ≈ 0.001).
        exclude_from_weight_decay: name substrings; default ``DEFAULT_EXCLUDE``.
        exclude_from_layer_adaptation: name substrings; default: same as weight decay.
    """

    def __init__(
        self,
        learning_rate=0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        exclude_from_weight_decay: Iterable[str] | None = None,
        exclude_from_layer_adaptation: Iterable[str] | None = None,
        name: str = "LARS",
        **kwargs,
    ):
        super().__init__(
            name, weight_decay, exclude_from_weight_decay, exclude_from_layer_adaptation, **kwargs
        )
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.momentum = float(momentum)
        self.eta = float(eta)

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self.velocities = [self.add_variable_from_reference(var, "velocity") for var in var_list]
        self._build_trust(var_list)
        self._built = True

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        lr = tf.cast(self.learning_rate, dtype)
        v = self._slot(self.velocities, variable)
        g = tf.convert_to_tensor(gradient)  # IndexedSlices (embeddings) -> dense: norms need all
        if self._decays(variable):
            g = g + tf.cast(self.weight_decay_rate, dtype) * variable
        if self._adapts(variable):
            trust = self._trust(tf.norm(variable), tf.norm(g), tf.cast(self.eta, dtype))
        else:
            trust = tf.ones((), dtype)
        v.assign(tf.cast(self.momentum, dtype) * v + lr * trust * g)
        variable.assign_sub(v)
        self._slot(self.trust_ratios, variable).assign(tf.cast(trust, tf.float32))

    def get_config(self):
        config = super().get_config()
        config.update({"momentum": self.momentum, "eta": self.eta})
        return config


class LAMB(_LayerwiseOptimizer):
    """Layer-wise Adaptive Moments for Batch training (You et al. 2019, arXiv:1904.00962, Alg. 2).

    ``tf.keras`` 2.15 has no LAMB; this is the paper's Algorithm 2 with φ = identity::

        m <- b1 * m + (1 - b1) * g ;  v <- b2 * v + (1 - b2) * g²
        m̂ = m / (1 - b1^t) ;  v̂ = v / (1 - b2^t)            (t = 1-based step)
        r = m̂ / (sqrt(v̂) + epsilon) + weight_decay * w       (decoupled; excluded vars: no decay)
        trust = ||w|| / ||r||                                 (1 if a norm is 0, or excluded)
        w <- w - lr * trust * r

    :func:`hpclab.core.scaling.lamb_update_reference` is the NumPy twin the tests compare with.
    """

    def __init__(
        self,
        learning_rate=0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        weight_decay: float = 0.0,
        exclude_from_weight_decay: Iterable[str] | None = None,
        exclude_from_layer_adaptation: Iterable[str] | None = None,
        name: str = "LAMB",
        **kwargs,
    ):
        super().__init__(
            name, weight_decay, exclude_from_weight_decay, exclude_from_layer_adaptation, **kwargs
        )
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self.first_moments = [self.add_variable_from_reference(var, "m") for var in var_list]
        self.second_moments = [self.add_variable_from_reference(var, "v") for var in var_list]
        self._build_trust(var_list)
        self._built = True

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        lr = tf.cast(self.learning_rate, dtype)
        t = tf.cast(self.iterations + 1, dtype)
        b1 = tf.cast(self.beta_1, dtype)
        b2 = tf.cast(self.beta_2, dtype)
        m = self._slot(self.first_moments, variable)
        v = self._slot(self.second_moments, variable)
        g = tf.convert_to_tensor(gradient)
        m.assign(b1 * m + (1.0 - b1) * g)
        v.assign(b2 * v + (1.0 - b2) * tf.square(g))
        m_hat = m / (1.0 - tf.pow(b1, t))
        v_hat = v / (1.0 - tf.pow(b2, t))
        r = m_hat / (tf.sqrt(v_hat) + tf.cast(self.epsilon, dtype))
        if self._decays(variable):
            r = r + tf.cast(self.weight_decay_rate, dtype) * variable
        if self._adapts(variable):
            trust = self._trust(tf.norm(variable), tf.norm(r), tf.ones((), dtype))
        else:
            trust = tf.ones((), dtype)
        variable.assign_sub(lr * trust * r)
        self._slot(self.trust_ratios, variable).assign(tf.cast(trust, tf.float32))

    def get_config(self):
        config = super().get_config()
        config.update({"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon})
        return config


class TableSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """LR for optimizer step ``s`` (0-based) = ``table[min(s, len(table) - 1)]``.

    The table is :meth:`hpclab.core.plan.RunPlan.lr_table` — the same numbers as
    ``RunPlan.lr_at(step)``; steps past the end keep the last value. Keras passes
    ``optimizer.iterations`` (the number of updates already applied) as ``step``, and the
    mixed-float16 ``LossScaleOptimizer`` counts skipped (non-finite) steps too, so the table stays
    aligned with the engine's step counter.
    """

    def __init__(self, table, name: str = "TableSchedule"):
        super().__init__()
        values = np.asarray(table, dtype=np.float32).reshape(-1)
        if values.size == 0:
            raise ValueError("TableSchedule needs at least one learning rate; the table is empty.")
        self.table = values
        self.name = name

    def __call__(self, step):
        with tf.name_scope(self.name):
            table = tf.constant(self.table, dtype=tf.float32)
            index = tf.clip_by_value(tf.cast(step, tf.int64), 0, self.table.size - 1)
            return tf.gather(table, index)

    def get_config(self):
        return {"table": self.table.tolist(), "name": self.name}


class StepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """LR for optimizer step ``s`` (0-based) = :func:`hpclab.core.scaling.lr_at_step` at
    ``min(s, total_steps - 1)``, computed in the graph from the step (O(1) memory however long
    the run).

    The arguments are :meth:`hpclab.core.plan.RunPlan.lr_params`. The arithmetic is float64 in
    the same order as ``lr_at_step``, rounded to float32 at the end, so it gives the float32 of
    ``RunPlan.lr_at(step)`` — the numbers of ``RunPlan.lr_table()`` (tests/test_lr_schedule_fn.py
    compares them at every step of every rule). Steps past the end keep the last step's LR.
    Keras passes ``optimizer.iterations`` (updates already applied) as ``step``; the
    mixed-float16 ``LossScaleOptimizer`` counts skipped (non-finite) steps too, so the schedule
    stays aligned with the engine's step counter.
    """

    def __init__(
        self,
        *,
        start_lr: float,
        peak_lr: float,
        warmup_steps: int,
        total_steps: int,
        schedule: str = "constant",
        name: str = "StepSchedule",
    ):
        super().__init__()
        if total_steps < 1:
            raise ValueError(f"StepSchedule needs total_steps >= 1; it got {total_steps}.")
        if schedule not in ("constant", "cosine", "poly"):
            raise ValueError(
                f"schedule must be one of constant, cosine, poly; you passed {schedule!r}."
            )
        self.start_lr, self.peak_lr = float(start_lr), float(peak_lr)
        self.warmup_steps, self.total_steps = int(warmup_steps), int(total_steps)
        self.schedule, self.name = schedule, name

    def __call__(self, step):
        with tf.name_scope(self.name):
            f64 = tf.float64
            last = self.total_steps - 1
            s = tf.cast(tf.clip_by_value(tf.cast(step, tf.int64), 0, last), f64)
            start, peak = tf.constant(self.start_lr, f64), tf.constant(self.peak_lr, f64)
            warm = self.warmup_steps
            span = float(max(1, self.total_steps - warm))
            progress = tf.clip_by_value((s - float(warm)) / span, 0.0, 1.0)
            if self.schedule == "cosine":
                after = 0.5 * peak * (1.0 + tf.cos(math.pi * progress))
            elif self.schedule == "poly":
                after = peak * tf.square(1.0 - progress)
            else:
                after = tf.broadcast_to(peak, tf.shape(s))
            if warm > 0:
                ramp = start + (peak - start) * s / float(warm)
                after = tf.where(s < float(warm), ramp, after)
            return tf.cast(after, tf.float32)

    def get_config(self):
        return {
            "start_lr": self.start_lr,
            "peak_lr": self.peak_lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "schedule": self.schedule,
            "name": self.name,
        }


def set_precision(precision: str) -> None:
    """Set the global Keras mixed-precision policy: float32 | mixed_float16 | mixed_bfloat16.

    Call before building the model. Models from :mod:`hpclab.rank.models` keep their last layer in
    float32, so logits and the loss stay float32 under either mixed policy.
    """
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision must be one of {', '.join(PRECISIONS)}; you passed precision={precision!r}."
        )
    keras.mixed_precision.set_global_policy(precision)


def build_optimizer(cfg: dict, learning_rate) -> keras.optimizers.Optimizer:
    """The optimizer ``cfg["optimizer"]`` names (``cfg`` is ``RunConfig.to_dict()``).

    ``learning_rate`` is a float or a schedule (usually :class:`StepSchedule`).

    ==========  =================================================================================
    sgd         ``SGD`` without momentum
    momentum    ``SGD(momentum=cfg["momentum"])``
    lars        :class:`LARS` (momentum, weight decay in the gradient, ``lars_eta``)
    lamb        :class:`LAMB` (beta_1 = ``momentum``, decoupled weight decay)
    adam        ``Adam(beta_1=cfg["momentum"])``
    ==========  =================================================================================

    Weight decay: LARS adds ``wd * w`` to the gradient (the paper's form); every other optimizer
    applies it *decoupled*, ``w -= lr * wd * w`` per step (Loshchilov & Hutter 2019,
    arXiv:1711.05101) — LAMB by its algorithm, sgd/momentum/adam through Keras's built-in
    ``weight_decay`` argument. Biases and normalisation parameters (``DEFAULT_EXCLUDE``) are never
    decayed. For ``precision == "mixed_float16"`` (unless ``loss_scaling`` is False, to show what
    it prevents) the optimizer is wrapped in a dynamic
    ``tf.keras.mixed_precision.LossScaleOptimizer``; the training step must then use
    ``get_scaled_loss`` and ``get_unscaled_gradients``. ``mixed_bfloat16`` needs no loss scaling.
    """
    name = cfg.get("optimizer", "momentum")
    momentum = float(cfg.get("momentum", 0.9))
    wd = float(cfg.get("weight_decay", 0.0))
    keras_wd = wd if wd > 0 else None
    if name == "sgd":
        opt = keras.optimizers.SGD(learning_rate, momentum=0.0, weight_decay=keras_wd)
    elif name == "momentum":
        opt = keras.optimizers.SGD(learning_rate, momentum=momentum, weight_decay=keras_wd)
    elif name == "adam":
        opt = keras.optimizers.Adam(learning_rate, beta_1=momentum, weight_decay=keras_wd)
    elif name == "lars":
        opt = LARS(
            learning_rate, momentum=momentum, weight_decay=wd, eta=float(cfg.get("lars_eta", 0.001))
        )
    elif name == "lamb":
        opt = LAMB(learning_rate, beta_1=momentum, weight_decay=wd)
    else:
        raise ValueError(
            "optimizer must be one of sgd, momentum, lars, lamb, adam; "
            f"you passed optimizer={name!r}."
        )
    if keras_wd is not None and name in ("sgd", "momentum", "adam"):
        # Keras matches these as regular expressions against variable names (substrings here).
        opt.exclude_from_weight_decay(var_names=list(DEFAULT_EXCLUDE))
    precision = cfg.get("precision", "float32")
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision must be one of {', '.join(PRECISIONS)}; you passed precision={precision!r}."
        )
    if precision == "mixed_float16" and cfg.get("loss_scaling", True):
        # Dynamic loss scaling: float16 gradients underflow without it (TF mixed-precision guide).
        opt = keras.mixed_precision.LossScaleOptimizer(opt)
    return opt
