"""Gradient clipping by global norm (``RunConfig.grad_clip_norm``).

The averaged gradient g is scaled by min(1, c / |g|), |g| its global L2 norm over every
variable (Pascanu, Mikolov & Bengio 2013, "On the difficulty of training recurrent neural
networks", arXiv:1211.5063, algorithm 2). It acts after the exchange, on the gradient every rank
holds alike, so the replicas stay equal. Under ``mixed_float16`` with loss scaling the gradient
still carries the loss scale S there, so the bound is S·c (the same clip as c on the unscaled
gradient).
"""

from __future__ import annotations

from hpclab.rank.features.hooks import Feature, StepContext, Traced


def in_run(cfg, world: int) -> bool:
    return cfg.grad_clip_norm > 0


class GradientClipping(Feature):
    """After the exchange: the averaged gradient clipped to a global norm."""

    def __init__(self, norm: float, optimizer, loss_scaled: bool, tf):
        self.norm, self.optimizer, self.loss_scaled, self.tf = (
            float(norm),
            optimizer,
            loss_scaled,
            tf,
        )

    def after_allreduce(self, s: Traced) -> None:
        tf = self.tf
        bound = tf.constant(self.norm, tf.float32)
        if self.loss_scaled:  # the gradient is S times the true one until the update
            bound = bound * tf.cast(self.optimizer.loss_scale, tf.float32)
        grads = [tf.cast(g, tf.float32) for g in s.grads]
        clipped, _ = tf.clip_by_global_norm(grads, bound)
        s.grads = [tf.cast(c, g.dtype) for c, g in zip(clipped, s.grads)]


def build(ctx: StepContext) -> GradientClipping:
    return GradientClipping(ctx.cfg.grad_clip_norm, ctx.optimizer, ctx.loss_scaled, ctx.tf)


__all__ = ["build", "GradientClipping", "in_run"]
