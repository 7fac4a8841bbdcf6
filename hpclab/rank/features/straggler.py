"""A straggler on purpose: one rank slower at all its useful work (``RunConfig.straggler_*``).

The way a throttled GPU, a noisy neighbour or a slower node does: after its backward pass the
rank ``straggler_rank`` waits ``factor × (its useful time since its previous exchange: the
update, loop, input, forward/backward) + ms``, so all its useful work takes
``1/(1 - slowdown)`` as long (:func:`hpclab.core.pop.straggler_factor`). The host sleeps, as it
would while a slower device computes (:func:`_straggle`); every rank of a straggler run enters
that function (the others return at once), and the wait is sized inside it, so the 0.1-0.4 ms
it takes to get there is slowed too (every rank pays it, so the straggler must be slower at it
as well), and it ends on a deadline however late the sleep wakes up. Every
other rank then waits in the allreduce, and :mod:`hpclab.core.pop` shows it as lower load
balance. The wait counts as the step's ``compute`` part.
"""

from __future__ import annotations

import time

from hpclab.core.pop import straggler_factor
from hpclab.rank.features.hooks import Feature, Traced


def in_run(cfg, world: int) -> bool:
    """Whether run ``cfg`` on ``world`` ranks has a straggler (every rank answers alike)."""
    return 0 <= cfg.straggler_rank < world and world > 1


class Straggler(Feature):
    """The wait after the backward pass: sized on the straggler, 0 s on every other rank.

    Every rank of a straggler run builds this same ``py_function``: Horovod matches collectives
    across ranks by name, and an op on one rank only would rename its allreduces."""

    def __init__(self, cfg, rank: int, tf, stamp):
        slow = rank == cfg.straggler_rank
        self.factor = straggler_factor(cfg.straggler_slowdown) if slow else 0.0
        self.extra_s = cfg.straggler_ms / 1000.0 if slow else 0.0
        self.tf, self.stamp = tf, stamp

    def before_allreduce(self, s: Traced) -> None:
        """Slower at all it did since its last exchange: the wait ends ``compute``; the
        gradients are released after it."""
        tf, since = self.tf, s.clock[0]
        with tf.control_dependencies(s.grads):
            waited = tf.py_function(_straggle, [since, self.factor, self.extra_s], tf.float64)
        with tf.control_dependencies([waited]):
            s.grads = [tf.identity(g) for g in s.grads]
        s.compute_end = self.stamp(s.grads)


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
    spun (a sleep would overshoot the deadline by the lateness). The estimate moves halfway up to a later wake-up at
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


def build(ctx) -> Straggler:
    return Straggler(ctx.cfg, ctx.rank, ctx.tf, ctx.stamp)


__all__ = ["build", "Straggler", "in_run"]
