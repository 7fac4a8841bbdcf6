"""What the lab offers and its bounds: datasets, models, optimizers, precisions, limits.

One home for each of these facts. The knob table (hpclab.core.knobs) names them as a knob's
choices and bounds, so `RunConfig` validates against them and the panel and the CLI offer
them; the rank side looks its builders up by the same names (its tests
check that every name here has a builder).
"""

from __future__ import annotations

# -- datasets ---------------------------------------------------------------------------------
DATASETS = ("mnist1d", "synthetic", "mnist", "fashion_mnist", "cifar10", "blobs")
#: Fixed-size datasets a user stages as files in data/ (never downloaded at run time):
#: name -> (training samples, validation samples).
STAGED_SIZES = {"mnist": (60000, 10000), "fashion_mnist": (60000, 10000), "cifar10": (50000, 10000)}
STAGED_DATASETS = tuple(STAGED_SIZES)
#: MNIST-1D, blobs and synthetic data are generated; this share of `num_samples` is held out.
GENERATED_VALIDATION_FRACTION = 0.2
NUM_CLASSES = 10  # every dataset here has 10 classes (synthetic as in Horovod's benchmark)
#: The kind of input each dataset yields: 1-D signals or images (H, W, C).
DATASET_INPUT = {
    "mnist1d": "1d",
    "synthetic": "image",
    "mnist": "image",
    "fashion_mnist": "image",
    "cifar10": "image",
    "blobs": "1d",
}
#: How a file dataset (a folder: hpclab.core.filedata) reaches the step: auto (resident when it
#: fits, the rule in hpclab.core.filedata), resident (read whole, batches cut in the graph) or
#: stream (read from the files during training by a tf.data pipeline: hpclab.rank.stream).
INPUTS = ("auto", "resident", "stream")
#: Where a file dataset is read from: the shared file system where it lies, or node-local
#: storage it is copied to before training ($HPCLAB_LOCAL_DIR, else $TMPDIR, else /tmp), or
#: packed there into one file with an index (hpclab.rank.pack).
STAGINGS = ("shared", "local", "pack")

# -- models -----------------------------------------------------------------------------------
MODELS = ("mlp", "cnn1d", "resnet20", "resnet50", "linear")
#: Your own model, as ``model="package.module:function"``: a function of (input_shape,
#: num_classes) returning a Keras 2 model that emits logits, importable on every rank.
USER_MODEL = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"


def is_user_model(name: object) -> bool:
    """Whether ``name`` names your own model (``package.module:function``), not the catalogue's."""
    import re

    return isinstance(name, str) and re.fullmatch(USER_MODEL, name) is not None


def check_user_model(name: str) -> None:
    """For your own model, a ConfigError of one sentence when its module cannot be found from
    here (``importlib.util.find_spec``: the module itself is not run; a package's parents are).
    The ranks import it and call the function; their errors name the rank."""
    import importlib.util

    from hpclab.core.errors import ConfigError

    if not is_user_model(name):
        return
    module = name.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as exc:
        found, why = False, f" ({type(exc).__name__}: {exc})"
    else:
        why = ""
    if not found:
        raise ConfigError(
            f"RunConfig.model {name!r}: module {module!r} cannot be imported here{why}; install "
            "it in the lab's environment or put its folder on PYTHONPATH (the engines inherit it)."
        )


#: The input kinds each model accepts.
MODEL_INPUT = {
    "mlp": ("1d", "image"),
    "cnn1d": ("1d",),
    "resnet20": ("image",),
    "resnet50": ("image",),
    "linear": ("1d", "image"),
}

# -- optimisation and numerics ------------------------------------------------------------------
OPTIMIZERS = ("sgd", "momentum", "lars", "lamb", "adam")
LR_SCALINGS = ("none", "linear", "sqrt")
LR_SCHEDULES = ("constant", "cosine", "poly")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
#: How gradients cross ranks: one grouped (fused) allreduce after the whole backward pass, or one
#: allreduce per tensor, each free to start as soon as its gradient exists (overlap with backprop).
GRAD_ALLREDUCES = ("grouped", "per_tensor")
VALIDATIONS = ("sharded", "rank0")  # who evaluates the held-out set (Amdahl's lesson)
#: Input augmentation (hpclab.rank.features.augment): none, online (every batch, inside the step's input
#: part) or offline (once over the shard, before training).
AUGMENTS = ("none", "online", "offline")
MAX_AUGMENT_COST = 10_000  # noise passes per batch (≈ 0.05-0.1 ms each, batch 64 of MNIST-1D)
#: How the training set is cut into rank shards: iid (the data set's own random order) or
#: by_label (sorted by label first, as data stored class by class: rank r holds classes of its own).
SHARDS = ("iid", "by_label")
#: Which samples a rank trains on each epoch: local (its own shard, reshuffled) or global (a new
#: permutation of the whole training set dealt to the ranks every epoch; hpclab.rank.feed).
SHUFFLES = ("local", "global")
#: How replicas stay consistent (hpclab.rank.features.averaging): sync averages gradients every step,
#: local_sgd averages models every RunConfig.average_every steps, hybrid averages gradients inside
#: synchronous groups of ranks every step and models across groups every average_every steps
#: (hpclab.rank.features.groups), crossbow pulls each learner toward a central average model every step
#: (synchronous model averaging).
UPDATES = ("sync", "local_sgd", "hybrid", "crossbow")
#: Silent data corruption (hpclab.rank.features.sdc): which tensor of one layer a single bit flip hits.
SDC_TARGETS = ("none", "weights", "gradients", "activations")
FLOAT32_BITS = 32  # bit 31 sign, 30-23 exponent, 22-0 mantissa (IEEE 754 binary32)
MAX_ROLLBACKS = 3  # rollbacks to the same state before a run gives up (the fault is not transient)

# -- limits -------------------------------------------------------------------------------------
#: MPI engines one Lab starts. 512 is where the default data still gives every rank a batch
#: (num_samples 40,960, 20 % held out: 32,768 training samples = 512 shards of 64); live
#: telemetry is flat past it (1,024 ranks simulated: benchmarks/long_run.py), but a start of more
#: than 512 ipyparallel engines has never been tried, so the bound stays until one is.
MAX_WORKERS = 512
MAX_THREADS_PER_WORKER = 256
MAX_STEPS_PER_CALL = 1000  # optimizer steps one compiled call may run
#: Evaluations on the held-out subset per run when RunConfig.eval_every is 0 (auto): steps and
#: time to a target accuracy are then exact to 1/40 = 2.5 % of the run.
EVAL_POINTS = 40
#: Optimizer steps one run may take (epochs x steps per epoch, after max_steps): hours of the
#: lab's fastest model; beyond it a typo (epochs=1e4 at batch 1) would build a per-step LR table
#: of billions of entries on every rank before the first step.
MAX_TOTAL_STEPS = 10_000_000
#: Live telemetry cadence: 0 (off) or at least this many seconds between publishes.
MIN_PUBLISH_EVERY_S = 0.1
#: A history row's throughput is taken over at least this many seconds of training (its window
#: and the ones before it, hpclab.rank.meters.RateWindow): readable, and still a true rate.
RATE_WINDOW_S = 1.0
#: Up to this many ranks a history row carries each per-rank figure as a list (the dashboard
#: draws one line per rank up to the same count); above it, a row carries min / median / max and
#: the slowest rank's id, and rank 0 writes the full lists to TELEMETRY_FILES["ranks"]: a row's
#: size then stays flat in the world size (~2 KB at 1,024 ranks instead of ~70 KB).
RANK_LISTS_MAX = 16
#: What rank 0 writes to the run folder while it trains (hpclab.rank.publisher): every history
#: row and epoch row (JSON lines, the order they were made), and above RANK_LISTS_MAX ranks the
#: per-rank lists (float64 records: the row's step, then each list; keys in the .json beside).
TELEMETRY_FILES = {
    "rows": "telemetry/rows.jsonl",
    "epochs": "telemetry/epochs.jsonl",
    "ranks": "telemetry/ranks.f64",
    "ranks_meta": "telemetry/ranks.json",
}


def models_for(dataset: str) -> tuple[str, ...]:
    """The models that accept `dataset`'s input kind."""
    kind = DATASET_INPUT[dataset]
    return tuple(m for m in MODELS if kind in MODEL_INPUT[m])


__all__ = [
    "DATASETS",
    "STAGED_SIZES",
    "STAGED_DATASETS",
    "GENERATED_VALIDATION_FRACTION",
    "NUM_CLASSES",
    "DATASET_INPUT",
    "INPUTS",
    "STAGINGS",
    "MODELS",
    "MODEL_INPUT",
    "USER_MODEL",
    "is_user_model",
    "check_user_model",
    "OPTIMIZERS",
    "LR_SCALINGS",
    "LR_SCHEDULES",
    "PRECISIONS",
    "GRAD_ALLREDUCES",
    "VALIDATIONS",
    "AUGMENTS",
    "MAX_AUGMENT_COST",
    "SHARDS",
    "SHUFFLES",
    "MAX_WORKERS",
    "MAX_THREADS_PER_WORKER",
    "MAX_STEPS_PER_CALL",
    "RATE_WINDOW_S",
    "EVAL_POINTS",
    "MAX_TOTAL_STEPS",
    "MIN_PUBLISH_EVERY_S",
    "models_for",
]
