"""Where the engine's step differs from a bare in-graph loop's, measured as paired calls in one
process (issue 31: the engine / in-graph loop ratio of ``make bench``).

Whole runs of a few seconds on two shared cores move ±20 % from run to run, so a 5-10 % gap
between two ways of training cannot be read from separate runs. Here every arm lives in the same
rank process, over the same resident data, and the arms take turns: one call of ``steps`` steps
each, in an order that rotates every round, for ``rounds`` rounds. A drift of the machine falls
on every arm of a round alike, so each round gives one ratio per arm against the bare loop, and
the median over rounds with its order-statistic interval (:func:`median_interval`) resolves a
few per cent where whole runs cannot.

The arms (each call: ``steps`` optimizer steps in one ``tf.while_loop``):

* ``bare``: the ceiling arm of ``make bench`` (``benchmarks/plain_horovod_loop.py --input
  resident``): batches gathered in the graph from the resident shard by a per-epoch
  permutation, loss, ``hvd.DistributedGradientTape``, ``SGD(momentum=0.9)`` at a constant
  rate, nothing else;
* ``engine``: the lab's own compiled call (:class:`hpclab.rank.compiled_call.CompiledCall`) of a
  :class:`hpclab.rank.trainer.Trainer` set up from ``cfg`` as a run would be: the step's sums
  (loss, correct predictions), the spike detector's state (the detector itself is off by
  default), the LR as a function of the step, the call's telemetry allreduce (with 2+ ranks),
  and the time split on its last step;
* ``untimed``: the same call's twin traced without any timestamp (``stamp_pairs``);
* ``lean``: a second trainer with the time split and the noise scale off (what remains is the
  step's bookkeeping that no knob turns off);
* ``bare_kept``: the bare loop plus that bookkeeping's arithmetic: the LR as a function of the
  step (:class:`hpclab.rank.optimizers.StepSchedule`) and, carried through the loop, the running
  loss and the count of correct predictions (an argmax a step) that the engine's rows report.

Run through ``lab.apply`` on every rank (the calls are collectives when ``world > 1``);
``benchmarks/step_anatomy.py`` drives it and prints the table.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

ARMS = ("bare", "engine", "untimed", "lean", "bare_kept")


def median_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high) of ``values`` with a distribution-free interval for the median: the
    order statistics whose ranks the binomial(n, 1/2) puts ``level`` between (Conover 1999,
    *Practical Nonparametric Statistics*, §3.2), by the normal approximation (n ≥ 20)."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n < 20:
        raise ValueError(f"median_interval needs at least 20 values for its interval; got {n}")
    z = {0.95: 1.959964, 0.99: 2.575829}[level]
    half = z * np.sqrt(n) / 2
    lo = max(0, int(np.floor(n / 2 - half)))
    hi = min(n - 1, int(np.ceil(n / 2 + half)))
    return float(np.median(x)), float(x[lo]), float(x[hi])


def _bare_call(cfg, plan, arrays, rank: int, world: int, kept: bool = False):
    """plain_horovod_loop.py's resident arm, on the same shard: a function running k steps;
    ``kept``: with the engine's LR schedule and running loss / correct sums."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hpclab.rank import data, models, optimizers
    from hpclab.rank.keras2 import keras

    x, y = data.shard(arrays.x_train, arrays.y_train, rank, world)
    B = plan.local_batches[rank]
    xs, ys = tf.constant(x), tf.constant(y)
    n_used = plan.steps_per_epoch * B
    perm = tf.Variable(tf.random.shuffle(tf.range(tf.shape(xs)[0]))[:n_used], trainable=False)
    position = tf.Variable(0, dtype=tf.int32, trainable=False)
    model = models.build_model(cfg.model, arrays.input_shape, arrays.num_classes, cfg.seed)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    lr = optimizers.StepSchedule(**plan.lr_params()) if kept else plan.peak_lr
    opt = keras.optimizers.SGD(lr, momentum=0.9)

    def step():
        at = position % plan.steps_per_epoch
        ids = perm[at * B : (at + 1) * B]
        position.assign_add(1)
        labels = tf.gather(ys, ids)
        with tf.GradientTape() as tape:
            logits = model(tf.gather(xs, ids), training=True)
            loss = loss_fn(labels, logits)
        tape = hvd.DistributedGradientTape(tape, num_groups=1)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if not kept:
            return loss, tf.constant(0.0)
        pred = tf.argmax(logits, axis=-1, output_type=labels.dtype)
        return loss, tf.reduce_sum(tf.cast(tf.equal(pred, labels), tf.float32))

    @tf.function
    def steps(k):
        loss_sum, correct = tf.constant(0.0), tf.constant(0.0)
        for _ in tf.range(k):
            loss, right = step()
            loss_sum, correct = loss_sum + loss, correct + right
        return loss_sum, correct

    return lambda k, _step: [t.numpy() for t in steps(tf.constant(k))]


def _engine_calls(cfg, plan, run_dir: Path, data_dir: str):
    """A set-up Trainer's timed call and its untimed twin: functions running k steps."""
    from hpclab.rank.meters import decisions
    from hpclab.rank.trainer import Trainer

    trainer = Trainer(cfg.to_dict(), plan.to_dict(), run_dir, Path(data_dir))
    trainer.setup()
    decided = decisions()

    def timed(k, step):  # (CompiledCall.next_function picks by the parity of its call count)
        trainer.call.calls = 0  # next_function(): odd calls run the timed function
        trainer._call(step, k, decided)

    def untimed(k, step):
        trainer.call.calls = 1  # even calls run the untimed twin
        trainer._call(step, k, decided)

    return timed, untimed, trainer.steps_per_epoch


def anatomy(cfg_dict: dict, run_dir: str, data_dir: str, steps: int, rounds: int) -> dict:
    """On every rank: seconds per step of each arm, one call each per round (rotating order).
    The calls of all ranks match: the same arms in the same order, ``steps`` steps each."""
    import horovod.tensorflow as hvd

    from hpclab.core.config import RunConfig
    from hpclab.rank import data

    rank, world = hvd.rank(), hvd.size()
    cfg = RunConfig.from_dict(cfg_dict).replace(stamp_pairs=True, time_split=True)
    lean_cfg = cfg.replace(stamp_pairs=False, time_split=False, noise_scale=False)
    plan = cfg.for_workers(world)
    arrays = data.load_arrays(cfg.to_dict(), data_dir)
    run_dir = Path(run_dir) / f"anatomy-rank{rank}"
    engine, untimed, per_epoch = _engine_calls(cfg, plan, run_dir / "engine", data_dir)
    lean, _, _ = _engine_calls(lean_cfg, lean_cfg.for_workers(world), run_dir / "lean", data_dir)
    bare = _bare_call(cfg, plan, arrays, rank, world)
    kept = _bare_call(cfg, plan, arrays, rank, world, kept=True)
    calls = {"bare": bare, "engine": engine, "untimed": untimed, "lean": lean, "bare_kept": kept}
    if steps > per_epoch:
        raise ValueError(f"steps={steps} is more than an epoch ({per_epoch} steps)")
    for arm in ARMS:  # trace and warm every arm, unmeasured
        for _ in range(3):
            calls[arm](steps, 0)
    seconds = {arm: [] for arm in ARMS}
    for r in range(rounds):
        start = (r * steps) % (per_epoch - steps + 1)  # a fresh stretch of the epoch
        k = r % len(ARMS)
        for arm in ARMS[k:] + ARMS[:k]:
            t0 = time.perf_counter()
            calls[arm](steps, start)
            seconds[arm].append((time.perf_counter() - t0) / steps)
    return {"rank": rank, "world": world, "steps": steps, "seconds_per_step": seconds}


__all__ = ["ARMS", "anatomy", "median_interval"]
