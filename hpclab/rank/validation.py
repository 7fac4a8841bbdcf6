"""Held-out evaluation on a rank: the whole validation set, and a fixed subset of it.

* :meth:`Validation.full_set` — every validation sample, at epoch ends (the number a run's
  summary reports as ``val_accuracy``).
* :meth:`Validation.subset` — the first ``RunConfig.eval_samples`` validation samples, every
  ``RunConfig.eval_interval`` steps, so steps and time to a target accuracy are measured to a few
  percent of a run instead of to whole epochs. Shallue et al. 2018 ("Measuring the Effects of Data
  Parallelism on Neural Network Training", arXiv:1811.03600) measure steps-to-result the same
  way: evaluating often enough that the step count, not the evaluation grid, is what is measured.
  The subset is fixed, so successive points differ by training, not by which samples were drawn.

Each is one compiled ``while_loop`` (:func:`hpclab.rank.feed.evaluate`) over this rank's shard;
with several ranks one allreduce sums loss, correct and count, so every rank gets the same figure.

``RunConfig.validation`` says who evaluates: ``"sharded"`` (every rank its 1/N of the set, the
default) or ``"rank0"`` (rank 0 the whole set, the others an empty shard: they wait for it in the
allreduce). The second is the sequential test phase that bounds strong scaling by Amdahl's law
(notebook 06): its time does not shrink with N.
"""

from __future__ import annotations

import numpy as np


class Validation:
    """This rank's validation shards and the compiled call that evaluates either of them."""

    def __init__(
        self,
        model,
        x_val: np.ndarray,
        y_val: np.ndarray,
        *,
        subset: int,
        batch: int,
        mode: str = "sharded",
        autograph: bool = False,
    ):
        import horovod.tensorflow as hvd
        import tensorflow as tf

        from hpclab.rank import data

        self.tf, self.hvd, self.model = tf, hvd, model
        self.rank, self.world = hvd.rank(), hvd.size()
        self.batch = max(int(batch), 256)

        def mine(x, y):
            if mode == "rank0":
                return (x, y) if self.rank == 0 else (x[:0], y[:0])
            return data.shard(x, y, self.rank, self.world)

        self.full = tuple(map(tf.constant, mine(x_val, y_val)))
        n = min(int(subset), len(x_val))
        self.sub = None
        if n >= (self.world if mode == "sharded" else 1):  # every shard needs a sample
            self.sub = tuple(map(tf.constant, mine(x_val[:n], y_val[:n])))
        x_spec = tf.TensorSpec([None, *x_val.shape[1:]], tf.float32)
        self.call = tf.function(  # `autograph`: as for training (hpclab.rank.compiled_call)
            self._call,
            input_signature=[x_spec, tf.TensorSpec([None], tf.int32)],
            autograph=autograph,
        )

    def _call(self, x, y):
        from hpclab.rank.feed import evaluate

        sums = evaluate(self.model, x, y, self.batch)
        if self.world == 1:
            return sums
        # Horovod: sum loss/correct/count over every rank's shard.
        return self.hvd.allreduce(sums, op=self.hvd.Sum, name="hpclab_validation")

    def _mean(self, pair) -> tuple[float, float]:
        loss_sum, correct, count = self.call(*pair).numpy()
        return float(loss_sum / count), float(correct / count)

    def full_set(self) -> tuple[float, float]:
        """(loss, accuracy) over the whole validation set (a collective: every rank calls it)."""
        return self._mean(self.full)

    def subset(self) -> tuple[float, float] | None:
        """(loss, accuracy) over the fixed subset, or None when it is too small to share."""
        return None if self.sub is None else self._mean(self.sub)
