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


def allreduce_times(
    cfg: dict, data_dir: str, sizes_bytes: list[int], rounds: int = 21, warmup: int = 3
) -> dict:
    """On every rank at once: the allreduce the planner fits α and β to and, held out of that
    fit, the allreduce a training step does — each averaged the way ``hpclab.rank.step``
    averages gradients (one grouped allreduce in a compiled function).

    The fit's sizes (``sizes_bytes``) are each cut into tensors in the proportions of the model's
    gradients: Horovod negotiates and copies each tensor of a group and TensorFlow averages each
    apart, so a group of k tensors costs more than one tensor of the same bytes (here ~0.2 ms
    for the default model's 8 against one, 2 ranks) — a cost every step pays, so the fitted α
    carries it. The held-out call is the model's own gradient shapes (uneven sizes, not fitted).

    Every call is timed once per round, the sizes and the gradients in turn, each after an
    unmeasured small one (the call after a 4 MiB one runs slow): a shared machine's load drifts
    over seconds, and timed one block after another the sweep and the held-out call would see
    different machines. Medians over ``rounds`` rounds after ``warmup`` unmeasured ones, less
    the median of the same compiled call without the allreduce (its dispatch from Python, which
    a training step pays once whatever the ranks, and the planner's 1-rank time split holds).
    (``hpclab.rank.probes.collectives`` times eager allreduces, which skip the compiled call's
    hand-over between TensorFlow's executor and Horovod's background loop.)"""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    def compiled(tensors, name):
        @tf.function
        def allreduce():
            # Horovod: as hpclab.rank.step averages gradients (grouped, averaged)
            return hvd.grouped_allreduce(tensors, op=hvd.Average, name=name)

        @tf.function
        def dispatch():  # the same call without the allreduce
            return [tf.identity(t) for t in tensors]

        return allreduce, dispatch

    model = _model(cfg, data_dir)
    grads = [tf.ones(v.shape, tf.float32) for v in model.trainable_variables]
    counts = [int(np.prod(v.shape)) for v in model.trainable_variables]
    calls = {"gradients": compiled(grads, "hpclab_planner_grads")}
    cuts = {}
    for size in sizes_bytes:
        cuts[int(size)] = [max(round(int(size) / 4 * c / sum(counts)), 1) for c in counts]
        parts = [tf.ones([c], tf.float32) for c in cuts[int(size)]]
        calls[int(size)] = compiled(parts, f"hpclab_planner_{int(size)}")
    settle = compiled([tf.ones([256], tf.float32)], "hpclab_planner_settle")
    took: dict = {key: ([], []) for key in calls}
    for i in range(warmup + rounds):
        for key, pair in calls.items():
            for call, times in zip(pair, took[key], strict=True):
                settle[0]()[-1].numpy()
                t0 = time.perf_counter()
                call()[-1].numpy()  # wait for the result
                if i >= warmup:
                    times.append(time.perf_counter() - t0)

    def seconds(key) -> float:
        allreduce, dispatch = (float(np.median(t)) for t in took[key])
        return max(allreduce - dispatch, 1e-7)

    return {
        "rank": hvd.rank(),
        "ranks": hvd.size(),
        "gradients": {
            "bytes": 4 * sum(counts),
            "tensors": len(counts),
            "seconds": seconds("gradients"),
        },
        "sweep": [
            {
                "bytes": 4 * sum(cuts[int(size)]),
                "tensors": len(counts),
                "seconds": seconds(int(size)),
            }
            for size in sizes_bytes
        ],
    }
