"""Uneven batches (``RunConfig.batch_skew``): each rank's gradient weighted by its batch share.

Horovod's average weighs ranks equally, so with uneven batches this rank's mean gradient (and
its loss, for the mean the meters report) is multiplied by its share of the global batch,
``b_r · world / B``: the average over ranks is then the global batch's mean gradient, as with
even batches. Chosen from the config, so every rank multiplies — also one whose share happens
to be exactly 1: Horovod names its allreduces after their tensors, and a rank that skipped the
product would leave the others waiting for a tensor that never comes.
"""

from __future__ import annotations

from hpclab.rank.features.hooks import Feature, Traced


def in_run(cfg, world: int) -> bool:
    return bool(cfg.batch_skew) and world > 1


class BatchWeighting(Feature):
    """Loss and gradients times this rank's share of the global batch, before the exchange."""

    def __init__(self, share: float):
        self.share = share

    def after_backward(self, s: Traced) -> None:
        s.grads = [g * self.share for g in s.grads]
        s.loss = s.loss * self.share


def build(ctx) -> BatchWeighting:
    return BatchWeighting(ctx.share)


__all__ = ["build", "BatchWeighting", "in_run"]
