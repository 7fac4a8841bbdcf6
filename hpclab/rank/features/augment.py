"""Data augmentation with a cost knob: the input-pipeline lesson.

The transform is what MNIST-1D's own generator does to its templates, drawn afresh: a random
circular shift of each sample along its first axis (up to :data:`SHIFT` positions) and Gaussian
noise of standard deviation :data:`NOISE`. ``cost`` sets the *work* and nothing else: the noise
is added in ``cost`` passes of ``NOISE / sqrt(cost)`` each, so the augmented data has the same
distribution at every cost while the time grows linearly — a stand-in for decoding and
augmenting large inputs (JPEG decoding, random crops) with a knob that changes time, not
statistics.

* ``online`` (``RunConfig.augment``): applied to every batch inside the compiled step, where the
  step's ``input`` part times it; a new draw every step, so no epoch sees the same copy.
* ``offline``: applied once to the rank's whole shard before training (preprocessing ahead of
  time); every epoch then sees the same augmented copy, and the steps pay nothing.

Seeds are stateless, ``(seed·stride + rank, step)``: a re-run draws the same augmentations.
"""

from __future__ import annotations

import math

import tensorflow as tf

SHIFT = 3  # positions a sample may move either way
NOISE = 0.1  # standard deviation of the added noise (MNIST-1D's signals have std ≈ 1)


def augment(x: tf.Tensor, seed: tf.Tensor, cost: int) -> tf.Tensor:
    """``x`` [B, L, ...] shifted and noised; ``seed`` an int64 [2] tensor; ``cost`` ≥ 1 passes."""
    b, length = tf.shape(x)[0], tf.shape(x)[1]
    shifts = tf.random.stateless_uniform([b], seed, -SHIFT, SHIFT + 1, dtype=tf.int32)
    index = tf.math.floormod(tf.range(length)[None, :] - shifts[:, None], length)
    x = tf.gather(x, index, axis=1, batch_dims=1)
    sigma = tf.constant(NOISE / math.sqrt(cost), x.dtype)

    def add_noise(i, x):
        pass_seed = tf.stack([seed[0], seed[1] * (cost + 1) + tf.cast(i, tf.int64) + 1])
        return i + 1, x + sigma * tf.random.stateless_normal(tf.shape(x), pass_seed, dtype=x.dtype)

    _, x = tf.while_loop(lambda i, _: i < cost, add_noise, (tf.constant(0), x))
    return x
