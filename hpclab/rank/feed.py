"""Batches inside the graph: a rank's shard resident on its device, cut by index in the step.

The engine's compiled call runs many optimizer steps in one ``tf.while_loop``; it takes its
batches from here rather than from a ``tf.data`` iterator, so no host round trip sits between two
steps (an eager ``next()`` on a prefetched pipeline cost ~0.5 ms a step, a third of a small
model's step). MNIST-1D's 32k × 40 floats are 5 MB, so holding the shard
resident costs nothing; a staged CIFAR-10 shard is 600 MB per rank in float32, still fine for
the lab's sizes.

* :class:`ResidentShard` — this rank's training shard as tensors, augmented once (``offline``) or
  every batch (``online``, :mod:`hpclab.rank.features.augment`); epoch ``e`` visits it in a
  seeded order (``stateless_shuffle`` of the indices with seed ``(seed·1000003 + rank, e)``:
  different per rank and per epoch, identical on a re-run), and step ``s`` of the epoch takes
  ``order[s·B : (s+1)·B]`` — every sample at most once an epoch, the remainder dropped.
  With ``deal=world`` (``shuffle="global"``) it holds the *whole* training set instead, and
  epoch ``e``'s order is rank ``r``'s slice of one permutation of all samples, seeded
  ``(seed, e)`` and so the same on every rank: the ranks share out all samples but the
  ``len mod world`` left over (a different few each epoch), and each epoch's shard is new (the reads that would cross the network: ``rank.stores``).
* :class:`SyntheticBatch` — Horovod's synthetic benchmark input (one random batch, generated on
  the device, repeated every step), with the same interface.
* :func:`evaluate` — loss/correct/count sums over a resident validation shard in one call.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from hpclab.rank.features.augment import augment as augment_batch
from hpclab.rank.keras2 import keras

SEED_STRIDE = 1_000_003  # seed·stride + rank: distinct shuffle streams per rank and run seed


class ResidentShard:
    """A rank's training samples held as tensors; batches are gathered inside the graph."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        *,
        batch: int,
        seed: int,
        rank: int,
        augment: str = "none",
        augment_cost: int = 1,
        deal: int = 0,
    ):
        batch, deal = int(batch), int(deal)
        # deal > 0: x is the whole set, dealt out anew every epoch to `deal` ranks (module doc)
        self.deal, self.rank, self.n = deal, int(rank), len(x) // deal if deal else len(x)
        self._all = tf.constant(len(x), tf.int32)  # dealt from all: the tail too, some epochs
        self._run_seed = tf.constant(int(seed), tf.int64)  # dealt orders: the same on all ranks
        self._seed = tf.constant(int(seed) * SEED_STRIDE + int(rank), tf.int64)  # this rank's
        if batch < 1 or self.n < batch:
            raise ValueError(
                f"this rank holds {self.n} training samples, fewer than one batch of {batch}; "
                "lower batch_per_worker or use more samples."
            )
        if len(x) != len(y):
            raise ValueError(f"x and y differ in length: {len(x)} inputs, {len(y)} labels.")
        self.batch = batch
        self.steps_per_epoch = self.n // batch
        self.online, self.cost = augment == "online", int(augment_cost)
        self.offline_s = 0.0  # seconds the offline augmentation took, before training
        self.x = tf.constant(x)
        self.y = tf.constant(y)
        if augment == "offline":
            t0 = time.perf_counter()
            # dealt: every rank holds the same augmented copy of the whole set (one seed)
            seed = tf.stack([self._run_seed if deal else self._seed, tf.constant(-1, tf.int64)])
            self.x = tf.constant(augment_batch(self.x, seed, self.cost).numpy())
            self.offline_s = time.perf_counter() - t0

    def order(self, epoch) -> tf.Tensor:
        """The sample order of epoch ``epoch`` (a scalar tensor or int), as int32 indices."""
        shuffle = tf.random.experimental.stateless_shuffle
        epoch = tf.cast(epoch, tf.int64)
        if self.deal:  # one permutation of everything, the same on every rank: take our slice
            everyone = shuffle(tf.range(self._all), tf.stack([self._run_seed, epoch]))
            return everyone[self.rank * self.n : (self.rank + 1) * self.n]
        return shuffle(tf.range(self.n, dtype=tf.int32), tf.stack([self._seed, epoch]))

    def batch_at(self, order: tf.Tensor, step, epoch=0) -> tuple[tf.Tensor, tf.Tensor]:
        """Step ``step`` of the epoch whose ``order`` is given: ``batch`` samples and labels
        (augmented here when ``online``, with a draw of its own for each epoch and step)."""
        idx = order[step * self.batch : (step + 1) * self.batch]
        x = tf.gather(self.x, idx)
        if self.online:
            at = tf.cast(epoch, tf.int64) * self.steps_per_epoch + tf.cast(step, tf.int64)
            x = augment_batch(x, tf.stack([self._seed, at]), self.cost)
        return x, tf.gather(self.y, idx)


class SyntheticBatch:
    """One random batch ``[batch, *image_shape]`` with random labels, repeated every step.

    As in Horovod's ``tensorflow2_synthetic_benchmark.py``; created under the default device, so
    on a GPU the data never crosses PCIe.
    """

    def __init__(self, image_shape, *, batch: int, seed: int, num_classes: int):
        shape = (int(batch),) + tuple(int(d) for d in image_shape)
        self.x = tf.random.stateless_uniform(shape, seed=[int(seed), 0], dtype=tf.float32)
        self.y = tf.random.stateless_uniform(
            (int(batch),), seed=[int(seed), 1], minval=0, maxval=int(num_classes), dtype=tf.int32
        )
        self.batch = int(batch)
        self.offline_s = 0.0  # (no augmentation)

    def order(self, epoch) -> tf.Tensor:
        return tf.zeros([0], tf.int32)

    def batch_at(self, order: tf.Tensor, step, epoch=0) -> tuple[tf.Tensor, tf.Tensor]:
        return self.x, self.y


def evaluate(model, x: tf.Tensor, y: tf.Tensor, batch: int) -> tf.Tensor:
    """[sum of losses, correct, count] of ``model`` over all of ``x`` (the last batch is short).

    Call inside a ``tf.function``: one ``while_loop`` over the batches, no host round trips.
    """
    n = tf.shape(x)[0]
    batches = (n + batch - 1) // batch

    def body(i, sums):
        lo = i * batch
        hi = tf.minimum(lo + batch, n)
        xb, yb = x[lo:hi], y[lo:hi]
        logits = tf.cast(model(xb, training=False), tf.float32)
        loss = keras.losses.sparse_categorical_crossentropy(yb, logits, from_logits=True)
        pred = tf.argmax(logits, axis=-1, output_type=yb.dtype)
        correct = tf.reduce_sum(tf.cast(tf.equal(pred, yb), tf.float32))
        count = tf.cast(hi - lo, tf.float32)
        return i + 1, sums + tf.stack([tf.reduce_sum(loss), correct, count])

    _, sums = tf.while_loop(lambda i, _: i < batches, body, (tf.constant(0), tf.zeros(3)))
    return sums


def for_rank(cfg, plan, arrays, rank: int):
    """This rank's training input for run ``cfg`` planned as ``plan`` (a
    :class:`hpclab.core.plan.RunPlan`): a :class:`ResidentShard` of ``arrays``
    (hpclab.rank.data.Arrays), or the synthetic batch. A ValueError if the shard holds fewer
    steps than an epoch of the catalogue's size needs (a truncated staged file)."""
    from hpclab.rank import data

    batches, world = list(plan.local_batches), plan.workers  # (uneven under batch_skew)
    B = batches[rank]
    if cfg.dataset == "synthetic":
        return SyntheticBatch(
            cfg.image_shape, batch=B, seed=cfg.seed + rank, num_classes=cfg.synthetic_classes
        )
    # Horovod: each rank trains on its own shard of the training set (and validates on its own
    # shard of the validation set: hpclab.rank.validation).
    # shards="by_label": sorted by class first (non-iid shards); shuffle="global": every
    # rank holds the whole set and takes its slice of a new permutation each epoch
    x, y = arrays.x_train, arrays.y_train
    if cfg.shards == "by_label":
        x, y = data.by_label(x, y)
    dealt = cfg.shuffle == "global"
    if not dealt:
        x, y = data.shard(x, y, rank, world, batches if cfg.batch_skew else None)
    shard = ResidentShard(
        x,
        y,
        batch=B,
        seed=cfg.seed,
        rank=rank,
        augment=cfg.augment,
        augment_cost=cfg.augment_cost,
        deal=world if dealt else 0,
    )
    needed = plan.steps_per_epoch
    if shard.steps_per_epoch < needed:
        raise ValueError(
            f"{cfg.dataset}: this rank holds {shard.n} training samples, enough for "
            f"{shard.steps_per_epoch} steps of batch {B}, but an epoch of the catalogue's "
            f"{cfg.train_size()} samples needs {needed}; the staged file is "
            "smaller than the data set it names: stage the full set, or choose another."
        )
    return shard
