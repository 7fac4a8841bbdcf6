"""A model of your own, as a researcher writes it: outside hpclab, a function of the input shape
and the number of classes returning a Keras 2 model that emits logits.

    RunConfig(model="my_model:small_cnn", dataset="/path/to/signals")

with this folder on PYTHONPATH (the engines inherit it). See docs/user-guide.md.
"""

import tensorflow as tf


def small_cnn(input_shape, num_classes):
    """Two 1-D convolutions and a dense head for signals of shape (length,)."""
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Reshape((*input_shape, 1))(inputs) if len(input_shape) == 1 else inputs
    x = tf.keras.layers.Conv1D(16, 5, strides=2, activation="relu")(x)
    x = tf.keras.layers.Conv1D(16, 3, strides=2, activation="relu")(x)
    x = tf.keras.layers.GlobalAveragePooling1D()(x)
    outputs = tf.keras.layers.Dense(num_classes, dtype="float32")(x)  # float32 logits
    return tf.keras.Model(inputs, outputs, name="small_cnn")


def broken_on_rank_1(input_shape, num_classes):
    """For the lab's tests: a model that fails to build on rank 1 only."""
    import horovod.tensorflow as hvd

    if hvd.rank() == 1:
        raise RuntimeError("this model cannot be built on rank 1")
    return small_cnn(input_shape, num_classes)
