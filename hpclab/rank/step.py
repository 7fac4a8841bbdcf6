"""One optimizer step inside the compiled call, with timestamps around each of its parts.

The step is the lab's unit of work: batch → forward/backward → gradient allreduce → update. Its
parts are timed *inside the graph* with ``tf.timestamp()`` ops that control dependencies pin
between them, so a rank learns where its step time goes without leaving the ``while_loop``
(hpclab issue 14): ``loop`` (the ``while_loop``'s own work between two steps), ``input`` (the
batch cut from the resident shard), ``compute`` (forward and
backward, and a straggler's extra time), ``allreduce`` (Horovod's gradient average, *including
the wait for the slowest rank*: the collective cannot finish before every rank has joined it) and
``apply`` (the optimizer's update). Five timestamps a step are not free where two ranks share
two busy cores: 2 ranks of cnn1d take 1.51 → 1.59 ms a step with them (one rank with a spare
core shows no cost); ``make bench`` compares telemetry on and off (benchmarks/README.md).

The straggler knob (``RunConfig.straggler_rank``, ``straggler_slowdown``, ``straggler_ms``)
makes one rank slow on purpose, the way a throttled GPU, a noisy neighbour or a slower node does:
after its backward pass that rank waits ``factor × (its useful time since its previous allreduce:
the update, loop, input, forward/backward) + ms``, so all its useful work takes
``1/(1 - slowdown)`` as long. The host sleeps, as it would while a slower device computes
(:func:`_straggle`); every rank of a straggler run enters that function (the others return at
once), and the wait is sized inside it, so the 0.1-0.4 ms it takes to get there is slowed too
(sized before it, a 30 % straggler read load balance 0.88-0.94 instead of 0.85), and it ends on
a deadline however late the sleep wakes up. Every other rank then waits in the allreduce, and
:mod:`hpclab.core.pop` shows it as lower load balance.
"""

from __future__ import annotations

import time

from hpclab.core.pop import straggler_factor
from hpclab.rank.features import averaging, groups, staleness

TIMES = ("loop", "input", "compute", "allreduce", "apply")  # seconds summed per call, in order


class Step:
    """The traced arithmetic of one step on this rank; built once per run by the trainer."""

    def __init__(self, cfg, *, model, optimizer, world: int, rank: int, share: float = 1.0):
        import horovod.tensorflow as hvd
        import tensorflow as tf

        self.tf, self.hvd, self.cfg = tf, hvd, cfg
        self.model, self.optimizer, self.world = model, optimizer, world
        self.loss_scaled = cfg.precision == "mixed_float16" and cfg.loss_scaling
        self.compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
        self.loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        # local SGD, Crossbow (hpclab.rank.features.averaging): no gradient allreduce, models averaged
        self.averaging = averaging.for_run(cfg, model, world)
        # hybrid: this rank's synchronous group, whose gradients are averaged every step
        hybrid = cfg.update == "hybrid" and world > 1
        self.group = groups.of_rank(hvd, world, cfg.groups, rank) if hybrid else None
        self.stale = staleness.for_run(cfg, model.trainable_variables)  # asynchrony's staleness
        # The noise scale needs two batch sizes: with one rank there is only one, so skip the norms
        # (with uneven batches the small one is not one size; averaged models average no gradient)
        self.track_noise = (
            cfg.noise_scale and world > 1 and not cfg.batch_skew and self.averaging is None
        )
        # Uneven batches (batch_skew): Horovod's average weighs ranks equally, so this rank's mean
        # gradient (and loss, for the mean the meters report) is weighted by its share of the
        # global batch (b_r·world/B): the average is then the global batch's mean, as with even
        # batches. Decided from the config, the same on every rank: a rank whose share happens
        # to be 1 still multiplies, or its tensors' names (Horovod names its allreduces after
        # them) would differ from the others' and the allreduce would never complete.
        self.weighted = bool(cfg.batch_skew) and world > 1
        self.share = share
        # silent data corruption (hpclab.rank.features.sdc): the planned flip, and the loss-spike
        # detector, which needs the global-batch loss of every step (it rides in the allreduce)
        self.fault = None  # (set by the trainer: hpclab.rank.features.sdc.Fault)
        self.detect = cfg.spike_factor > 0
        grads = tf.function(self._loss_and_grads, jit_compile=True) if cfg.xla else None
        self.loss_and_grads = grads or self._loss_and_grads
        # A straggler run builds the same graph on every rank (the others wait 0 s): Horovod
        # matches collectives across ranks by name, and extra ops on one rank would rename its
        # allreduces and leave the others waiting for a tensor that never comes.
        self.straggler_run = 0 <= cfg.straggler_rank < world and world > 1
        slow = self.straggler_run and rank == cfg.straggler_rank
        self.slow_factor = straggler_factor(cfg.straggler_slowdown) if slow else 0.0
        self.slow_s = cfg.straggler_ms / 1000.0 if slow else 0.0
        # time_split=False (make bench's "telemetry off"): no timestamps, the parts read 0;
        # a straggler run needs them to size its wait
        self.timed = cfg.time_split or self.straggler_run

    @property
    def state(self) -> list:
        """Variables of this step's own beyond the model and optimizer (a central model, a ring
        of stale gradients): broadcast at the start, saved and restored by a rollback."""
        return [*getattr(self.averaging, "variables", []), *getattr(self.stale, "ring", [])]

    def _loss_and_grads(self, x, y, flip=None):
        """Forward and backward (XLA-compiled with ``xla=True``); loss-scaled under float16;
        ``flip``: the activation fault's XOR mask (tensor), for the call's last step only."""
        tf = self.tf
        with tf.GradientTape() as tape:
            logits = tf.cast(self._forward(x, flip), tf.float32)
            loss = self.loss_fn(y, logits)
            target = self.optimizer.get_scaled_loss(loss) if self.loss_scaled else loss
        grads = tape.gradient(target, self.model.trainable_variables)
        pred = tf.argmax(logits, axis=-1, output_type=y.dtype)
        return loss, tf.reduce_sum(tf.cast(tf.equal(pred, y), tf.float32)), grads

    def _forward(self, x, flip):
        """The model on ``x``; with an activation ``flip``, the planned layer's activation
        passes through the fault while this step is traced (no other step carries it)."""
        fault = self.fault
        if flip is None or fault is None or fault.target != "activations":
            return self.model(x, training=True)
        layer, activation = fault.layer, fault.layer.activation
        layer.activation = lambda z: fault.flip_tensor(self.tf, activation(z), flip)
        try:
            return self.model(x, training=True)
        finally:
            layer.activation = activation

    def _allreduce(self, grads, ranks=None):
        """Horovod: average gradients over ranks (a process set: ``ranks``; all by default): one
        grouped (fused) op, or one per tensor so each can start while backprop still runs.
        Loss-scaled gradients cross scaled (float16 compression keeps their range) and are
        unscaled afterwards."""
        hvd = self.hvd
        over = dict(op=hvd.Average, compression=self.compression)
        if ranks is not None:
            over["process_set"] = ranks
        if self.cfg.grad_allreduce == "per_tensor":
            return [hvd.allreduce(g, **over) for g in grads]
        return hvd.grouped_allreduce(grads, **over)

    def _sq_norm(self, grads):
        tf = self.tf
        if self.loss_scaled:
            grads = self.optimizer.get_unscaled_gradients(grads)
        return tf.square(tf.linalg.global_norm(grads))

    def _zeros(self, grads):
        """Gradient elements exactly 0 (scaled or not): float16's underflow, made visible."""
        tf = self.tf
        return tf.add_n([tf.reduce_sum(tf.cast(tf.equal(g, 0), tf.float32)) for g in grads])

    def _after(self, tensors):
        """A timestamp taken once every tensor in ``tensors`` exists (float64 seconds); 0 when
        the split is off."""
        if not self.timed:
            return self.tf.constant(0.0, self.tf.float64)
        with self.tf.control_dependencies(list(tensors)):
            return self.tf.timestamp()

    def _straggle(self, since, grads):
        """The straggler's extra time (none on the other ranks): the host sleeps until
        ``factor × (now - since) + ms`` past now; ``grads`` released after it, with its end."""
        tf = self.tf
        with tf.control_dependencies(grads):
            waited = tf.py_function(_straggle, [since, self.slow_factor, self.slow_s], tf.float64)
        with tf.control_dependencies([waited]):
            grads = [tf.identity(g) for g in grads]
        return grads, self._after(grads)

    def start(self):
        """The clock the call's first step starts from: ``[end of the previous allreduce, end
        of the previous step]``, both now (the first step's ``loop`` part counts from it)."""
        t = self._after([])
        return self.tf.stack([t, t])

    def __call__(self, batch, clock, sample=False, flip=None):
        """One step on ``batch()`` (a function cutting the batch, timed as input); ``clock`` is
        the previous step's ``[allreduce end, end]`` (or :meth:`start`): the gap to its end is
        the ``loop`` part; the straggler sizes its extra work from its allreduce end.

        Returns ``(loss, correct, |G_small|², |G_big|², gradient zeros)`` — norms and zeros only
        when ``sample`` —, this rank's seconds of each part of :data:`TIMES`, the new clock and
        the loss the spike detector judges (the global batch's with the detector on).
        ``sample`` is a Python flag: the call's last step is traced apart with it, so no step
        pays a ``tf.cond``; it alone takes ``flip``, the fault's XOR mask (0: none)."""
        tf = self.tf
        t_prev = clock[1]
        t0 = self._after([t_prev])
        with tf.control_dependencies([t0] if self.timed else []):
            x, y = batch()
        t1 = self._after([x, y])
        if self.timed:  # the forward pass waits for t1: the executor may run ready ops in any
            # order: at 512 samples t1 came late (median input 2.0-4.3 ms, not 0.1; now and
            # then after the backward pass: compute 0.006 ms); at 64 the slip hid in noise
            with tf.control_dependencies([t1]):
                x, y = tf.identity(x), tf.identity(y)
        if flip is not None and self.fault.target == "activations":
            loss, correct, grads = self._loss_and_grads(x, y, flip)
        else:
            loss, correct, grads = self.loss_and_grads(x, y)
        if self.weighted:
            grads = [g * self.share for g in grads]
            loss = loss * self.share
        t2 = self._after([loss, correct, *grads])
        if self.straggler_run:  # slower at all it did since its last allreduce: apply to compute
            grads, t2 = self._straggle(clock[0], grads)
        if flip is not None and self.fault.target == "gradients":  # before the allreduce
            i = self.fault.var_index
            grads = [*grads[:i], self.fault.flip_tensor(tf, grads[i], flip), *grads[i + 1 :]]
        zero = tf.constant(0.0)
        zeros = self._zeros(grads) if sample else zero  # in this rank's own gradient
        small = self._sq_norm(grads) if sample and self.track_noise else zero  # before allreduce
        judged = loss
        if self.averaging is not None:  # local gradients; the detector's loss is averaged alone
            if self.group is not None:  # hybrid: synchronous inside the group
                grads = self._allreduce(grads, self.group)
            if self.detect:
                judged = self.hvd.allreduce(loss, op=self.hvd.Average, name="hpclab_spike_loss")
        elif self.world > 1:
            # (not held back until t2: per_tensor allreduces overlap the backward pass, and
            # then only the part left after it — the exposed communication — counts as such)
            if self.detect:  # the detector's loss, averaged with the gradients (one fused op)
                *grads, judged = self._allreduce([*grads, loss])
            else:
                grads = self._allreduce(grads)
        t3 = self._after(grads)
        big = self._sq_norm(grads) if sample and self.track_noise else zero  # after it
        if self.stale is not None:  # the averaged gradient of τ steps ago
            grads = self.stale(grads, self.optimizer.iterations.read_value())
        if self.loss_scaled:
            # Unscaled after the allreduce, not before: float16 compression keeps the range of
            # scaled values. The LossScaleOptimizer then skips a non-finite step and lowers its
            # scale (dynamic loss scaling, Micikevicius et al. 2018, arXiv:1710.03740).
            grads = self.optimizer.get_unscaled_gradients(grads)
        prepared = getattr(self.averaging, "prepare", lambda: [])()  # (Crossbow's corrections)
        with tf.control_dependencies([t3, *prepared]):
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        # (apply_gradients returns a variable or None; a read of the step counter it increments
        # last is ordered after it: tf.function runs reads and writes of a variable in order)
        t4 = self._after([self.optimizer.iterations.read_value()])
        comm, end = t3 - t2, t4
        if self.averaging is not None:  # after the update: the models' average is the exchange
            with tf.control_dependencies([t4]):
                averaged = self.averaging(self.optimizer.iterations.read_value())
            end = self._after([averaged])
            comm += end - t4
        times = tf.cast(tf.stack([t0 - t_prev, t1 - t0, t2 - t1, comm, t4 - t3]), tf.float32)
        out = tf.stack([loss, correct, small, big, zeros])
        return out, times, tf.stack([t3 if self.averaging is None else end, end]), judged


_LATE = [0.0]  # how late time.sleep wakes up on this rank: a high running estimate, in seconds


def _straggle(since, factor, extra_s) -> float:
    """The straggler's wait, outside TensorFlow's thread pools: the host sleeps, as it would
    while a slower device computes, and leaves the core to the other ranks (a spin would take
    it from them on a machine with no spare core). The wait is sized *here*, from the clock:
    ``since`` (``tf.timestamp()``'s epoch seconds, as ``time.time()``) up to now includes what
    it took to enter this Python function (the GIL hand-over, 0.1-0.4 ms, paid by every rank of
    a straggler run), so the straggler is slower at exactly everything the others did too.

    It ends on a deadline: the sleep is shortened by how late this rank's sleeps wake up, and
    the rest is spun. Wake-ups are 0.05 ms late on a quiet core, and 1 ms and more where two
    ranks' threads share two busy cores, longer than a small model's whole wait: then it is all
    spun (a sleep capped at half the wait overshot it by the lateness, and a 30 % straggler read
    load balance 0.77 instead of 0.85). The estimate moves halfway up to a later wake-up at
    once, down by 5 % of the gap after an earlier one, and decays while every wait is spun, so
    a later wait sleeps and measures it again. Returns the seconds asked for."""
    now = time.time()
    wait = (now - float(since)) * float(factor) + float(extra_s)
    if wait <= 0:
        return 0.0
    deadline, nap = now + wait, wait - _LATE[0]
    if nap > 0:
        t0 = time.time()
        time.sleep(nap)
        late = time.time() - t0 - nap
        _LATE[0] += (0.5 if late > _LATE[0] else 0.05) * (late - _LATE[0])
    else:
        _LATE[0] *= 0.98
    while time.time() < deadline:  # the rest: precise to microseconds
        pass
    return wait


__all__ = ["Step", "TIMES"]
