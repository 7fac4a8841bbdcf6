"""Batches inside the graph (hpclab.rank.feed): real TensorFlow on CPU, no MPI."""

import numpy as np
import pytest
import tensorflow as tf

from hpclab.rank import feed


def _epoch(shard, epoch):
    """Every batch of one epoch, cut the way the trainer's compiled call cuts them."""
    order = shard.order(epoch)
    return [shard.batch_at(order, s) for s in range(shard.steps_per_epoch)]


def test_an_epoch_visits_each_sample_at_most_once_and_keeps_pairs():
    n, batch = 130, 8  # 16 full batches, 2 samples left over
    x = np.arange(n, dtype=np.float32)[:, None].repeat(3, axis=1)
    y = np.arange(n, dtype=np.int32)
    shard = feed.ResidentShard(x, y, batch=batch, seed=0, rank=0)
    assert shard.steps_per_epoch == n // batch
    batches = _epoch(shard, 0)
    labels = np.concatenate([yb.numpy() for _, yb in batches])
    assert len(labels) == 16 * batch and len(set(labels.tolist())) == 16 * batch
    for xb, yb in batches:
        assert xb.shape == (batch, 3)
        np.testing.assert_array_equal(xb.numpy()[:, 0], yb.numpy().astype(np.float32))


def test_orders_are_seeded_per_epoch_rank_and_run_seed():
    x = np.arange(64, dtype=np.float32)[:, None]
    y = np.arange(64, dtype=np.int32)

    def order(seed, rank, epoch):
        return feed.ResidentShard(x, y, batch=4, seed=seed, rank=rank).order(epoch).numpy()

    np.testing.assert_array_equal(order(0, 0, 0), order(0, 0, 0))  # reproducible
    assert sorted(order(0, 0, 0).tolist()) == list(range(64))  # a permutation
    for other in (order(0, 0, 1), order(0, 1, 0), order(1, 0, 0)):
        assert not np.array_equal(order(0, 0, 0), other)


def test_batches_are_cut_inside_a_compiled_while_loop():
    x = np.random.rand(64, 40).astype(np.float32)
    y = (np.arange(64) % 10).astype(np.int32)
    shard = feed.ResidentShard(x, y, batch=8, seed=0, rank=0)

    @tf.function
    def label_sum(epoch, start, steps):
        order = shard.order(epoch)

        def body(i, total):
            _, yb = shard.batch_at(order, start + i)
            return i + 1, total + tf.reduce_sum(yb)

        return tf.while_loop(lambda i, _: i < steps, body, (tf.constant(0), tf.constant(0)))[1]

    expected = sum(int(yb.numpy().sum()) for _, yb in _epoch(shard, 3)[2:6])
    assert int(label_sum(tf.constant(3), tf.constant(2), tf.constant(4))) == expected
    # A different step count is the same trace (a tensor), not a new one.
    label_sum(tf.constant(0), tf.constant(0), tf.constant(8))
    assert label_sum.experimental_get_tracing_count() == 1


def test_too_few_samples_for_one_batch_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match="10 training samples, fewer than one batch of 16"):
        feed.ResidentShard(
            np.zeros((10, 2), np.float32), np.zeros(10, np.int32), batch=16, seed=0, rank=0
        )


def test_synthetic_batch_is_one_random_batch_repeated():
    synth = feed.SyntheticBatch((8, 8, 3), batch=4, seed=0, num_classes=10)
    order = synth.order(0)
    x0, y0 = synth.batch_at(order, 0)
    x1, _ = synth.batch_at(order, 5)
    assert x0.shape == (4, 8, 8, 3) and x0.dtype == tf.float32 and y0.dtype == tf.int32
    assert 0 <= int(tf.reduce_min(y0)) and int(tf.reduce_max(y0)) < 10
    np.testing.assert_array_equal(x0.numpy(), x1.numpy())


def test_evaluate_counts_every_sample_including_a_short_last_batch():
    x = np.random.RandomState(0).rand(21, 3).astype(np.float32)
    y = np.random.RandomState(1).randint(0, 2, 21).astype(np.int32)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    sums = tf.function(lambda: feed.evaluate(model, tf.constant(x), tf.constant(y), 8))().numpy()
    logits = model(x).numpy()
    losses = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True).numpy()
    assert sums[2] == 21
    assert sums[1] == (logits.argmax(-1) == y).sum()
    assert sums[0] == pytest.approx(losses.sum(), rel=1e-5)


def test_a_global_shuffle_deals_every_sample_once_an_epoch_and_new_shards_each_epoch():
    """shuffle="global": each rank holds the whole set; in every epoch the ranks' orders are
    disjoint slices of one permutation of all 103 (102 dealt, the one left over differs from
    epoch to epoch), the same on a re-run, and a rank's slice changes from epoch to epoch."""
    n_all, world = 103, 2  # 51 per rank, one sample dealt to nobody
    x = np.arange(n_all, dtype=np.float32)[:, None]
    y = np.arange(n_all, dtype=np.int32)

    def orders(epoch, seed=0):
        ranks = [feed.ResidentShard(x, y, batch=4, seed=seed, rank=r, deal=world) for r in range(2)]
        assert all(s.n == 51 and s.steps_per_epoch == 12 for s in ranks)
        return [s.order(epoch).numpy() for s in ranks]

    for epoch in (0, 1):
        a, b = orders(epoch)
        assert len(a) == len(b) == 51 and not set(a) & set(b)
        assert set(a) | set(b) <= set(range(n_all)) and len(set(a) | set(b)) == 102
    np.testing.assert_array_equal(orders(0)[0], orders(0)[0])
    assert set(orders(0)[0]) != set(orders(1)[0])  # a new shard each epoch
    left_out = {e: set(range(n_all)) - set(np.concatenate(orders(e))) for e in range(8)}
    assert len(set().union(*left_out.values())) > 1  # the tail is not always the same sample
    assert set(orders(0, seed=1)[0]) != set(orders(0)[0])


def test_shards_by_label_hold_classes_of_their_own():
    from hpclab.rank import data

    y = np.random.default_rng(0).integers(0, 10, 1000).astype(np.int32)
    x = y[:, None].astype(np.float32)
    sx, sy = data.by_label(x, y)
    np.testing.assert_array_equal(sx[:, 0], sy)  # pairs kept
    lo, hi = (data.shard(sx, sy, r, 2)[1] for r in range(2))
    assert lo.max() <= hi.min() and set(lo) | set(hi) == set(range(10))
