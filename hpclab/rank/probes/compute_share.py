"""How much slower a rank computes when its neighbours compute too: POP's computation
scalability, measured without any communication.

Ranks that share a machine share its cores, caches and memory bandwidth (and on this lab's
2-core host, every rank's Horovod background loop busy-polls): a forward/backward pass takes
longer when every rank runs one at the same moment than when one rank runs alone. The planner's
hardware model (:mod:`hpclab.core.hardware_model`, ``compute_slowdown``) takes the ratio of the
two from this probe, never from the training runs it is checked against. Run through
``lab.apply`` (:mod:`hpclab.studies.planner`).
"""

from __future__ import annotations

import time

import numpy as np

PASS_SAMPLES = 4096  # samples one compiled call passes forward and backward (≥ 4 passes)


def forward_backward_seconds(
    cfg: dict, data_dir: str, local_batch: int, active: list[int], repeats: int = 7
) -> dict:
    """On every rank at once: the seconds of one forward and backward pass of the run's model on
    ``local_batch`` random inputs, on the ranks in ``active`` (the others wait at the barriers
    only). Many passes run inside one compiled call (as a training step's compiled loop runs
    them), so the call's dispatch stays out; the median of ``repeats`` calls, per pass. One
    barrier before and one after, so the active ranks overlap."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hpclab.rank import data, models
    from hpclab.rank.keras2 import keras

    arrays = data.load_arrays(cfg, data_dir)
    model = models.build_model(cfg["model"], arrays.input_shape, arrays.num_classes, cfg["seed"])
    x = tf.random.uniform((int(local_batch), *arrays.input_shape), seed=cfg["seed"])
    y = tf.zeros((int(local_batch),), tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    passes = max(4, PASS_SAMPLES // int(local_batch))

    @tf.function
    def many():
        total = tf.constant(0.0)
        for _ in tf.range(passes):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            total += tf.reduce_sum(grads[-1])
        return total

    took = []
    mine = hvd.rank() in active
    if mine:
        many().numpy()  # trace and warm up, unmeasured
    # Horovod: a one-number allreduce as a barrier, so the active ranks start together
    hvd.allreduce(tf.constant(0.0), name="hpclab_compute_share_start").numpy()
    if mine:
        for _ in range(repeats):
            t0 = time.perf_counter()
            many().numpy()  # wait for the result
            took.append((time.perf_counter() - t0) / passes)
    hvd.allreduce(tf.constant(0.0), name="hpclab_compute_share_end").numpy()
    return {
        "rank": hvd.rank(),
        "active": mine,
        "local_batch": int(local_batch),
        "seconds": float(np.median(took)) if took else None,
    }
