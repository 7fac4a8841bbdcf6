"""The compiled call: a tensor number of optimizer steps in one ``tf.while_loop``, and the
collectives of a call's telemetry.

Per-call Python overhead, not arithmetic, dominates the lab's small models, so
one ``tf.function`` runs many steps of :class:`hpclab.rank.step.Step` over batches cut inside
the graph from the rank's resident shard (:mod:`hpclab.rank.feed`). Its signature is fixed, so it
is traced once per run, whatever the call's step count or epoch; the call's last step is traced
apart and samples the gradients (norms, zeros) and carries the fault's flip. The call ends with
one small allreduce of :data:`hpclab.rank.meters.REDUCED` (rank 0's decisions ride in it); on
publish calls the host gathers every rank's own timings (:meth:`CompiledCall.gather_detail`).
"""

from __future__ import annotations

import contextlib

from hpclab.core.catalog import is_user_model
from hpclab.core.pop import STEP_PARTS
from hpclab.rank.meters import DECISIONS, REDUCED
from hpclab.rank.step import SUMS

#: Only the call's last step is split into parts (hpclab.rank.step), its split stretched over the
#: call's total: five timestamps a step cost ~5 % of a small model's step on two shared cores,
#: so the loop's steps take none and only their total time is stamped; the last step is traced
#: apart anyway (it samples the gradients), so this adds no trace. A straggler run times every
#: step: its wait is sized from each step's clock.


class CompiledCall:
    """``function(epoch, start, steps, decisions, guard, flip)`` → the call's reduced telemetry,
    this rank's seconds of each part of :data:`hpclab.core.pop.STEP_PARTS` and the spike
    detector's state out.

    ``step``: the run's :class:`~hpclab.rank.step.Step`; ``source``: the training input
    (:mod:`hpclab.rank.feed`); ``watch``: the SDC watch (its detector runs in the graph)."""

    def __init__(self, step, source, watch, *, local_batch: int, grad_elems: float, world: int):
        import horovod.tensorflow as hvd
        import tensorflow as tf

        self.tf, self.hvd, self.world = tf, hvd, world
        self.step, self.source, self.watch = step, source, watch
        self.local_batch, self.grad_elems = local_batch, grad_elems
        scalar = tf.TensorSpec([], tf.int32)
        signature = [
            scalar,
            scalar,
            scalar,
            tf.TensorSpec([len(DECISIONS)], tf.float64),
            tf.TensorSpec([3], tf.float32),
            scalar,
        ]
        # AutoGraph off: the call and the step spell their control flow in TensorFlow's own ops
        # (while_loop, cond), so there is nothing to convert, and converting costs every fresh
        # engine's first run seconds (AutoGraph transpiles the step's and every Keras layer's
        # Python source once per process: 6.5 of a first trace's 7.2 s on one rank, 0.7 s
        # after). A model of the user's own may rely on it (Python `if` on a tensor in a
        # layer's call), so with one AutoGraph stays on.
        self.function = tf.function(
            self._call, input_signature=signature, autograph=is_user_model(step.cfg.model)
        )
        # stamp_pairs (make bench): every other call runs a twin traced without any timestamp,
        # so the stamps' cost is read from adjacent calls of one run (the load drifts slowly)
        paired = step.cfg.stamp_pairs and step.stamp.on and not step.every_step
        # (traced without AutoGraph whatever the model: AutoGraph's conversion of the step's
        # methods under the pausing `with` dropped their `self`)
        self.untimed = (
            tf.function(self._untimed, input_signature=signature, autograph=False)
            if paired
            else None
        )
        self.calls, self.pairs, self._timed = 0, [], None

    def next_function(self):
        """The function the next call runs: the timed one, or every other call its untimed twin."""
        self.calls += 1
        return self.untimed if self.untimed is not None and self.calls % 2 == 0 else self.function

    def took(self, steps: int, seconds: float) -> None:
        """The call just run: with ``stamp_pairs``, a (timed, untimed) pair of seconds per step
        is recorded each untimed call (:attr:`pairs`)."""
        if self.untimed is None or steps <= 0:
            return
        if self.calls % 2:
            self._timed = seconds / steps
        elif self._timed is not None:
            self.pairs.append((self._timed, seconds / steps))
            self._timed = None

    def _untimed(self, *args):
        with self.step.stamp.paused():
            return self._call(*args)

    def _call(self, epoch, start, steps, decided, guard, flip):
        """``steps`` optimizer steps from step ``start`` of ``epoch``; the reduced telemetry, this
        rank's time split (by part) and the spike detector's ``guard`` state (``flip``: the
        fault's mask)."""
        tf, source, check, stamp = self.tf, self.source, self.watch.check, self.step.stamp
        order = source.order(epoch)
        last = steps - 1  # (steps >= 1: the last step, traced apart, samples the gradients)

        def batch(i):  # the step's input: cut (and augmented) when the step runs
            return lambda: source.batch_at(order, start + i, epoch)

        def body(i, sums, times, clock, guard):
            out, took, clock, loss = self.step(batch(i), clock)
            return i + 1, _add(sums, out), _add(times, took), clock, check(tf, guard, loss, i)

        init = (tf.constant(0), self._zeros(SUMS), self._zeros(STEP_PARTS), self.step.start())
        sampled = stamp.on and not self.step.every_step
        with stamp.paused() if sampled else contextlib.nullcontext():
            _, sums, times, clock, guard = tf.while_loop(
                lambda i, *_: i < last, body, (*init, guard), parallel_iterations=1
            )
        if sampled:  # the loop's steps untimed, their total stamped (the While op's outputs:
            begun = stamp([*sums.values(), guard])  # after all its steps)
            untimed = tf.cast(begun - init[3][1], tf.float32)
            clock, times = tf.stack([begun, begun]), init[2]  # (the loop's parts read nothing)
        flip = flip if self.watch.in_call else None
        out, took, _, loss = self.step(batch(last), clock, sample=True, flip=flip)
        sums, times, guard = _add(sums, out), _add(times, took), check(tf, guard, loss, last)
        if sampled:  # the last step's split, stretched over the call's exactly timed total
            timed = tf.add_n(list(times.values()))
            scale = tf.math.divide_no_nan(timed + untimed, timed)
            times = {part: t * scale for part, t in times.items()}
        return self._reduce(sums, steps, decided), times, guard  # the times: this rank's own

    def _zeros(self, names) -> dict:
        return {name: self.tf.constant(0.0) for name in names}

    def _reduce(self, sums, steps, decided):
        """The call's :data:`~hpclab.rank.meters.REDUCED` vector: this rank's share, summed
        over ranks with rank 0's ``decided`` decisions (the other ranks pass zeros)."""
        tf = self.tf
        decided = tf.cast(decided, tf.float32)
        entries = {  # this rank's share of meters.REDUCED, by name
            **sums,  # the step's SUMS: loss_sum, correct, small_sq, big_sq, grad_zeros
            "count": tf.cast(steps * self.local_batch, tf.float32),
            "noise_samples": tf.constant(1.0 if self.step.track_noise else 0.0),
            "grad_elems": tf.constant(self.grad_elems, tf.float32),
            "nonfinite": 1.0 - tf.cast(tf.math.is_finite(sums["loss_sum"]), tf.float32),
            **{name: decided[i] for i, name in enumerate(DECISIONS)},
        }
        mine = tf.stack([entries[name] for name in REDUCED])
        if self.world > 1:
            # Horovod: one small allreduce a call: every rank learns the sums and rank 0's decisions.
            mine = self.hvd.allreduce(mine, op=self.hvd.Sum, name="hpclab_telemetry")
        return mine

    def gather_detail(self, mine):
        """Horovod: every rank's own timings, on publish calls only (O(world) twice a second)."""
        tf = self.tf
        vec = tf.constant(mine[None, :], dtype=tf.float64)
        if self.world == 1:
            return vec.numpy()
        return self.hvd.allgather(vec, name="hpclab_detail").numpy()


def _add(a: dict, b: dict) -> dict:
    """Running sums by name."""
    return {name: a[name] + b[name] for name in a}


__all__ = ["CompiledCall"]
