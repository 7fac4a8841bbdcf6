"""Models as a researcher writes them, for tests/test_user_model.py: ``model="user_models:NAME"``
(the engines import this module; the test puts this folder on PYTHONPATH)."""

import tensorflow as tf


class Damped(tf.keras.layers.Layer):
    """A layer written as Python: an ``if`` on a tensor, which only AutoGraph turns into graph
    control flow (the lab leaves AutoGraph on for a model of your own; its built-in models need
    none, hpclab.rank.compiled_call)."""

    def call(self, x):
        if tf.reduce_max(tf.abs(x)) > 1e6:  # never on this data: the branch is what is tested
            x = x * 1e-6
        return x


def tiny_dense(input_shape, num_classes):
    """A small MLP of your own: logits, float32 at the end (Keras' mixed-precision guide)."""
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(64, activation="relu")(Damped()(x))
    outputs = tf.keras.layers.Dense(num_classes, dtype="float32")(x)
    return tf.keras.Model(inputs, outputs, name="tiny_dense")


def wrong_output(input_shape, num_classes):
    """A model that forgot the classes: one output per sample."""
    inputs = tf.keras.Input(shape=input_shape)
    outputs = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(inputs))
    return tf.keras.Model(inputs, outputs)
