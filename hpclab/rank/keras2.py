"""The rank side's one Keras: Keras 2, on both supported stacks.

Every rank module takes Keras from here (``from hpclab.rank.keras2 import keras``), never from a
bare ``import keras``:

* default stack (Python 3.11, TensorFlow 2.15): ``tf.keras`` is Keras 2.15 itself;
* py312 stack (TensorFlow >= 2.16): ``import keras`` is Keras 3, which Horovod 0.28.1 cannot
  drive (horovod issue #4290: ``'Variable' object has no attribute 'ref'``) and whose optimizers
  and mixed-precision API differ from what this package uses. ``tf.keras`` is the Keras 2
  package ``tf_keras`` when ``TF_USE_LEGACY_KERAS=1`` ("Using Keras 2 with TensorFlow 2.16+",
  https://keras.io/getting_started/#tensorflow--keras-2-backwards-compatibility).
  ``hpclab/__init__.py`` sets that variable before anything can import TensorFlow, in every
  process of the lab (kernel, CLI, engines, which inherit it and import hpclab first).

Importing this module fails with one sentence when ``tf.keras`` is not Keras 2 (for example
``TF_USE_LEGACY_KERAS=0`` on the py312 stack), instead of a Keras 3 error deep inside a step.
"""

from __future__ import annotations

import importlib
import os

import tensorflow as tf

keras = tf.keras
#: The package behind tf.keras ("keras" with TensorFlow 2.15, "tf_keras" under the legacy flag).
KERAS_PACKAGE: str = keras.__name__.split(".")[0]
KERAS_VERSION: str = importlib.import_module(KERAS_PACKAGE).__version__

if not KERAS_VERSION.startswith("2."):
    raise ImportError(
        f"tf.keras is {KERAS_PACKAGE} {KERAS_VERSION} but hpclab needs Keras 2 (TensorFlow "
        f"{tf.__version__}); set TF_USE_LEGACY_KERAS=1 (it is "
        f"{os.environ.get('TF_USE_LEGACY_KERAS')!r}) and install tf-keras of the same minor "
        "version, as `make setup` does for the py312 stack."
    )

__all__ = ["keras", "KERAS_PACKAGE", "KERAS_VERSION"]
