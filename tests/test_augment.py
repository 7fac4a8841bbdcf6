"""The input lesson's augmentation (hpclab/rank/features/augment.py) and where the feed applies it:
the cost knob changes the work and not the statistics; online draws afresh every step, offline
once before training."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hpclab.rank import feed  # noqa: E402
from hpclab.rank.features import augment  # noqa: E402


def seed(a: int, b: int):
    return tf.constant([a, b], tf.int64)


@pytest.mark.parametrize("cost", [1, 16, 256])
def test_the_noise_has_the_same_spread_at_every_cost(cost):
    x = tf.zeros([256, 40])
    out = augment.augment(x, seed(1, 2), cost).numpy()
    assert out.std() == pytest.approx(augment.NOISE, rel=0.05)
    assert abs(out.mean()) < 0.01


def test_each_sample_moves_by_at_most_the_shift_and_draws_repeat_by_seed():
    x = np.zeros((64, 40), np.float32)
    x[:, 20] = 10.0
    out = augment.augment(tf.constant(x), seed(3, 4), 1).numpy()
    moved = out.argmax(axis=1) - 20
    assert np.abs(moved).max() <= augment.SHIFT and len(set(moved)) > 1  # shifted, not all alike
    again = augment.augment(tf.constant(x), seed(3, 4), 1).numpy()
    other = augment.augment(tf.constant(x), seed(3, 5), 1).numpy()
    np.testing.assert_array_equal(out, again)
    assert not np.allclose(out, other)


def test_images_shift_along_their_height():
    x = tf.zeros([4, 8, 8, 3])
    assert augment.augment(x, seed(0, 0), 2).shape == (4, 8, 8, 3)


def test_online_draws_afresh_each_epoch_offline_once_before_training():
    x = np.random.default_rng(0).normal(size=(128, 40)).astype(np.float32)
    y = np.zeros(128, np.int32)
    plain = feed.ResidentShard(x, y, batch=32, seed=0, rank=0)
    online = feed.ResidentShard(x, y, batch=32, seed=0, rank=0, augment="online", augment_cost=4)
    offline = feed.ResidentShard(x, y, batch=32, seed=0, rank=0, augment="offline")
    order = plain.order(0)
    base = plain.batch_at(order, 1)[0].numpy()
    e0, e1 = (online.batch_at(order, 1, epoch)[0].numpy() for epoch in (0, 1))
    assert not np.allclose(e0, base) and not np.allclose(e0, e1)  # a new draw each epoch
    o0, o1 = (offline.batch_at(order, 1, epoch)[0].numpy() for epoch in (0, 1))
    assert not np.allclose(o0, base) and np.array_equal(o0, o1)  # one copy for every epoch
    assert offline.offline_s > 0 and online.offline_s == plain.offline_s == 0.0
