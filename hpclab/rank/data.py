"""Data in: the arrays of a run (generated, cached or staged) and a rank's shard of them.

Datasets (``RunConfig.dataset``):

* ``mnist1d`` (default) — MNIST-1D (Greydanus 2020, "Scaling down deep learning",
  arXiv:2011.14439): 1-D signals of length 40, 10 classes, generated procedurally by the
  ``mnist1d`` package (``mnist1d.data.make_dataset``) from ``num_samples`` and ``seed``. Nothing is
  downloaded: ``mnist1d.data.get_dataset`` would fetch a pickle from GitHub, so it is never called.
  Generation is slow (about 30 s for 40k samples), so arrays are cached as
  ``data_dir/mnist1d-n{N}-s{seed}.npz``.
* ``mnist``, ``fashion_mnist``, ``cifar10`` — read from files the user stages as
  ``data_dir/<name>.npz`` with keys ``x_train, y_train, x_test, y_test`` (the layout of Keras's
  ``mnist.npz``); the test split is the validation set. Nothing is downloaded; a missing file
  raises ``FileNotFoundError`` saying how to stage it.
* ``synthetic`` — no arrays: like Horovod's ``tensorflow2_synthetic_benchmark.py``, one random
  batch of ``image_shape`` with random labels (10 classes), repeated every step
  (:func:`synthetic_train_dataset`). There is no validation set.
* ``blobs`` — class-conditional Gaussians with a known gradient noise scale: 10 balanced classes,
  ``x | y=c ~ N(mu_c, sigma² I)`` in 40 dimensions (MNIST-1D's length), the means fixed by
  ``seed`` (:func:`blobs_parameters`). With the ``linear`` model at its zero initialisation, the
  true B_simple of McCandlish et al. 2018 is a closed form
  (:func:`hpclab.core.metrics.softmax_zero_noise_scale`), so the lab's estimator can be checked
  against it. Generated in memory from ``num_samples`` and ``seed`` (cheap: no cache file).

Race-safety of the MNIST-1D cache: all ranks of a run call :func:`load_arrays` at once. The first
to take an exclusive ``flock`` on ``<cache>.lock`` generates the file; the others block on the
lock and then read the finished file. A lock held by a process that dies is released by the
kernel, so no stale lock survives a crash. The file itself is written to a per-process temporary
name and moved into place with ``os.replace`` (atomic on POSIX), so a reader never sees half a
file; on file systems without ``flock`` (some Lustre mounts) every rank generates its own copy
and the atomic replace still keeps the cache whole (the copies are identical).

Batches are cut from these arrays inside the compiled training call: :mod:`hpclab.rank.feed`.
"""

from __future__ import annotations

import logging
import math
import os
import random
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hpclab.core.catalog import GENERATED_VALIDATION_FRACTION, NUM_CLASSES, STAGED_DATASETS
from hpclab.rank.heartbeat import PROGRESS

log = logging.getLogger(__name__)

try:  # POSIX advisory locks; absent on Windows, where the atomic replace alone protects the cache
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None


class Arrays(NamedTuple):
    """A run's data as NumPy: float32 inputs, int32 labels (``None`` for ``synthetic``)."""

    x_train: np.ndarray | None
    y_train: np.ndarray | None
    x_val: np.ndarray | None
    y_val: np.ndarray | None
    num_classes: int
    input_shape: tuple


# ---------------------------------------------------------------------------------------------
# arrays
# ---------------------------------------------------------------------------------------------


def load_arrays(cfg: dict, data_dir: str | Path) -> Arrays:
    """The arrays for ``cfg["dataset"]`` (``cfg`` is ``RunConfig.to_dict()``).

    ``mnist1d`` is generated (or read from its cache in ``data_dir``), ``blobs`` is generated in
    memory, staged datasets are read from ``data_dir/<name>.npz``; ``synthetic`` returns
    ``Arrays`` with ``None`` arrays and only ``num_classes`` and ``input_shape`` set.
    """
    name = cfg["dataset"]
    data_dir = Path(data_dir)
    if name == "mnist1d":
        return _mnist1d(int(cfg["num_samples"]), int(cfg["seed"]), data_dir)
    if name == "blobs":
        return _blobs(int(cfg["num_samples"]), int(cfg["seed"]))
    if name in STAGED_DATASETS:
        return _staged(name, data_dir)
    if name == "synthetic":
        return Arrays(
            None, None, None, None, NUM_CLASSES, tuple(int(d) for d in cfg["image_shape"])
        )
    raise ValueError(
        f"dataset must be one of mnist1d, blobs, synthetic, {', '.join(STAGED_DATASETS)}; "
        f"you passed dataset={name!r}."
    )


def mnist1d_cache_path(num_samples: int, seed: int, data_dir: str | Path) -> Path:
    return Path(data_dir) / f"mnist1d-n{int(num_samples)}-s{int(seed)}.npz"


def _mnist1d(num_samples: int, seed: int, data_dir: Path) -> Arrays:
    path = mnist1d_cache_path(num_samples, seed, data_dir)
    loaded = _read_cache(path, num_samples)
    if loaded is None:  # missing, or corrupt (a torn copy, a full disk): make it, once
        data_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(path.with_name(path.name + ".lock")):
            loaded = _read_cache(path, num_samples)  # another rank may have made it meanwhile
            if loaded is None:
                if path.exists():
                    log.warning("the dataset cache %s is unreadable; generating it again", path)
                with PROGRESS.during("generate"):  # (the watchdog's longer bound)
                    _atomic_savez(path, **_generate_mnist1d(num_samples, seed))
                loaded = _read_cache(path, num_samples)
    x, y = loaded
    n_val = int(round(num_samples * GENERATED_VALIDATION_FRACTION))  # = RunConfig.validation_size()
    n_train = num_samples - n_val
    return Arrays(x[:n_train], y[:n_train], x[n_train:], y[n_train:], NUM_CLASSES, x.shape[1:])


def _read_cache(path: Path, num_samples: int):
    """(x, y) from a cache file, or None if it is missing or not a whole, matching cache."""
    try:
        with np.load(path) as f:
            x, y = f["x"], f["y"]
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None  # missing (FileNotFoundError is an OSError) or not a whole npz
    return (x, y) if len(x) == len(y) == num_samples else None


def _generate_mnist1d(num_samples: int, seed: int) -> dict:
    """Exactly `num_samples` MNIST-1D signals (float32, shape [N, 40]) and int32 labels."""
    from mnist1d.data import get_dataset_args, make_dataset  # generation only; no get_dataset

    args = get_dataset_args()  # an ObjectView of the paper's defaults
    # make_dataset makes num_samples // 10 per class: round up, then keep exactly num_samples.
    args.num_samples = 10 * math.ceil(num_samples / 10)
    args.seed = seed
    args.train_split = 1.0 - GENERATED_VALIDATION_FRACTION  # we re-split below by exact counts
    # make_dataset reseeds Python's and NumPy's global generators: give the caller theirs back.
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    # make_dataset already shuffles samples; its split is just a cut, so join and cut our own.
    x = np.concatenate([d["x"], d["x_test"]])[:num_samples].astype(np.float32)
    y = np.concatenate([d["y"], d["y_test"]])[:num_samples].astype(np.int32)
    return {"x": x, "y": y}


BLOBS_DIM = 40  # input length, as MNIST-1D's
BLOBS_MEAN_NORM = 2.0  # |mu_c|: B_simple ≈ 100 at zero weights for sigma = 1
BLOBS_SIGMA = 1.0


def blobs_parameters(seed: int) -> tuple[np.ndarray, float]:
    """The ``blobs`` class means ``[NUM_CLASSES, BLOBS_DIM]`` (each of norm ``BLOBS_MEAN_NORM``,
    in a random direction drawn from ``seed``) and the per-coordinate noise σ."""
    rng = np.random.default_rng([int(seed), 0])  # means: a stream of their own
    means = rng.normal(size=(NUM_CLASSES, BLOBS_DIM))
    means *= BLOBS_MEAN_NORM / np.linalg.norm(means, axis=1, keepdims=True)
    return means, BLOBS_SIGMA


def _blobs(num_samples: int, seed: int) -> Arrays:
    """``x = mu_y + σ·ε`` with balanced labels: the training and validation labels are each
    ``0, 1, …, 9, 0, 1, …`` shuffled, so every class has ⌊n/10⌋ or ⌈n/10⌉ samples in both."""
    means, sigma = blobs_parameters(seed)
    rng = np.random.default_rng([int(seed), 1])  # samples
    n_val = int(round(num_samples * GENERATED_VALIDATION_FRACTION))  # = RunConfig.validation_size()
    parts = []
    for n in (num_samples - n_val, n_val):
        y = rng.permutation(np.arange(n) % NUM_CLASSES).astype(np.int32)
        x = (means[y] + sigma * rng.normal(size=(n, BLOBS_DIM))).astype(np.float32)
        parts += [x, y]
    return Arrays(*parts, NUM_CLASSES, (BLOBS_DIM,))


class _exclusive_lock:
    """``flock`` on a side file; a no-op where the file system does not support it."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = None

    def __enter__(self):
        if fcntl is None:
            return self
        try:
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except PermissionError:  # another user's lock file: flock works read-only too
                self.fd = os.open(self.path, os.O_RDONLY)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:  # e.g. ENOLCK/ENOSYS on a mount without locks: rely on os.replace
            log.warning(
                "no lock on %s (%s): ranks may each generate the same data (safe, but slower)",
                self.path,
                exc,
            )
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
        return False


def _atomic_savez(path: Path, **arrays) -> None:
    """Write to a unique temporary file next to `path`, then rename it into place."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _staged(name: str, data_dir: Path) -> Arrays:
    path = data_dir / f"{name}.npz"
    if not path.exists():
        raise FileNotFoundError(
            f"Dataset {name!r} is read from {path}, and that file does not exist. Nothing is "
            f"downloaded at run time: stage the file first. On a machine with internet run\n"
            f'  python -c "import numpy as np, tensorflow as tf; '
            f"(a, b), (c, d) = tf.keras.datasets.{name}.load_data(); "
            f"np.savez_compressed('{name}.npz', x_train=a, y_train=b, x_test=c, y_test=d)\"\n"
            f"and copy {name}.npz to {path} (keys x_train, y_train, x_test, y_test; uint8 images)."
        )
    with np.load(path) as f:
        missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in f.files]
        if missing:
            raise ValueError(
                f"{path} lacks the arrays {', '.join(missing)}; a staged dataset "
                f"needs x_train, y_train, x_test, y_test (it has {', '.join(f.files)})."
            )
        x_train, y_train, x_test, y_test = (
            f[k] for k in ("x_train", "y_train", "x_test", "y_test")
        )
    x_train, x_test = _images(x_train), _images(x_test)
    return Arrays(
        x_train,
        y_train.reshape(-1).astype(np.int32),
        x_test,
        y_test.reshape(-1).astype(np.int32),
        NUM_CLASSES,
        x_train.shape[1:],
    )


def _images(x: np.ndarray) -> np.ndarray:
    """uint8 [0, 255] -> float32 [0, 1]; grey images [N, H, W] get a channel axis [N, H, W, 1]."""
    scale = 255.0 if np.issubdtype(x.dtype, np.integer) else 1.0
    x = x.astype(np.float32)
    if scale != 1.0:
        x /= scale
    return x[..., None] if x.ndim == 3 else x


# ---------------------------------------------------------------------------------------------
# sharding
# ---------------------------------------------------------------------------------------------


def by_label(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples sorted by label (stable): contiguous shards then hold classes of their own,
    as a data set stored class by class and cut into files per rank would (``shards="by_label"``,
    the non-iid case of the shuffle lesson)."""
    order = np.argsort(y, kind="stable")
    return x[order], y[order]


def shard(
    x: np.ndarray, y: np.ndarray, rank: int, world: int, batches: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Rank `rank`'s contiguous slice of `world` equal parts (the remainder is dropped); with
    `batches` (each rank's batch, ``RunPlan.local_batches``), parts in proportion to them.

    Every rank gets enough samples for the same number of steps (a rank with one extra batch
    would wait forever in an allreduce). The slices are views, not copies.
    """
    if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
        raise ValueError(
            f"shard needs 0 <= rank < world; you passed rank={rank!r}, world={world!r}."
        )
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} inputs, {len(y)} labels.")
    per = len(x) // world
    if per == 0:
        raise ValueError(
            f"{len(x)} samples cannot be shared by {world} workers: each would get "
            "none. Use more samples or fewer workers."
        )
    if batches is None:
        return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
    steps = len(x) // sum(batches)  # whole global batches
    lo = sum(batches[:rank]) * steps
    hi = lo + batches[rank] * steps
    return x[lo:hi], y[lo:hi]
