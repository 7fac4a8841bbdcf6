"""Where a model's gradients sit against float16's range, and what loss scaling moves.

float16 has 5 exponent bits: its smallest normal number is 2^-14 and its smallest subnormal
2^-24; a gradient of magnitude below ~2^-25 becomes exactly 0, one between 2^-24 and 2^-14 keeps
fewer than 10 significant bits. Micikevicius et al. 2018 ("Mixed Precision Training", ICLR,
arXiv:1710.03740, Fig. 3) plot the exponents of a network's *activation* gradients — the float16
tensors backprop carries from layer to layer — and find most of them below 2^-24; multiplying the
loss by S (loss scaling) shifts every exponent up by log2 S before backprop and back after.

This probe measures the same on this lab's models (run through ``lab.apply``; rank 0 works,
the others return ``None``):

* the model is trained in float32 (plain momentum SGD, the run's data) to each of ``epochs``;
* at each point, on one batch, the float32 gradients with respect to every hidden layer's
  output (activation gradients) and to every weight are taken: the *reference*. Their log2|g|
  histogram, and the share below 2^-24 and 2^-14 with the loss unscaled and scaled by S, say
  what float16 would lose;
* the same batch through the same weights under ``mixed_float16`` (loss unscaled, then scaled by
  S) gives the gradients float16 really produces: ``flushed`` is the share of elements that are
  exactly 0 there but not in the float32 reference — underflow counted, not inferred. Zeros the
  reference has too (ReLUs that pass nothing back) are structural, not underflow.

:func:`continue_in_float16` then trains from the float32 weights in ``mixed_float16`` with and
without loss scaling, so a notebook can show whether the lost gradients change the result.
"""

from __future__ import annotations

import numpy as np

LOW, HIGH = -40, 12  # the histogram's exponent bins (integer log2|g|); outside ones are clipped
NORMAL, SUBNORMAL = -14, -24  # float16's smallest normal and smallest subnormal, as powers of 2


def _setup(cfg: dict, data_dir: str):
    from hpclab.rank import data
    from hpclab.rank.keras2 import keras

    arrays = data.load_arrays(cfg, data_dir)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return arrays, loss_fn


def _built(cfg: dict, arrays, policy: str, weights=None):
    from hpclab.rank import models
    from hpclab.rank.keras2 import keras

    keras.mixed_precision.set_global_policy(policy)
    try:
        model = models.build_model(
            cfg["model"], arrays.input_shape, arrays.num_classes, cfg["seed"]
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if weights is not None:
        model.set_weights(weights)
    return model


def _gradients(model, x, y, loss_fn, scale: float):
    """(activation gradients, weight gradients) as float64 NumPy, loss multiplied by ``scale``;
    activation gradients of the hidden layers' outputs (the logits' own are float32 always)."""
    import tensorflow as tf

    from hpclab.rank.keras2 import keras

    hidden = [layer.output for layer in model.layers[1:-1]]
    probe = keras.Model(model.inputs, [*hidden, model.output])
    with tf.GradientTape() as tape:
        *outs, logits = probe(x, training=True)
        loss = loss_fn(y, tf.cast(logits, tf.float32)) * scale
    acts, weights = tape.gradient(loss, [outs, model.trainable_variables])
    flat = lambda gs: np.concatenate(  # noqa: E731
        [g.numpy().astype(np.float64).ravel() for g in gs if g is not None]
    )
    return flat(acts), flat(weights)


def _histogram(g: np.ndarray) -> list[int]:
    nonzero = np.abs(g[g != 0])
    bins = np.clip(np.floor(np.log2(nonzero)), LOW, HIGH).astype(int) - LOW
    return np.bincount(bins, minlength=HIGH - LOW + 1).tolist()


def _shares(ref: np.ndarray, f16: np.ndarray, shift: float) -> dict:
    """Shares of all elements: below float16's subnormal/normal range after scaling the float32
    reference by 2^shift, and flushed (0 in float16, not 0 in the reference)."""
    mag = np.abs(ref) * 2.0**shift
    return {
        "below_subnormal": float(np.mean((ref != 0) & (mag < 2.0**SUBNORMAL))),
        "below_normal": float(np.mean((ref != 0) & (mag < 2.0**NORMAL))),
        "flushed": float(np.mean((ref != 0) & (f16 == 0))),
        "structural_zero": float(np.mean(ref == 0)),
    }


def _point(cfg, arrays, loss_fn, weights, batch: int, scale: float) -> dict:
    import tensorflow as tf

    x = tf.constant(arrays.x_train[:batch])
    y = tf.constant(arrays.y_train[:batch])
    ref_a, ref_w = _gradients(_built(cfg, arrays, "float32", weights), x, y, loss_fn, 1.0)
    f16 = _built(cfg, arrays, "mixed_float16", weights)
    out = {"elements": {"activation": int(ref_a.size), "weight": int(ref_w.size)}}
    for name, s in (("unscaled", 1.0), ("scaled", scale)):
        got_a, got_w = _gradients(f16, x, y, loss_fn, s)
        shift = float(np.log2(s))
        out[name] = {
            "activation": _shares(ref_a, got_a, shift),
            "weight": _shares(ref_w, got_w, shift),
        }
    out["histogram"] = {"activation": _histogram(ref_a), "weight": _histogram(ref_w)}
    return out


def gradient_exponents(
    cfg: dict, data_dir: str, epochs=(0, 6), batch: int = 512, scale: float = 2.0**15
) -> dict | None:
    """On rank 0 (others: ``None``): the gradient-exponent histograms and float16's losses at
    each of ``epochs`` of float32 training (``cfg`` is ``RunConfig.to_dict()``: its data, model,
    seed, batch per worker and its LR by the linear rule, momentum). ``scale`` is the loss scale S compared (2^15, Keras's
    dynamic loss scale's starting value). Returns ``{"bins": [...], "normal": -14, "subnormal":
    -24, "scale_log2": 15, "points": [{"epoch", "val_accuracy", "weights", ...}]}`` where a
    point's ``weights`` are the float32 weights there (for :func:`continue_in_float16`)."""
    import horovod.tensorflow as hvd

    from hpclab.rank.keras2 import keras

    if hvd.rank() != 0:
        return None
    arrays, loss_fn = _setup(cfg, data_dir)
    model = _built(cfg, arrays, "float32")
    lr = float(cfg["base_lr"]) * int(cfg["batch_per_worker"]) / int(cfg["base_batch"])  # linear
    model.compile(keras.optimizers.SGD(lr, momentum=float(cfg["momentum"])), loss_fn, ["accuracy"])
    points, done = [], 0
    for epoch in sorted(int(e) for e in epochs):
        if epoch > done:
            model.fit(
                arrays.x_train,
                arrays.y_train,
                batch_size=int(cfg["batch_per_worker"]),
                epochs=epoch - done,
                verbose=0,
            )
            done = epoch
        weights = model.get_weights()
        point = _point(cfg, arrays, loss_fn, weights, batch, scale)
        point["epoch"] = epoch
        point["val_accuracy"] = float(model.evaluate(arrays.x_val, arrays.y_val, verbose=0)[1])
        point["weights"] = weights
        points.append(point)
    return {
        "bins": list(range(LOW, HIGH + 1)),
        "normal": NORMAL,
        "subnormal": SUBNORMAL,
        "scale_log2": float(np.log2(scale)),
        "points": points,
    }


def continue_in_float16(
    cfg: dict, data_dir: str, weights: list, epochs: int, batch: int, lr: float
) -> dict | None:
    """On rank 0 (others: ``None``): ``epochs`` more epochs in ``mixed_float16`` from
    ``weights``, once with dynamic loss scaling (Keras's ``LossScaleOptimizer``) and once
    without; the same batches in the same order for both. Returns, for ``"scaled"`` and
    ``"unscaled"``, the training loss on the first 8,192 training samples, the validation
    accuracy and the seconds the training took."""
    import time

    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hpclab.rank.keras2 import keras

    if hvd.rank() != 0:
        return None
    arrays, loss_fn = _setup(cfg, data_dir)
    out = {}
    for name in ("scaled", "unscaled"):
        tf.keras.utils.set_random_seed(int(cfg["seed"]))
        model = _built(cfg, arrays, "mixed_float16", weights)
        opt = keras.optimizers.SGD(float(lr), momentum=0.9)
        if name == "scaled":
            opt = keras.mixed_precision.LossScaleOptimizer(opt)
        model.compile(opt, loss_fn, ["accuracy"])
        start = time.perf_counter()
        model.fit(
            arrays.x_train,
            arrays.y_train,
            batch_size=int(batch),
            epochs=int(epochs),
            shuffle=True,
            verbose=0,
        )
        seconds = time.perf_counter() - start
        train = model.evaluate(arrays.x_train[:8192], arrays.y_train[:8192], verbose=0)
        val = model.evaluate(arrays.x_val, arrays.y_val, verbose=0)
        out[name] = {
            "train_loss": float(train[0]),
            "val_loss": float(val[0]),
            "val_accuracy": float(val[1]),
            "seconds": seconds,
        }
    return out
