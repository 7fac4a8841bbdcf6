"""Named starting points for a run: the workshop's, a quick one, and a GPU cluster's.

A preset is a :class:`~hpclab.core.config.RunConfig`; change what a lesson varies with
``WORKSHOP.replace(batch_per_worker=256)``. The notebooks, the panel (``lab.panel(preset=...)``),
the CLI (``hpclab run --preset quick``, options after it override) and ``make demo`` start from
these, so a number in one place is the number everywhere.

==============  ===================================================================================
``WORKSHOP``    ``RunConfig()``'s defaults: MNIST-1D, 40,960 samples: 32,768 for training — a power of two, so every batch size
                the notebooks use divides an epoch exactly — and 8,192 held out; the 1-D CNN,
                momentum SGD at base LR 0.05 tuned at global batch 64, linear scaling, a 1-epoch
                warm-up, 6 epochs, seed ``HPCLAB_SEED`` (0 unless set). A 2-worker run takes
                seconds on a laptop.
``QUICK``       the workshop's problem for checks and demos that must finish in a few seconds:
                2 epochs of 8,192 training samples (10,240 generated).
``CLUSTER_GPU`` Horovod's synthetic ResNet-50 benchmark (``tensorflow2_synthetic_benchmark.py``):
                224x224x3 random images, 1,000 classes, batch 64 per GPU, mixed float16 with XLA.
                A throughput measurement for GPU nodes (no accuracy: the labels are random); on a
                CPU it is very slow.
==============  ===================================================================================

**Shifting every seed.** Each preset's ``seed`` is the environment variable ``HPCLAB_SEED``
(a whole number >= 0; 0 when unset), read once when this module is imported, and every notebook
writes its extra seeds relative to it (``base.replace(seed=base.seed + 1)``). So
``HPCLAB_SEED=1 jupyter lab`` (or ``HPCLAB_SEED=1 make test``) repeats every lesson on other
seeds — other data, other initial weights, another shuffle: the way to tell a finding from one
seed's luck.
"""

from __future__ import annotations

import os

from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError

#: The environment variable that shifts every preset's seed (and so every notebook's seeds).
SEED_VARIABLE = "HPCLAB_SEED"


def workshop_seed(environ: dict | None = None) -> int:
    """The seed the presets start from: ``HPCLAB_SEED`` if set, else 0 (RunConfig's default)."""
    raw = (os.environ if environ is None else environ).get(SEED_VARIABLE, "").strip()
    if not raw:
        return RunConfig().seed
    if not raw.isdigit():
        raise ConfigError(
            f"{SEED_VARIABLE} must be a whole number >= 0 (the seed every preset starts from); "
            f"it is {raw!r}."
        )
    return int(raw)


# RunConfig's defaults are the workshop's, at the seed HPCLAB_SEED asks for
WORKSHOP = RunConfig(seed=workshop_seed())
QUICK = WORKSHOP.replace(num_samples=10240, epochs=2)
CLUSTER_GPU = RunConfig(
    seed=WORKSHOP.seed,
    dataset="synthetic",
    model="resnet50",
    image_shape=(224, 224, 3),
    synthetic_classes=1000,
    num_samples=64 * 1000,
    batch_per_worker=64,
    epochs=1,
    lr_scaling="none",
    warmup_epochs=0,
    precision="mixed_float16",
    xla=True,
)

#: Presets by the name the panel and the CLI use.
PRESETS = {"workshop": WORKSHOP, "quick": QUICK, "cluster_gpu": CLUSTER_GPU}


def preset(name: str | RunConfig) -> RunConfig:
    """The preset called `name` (case-insensitive); a RunConfig is returned as it is."""
    if isinstance(name, RunConfig):
        return name
    key = str(name).strip().lower()
    if key not in PRESETS:
        raise ConfigError(
            f"preset must be one of {', '.join(repr(k) for k in PRESETS)}; you passed {name!r}."
        )
    return PRESETS[key]


__all__ = [
    "WORKSHOP",
    "QUICK",
    "CLUSTER_GPU",
    "PRESETS",
    "SEED_VARIABLE",
    "preset",
    "workshop_seed",
]
