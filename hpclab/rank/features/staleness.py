"""Stale gradients: apply the averaged gradient of τ steps ago, the way asynchronous SGD does.

In asynchronous (parameter-server) SGD a worker's gradient is computed on weights that others
have updated since, so the update applied at step t was taken at the weights of step t − τ
(Dean et al., "Large scale distributed deep networks", NIPS 2012; the staleness analysis of
Dutta et al., "Slow and stale gradients can win the race", AISTATS 2018). Its throughput gain —
no worker waits for the slowest — needs slow or uneven workers and a network; two shared cores
cannot show it. Its *statistical* cost can be shown exactly: this module keeps the last τ
averaged gradients in a ring buffer on every rank and applies the oldest, so every rank applies
the same stale update (the replicas stay equal) and only the staleness differs from synchronous
SGD. The first τ steps apply zeros (no gradient is old enough yet).
"""

from __future__ import annotations

from hpclab.rank.features.hooks import Feature, Traced


class StaleGradients:
    """A ring of the last τ averaged gradients (τ = ``RunConfig.staleness`` ≥ 1)."""

    def __init__(self, tau: int, variables, tf):
        self.tau, self.tf = int(tau), tf
        self.ring = [
            tf.Variable(tf.zeros([self.tau, *v.shape], v.dtype), trainable=False, name="stale")
            for v in variables
        ]

    def __call__(self, grads, iterations):
        """The gradients of step ``iterations − τ`` (zeros before step τ); ``grads`` (this
        step's, averaged) take their slot in the ring."""
        tf = self.tf
        slot = tf.cast(tf.math.floormod(iterations, self.tau), tf.int32)
        old = [ring[slot] for ring in self.ring]  # (read before the slot is overwritten)
        with tf.control_dependencies(old):
            writes = [ring[slot].assign(g) for ring, g in zip(self.ring, grads)]
        with tf.control_dependencies(writes):
            return [tf.identity(g) for g in old]


def in_run(cfg, world: int) -> bool:
    return bool(cfg.staleness)


class Staleness(Feature):
    """The step's hook: after the exchange, the averaged gradient of τ steps ago is applied."""

    def __init__(self, tau: int, model, optimizer, tf):
        self.ring = StaleGradients(tau, model.trainable_variables, tf)
        self.optimizer = optimizer

    @property
    def state(self) -> list:
        return list(self.ring.ring)

    def after_allreduce(self, s: Traced) -> None:
        s.grads = self.ring(s.grads, self.optimizer.iterations.read_value())


def build(ctx) -> Staleness:
    return Staleness(ctx.cfg.staleness, ctx.model, ctx.optimizer, ctx.tf)


__all__ = ["build", "StaleGradients", "Staleness", "in_run"]
