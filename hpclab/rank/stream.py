"""Your own files in: staging, a rank's ``tf.data`` pipeline, and the streamed training source.

A file dataset (:mod:`hpclab.core.filedata`) reaches the step one of two ways
(``RunConfig.input``, the rule for ``auto`` in :mod:`hpclab.core.filedata`):

* **resident** — every rank reads the training files whole (:func:`read_arrays`) and the lab's
  :class:`hpclab.rank.feed.ResidentShard` cuts batches in the graph, as for the catalogue's data;
* **stream** — :class:`StreamedShard`: the step's input part is ``get_next()`` on a ``tf.data``
  iterator inside the compiled call, so the time split's ``input`` is the time the step waits for
  the pipeline. The pipeline (:func:`pipeline`), after the tf.data performance guide
  (https://www.tensorflow.org/guide/data_performance): files read in parallel (``interleave``),
  sharded across ranks, shuffled in a buffer, batched, decoded in parallel on whole batches
  (``tf.io.parse_example``, ``decode_raw``), prefetched.

Sharding rule: **by file** when the training files divide evenly among the ranks (their number a
multiple of the world size) and hold equal record counts, so every rank reads only its files and
holds the same number of records; else **by record** (every rank reads every file and keeps every
world-th record: ``Dataset.shard``, correct for any layout, at world× the reads). npy shards
stream (shard, record index) pairs and a batch's rows are read from memory maps after the
shard and the shuffle, so by record too a rank reads only its own records.
Shuffling: ``local`` — a rank's files in a new order each epoch (seeded per rank) and a buffer of
``stream_buffer`` records; ``global`` — the file order is one permutation per epoch, the same on
every rank (seeded by the run's seed and the epoch), dealt out anew, then the buffer. The stream
repeats without end: epochs are counted in steps (the plan's), so records of two epochs may meet
in the buffer at an epoch's edge.

Staging (``RunConfig.stage="local"``): before training one rank per node copies the files to
node-local storage (``$HPCLAB_LOCAL_DIR``, else ``$TMPDIR``, else ``/tmp``; a copy whose size and
modification time match is kept), timed, and the pipeline reads the copies; ``stage="pack"``
writes them once per node into one pack file read through one open (:mod:`hpclab.rank.pack`,
after FanStore, arXiv:1809.10799). Validation files are always read whole (resident, every rank).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from hpclab.core.filedata import describe, npy_pair, resident, shard_files

SEED_STRIDE = 1_000_003  # as hpclab.rank.feed: distinct streams per rank and run seed
PROBE_BATCHES = 20  # batches the pipeline's own timing reads before training
MAX_EPOCHS = 1 << 30  # the stream "repeats without end"


# -- staging ---------------------------------------------------------------------------------
def local_root() -> Path:
    env = os.environ
    return Path(env.get("HPCLAB_LOCAL_DIR") or env.get("TMPDIR") or "/tmp")


def stage_dir(folder: str) -> Path:
    """Where a dataset's node-local copy or pack lives (one per user and source folder)."""
    digest = hashlib.sha256(str(folder).encode()).hexdigest()[:10]
    return local_root() / f"hpclab-stage-{os.getuid()}" / f"{Path(folder).name}-{digest}"


def stage(d: dict, folder: str, copier: bool, how: str = "local") -> tuple[dict, dict]:
    """The description with its files moved to node-local copies (``how="local"``) or to a pack
    (``"pack"``, :mod:`hpclab.rank.pack`), and what staging did. Only a ``copier`` rank (local
    rank 0) writes; the caller's barrier makes the others wait for it."""
    target = stage_dir(folder)
    if how == "pack":
        from hpclab.rank import pack

        return pack.write(d, folder, target / "pack", writer=copier)
    t0, copied, kept = time.perf_counter(), 0, 0
    moved = dict(d)
    for split in ("train", "validation"):
        moved[f"{split}_files"] = [
            str(target / Path(s).relative_to(folder)) for s in d[f"{split}_files"]
        ]
        for shard in d[f"{split}_files"] if copier else ():
            for src in shard_files(d, shard):
                n, same = _copy(src, target / Path(src).relative_to(folder))
                copied, kept = copied + (0 if same else n), kept + (n if same else 0)
    info = {
        "to": str(target),
        "copied_mb": copied / 2**20,
        "kept_mb": kept / 2**20,
        "seconds": time.perf_counter() - t0,
    }
    return moved, info


def _copy(src: str, dst: Path) -> tuple[int, bool]:
    """(bytes, whether a copy of the same size and modification time was already there)."""
    st = os.stat(src)
    try:
        s = os.stat(dst)
        if (s.st_size, int(s.st_mtime)) == (st.st_size, int(st.st_mtime)):
            return st.st_size, True
    except OSError:
        pass
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + f".{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)  # (a reader never sees half a file)
    return st.st_size, False


# -- reading ---------------------------------------------------------------------------------
def _decode(d: dict):
    """A function of a batch of records → (x float32 [B, *shape], y int32 [B])."""
    shape, dtype = list(d["input_shape"]), tf.as_dtype(d["x"]["dtype"])
    kx, ky = d["x"]["key"], d["y"]["key"]

    def scale(x):
        x = tf.cast(x, tf.float32)
        return x / 255.0 if dtype == tf.uint8 else x

    if d["format"] == "npy":  # (shard, record index) pairs: the rows read here, mapped
        rows = _NpyRows(d)

        def gather(shards, index):
            x, y = tf.numpy_function(rows, [shards, index], (dtype, tf.int64))
            return scale(tf.ensure_shape(x, [None, *shape])), tf.cast(y, tf.int32)

        return gather
    if d["format"] != "tfrecord":  # arrays already (npz, hdf5)
        return lambda x, y: (scale(x), tf.cast(y, tf.int32))
    spec = {kx: tf.io.FixedLenFeature([], tf.string), ky: tf.io.FixedLenFeature([], tf.int64)}

    def parse(serialized):
        f = tf.io.parse_example(serialized, spec)
        x = tf.io.decode_raw(f[kx], dtype)
        x = tf.reshape(x, [-1, *shape])  # (a wrong size fails here, naming both sizes)
        return scale(x), tf.cast(f[ky], tf.int32)

    return parse


class _NpyRows:
    """Rows of npy shards by (shard, index), read from memory maps (``np.load(mmap_mode="r")``,
    one map per file and pipeline): a rank's batch touches only the pages of its records."""

    def __init__(self, d: dict):
        self.keys, self.maps, self.pack = (d["x"]["key"], d["y"]["key"]), {}, d.get("pack")
        self.lock = threading.Lock()  # (tf.data's parallel calls: each file mapped once)
        self.xdtype, self.shape = np.dtype(d["x"]["dtype"]), tuple(d["input_shape"])

    def _mapped(self, path: str) -> np.ndarray:
        if self.pack:
            return self.pack.mapped(path)
        with self.lock:
            if path not in self.maps:
                self.maps[path] = np.load(path, mmap_mode="r")
            return self.maps[path]

    def __call__(self, shards: np.ndarray, index: np.ndarray):
        x = np.empty((len(index), *self.shape), self.xdtype)
        y = np.empty(len(index), np.int64)
        for shard in np.unique(shards):
            at = np.flatnonzero(shards == shard)
            px, py = npy_pair(shard.decode(), *self.keys)
            x[at], y[at] = self._mapped(px)[index[at]], self._mapped(py)[index[at]]
        return x, y


def _path(p) -> str:
    """A file name that tf.numpy_function passed (bytes, or a 0-d array eagerly)."""
    return (p if isinstance(p, bytes) else p.item()).decode()


def _reader(d: dict):
    """A function of one file name → a dataset of its records (serialized, (x, y) arrays, or
    for npy (shard, record index) pairs that :func:`_decode` reads)."""
    pack = d.get("pack")  # stage="pack": every file's bytes come from the node's pack
    if d["format"] == "tfrecord" and pack:

        def records(f):
            serialized = tf.numpy_function(lambda p: pack.records(_path(p)), [f], tf.string)
            return tf.data.Dataset.from_tensor_slices(tf.ensure_shape(serialized, [None]))

        return records
    if d["format"] == "tfrecord":
        return lambda f: tf.data.TFRecordDataset(f, buffer_size=1 << 20)
    if d["format"] == "npy":
        names = d["train_files"] + d["validation_files"]
        counts = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(names),
                tf.constant(d["train_counts"] + d["validation_counts"], tf.int64),
            ),
            default_value=0,
        )
        return lambda f: tf.data.Dataset.range(counts.lookup(f)).map(lambda i: (f, i))
    kx, ky, shape = d["x"]["key"], d["y"]["key"], list(d["input_shape"])
    dtype = tf.as_dtype(d["x"]["dtype"])

    def load(path):
        path = _path(path)
        src = pack.file(path) if pack else path
        if d["format"] == "hdf5":
            import h5py

            with h5py.File(src, "r") as f:
                return f[kx][()], f[ky][()].astype(np.int64)
        with np.load(src) as z:
            return z[kx], z[ky].astype(np.int64)

    def read(f):
        x, y = tf.numpy_function(load, [f], (dtype, tf.int64))
        return tf.data.Dataset.from_tensor_slices(
            (tf.ensure_shape(x, [None, *shape]), tf.ensure_shape(y, [None]))
        )

    return read


def read_arrays(d: dict, split: str) -> tuple[np.ndarray, np.ndarray]:
    """All records of ``split`` as (x float32, y int32), in file order."""
    files = d[f"{split}_files"]
    ds = tf.data.Dataset.from_tensor_slices(files).flat_map(_reader(d))
    ds = ds.batch(4096).map(_decode(d), num_parallel_calls=tf.data.AUTOTUNE)
    xs, ys = zip(*((x.numpy(), y.numpy()) for x, y in ds))
    return np.concatenate(xs), np.concatenate(ys)


def by_file(d: dict, world: int) -> bool:
    """The sharding rule of the module doc."""
    counts = d["train_counts"]
    return len(counts) % world == 0 and len(set(counts)) == 1


def pipeline(d: dict, cfg, rank: int, world: int, batch: int) -> tf.data.Dataset:
    """This rank's endless stream of training batches (the module doc's rules)."""
    files = tf.constant(d["train_files"])
    n, split_files = len(d["train_files"]), by_file(d, world)
    seed = cfg.seed if cfg.shuffle == "global" else cfg.seed * SEED_STRIDE + rank

    dealt = cfg.shuffle == "global"

    def epoch_files(e):
        shuffle = tf.random.experimental.stateless_shuffle
        key = tf.stack([tf.constant(seed, tf.int64), e])
        if split_files and dealt:  # one permutation on every rank, dealt: every world-th file
            order = shuffle(tf.range(n), key)[rank::world]
        elif split_files:  # local: this rank's own files, in a new order of its own each epoch
            order = shuffle(tf.range(n)[rank::world], key)
        elif dealt:  # by record: every rank reads one order (the same seed), new each epoch
            order = shuffle(tf.range(n), key)
        else:  # by record, local: every rank reads the files in one fixed order
            order = tf.range(n)
        # an epoch's files read in parallel, interleaved within the epoch only: by file the
        # next epoch holds the same files, so records of two epochs never mix here. In order:
        # by record every rank must see the one record stream it shards.
        return tf.data.Dataset.from_tensor_slices(tf.gather(files, order)).interleave(
            read,
            cycle_length=min(4, n // world if split_files else n),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    read = _reader(d)
    ds = tf.data.Dataset.range(MAX_EPOCHS).flat_map(epoch_files)
    if not split_files:
        ds = ds.shard(world, rank)
    ds = ds.shuffle(cfg.stream_buffer, seed=cfg.seed * SEED_STRIDE + rank)
    ds = ds.batch(batch, drop_remainder=True)
    ds = ds.map(_decode(d), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def check_rank_files(d: dict, cfg, rank: int, world: int) -> None:
    """Decode the first record of every training file this rank reads (all of them when sharding
    by record): a file unlike its description is a ValueError naming it, before the first step."""
    files = d["train_files"]
    if by_file(d, world):
        files = files[rank::world]  # (global shuffle deals others later: checked by their owner)
        if cfg.shuffle == "global":
            files = d["train_files"]
    read, decode = _reader(d), _decode(d)
    for f in files:
        try:
            for rec in read(tf.constant(f)).take(1).batch(1):
                decode(*rec) if isinstance(rec, tuple) else decode(rec)
        except (tf.errors.OpError, ValueError) as exc:
            msg = getattr(exc, "message", str(exc)).strip().splitlines()[0]
            raise ValueError(
                f"dataset {cfg.dataset!r}: file {Path(f).name!r} is not what dataset.json says "
                f"({d['format']}, x {d['x']['dtype']} {list(d['input_shape'])}): {msg}"
            ) from None


class StreamedShard:
    """The training source of a streamed run, with :class:`hpclab.rank.feed.ResidentShard`'s
    interface: ``batch_at`` pulls the next batch from the pipeline's iterator (in the graph)."""

    def __init__(self, dataset: tf.data.Dataset, *, batch: int, steps_per_epoch: int, aug=None):
        self.dataset, self.batch, self.steps_per_epoch = dataset, int(batch), steps_per_epoch
        self.n = steps_per_epoch * self.batch
        self.offline_s = 0.0
        self.iterator = iter(dataset)
        self._aug = aug  # (seed, cost) of online augmentation, or None

    def order(self, epoch) -> tf.Tensor:
        return tf.zeros([0], tf.int32)

    def batch_at(self, order, step, epoch=0):
        x, y = self.iterator.get_next()
        if self._aug is not None:
            from hpclab.rank.features.augment import augment

            seed, cost = self._aug
            at = tf.cast(epoch, tf.int64) * self.steps_per_epoch + tf.cast(step, tf.int64)
            x = augment(x, tf.stack([tf.constant(seed, tf.int64), at]), cost)
        return x, y

    def probe(self, batches: int = PROBE_BATCHES) -> float:
        """The pipeline's own timing: seconds per batch over ``batches`` batches read alone
        (after one to start it), from an iterator of its own."""
        it = iter(self.dataset)
        next(it)
        t0 = time.perf_counter()
        for _ in range(batches):
            next(it)
        return (time.perf_counter() - t0) / batches


def for_rank(cfg, plan, rank: int, world: int, local_rank: int, barrier):
    """(training source, validation arrays, num_classes, input_shape, what the input did) of a
    file dataset on this rank. ``barrier(failed)`` is the trainer's: a rank that cannot read
    its files fails every rank together, before the first step, so none waits for it."""
    info, failure, out = {}, None, None
    try:
        d = describe(cfg.dataset)
        info = {"format": d["format"], "files": len(d["train_files"]), "stage": None}
        info["mode"] = "resident" if resident(cfg, world) else "stream"
        if cfg.stage in ("local", "pack"):
            d, info["stage"] = stage(d, cfg.dataset, copier=local_rank == 0, how=cfg.stage)
    except Exception as exc:  # noqa: BLE001 — any failure must reach the barrier, not hang it
        failure = exc
    if barrier(failed=failure is not None):  # staged (or failed) everywhere
        raise failure or RuntimeError(
            "another rank could not stage the dataset; its error says why"
        )
    try:
        out = _source(cfg, plan, d, rank, world, info)
        if d.get("pack"):
            info["stage"]["pack_opens"] = d["pack"].opens  # (up to the first step)
    except Exception as exc:  # noqa: BLE001 — as above: every rank learns of it
        failure = exc
    if barrier(failed=failure is not None):
        raise failure or RuntimeError(
            "another rank could not read its files of the dataset; its error names the file"
        )
    return (*out, d["classes"], tuple(d["input_shape"]), info)


def _source(cfg, plan, d, rank, world, info):
    from hpclab.rank import feed

    B = plan.local_batches[rank]
    t0 = time.perf_counter()
    val = read_arrays(d, "validation")
    if info["mode"] == "resident":
        x, y = read_arrays(d, "train")
        arrays = _Arrays(x, y)
        info["read_s"] = time.perf_counter() - t0
        return feed.for_rank(cfg, plan, arrays, rank), val
    if cfg.augment == "offline" or cfg.shards == "by_label" or cfg.batch_skew:
        raise ValueError(
            f"input 'stream' streams records as they come: augment={cfg.augment!r}, "
            f"shards={cfg.shards!r}, batch_skew={cfg.batch_skew!r} need input='resident'."
        )
    check_rank_files(d, cfg, rank, world)
    aug = (cfg.seed * SEED_STRIDE + rank, cfg.augment_cost) if cfg.augment == "online" else None
    ds = pipeline(d, cfg, rank, world, B)
    source = StreamedShard(ds, batch=B, steps_per_epoch=plan.steps_per_epoch, aug=aug)
    info["sharding"] = "by_file" if by_file(d, world) else "by_record"
    reads = len(d["train_files"]) // world if by_file(d, world) else len(d["train_files"])
    # counted from the readers' rule: a tfrecord, npz or hdf5 reader opens each file it reads
    # every epoch; npy memory maps (and a pack) are opened once per run
    reopen = d["format"] != "npy" and not d.get("pack")
    info["file_opens_per_epoch"] = reads if reopen else 0
    info["probe_s_per_batch"] = source.probe()
    info["read_s"] = time.perf_counter() - t0
    return source, val


class _Arrays:
    """The two fields feed.for_rank reads of hpclab.rank.data.Arrays."""

    def __init__(self, x, y):
        self.x_train, self.y_train = x, y


__all__ = ["StreamedShard", "pipeline", "read_arrays", "stage", "for_rank", "by_file"]
