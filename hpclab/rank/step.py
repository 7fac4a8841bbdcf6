"""One optimizer step inside the compiled call: the core step, its timestamps, and its features.

The step is the lab's unit of work: batch → forward/backward → gradient exchange → update. Its
parts (:data:`hpclab.core.pop.STEP_PARTS`) are timed *inside the graph* with ``tf.timestamp()``
ops that control dependencies pin between them, so a rank learns where its step time goes
without leaving the ``while_loop``: ``loop`` (the ``while_loop``'s own work
between two steps), ``input`` (the batch cut from the resident shard), ``compute`` (forward and
backward, and a straggler's extra time), ``allreduce`` (Horovod's gradient average, *including
the wait for the slowest rank*: the collective cannot finish before every rank has joined it;
with model averaging, the models' average too) and ``apply`` (the optimizer's update). Five
timestamps a step are not free where two ranks share two busy cores: 2 ranks of cnn1d take
1.51 → 1.59 ms a step with them (one rank with a spare core shows no cost), so only each call's
last step is split, over the call's exactly timed total (:mod:`hpclab.rank.compiled_call`; a
straggler run times every step); ``make bench`` compares telemetry on and off (benchmarks/README.md).

What a lesson adds to the step is a *feature* (:mod:`hpclab.rank.features`): the straggler,
batch weighting, SDC, model averaging (local SGD, hybrid, Crossbow), staleness. Each fills named
hook points (:mod:`hpclab.rank.features.hooks`); :func:`chosen` picks them once, when the step
is built, and the step calls the hooks of that list — no branch per feature per step.

Collectives matched on every rank
---------------------------------
Horovod completes a collective only when every rank has called it, and it matches a rank's
collective with the others' *by name* (an unnamed allreduce is named after its tensor, whose
name depends on every op built before it). Hence the rules, which this module enforces:

1. **The same graph on every rank.** The features are chosen from the config and the world size
   alone — :func:`chosen` takes no rank — so every rank builds the same ops in the same order.
   What differs by rank is a *value* inside that graph: the straggler waits 0 s elsewhere, the
   fault's mask is 0 elsewhere, a batch share may be 1. A rank never skips an op because its
   value makes it a no-op.
2. **One gradient exchange a step, the same kind everywhere:** Horovod's average over all ranks
   (synchronous SGD), or the one feature that replaces it (``replaces_allreduce``: model
   averaging); with one rank, none at all.
3. **A collective that runs on some steps only runs under a condition every rank computes
   alike** (the optimizer's step counter: local SGD's ``tf.cond``), never a rank's own data.
4. **The host's collectives follow decisions every rank shares** — the call's telemetry
   allreduce carries rank 0's stop/publish decisions, the detector's loss is the global batch's —
   so every rank calls the same per-call collectives after the same step (:mod:`.trainer`).
"""

from __future__ import annotations

import contextlib

from hpclab.core.catalog import is_user_model
from hpclab.core.devices import split_method
from hpclab.core.pop import STEP_PARTS
from hpclab.rank.features import averaging, clipping, sdc, staleness, straggler, weighting
from hpclab.rank.features.hooks import StepContext, Traced

#: The sums a step returns by name (entries of hpclab.rank.meters.REDUCED): the step-mean loss,
#: correct samples, and at the call's sampled step |G_small|², |G_big|² and the zero gradients.
SUMS = ("loss_sum", "correct", "small_sq", "big_sq", "grad_zeros")

#: The features a step may carry, in the order their hooks run at a shared point (the
#: straggler's wait comes before a gradient's flip; staleness after the exchange it delays).
#: Each is a module of hpclab.rank.features with ``in_run(cfg, world)`` and ``build(ctx)``.
FEATURES = (weighting, straggler, sdc, averaging, staleness, clipping)


def chosen(cfg, world: int) -> tuple[str, ...]:
    """The features run ``cfg`` gives its step on ``world`` ranks, by name: the same on every
    rank (no rank argument, by rule 1 of the module doc)."""
    return tuple(_name(f) for f in FEATURES if f.in_run(cfg, world))


def _name(feature_module) -> str:
    return feature_module.__name__.rsplit(".", 1)[-1]


class Stamp:
    """``stamp(tensors)``: a timestamp taken once every tensor exists (float64 seconds); a
    constant 0 when the time split is off (``method`` "off").

    ``method`` "device_sync" (hpclab.core.devices.split_method; a rank with a GPU): the stamp
    waits until the tensors' *values* are done, not only queued, by copying one element of
    each to the host first; a device runs its queue in order, so that copy ends after the
    work the tensors came from."""

    def __init__(self, tf, method: str):
        self.tf, self.method = tf, method
        self.on = method != "off"

    @contextlib.contextmanager
    def paused(self):
        """Steps traced inside take no timestamps (their stamps read 0): the compiled call's
        untimed steps (:mod:`hpclab.rank.compiled_call`)."""
        on, self.on = self.on, False
        try:
            yield
        finally:
            self.on = on

    def __call__(self, tensors):
        tf = self.tf
        if not self.on:
            return tf.constant(0.0, tf.float64)
        tensors = list(tensors)
        if self.method == "device_sync" and tensors:
            tensors = [self._on_host(tensors)]
        with tf.control_dependencies(tensors):
            return tf.timestamp()

    def _on_host(self, tensors):
        """One element of each tensor, gathered where they are and copied to the host."""
        tf = self.tf
        heads = []
        for t in tensors:
            t = t.values if isinstance(t, tf.IndexedSlices) else t
            heads.append(tf.cast(tf.reshape(t, [-1])[:1], tf.float32))
        head = tf.concat(heads, 0)
        with tf.device("/CPU:0"):
            return tf.identity(head)


class Step:
    """The traced arithmetic of one step on this rank; built once per run by the trainer.

    ``share``: this rank's share of the global batch (uneven batches); ``fault``: the run's
    planned bit flip (:class:`hpclab.rank.features.sdc.Fault`)."""

    def __init__(self, cfg, *, model, optimizer, world: int, rank: int, share=1.0, fault=None):
        import horovod.tensorflow as hvd
        import tensorflow as tf

        from hpclab.rank.keras2 import keras

        self.tf, self.hvd, self.cfg = tf, hvd, cfg
        self.model, self.optimizer, self.world = model, optimizer, world
        self.loss_scaled = cfg.precision == "mixed_float16" and cfg.loss_scaling
        self.compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        names = chosen(cfg, world)
        # time_split=False (make bench's "telemetry off"): no timestamps, the parts read 0;
        # a straggler run needs them to size its wait. On a GPU each split point syncs with the
        # device (time_sync "auto"; hpclab.core.devices.split_method says why).
        on = cfg.time_split or "straggler" in names
        gpu = bool(tf.config.list_logical_devices("GPU"))
        self.stamp = Stamp(tf, split_method(cfg.time_sync, gpu, on))
        # The straggler sizes its wait from every step's clock: its steps are all timed. Other
        # runs time each call's last step (compiled_call).
        self.every_step = "straggler" in names
        ctx = StepContext(
            cfg=cfg,
            model=model,
            optimizer=optimizer,
            world=world,
            rank=rank,
            share=share,
            fault=fault,
            allreduce=self._allreduce,
            stamp=self.stamp,
            loss_scaled=self.loss_scaled,
            tf=tf,
            hvd=hvd,
        )
        self.features = [f.build(ctx) for f in FEATURES if _name(f) in names]
        # The noise scale needs two batch sizes: with one rank there is only one, so skip the norms
        # (with uneven batches the small one is not one size; averaged models average no gradient)
        self.track_noise = (
            cfg.noise_scale and world > 1 and not cfg.batch_skew and "averaging" not in names
        )
        self.detect = cfg.spike_factor > 0  # the detector's loss rides in the exchange
        self.exchange = self._exchange_of_run()
        grads = (  # AutoGraph as for the call around it (hpclab.rank.compiled_call)
            tf.function(self._loss_and_grads, jit_compile=True, autograph=is_user_model(cfg.model))
            if cfg.xla
            else None
        )
        self.loss_and_grads = grads or self._loss_and_grads

    def _exchange_of_run(self):
        """Rule 2 of the module doc: the step's one gradient exchange."""
        replacing = [f for f in self.features if f.replaces_allreduce]
        if len(replacing) > 1:
            raise ValueError(f"two features replace the gradient allreduce: {replacing}")
        if replacing:
            return replacing[0].exchange
        return self._average_gradients if self.world > 1 else (lambda s: None)

    @property
    def state(self) -> list:
        """Variables of this step's own beyond the model and optimizer (a central model, a ring
        of stale gradients): broadcast at the start, saved and restored by a rollback."""
        return [v for f in self.features for v in f.state]

    def evaluated(self):
        """The weights held-out evaluation uses while the block runs: the central model under
        Crossbow (its own evaluation), else this rank's."""
        for f in self.features:
            if hasattr(f, "central"):
                return f.central()
        return contextlib.nullcontext()

    def central_weights(self) -> list:
        """Crossbow's central average model as NumPy arrays ([] for other runs)."""
        return [w for f in self.features for w in getattr(f, "central_weights", list)()]

    # -- the core step's parts ------------------------------------------------------------------
    def _loss_and_grads(self, x, y):
        """Forward and backward (XLA-compiled with ``xla=True``); loss-scaled under float16."""
        tf = self.tf
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model(x, training=True), tf.float32)
            loss = self.loss_fn(y, logits)
            target = self.optimizer.get_scaled_loss(loss) if self.loss_scaled else loss
        grads = tape.gradient(target, self.model.trainable_variables)
        pred = tf.argmax(logits, axis=-1, output_type=y.dtype)
        return loss, tf.reduce_sum(tf.cast(tf.equal(pred, y), tf.float32)), grads

    def _compute(self, x, y, flip):
        """Forward and backward; a fault in the forward pass (the call's last step) is traced
        uncompiled, inside the features' contexts."""
        faults = [c for f in self.features if (c := f.forward_fault(flip)) is not None]
        if not faults:
            return self.loss_and_grads(x, y)
        with contextlib.ExitStack() as stack:
            for context in faults:
                stack.enter_context(context)
            return self._loss_and_grads(x, y)

    def _allreduce(self, grads, ranks=None):
        """Horovod: average gradients over ranks (a process set: ``ranks``; all by default): one
        grouped (fused) op, or one per tensor so each can start while backprop still runs.
        Loss-scaled gradients cross scaled (float16 compression keeps their range) and are
        unscaled afterwards."""
        if self.cfg.skip_allreduce:  # a measuring device (knob skip_allreduce): replicas drift
            return list(grads)
        hvd = self.hvd
        over = dict(op=hvd.Average, compression=self.compression)
        if ranks is not None:
            over["process_set"] = ranks
        if self.cfg.grad_allreduce == "per_tensor":
            return [hvd.allreduce(g, **over) for g in grads]
        return hvd.grouped_allreduce(grads, **over)

    def _average_gradients(self, s: Traced) -> None:
        """Synchronous SGD's exchange. (Not held back until compute's end: per_tensor
        allreduces overlap the backward pass, and then only the part left after it — the
        exposed communication — counts as such.)"""
        if self.detect:  # the detector's loss, averaged with the gradients (one fused op)
            *s.grads, s.judged = self._allreduce([*s.grads, s.loss])
        else:
            s.grads = self._allreduce(s.grads)

    def _sq_norm(self, grads):
        tf = self.tf
        if self.loss_scaled:
            grads = self.optimizer.get_unscaled_gradients(grads)
        return tf.square(tf.linalg.global_norm(grads))

    def _zeros(self, grads):
        """Weight-gradient elements exactly 0 in this rank's gradient (scaled or not). Under
        ``mixed_float16`` a weight gradient is the float16 gradient cast to float32, so this
        counts the weight gradients' underflow to 0 together with zeros that are no underflow
        (ReLUs that pass nothing back); it sees none of the activation gradients (the float16
        tensors backprop carries between layers), where Micikevicius et al. 2018 ("Mixed
        Precision Training", ICLR, Fig. 3) find most of the underflow.
        ``hpclab.rank.probes.fp16_exponents`` counts both, against a float32 reference."""
        tf = self.tf
        return tf.add_n([tf.reduce_sum(tf.cast(tf.equal(g, 0), tf.float32)) for g in grads])

    def _apply(self, s: Traced):
        """The optimizer's update of the exchanged gradients; the timestamp after it."""
        tf = self.tf
        if self.loss_scaled:
            # Unscaled after the allreduce, not before: float16 compression keeps the range of
            # scaled values. The LossScaleOptimizer then skips a non-finite step and lowers its
            # scale (dynamic loss scaling, Micikevicius et al. 2018, arXiv:1710.03740).
            s.grads = self.optimizer.get_unscaled_gradients(s.grads)
        waits = [t for f in self.features for t in f.before_apply(s)]
        with tf.control_dependencies([s.exchange_end, *waits]):
            self.optimizer.apply_gradients(zip(s.grads, self.model.trainable_variables))
        # (apply_gradients returns a variable or None; a read of the step counter it increments
        # last is ordered after it: tf.function runs reads and writes of a variable in order)
        return self.stamp([self.optimizer.iterations.read_value()])

    def start(self):
        """The clock the call's first step starts from: ``[end of the previous exchange, end
        of the previous step]``, both now (the first step's ``loop`` part counts from it)."""
        t = self.stamp([])
        return self.tf.stack([t, t])

    # -- one step --------------------------------------------------------------------------------
    def _input(self, batch, t_prev):
        """The batch, stamped before and after it is cut: ``(x, y, t_loop_end, t_input_end)``."""
        tf = self.tf
        t0 = self.stamp([t_prev])
        with tf.control_dependencies([t0] if self.stamp.on else []):
            x, y = batch()
        t1 = self.stamp([x, y])
        if self.stamp.on:  # the forward pass waits for t1: the executor may run ready ops in any
            # order, and an unpinned t1 can be taken late, after the forward pass began
            with tf.control_dependencies([t1]):
                x, y = tf.identity(x), tf.identity(y)
        return x, y, t0, t1

    def __call__(self, batch, clock, sample=False, flip=None):
        """One step on ``batch()`` (a function cutting the batch, timed as input); ``clock`` is
        the previous step's ``[exchange end, end]`` (or :meth:`start`): the gap to its end is
        the ``loop`` part; the straggler sizes its extra work from its exchange end.

        Returns the step's :data:`SUMS` by name (the norms and zeros 0 unless ``sample``), this rank's seconds of each part of
        :data:`STEP_PARTS` by name, the new clock and the loss the spike detector judges (the
        global batch's with the detector on). ``sample`` is a Python flag: the call's last step
        is traced apart with it, so no step pays a ``tf.cond``; it alone takes ``flip``, the
        fault's XOR mask (0: none)."""
        tf, hooks = self.tf, self.features
        s = Traced(clock=clock, flip=flip)
        x, y, t0, t1 = self._input(batch, clock[1])
        s.loss, s.correct, s.grads = self._compute(x, y, flip)
        for f in hooks:
            f.after_backward(s)
        s.compute_end = self.stamp([s.loss, s.correct, *s.grads])
        for f in hooks:
            f.before_allreduce(s)
        zero = tf.constant(0.0)
        zeros = self._zeros(s.grads) if sample else zero  # in this rank's own gradient
        small = self._sq_norm(s.grads) if sample and self.track_noise else zero  # before exchange
        s.judged = s.loss
        self.exchange(s)
        s.exchange_end = t3 = self.stamp(s.grads)
        big = self._sq_norm(s.grads) if sample and self.track_noise else zero  # after it
        for f in hooks:
            f.after_allreduce(s)
        s.update_end = t4 = self._apply(s)
        for f in hooks:
            f.after_apply(s)
        comm = t3 - s.compute_end
        if s.exchanged_after_update is not None:
            comm += s.exchanged_after_update
        seconds = {
            "loop": t0 - clock[1],
            "input": t1 - t0,
            "compute": s.compute_end - t1,
            "allreduce": comm,
            "apply": t4 - t3,
        }
        times = {part: tf.cast(seconds[part], tf.float32) for part in STEP_PARTS}
        sums = {
            "loss_sum": s.loss,
            "correct": s.correct,
            "small_sq": small,
            "big_sq": big,
            "grad_zeros": zeros,
        }
        end = s.update_end if s.exchanged_after_update is None else s.exchange_end
        return sums, times, tf.stack([s.exchange_end, end]), s.judged


__all__ = ["FEATURES", "SUMS", "Stamp", "Step", "chosen"]
