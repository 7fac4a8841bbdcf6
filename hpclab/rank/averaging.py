"""Averaging models instead of gradients: local SGD, every ``average_every`` steps.

Synchronous SGD averages the *gradients* every step, so every replica applies the same update and
the replicas never differ. **Local SGD** (Lin et al., "Don't use large mini-batches, use local
SGD", ICLR 2020, arXiv:1808.07217; Stich, "Local SGD converges fast and communicates little",
ICLR 2019) lets each rank apply its *own* gradient with its own optimizer state and averages the
*models* (the trainable variables) every H steps: 1/H of the communication, at the price of
replicas that drift apart between averages — more so when the ranks' shards differ
(``shards="by_label"``). With H = 1 and an optimizer whose update is linear in the gradient
(SGD, momentum), averaging the models after each local step *is* synchronous SGD: the mean of
the replicas' momentum buffers obeys the same recursion as the buffer of the mean gradient
(tests/test_averaging.py checks the weights against synchronous SGD's). Adaptive updates
(LARS, LAMB, Adam) are not linear in the gradient, so there H = 1 only approximates it.

The average runs inside the compiled step, after the update, on the steps where the optimizer's
step counter is a multiple of H (a ``tf.cond`` whose branch every rank takes alike: the counter
is equal everywhere, so Horovod's collectives stay matched). It is timed as the step's
``allreduce`` part. Optimizer state (momentum) stays local, as in Lin et al.
"""

from __future__ import annotations


class LocalSGD:
    """The model average of local SGD, for one run on one rank."""

    def __init__(self, cfg, model, tf, hvd):
        self.every, self.model, self.tf, self.hvd = cfg.average_every, model, tf, hvd

    def _average(self):
        tf, hvd = self.tf, self.hvd
        variables = self.model.trainable_variables
        means = hvd.grouped_allreduce(
            [v.read_value() for v in variables], op=hvd.Average, name="hpclab_model_average"
        )
        with tf.control_dependencies([v.assign(m) for v, m in zip(variables, means)]):
            return tf.constant(1.0)

    def __call__(self, iterations):
        """After the update of step ``iterations`` (the optimizer's counter, now incremented):
        average the models if it is a multiple of H; 1.0 if they were averaged, else 0.0."""
        tf = self.tf
        if self.every == 1:
            return self._average()
        due = tf.equal(tf.math.floormod(iterations, self.every), 0)
        return tf.cond(due, self._average, lambda: tf.constant(0.0))


def for_run(cfg, model, world: int):
    """The run's model averaging, or None for synchronous SGD (or a single rank)."""
    if cfg.update == "sync" or world == 1:
        return None
    import horovod.tensorflow as hvd
    import tensorflow as tf

    return LocalSGD(cfg, model, tf, hvd)


__all__ = ["LocalSGD", "for_run"]
