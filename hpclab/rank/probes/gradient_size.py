"""What the gradient allreduce of a run's model moves, and what it costs here.

The allocation planner's communication model (:mod:`hpclab.core.hardware_model`) needs the
bytes one step's allreduce carries — the model's trainable parameters, 4 bytes each in float32
(2 with ``fp16_allreduce``) — and its held-out check needs that allreduce timed on these ranks:
one grouped allreduce of tensors shaped like the model's gradients, which Horovod packs into its
fusion buffer as a training step's grouped allreduce does (``grad_allreduce="grouped"``).
Run through ``lab.apply`` (:mod:`hpclab.studies.planner`).
"""

from __future__ import annotations

import time

import numpy as np


def _model(cfg: dict, data_dir: str):
    from hpclab.rank import data, models

    arrays = data.load_arrays(cfg, data_dir)
    return models.build_model(cfg["model"], arrays.input_shape, arrays.num_classes, cfg["seed"])


def gradient_layout(cfg: dict, data_dir: str) -> dict:
    """On a rank: the model's trainable tensors and the bytes their gradients' allreduce moves
    (``cfg`` is ``RunConfig.to_dict()``)."""
    model = _model(cfg, data_dir)
    counts = [int(np.prod(v.shape)) for v in model.trainable_variables]
    per_value = 2 if cfg.get("fp16_allreduce") else 4
    return {
        "model": cfg["model"],
        "tensors": len(counts),
        "parameters": sum(counts),
        "bytes": per_value * sum(counts),
    }


def gradient_allreduce_times(cfg: dict, data_dir: str, repeats: int = 30, warmup: int = 3) -> dict:
    """On every rank at once: ``repeats`` timings (seconds) of the allreduce a training step
    does — one grouped, averaging allreduce of tensors shaped like the model's gradients, in a
    compiled function (``hpclab.rank.step``) — after ``warmup`` unmeasured ones, and their
    median."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    model = _model(cfg, data_dir)
    grads = [tf.ones(v.shape, tf.float32) for v in model.trainable_variables]

    @tf.function
    def allreduce():
        # Horovod: the step's own call (hpclab.rank.step: grouped, averaged)
        return hvd.grouped_allreduce(grads, op=hvd.Average, name="hpclab_planner_grads")

    took = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        allreduce()[-1].numpy()  # wait for the result
        if i >= warmup:
            took.append(time.perf_counter() - t0)
    return {
        "rank": hvd.rank(),
        "ranks": hvd.size(),
        "bytes": 4 * sum(int(np.prod(v.shape)) for v in model.trainable_variables),
        "tensors": len(grads),
        "seconds": float(np.median(took)),
        "all_seconds": [float(s) for s in took],
    }


def compiled_allreduce_sweep(sizes_bytes: list[int], repeats: int = 15, warmup: int = 3) -> list:
    """On every rank at once: for each size, the median seconds of a float32 tensor of that many
    bytes averaged the way a training step averages its gradients (one grouped allreduce in a
    compiled function), after ``warmup`` unmeasured calls — the sizes the planner fits α and β
    to. (``hpclab.rank.probes.collectives`` times eager allreduces, which skip the compiled
    call's hand-over between TensorFlow's executor and Horovod's background loop.)"""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    rows = []
    for size in sizes_bytes:
        x = [tf.ones([max(int(size) // 4, 1)], tf.float32)]

        @tf.function
        def allreduce(x=x, size=size):
            # Horovod: as hpclab.rank.step averages gradients (grouped, averaged)
            return hvd.grouped_allreduce(x, op=hvd.Average, name=f"hpclab_planner_{size}")

        took = []
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            allreduce()[-1].numpy()
            if i >= warmup:
                took.append(time.perf_counter() - t0)
        rows.append(
            {
                "rank": hvd.rank(),
                "ranks": hvd.size(),
                "bytes": int(size),
                "seconds": float(np.median(took)),
            }
        )
    return rows
