"""Named Keras models for the lab: ``mlp``, ``cnn1d``, ``resnet20``, ``resnet50``, ``linear``.

Every model outputs **logits** (no softmax) from a final ``Dense(..., dtype="float32")``, so under
a mixed-precision policy (``mixed_float16`` / ``mixed_bfloat16``, see
:func:`hpclab.rank.optimizers.set_precision`) the hidden layers compute in 16 bits while logits and the
loss stay float32 (TensorFlow mixed-precision guide). Build the model *after* setting the policy.

* ``mlp`` and ``cnn1d`` are the MNIST-1D baselines of Greydanus 2020 ("Scaling down deep
  learning", arXiv:2011.14439; ``MLPBase`` and ``ConvBase`` in the mnist1d repository):
  the MLP has two hidden layers of 100 with a residual connection around the second (as in
  ``MLPBase``: ``h = h + relu(W2 h)``); the CNN has three Conv1D of 25 channels (kernel 5 stride 2,
  kernel 3 stride 2, kernel 3 stride 2, padding 1 each, ReLU) and a linear classifier on the
  flattened 5 x 25 = 125 features: 5,210 parameters for 10 classes, the paper's count.
* ``resnet20``: the CIFAR ResNet of He et al. 2016 ("Deep Residual Learning for Image
  Recognition", arXiv:1512.03385, sec. 4.2): 3x3 conv with 16 filters, then 3 stages x 3 basic
  blocks with 16/32/64 filters, identity shortcuts with zero-padded channels where the shape
  changes (the paper's option A), global average pooling, dense: ~0.27 M parameters.
* ``resnet50``: ``tf.keras.applications.ResNet50`` with ``weights=None`` (never downloads) and
  our own float32 classifier. ``ResNet50(classes=..., classifier_activation=None)`` would put its
  ``predictions`` Dense under the global policy (float16 logits under ``mixed_float16``), so the
  backbone is built with ``include_top=False, pooling="avg"`` — the same layers as its top — and
  the float32 Dense is added here. Inputs smaller than 32x32 (MNIST's 28x28, which the
  application rejects) are zero-padded to 32x32.
* ``linear``: softmax regression, logits = W x + b on the flattened input, kernel and bias
  initialised to **zero**. At zero weights the softmax is uniform, so the gradient's mean and
  covariance have a closed form on the ``blobs`` data set
  (:func:`hpclab.core.metrics.softmax_zero_noise_scale`): the known answer the gradient-noise-scale
  estimator is tested against (McCandlish et al. 2018, arXiv:1812.06162).

Seeding: kernels of ``mlp``, ``cnn1d`` and ``resnet20`` use initialisers seeded from ``seed``
(one distinct seed per layer), so the same seed gives the same weights; ``linear`` starts at zero
whatever the seed. ``resnet50``'s layers take Keras's default unseeded initialisers: their values
follow ``tf.keras.utils.set_random_seed``, which the engine calls; under Horovod rank 0's weights
are broadcast anyway.
"""

from __future__ import annotations

import itertools

import tensorflow as tf

from hpclab.core.catalog import MODELS, is_user_model
from hpclab.rank.keras2 import keras

layers = keras.layers


class _Seeds:
    """Distinct, reproducible initialiser seeds for successive layers."""

    def __init__(self, seed: int):
        self._counter = itertools.count(int(seed) * 1000)

    def glorot(self):
        return keras.initializers.GlorotUniform(seed=next(self._counter))

    def he(self):
        return keras.initializers.HeNormal(seed=next(self._counter))


def _logits(x, num_classes: int, seeds: _Seeds):
    # float32 even under a mixed policy: numerically safe softmax/cross-entropy.
    return layers.Dense(
        num_classes, kernel_initializer=seeds.glorot(), dtype="float32", name="logits"
    )(x)


def _mlp(input_shape, num_classes, seeds, hidden: int = 100):
    inputs = keras.Input(shape=input_shape)
    x = layers.Flatten()(inputs)
    h = layers.Dense(hidden, activation="relu", kernel_initializer=seeds.glorot())(x)
    h2 = layers.Dense(hidden, activation="relu", kernel_initializer=seeds.glorot())(h)
    h = layers.Add()([h, h2])  # MLPBase: h = h + relu(linear2(h))
    return keras.Model(inputs, _logits(h, num_classes, seeds), name="mlp")


def _cnn1d(input_shape, num_classes, seeds, channels: int = 25):
    inputs = keras.Input(shape=input_shape)
    length = 1
    for d in input_shape:
        length *= d
    x = layers.Reshape((length, 1))(inputs)  # (40,) -> (40, 1): one input channel
    # ConvBase: Conv1d(k, stride 2, padding 1) -> lengths 40 -> 19 -> 10 -> 5.
    for kernel in (5, 3, 3):
        x = layers.ZeroPadding1D(1)(x)
        x = layers.Conv1D(
            channels,
            kernel,
            strides=2,
            padding="valid",
            activation="relu",
            kernel_initializer=seeds.glorot(),
        )(x)
    x = layers.Flatten()(x)
    return keras.Model(inputs, _logits(x, num_classes, seeds), name="cnn1d")


def _pad_channels(x, filters: int):
    """Option-A shortcut: subsample by 2 and zero-pad the channels up to `filters`."""
    extra = filters - x.shape[-1]
    return tf.pad(x[:, ::2, ::2, :], [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]])


def _basic_block(x, filters: int, stride: int, seeds: _Seeds):
    shortcut = x
    y = layers.Conv2D(
        filters, 3, strides=stride, padding="same", use_bias=False, kernel_initializer=seeds.he()
    )(x)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU()(y)
    y = layers.Conv2D(filters, 3, padding="same", use_bias=False, kernel_initializer=seeds.he())(y)
    y = layers.BatchNormalization()(y)
    if stride != 1 or x.shape[-1] != filters:
        shortcut = layers.Lambda(_pad_channels, arguments={"filters": filters})(x)
    return layers.ReLU()(layers.Add()([y, shortcut]))


def _resnet20(input_shape, num_classes, seeds, blocks_per_stage: int = 3):
    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(16, 3, padding="same", use_bias=False, kernel_initializer=seeds.he())(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, filters, stride, seeds)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, _logits(x, num_classes, seeds), name="resnet20")


def _resnet50(input_shape, num_classes, seeds):
    h, w, c = input_shape
    inputs = keras.Input(shape=input_shape)
    x = inputs
    if h < 32 or w < 32:  # keras.applications' minimum input size
        ph, pw = max(0, 32 - h), max(0, 32 - w)
        x = layers.ZeroPadding2D(((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2)))(x)
        h, w = max(h, 32), max(w, 32)
    backbone = keras.applications.ResNet50(
        include_top=False, weights=None, input_shape=(h, w, c), pooling="avg"
    )
    x = backbone(x)
    return keras.Model(inputs, _logits(x, num_classes, seeds), name="resnet50")


def _linear(input_shape, num_classes, seeds):
    inputs = keras.Input(shape=input_shape)
    x = layers.Flatten()(inputs)
    logits = layers.Dense(
        num_classes,
        kernel_initializer="zeros",
        bias_initializer="zeros",
        dtype="float32",
        name="logits",
    )(x)
    return keras.Model(inputs, logits, name="linear")


_BUILDERS = {
    "mlp": _mlp,
    "cnn1d": _cnn1d,
    "resnet20": _resnet20,
    "resnet50": _resnet50,
    "linear": _linear,
}


def user_model(name: str, input_shape: tuple, num_classes: int) -> keras.Model:
    """Your own model, ``name = "package.module:function"``: ``function(input_shape,
    num_classes)`` imported on this rank and called after the run's seed and precision policy
    are set (so its layers take both), returning a Keras 2 model whose output is
    ``num_classes`` logits per sample. Anything else is a ValueError of one sentence naming the
    model, what was found and what is needed (the client adds the rank)."""
    import importlib

    module_name, _, function_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 — the user's import: every failure is the sentence
        raise ValueError(
            f"model {name!r}: module {module_name!r} could not be imported on this rank "
            f"({type(exc).__name__}: {exc}); it must be importable where the engines run "
            "(installed in the venv, or on PYTHONPATH)."
        ) from None
    build = getattr(module, function_name, None)
    if not callable(build):
        raise ValueError(
            f"model {name!r}: module {module_name!r} has no function {function_name!r}."
        )
    try:
        model = build(input_shape, num_classes)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(
            f"model {name!r}: {function_name}(input_shape={input_shape}, "
            f"num_classes={num_classes}) raised {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"model {name!r}: {function_name} returned a {type(model).__name__}, not a Keras "
            "2 model (build it with tf.keras, which is Keras 2 on both stacks; a bare "
            "`import keras` is Keras 3 with TensorFlow >= 2.16)."
        )
    out = tuple(model.output_shape) if hasattr(model, "output_shape") else ()
    if out[1:] != (num_classes,):
        raise ValueError(
            f"model {name!r} emits shape {out}; it must emit (batch, {num_classes}) logits, one "
            "per class, without a softmax."
        )
    return model


def build_model(name: str, input_shape, num_classes: int, seed: int = 0) -> keras.Model:
    """The model `name` for inputs of `input_shape` (no batch axis), emitting float32 logits.

    ``mlp`` and ``linear`` take any shape; ``cnn1d`` a 1-D signal such as MNIST-1D's (40,); ``resnet20`` and
    ``resnet50`` images (H, W, C).
    """
    input_shape = tuple(int(d) for d in input_shape)
    if is_user_model(name):
        return user_model(name, input_shape, int(num_classes))
    if name not in _BUILDERS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}; you passed model={name!r}.")
    if name in ("resnet20", "resnet50") and len(input_shape) != 3:
        raise ValueError(
            f"model {name!r} needs image inputs (height, width, channels); "
            f"the data has input_shape={input_shape}. Use 'mlp' or 'cnn1d' for "
            "1-D signals such as MNIST-1D."
        )
    if name == "cnn1d" and len(input_shape) != 1:
        raise ValueError(
            f"model 'cnn1d' needs 1-D signals such as MNIST-1D's (40,); the data has "
            f"input_shape={input_shape}. Use 'mlp', 'resnet20' or 'resnet50' for "
            "images."
        )
    return _BUILDERS[name](input_shape, int(num_classes), _Seeds(seed))
