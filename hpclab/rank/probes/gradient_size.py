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

#: One message cut into this many tensors (16 KiB in all): a grouped allreduce's cost per
#: tensor (Horovod negotiates and copies each; TensorFlow runs the average per tensor).
TENSOR_COUNTS = (1, 2, 4, 16, 32)
SPLIT_BYTES = 16384


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


def compiled_allreduce_sweep(
    sizes_bytes: list[int], cfg: dict | None = None, data_dir: str = "", repeats: int = 15
) -> dict:
    """On every rank at once: the median seconds of a float32 tensor of each size averaged the
    way a training step averages its gradients (one grouped allreduce in a compiled function) —
    the sizes the planner fits α and β to — and, with ``cfg``, of the model's own gradient
    tensors, held out of that fit. The calls take turns in every round (one of each size, then
    the gradients), so a busy spell of the machine lands on all of them alike. Two rounds warm
    up unmeasured. (``hpclab.rank.probes.collectives`` times eager allreduces, which skip the
    compiled call's hand-over between TensorFlow's executor and Horovod's background loop.)"""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    def compiled(tensors, name):
        @tf.function
        def allreduce():
            # Horovod: as hpclab.rank.step averages gradients (grouped, averaged)
            return hvd.grouped_allreduce(tensors, op=hvd.Average, name=name)

        return allreduce

    calls = {
        int(s): compiled([tf.ones([max(int(s) // 4, 1)], tf.float32)], f"hpclab_planner_{s}")
        for s in sizes_bytes
    }
    for k in TENSOR_COUNTS:  # one size cut into k tensors: what each tensor adds
        parts = [tf.ones([SPLIT_BYTES // 4 // k], tf.float32) for _ in range(k)]
        calls[f"tensors_{k}"] = compiled(parts, f"hpclab_planner_tensors_{k}")
    if cfg is not None:
        grads = [tf.ones(v.shape, tf.float32) for v in _model(cfg, data_dir).trainable_variables]
        calls["gradients"] = compiled(grads, "hpclab_planner_gradients")
    settle = compiled([tf.ones([256], tf.float32)], "hpclab_planner_settle")
    took: dict = {key: [] for key in calls}
    for i in range(2 + repeats):
        for key, call in calls.items():
            settle()[-1].numpy()  # unmeasured: the call after a large one runs slow
            t0 = time.perf_counter()
            call()[-1].numpy()  # wait for the result
            if i >= 2:
                took[key].append(time.perf_counter() - t0)
    return {
        "rank": hvd.rank(),
        "ranks": hvd.size(),
        "sizes": [
            {"bytes": k, "seconds": float(np.median(v))}
            for k, v in took.items()
            if isinstance(k, int)
        ],
        "tensors": [
            {"tensors": k, "bytes": SPLIT_BYTES, "seconds": float(np.median(took[f"tensors_{k}"]))}
            for k in TENSOR_COUNTS
        ],
        "gradients": float(np.median(took["gradients"])) if cfg is not None else None,
    }
