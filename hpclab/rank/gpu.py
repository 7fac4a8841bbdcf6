"""Pin this rank's GPU and say which one it is (the rank side of hpclab.core.devices).

`hpclab.rank.engine.init_worker` calls :func:`pin_gpu` once, after ``hvd.init()`` and before any
TensorFlow op: TensorFlow fixes its visible devices at the first op (TensorFlow's
``tf.config.set_visible_devices`` docs), and Horovod's examples pin ``gpus[hvd.local_rank()]``
the same way. What it returns goes into the rank's identity (``lab.ranks`` and
``config.json``): the GPU's node index, UUID and name, or nothing on CPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from hpclab.core.devices import gpu_identity, gpu_memory_limit, local_rank_of, parse_smi, pick_gpu


def _smi_rows() -> list[dict]:
    """nvidia-smi's index/uuid/name rows ([] without nvidia-smi or a driver)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,uuid,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_smi(out.stdout) if out.returncode == 0 else []


def pin_gpu(tf, hvd) -> dict:
    """Make one GPU visible to this rank (memory growth on, or the ``HPCLAB_GPU_MEMORY_MIB``
    cap: hpclab.core.devices.gpu_memory_limit), and describe it.

    Returns ``gpus`` (how many GPUs this rank saw), ``gpu`` ({"index", "uuid", "name"}; {} on
    CPU), ``gpu_binding`` (hpclab.core.devices.GpuChoice.how), ``gpu_memory`` ("growth", "limit
    N MiB", "" on CPU), ``tf_cuda`` (TensorFlow was built with CUDA) and ``horovod_nccl``
    (Horovod was built with NCCL)."""
    gpus = tf.config.list_physical_devices("GPU")
    local = local_rank_of(hvd.local_rank(), os.environ)
    choice = pick_gpu(local, hvd.local_size(), len(gpus), os.environ)
    identity: dict = {}
    memory = ""
    if choice.index is not None:
        chosen = gpus[choice.index]
        limit = gpu_memory_limit(os.environ)
        if limit is None:  # TensorFlow would reserve nearly the whole GPU at its first op
            tf.config.experimental.set_memory_growth(chosen, True)
            memory = "growth"
        else:
            config = tf.config.LogicalDeviceConfiguration(memory_limit=limit)
            tf.config.set_logical_device_configuration(chosen, [config])
            memory = f"limit {limit} MiB"
        tf.config.set_visible_devices(chosen, "GPU")
        name = tf.config.experimental.get_device_details(chosen).get("device_name", "")
        identity = gpu_identity(choice, os.environ, _smi_rows(), name)
    return {
        "gpus": len(gpus),
        "gpu": identity,
        "gpu_binding": choice.how,
        "gpu_memory": memory,
        "tf_cuda": bool(tf.test.is_built_with_cuda()),
        "horovod_nccl": bool(hvd.nccl_built()),
    }


__all__ = ["pin_gpu"]
