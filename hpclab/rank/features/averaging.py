"""Averaging models instead of gradients: local SGD every ``average_every`` steps, and Crossbow.

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

**Hybrid** (``update="hybrid"``, ``groups=G``) is local SGD between G synchronous groups: inside
a group the ranks average their gradients every step over a Horovod process set, so the group's
replicas stay equal, and the groups' models are averaged every H steps (Lin et al.'s
hierarchical local SGD; hpclab.rank.features.groups). G = 1 is synchronous SGD, G = k is local SGD.
"""

from __future__ import annotations

import contextlib

from hpclab.rank.features import groups
from hpclab.rank.features.hooks import Feature, Traced


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


class SMA:
    """Crossbow's synchronous model averaging (Koliousis et al., "Crossbow: scaling deep learning
    with small batch sizes on multi-GPU servers", VLDB 2019, Algorithm 1), one learner per rank.

    Every step, after learner j's own SGD update, it is pulled toward a central average model z by
    the correction c_j = α (w_j − z), and z moves by all the corrections with momentum:
    ``w_j ← w_j − c_j``; ``z ← z + Σ_j c_j + μ (z − z_prev)`` (α = 1/k for k learners, μ =
    ``RunConfig.momentum``). The learners stay small-batch SGD (``optimizer="sgd"``), each at
    the learning rate of its own batch; the momentum lives in z. Held-out evaluation uses z,
    as Crossbow's does (:meth:`central`)."""

    def __init__(self, cfg, model, tf, hvd, world: int):
        self.model, self.tf, self.hvd = model, tf, hvd
        self.alpha, self.mu = 1.0 / world, float(cfg.momentum)
        weights = model.trainable_variables
        # (broadcast from rank 0 with the model: Trainer.setup)
        self.z = [tf.Variable(v, trainable=False, name="sma_z") for v in weights]
        self.z_prev = [tf.Variable(v, trainable=False, name="sma_z_prev") for v in weights]
        self.variables = [*self.z, *self.z_prev]

    def prepare(self):
        """Before the learner's own update: its corrections c_j = α (w_j − z) from the weights
        the step's gradient was taken at (Algorithm 1), kept for :meth:`__call__`."""
        weights = self.model.trainable_variables
        self._corrections = [self.alpha * (w.read_value() - z) for w, z in zip(weights, self.z)]
        return self._corrections

    def __call__(self, iterations):
        tf, hvd = self.tf, self.hvd
        weights = self.model.trainable_variables
        corrections = self._corrections
        total = hvd.grouped_allreduce(corrections, op=hvd.Sum, name="hpclab_sma_corrections")
        new_z = [
            z + c + self.mu * (z - zp) for z, c, zp in zip(self.z, total, self.z_prev)
        ]  # (read before any assignment below)
        ops = [w.assign_sub(c) for w, c in zip(weights, corrections)]
        with tf.control_dependencies(new_z):
            ops += [zp.assign(z.read_value()) for zp, z in zip(self.z_prev, self.z)]
        with tf.control_dependencies(ops):
            ops += [z.assign(n) for z, n in zip(self.z, new_z)]
        with tf.control_dependencies(ops):
            return tf.constant(1.0)

    @contextlib.contextmanager
    def central(self):
        """The model holds z while the block runs (evaluation), its own replica again after."""
        weights = self.model.trainable_variables
        own = [w.numpy() for w in weights]
        for w, z in zip(weights, self.z):
            w.assign(z)
        try:
            yield
        finally:
            for w, value in zip(weights, own):
                w.assign(value)


def in_run(cfg, world: int) -> bool:
    """Whether the run averages models instead of gradients (never with a single rank)."""
    return cfg.update != "sync" and world > 1


class Averaging(Feature):
    """The step's hooks of local SGD, hybrid and Crossbow: the gradient exchange is replaced by
    the hybrid group's own average (nothing at all for local SGD and Crossbow), and the models
    are averaged after the update, timed as the step's ``allreduce`` part.

    ``allreduce(grads, process_set)``: the step's gradient allreduce, over a hybrid group.
    ``detect``: the spike detector is on, so the loss is averaged over all ranks on its own
    (the gradients are not: no fused op carries it)."""

    replaces_allreduce = True

    def __init__(self, cfg, *, model, optimizer, world: int, rank: int, allreduce, stamp, tf, hvd):
        self.tf, self.hvd, self.stamp, self.allreduce = tf, hvd, stamp, allreduce
        self.optimizer = optimizer
        self.detect = cfg.spike_factor > 0
        crossbow = cfg.update == "crossbow"
        self.models = SMA(cfg, model, tf, hvd, world) if crossbow else LocalSGD(cfg, model, tf, hvd)
        # hybrid: this rank's synchronous group, whose gradients are averaged every step
        hybrid = cfg.update == "hybrid"
        self.group = groups.of_rank(hvd, world, cfg.groups, rank) if hybrid else None

    @property
    def state(self) -> list:
        return list(getattr(self.models, "variables", []))

    def exchange(self, s: Traced) -> None:
        if self.group is not None:  # hybrid: synchronous inside the group
            s.grads = self.allreduce(s.grads, self.group)
        if self.detect:
            hvd = self.hvd
            s.judged = hvd.allreduce(s.loss, op=hvd.Average, name="hpclab_spike_loss")

    def before_apply(self, s: Traced) -> list:
        prepare = getattr(self.models, "prepare", None)  # Crossbow's corrections
        return prepare() if prepare is not None else []

    def after_apply(self, s: Traced) -> None:
        """After the update: the models' average is the exchange (it ends the step)."""
        with self.tf.control_dependencies([s.update_end]):
            averaged = self.models(self.optimizer.iterations.read_value())
        end = self.stamp([averaged])
        s.exchanged_after_update = end - s.update_end
        s.exchange_end = end

    def central_weights(self) -> list:
        """Crossbow's central model z as NumPy arrays ([] for local SGD and hybrid)."""
        return [z.numpy() for z in getattr(self.models, "z", [])]

    def central(self):
        """The weights held-out evaluation uses: Crossbow's central model, else this rank's."""
        central = getattr(self.models, "central", None)
        return central() if central is not None else contextlib.nullcontext()


def build(ctx) -> Averaging:
    return Averaging(
        ctx.cfg,
        model=ctx.model,
        optimizer=ctx.optimizer,
        world=ctx.world,
        rank=ctx.rank,
        allreduce=ctx.allreduce,
        stamp=ctx.stamp,
        tf=ctx.tf,
        hvd=ctx.hvd,
    )


__all__ = ["build", "Averaging", "LocalSGD", "SMA", "in_run"]
