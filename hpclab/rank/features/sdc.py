"""Silent data corruption on purpose: one bit flip, a loss-spike detector, and rollback.

A memory or logic error that flips one bit of a float32 changes its value by a factor that
depends only on *which* bit (IEEE 754 binary32: bit 31 sign, 30-23 exponent, 22-0 mantissa).
Zhang et al. ("Quantifying the impact of memory errors in deep learning", IEEE Cluster 2019, TACC)
flipped single bits during training and found the outcome set by the bit position: a flip of a
high exponent bit (30) turns a weight of 0.05 into ~1.7e37 and training fails at once, visibly,
in the very next iteration's loss; low mantissa bits change a value by parts per million and
training never notices. So P(failure) = P(failure | SDC) × P(SDC), and the first factor is
measured by injection (:func:`hpclab.studies.sdc.monte_carlo`).

Data parallelism adds a twist the lab makes visible: a flip in one rank's *weights* is never
averaged away (each rank applies the same averaged gradient to its own copy), so the replicas
silently diverge and the per-rank weight digests differ from then on; a flip in one rank's
*gradient* before the allreduce reaches every rank, equally, and the replicas stay equal.

:class:`Fault` is the planned flip (``RunConfig.sdc_*``): the weights are flipped on the host
between two calls, a gradient or an activation inside the call's last step (traced apart: no
other step carries the flip). :class:`Guard` is the detector of Zhang et al.: a step whose
global-batch loss is non-finite or above ``spike_factor`` × its running mean fires it (the loss
rides in the step's gradient allreduce, so every rank sees the same value and takes the same
decision); with ``rollback`` every rank restores its newest state older than the spike and
redoes the steps since (the fault was transient, so they come out clean).
"""

from __future__ import annotations

import contextlib
from collections import deque

import numpy as np

from hpclab.rank.features.hooks import Feature, Traced

EMA_RATE = 0.1  # weight of the newest clean step in the loss's running mean
ARM_STEPS = 10  # clean steps seen before the detector may fire (the mean needs a few)
NO_SPIKE = -1.0


def flip_bit(value: float, bit: int) -> np.float32:
    """``value`` as float32 with bit ``bit`` (0 = least significant mantissa bit) inverted."""
    word = np.array([value], dtype=np.float32).view(np.uint32)
    word ^= np.uint32(1 << bit)
    return word.view(np.float32)[0]


def mask_int32(bit: int) -> int:
    """The XOR mask of ``bit`` as a signed 32-bit integer (bit 31 is the sign: -2**31)."""
    return int(np.array([1 << bit], dtype=np.uint32).view(np.int32)[0])


def assign_all(variables, values) -> None:
    """Every variable set to its saved value (a rollback; a Monte-Carlo trial's fresh start)."""
    for var, value in zip(variables, values):
        var.assign(value)


def weighted_layers(model) -> list:
    """The layers with a kernel (convolutions and dense layers), in model order: ``sdc_layer``
    counts these."""
    return [layer for layer in model.layers if getattr(layer, "kernel", None) is not None]


class Fault:
    """This run's planned bit flip, as seen from one rank (it acts only on ``sdc_rank``)."""

    def __init__(self, cfg, model, rank: int):
        self.target, self.bit, self.step = cfg.sdc_target, cfg.sdc_bit, cfg.sdc_step
        self.on = cfg.sdc_target != "none"
        self.mine = self.on and rank == cfg.sdc_rank
        self.done = False  # a transient fault: after a rollback the redone step is clean
        self.record: dict = {}
        if not self.on:
            return
        layers = weighted_layers(model)
        if cfg.sdc_layer >= len(layers):
            raise ValueError(
                f"RunConfig.sdc_layer must be a layer with weights of model {cfg.model!r}: 0 to "
                f"{len(layers) - 1} ({', '.join(layer.name for layer in layers)}); you passed "
                f"sdc_layer={cfg.sdc_layer}."
            )
        self.layer = layers[cfg.sdc_layer]
        kernel = self.layer.kernel
        self.var_index = next(
            i for i, v in enumerate(model.trainable_variables) if v is kernel
        )  # (the same object: a name match could pick another layer's kernel)
        # the element hit: seeded, the same on every rank, recorded
        rng = np.random.default_rng([cfg.seed, cfg.sdc_layer, cfg.sdc_bit, cfg.sdc_step])
        self.element = int(rng.integers(kernel.shape.num_elements()))
        self.record = {
            "target": self.target,
            "layer": self.layer.name,
            "bit": self.bit,
            "rank": cfg.sdc_rank,
            "step": self.step,
            "element": self.element,
        }

    # -- when -------------------------------------------------------------------------------------
    def steps_to_cut(self, step: int) -> int:
        """Steps the call starting at ``step`` may run so the flip lands on a call boundary:
        weights flip on the host *before* step ``sdc_step``, a gradient or an activation in the
        *last* step of a call (large when nothing is due)."""
        if not self.on or self.done:
            return 1 << 30
        end = self.step if self.target == "weights" else self.step + 1
        return end - step if end > step else 1 << 30

    def mask(self, step: int, steps: int) -> int:
        """The XOR mask the call ``[step, step + steps)`` applies in its last step (0: none)."""
        due = self.target in ("gradients", "activations") and step + steps - 1 == self.step
        return mask_int32(self.bit) if self.mine and not self.done and due else 0

    # -- how --------------------------------------------------------------------------------------
    def flip_weights(self, model, step: int) -> None:
        """Before step ``step``: flip the planned weight on this rank, once."""
        if self.target != "weights" or self.done or step != self.step:
            return
        if self.mine:
            var = model.trainable_variables[self.var_index]
            flat = var.numpy().reshape(-1)
            before = float(flat[self.element])
            flat[self.element] = flip_bit(before, self.bit)
            var.assign(flat.reshape(var.shape))
            self.record.update(before=before, after=float(flat[self.element]))
        self.done = True

    def flip_tensor(self, tf, tensor, mask):
        """``tensor`` with bit ``mask`` inverted in its planned element (float32; a zero mask
        leaves it as it is). Activations are batches: the element index wraps to their size."""
        flat = tf.reshape(tensor, [-1])
        index = tf.math.floormod(tf.constant(self.element, tf.int32), tf.size(flat))[None, None]
        word = tf.bitcast(tf.gather_nd(flat, index), tf.int32)
        flipped = tf.bitcast(tf.bitwise.bitwise_xor(word, mask), tf.float32)
        return tf.reshape(tf.tensor_scatter_nd_update(flat, index, flipped), tf.shape(tensor))

    def flipped(self, step: int, steps: int) -> None:
        """After the call ``[step, step + steps)``: the in-call flip, if it was due, is done."""
        if self.target in ("gradients", "activations") and step <= self.step < step + steps:
            self.done = True


class Guard:
    """The loss-spike detector's running state and, with rollback, this rank's recent states.

    In the graph (:meth:`check`), per step: ``state = [mean, clean steps seen, first spike]``
    (the spike as the step's index in its call, :data:`NO_SPIKE` when none). On the host: a
    snapshot of the model's and the optimizer's variables and the detector's mean after every
    call that ended clean (the newest two: a spike at step j restores the newest one from a step
    <= j - 1, which a flip in step j - 1 cannot have reached)."""

    def __init__(self, factor: float, rollback: bool, variables=()):
        self.factor, self.rollback = float(factor), bool(rollback)
        self.on = self.factor > 0
        self.variables = list(variables)
        self.mean = np.array([0.0, 0.0], dtype=np.float32)  # running mean, clean steps seen
        self.snapshots: deque = deque(maxlen=2)
        self.restored: dict[int, int] = {}  # step restored -> times
        self.events: list[dict] = []

    def check(self, tf, state, loss, i):
        """One step's update of ``state`` with the step's global-batch ``loss`` (float32)."""
        mean, seen, first = state[0], state[1], state[2]
        finite = tf.math.is_finite(loss)
        armed = seen >= ARM_STEPS
        spike = tf.logical_or(
            tf.logical_not(finite), tf.logical_and(armed, loss > self.factor * mean)
        )
        clean = tf.logical_not(spike)
        value = tf.where(finite, loss, mean)
        new_mean = tf.where(seen > 0, mean + EMA_RATE * (value - mean), value)
        first = tf.where(tf.logical_and(spike, first < 0), tf.cast(i, tf.float32), first)
        return tf.stack([tf.where(clean, new_mean, mean), seen + tf.cast(clean, tf.float32), first])

    def state_in(self) -> np.ndarray:
        return np.array([*self.mean, NO_SPIKE], dtype=np.float32)

    def after_call(self, state_out: np.ndarray, step: int, steps: int) -> int | None:
        """Keep the call's detector state; the global step of its first spike, or None."""
        if state_out[2] >= 0:
            return step + int(state_out[2])
        self.mean = np.asarray(state_out[:2], dtype=np.float32)
        self.snapshot(step + steps)
        return None

    def snapshot(self, step: int) -> None:
        """With rollback: keep the state before step ``step`` (host copies)."""
        if self.rollback:
            values = [v.numpy() for v in self.variables]
            self.snapshots.append((step, values, self.mean.copy()))

    def restore(self, spike_step: int, max_times: int) -> int | None:
        """Every rank: restore the newest state older than ``spike_step``; the step it was at
        (None when there is none, or it was restored ``max_times`` already: not transient)."""
        older = [s for s in self.snapshots if s[0] <= spike_step - 1]
        if not older:
            return None
        step, values, mean = older[-1]
        if self.restored.get(step, 0) >= max_times:
            return None
        self.restored[step] = self.restored.get(step, 0) + 1
        assign_all(self.variables, values)
        self.mean = mean.copy()
        while self.snapshots and self.snapshots[-1][0] > step:  # (states after it are gone)
            self.snapshots.pop()
        return step


def in_run(cfg, world: int) -> bool:
    """Whether the step carries a flip (a gradient's or an activation's; weights flip on the
    host): every rank builds it, the fault's rank with the bit's mask, the others with 0."""
    return cfg.sdc_target in ("gradients", "activations")


class FaultInStep(Feature):
    """The step's hooks of the planned flip: in the forward pass (an activation) or in this
    rank's gradient before the exchange, in the call's last step only (``flip`` is None in the
    others)."""

    def __init__(self, fault: Fault, tf):
        self.fault, self.tf = fault, tf

    def forward_fault(self, flip):
        if flip is None or self.fault.target != "activations":
            return None
        return self._in_activation(flip)

    @contextlib.contextmanager
    def _in_activation(self, flip):
        """The planned layer's activation passes through the fault while the step is traced."""
        fault, tf = self.fault, self.tf
        layer, activation = fault.layer, fault.layer.activation
        layer.activation = lambda z: fault.flip_tensor(tf, activation(z), flip)
        try:
            yield
        finally:
            layer.activation = activation

    def before_allreduce(self, s: Traced) -> None:
        if s.flip is not None and self.fault.target == "gradients":
            i, grads = self.fault.var_index, s.grads
            flipped = self.fault.flip_tensor(self.tf, grads[i], s.flip)
            s.grads = [*grads[:i], flipped, *grads[i + 1 :]]


class Watch:
    """What the trainer asks of this module, call by call: the fault and the guard together."""

    def __init__(self, cfg, fault: Fault, state, max_rollbacks: int):
        """``state``: every variable a rollback restores (weights, optimizer state, ...);
        ``max_rollbacks``: restores of one state before a spike counts as not transient."""
        self.fault = fault
        self.guard = Guard(cfg.spike_factor, cfg.rollback, state)
        self.rollback, self.max_rollbacks = bool(cfg.rollback), int(max_rollbacks)
        self.in_call = self.fault.on and self.fault.target != "weights"  # the call takes a mask
        self.detected: int | None = None  # the first spike's step

    @property
    def on(self) -> bool:
        """A fault is planned or the detector runs (the summary then reports them)."""
        return self.fault.on or self.guard.on

    @property
    def variables(self) -> list:
        """Every variable a rollback restores."""
        return self.guard.variables

    def check(self, tf, state, loss, i):
        """The detector's update of ``state`` with step ``i``'s judged ``loss`` (in the graph);
        ``state`` unchanged with the detector off."""
        return self.guard.check(tf, state, loss, i) if self.guard.on else state

    def steps_to_cut(self, step: int) -> int:
        """Steps the call starting at ``step`` may run so a flip lands on a call boundary."""
        return self.fault.steps_to_cut(step)

    def detector_state(self) -> np.ndarray:
        """The detector's state a call starts from (no spike yet)."""
        return self.guard.state_in()

    def roll_back(self, spike: int) -> int | None:
        """With rollback, every rank: restore the newest state older than the ``spike`` step and
        record it; the step it was at, or None (rollback off, or the fault is not transient)."""
        if not self.rollback:
            return None
        back = self.guard.restore(spike, self.max_rollbacks)
        if back is not None:
            self.guard.events[-1]["restored_step"] = back
        return back

    def before_call(self, model, step: int, digest) -> None:
        if step == 0:
            self.guard.snapshot(0)
        self.fault.flip_weights(model, step)
        self._digest(digest)

    def _digest(self, digest) -> None:
        """This rank's weight digest right after the flip (weights: before any step uses them;
        a gradient or an activation: after the step that carried it), once."""
        if self.fault.done and "digest_after" not in self.fault.record:
            self.fault.record["digest_after"] = digest()

    def inputs(self, step: int, steps: int) -> tuple[np.ndarray, int]:
        """The call's detector state and fault mask."""
        return self.detector_state(), self.fault.mask(step, steps)

    def after_call(self, state_out, step: int, steps: int, digest) -> int | None:
        """The global step of a spike in the call ``[step, step + steps)``, or None. Records the
        flip (with this rank's weight digest right after it) and the first spike."""
        self.fault.flipped(step, steps)
        self._digest(digest)
        spike = self.guard.after_call(np.asarray(state_out), step, steps)
        if spike is not None:
            self.detected = spike if self.detected is None else self.detected
            self.guard.events.append({"spike_step": spike})
        return spike

    def summary(self) -> dict:
        out = dict(self.fault.record)
        out["detected_step"] = self.detected
        out["spikes"] = list(self.guard.events)  # each with restored_step if rolled back
        return out


def build(ctx) -> FaultInStep:
    return FaultInStep(ctx.fault, ctx.tf)


__all__ = [
    "build",
    "Fault",
    "FaultInStep",
    "Guard",
    "Watch",
    "assign_all",
    "flip_bit",
    "in_run",
    "mask_int32",
    "weighted_layers",
]
