"""The hook points a step feature may fill, and what flows through them.

The core step (:mod:`hpclab.rank.step`) runs input → forward/backward → gradient exchange →
update, with a timestamp after each part. A feature (the straggler, batch weighting, SDC, model
averaging, staleness) changes the step at named points and nowhere else; each point does
nothing unless a feature overrides it. In the order a step passes them:

* :meth:`Feature.forward_fault` — a context the forward pass runs in (an activation's bit flip);
* :meth:`Feature.after_backward` — this rank's loss and gradients, before ``compute`` ends;
* :meth:`Feature.before_allreduce` — after ``compute``'s timestamp: it may move it (a
  straggler's extra time counts as compute) and change the gradients that are exchanged;
* :meth:`Feature.exchange` — only for a feature that *replaces* the gradient average
  (``replaces_allreduce``: local SGD, hybrid, Crossbow); at most one per run;
* :meth:`Feature.after_allreduce` — the exchanged gradient, still loss-scaled (staleness);
* :meth:`Feature.before_apply` — tensors the optimizer's update must wait for;
* :meth:`Feature.after_apply` — after the update's timestamp (an exchange of models).

Hooks read and write one :class:`Traced` per step: graph tensors, never Python decisions per
rank (the rules that keep Horovod's collectives matched: :mod:`hpclab.rank.step`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class Traced:
    """One step's tensors as the hooks see them (set by the core step as it gets there)."""

    clock: object  # the previous step's [exchange end, end] timestamps
    flip: object = None  # the fault's XOR mask (tensor) in the call's sampled last step, else None
    loss: object = None  # this rank's loss (weighted by its share with uneven batches)
    correct: object = None
    grads: list = field(default_factory=list)
    judged: object = None  # the loss the spike detector judges (the global batch's when on)
    compute_end: object = None  # timestamp: end of forward/backward (and a straggler's wait)
    update_end: object = None  # timestamp: the optimizer's update applied
    exchange_end: object = None  # timestamp: the last exchange of the step (the next straggle
    # counts from it)
    exchanged_after_update: object = None  # seconds of exchange after the update (models)


@dataclass(frozen=True)
class StepContext:
    """What a feature may need when the step builds it (every rank builds the same list)."""

    cfg: object  # the run's RunConfig
    model: object
    optimizer: object
    world: int
    rank: int
    share: float  # this rank's share of the global batch (uneven batches)
    fault: object  # the run's planned bit flip (hpclab.rank.features.sdc.Fault) or None
    allreduce: object  # the step's gradient allreduce, ``allreduce(tensors, ranks=None)``
    stamp: object  # the step's timestamp op (hpclab.rank.step.Stamp)
    loss_scaled: bool  # gradients carry mixed_float16's loss scale until the update
    tf: object
    hvd: object


class Feature:
    """A lesson's change to the synchronous step; every hook does nothing by default.

    A feature module defines ``in_run(cfg, world) -> bool`` (does run ``cfg`` carry it: the same
    answer on every rank) and ``build(ctx: StepContext) -> Feature``, and is listed once in
    :data:`hpclab.rank.step.FEATURES`."""

    replaces_allreduce = False  # True: :meth:`exchange` is the step's gradient exchange

    @property
    def state(self) -> list:
        """Variables of the feature's own, broadcast at the start and restored by a rollback."""
        return []

    def forward_fault(self, flip) -> contextlib.AbstractContextManager | None:
        return None

    def after_backward(self, s: Traced) -> None:
        pass

    def before_allreduce(self, s: Traced) -> None:
        pass

    def exchange(self, s: Traced) -> None:
        pass

    def after_allreduce(self, s: Traced) -> None:
        pass

    def before_apply(self, s: Traced) -> list:
        return []

    def after_apply(self, s: Traced) -> None:
        pass


__all__ = ["Feature", "StepContext", "Traced"]
