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


def forward_backward_seconds(
    cfg: dict, data_dir: str, local_batch: int, active: list[int], repeats: int = 30
) -> dict:
    """On every rank at once: the median seconds of one compiled forward and backward pass of
    the run's model on ``local_batch`` random inputs, on the ranks in ``active`` (the others
    wait at the barriers only); one barrier before and one after, so active ranks overlap."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hpclab.rank import data, models

    arrays = data.load_arrays(cfg, data_dir)
    model = models.build_model(cfg["model"], arrays.input_shape, arrays.num_classes, cfg["seed"])
    x = tf.random.uniform((int(local_batch), *arrays.input_shape), seed=cfg["seed"])
    y = tf.zeros((int(local_batch),), tf.int32)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    took = []
    mine = hvd.rank() in active
    if mine:
        for _ in range(3):  # trace and warm up, unmeasured
            step()
    # Horovod: a one-number allreduce as a barrier, so the active ranks start together
    hvd.allreduce(tf.constant(0.0), name="hpclab_compute_share_start").numpy()
    if mine:
        for _ in range(repeats):
            t0 = time.perf_counter()
            grads = step()
            grads[-1].numpy()  # wait for the result
            took.append(time.perf_counter() - t0)
    hvd.allreduce(tf.constant(0.0), name="hpclab_compute_share_end").numpy()
    return {
        "rank": hvd.rank(),
        "active": mine,
        "local_batch": int(local_batch),
        "seconds": float(np.median(took)) if took else None,
    }
