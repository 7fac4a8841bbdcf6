"""How a dataset sits on disk, and the file operations one epoch of a rank costs.

The I/O lesson. On one machine every read hits the page cache, so the lab
*counts* what a shared file system would serve — metadata operations (``stat``, ``open``) and
read requests, per rank and epoch — and *times* only what really happens here. A slow shared
path is a per-operation latency multiplied by those counts: ``simulated_s``, always labelled
simulated, never slept.

Why counts: on Lustre every ``open``/``stat`` is a round trip to a metadata server the whole
machine shares. At TACC, ImageNet's 1.28 M small files loaded the metadata servers, not the
disks, until the data was staged on node-local storage (FanStore: Zhang et al., "FanStore:
Enabling Efficient and Scalable I/O for Distributed Deep Learning", arXiv:1809.10799, 2018). Studies of
TensorFlow's I/O (Chien et al., "Characterizing Deep-Learning I/O Workloads in TensorFlow",
PDSW-DISCS 2018) and NERSC's breakdown of training latency show packed formats (TFRecord) and
the cost of a global shuffle.

Layouts (:data:`LAYOUTS`):

* ``files`` — one file per sample (``files/<i // 1000>/<i>.bin``), as image folders are; reading
  a sample is ``stat`` + ``open`` + ``read`` + ``close``: an epoch costs one ``open`` per sample.
* ``packed`` — every sample back to back in ``packed.bin`` (a TFRecord-like file), read in
  requests of :data:`CHUNK_BYTES` (``tf.data.TFRecordDataset``'s default ``buffer_size``,
  ``readers._DEFAULT_READER_BUFFER_SIZE_BYTES``, is 256 KiB): one ``open`` per epoch whatever
  the sample count; the requests are the chunks that hold any sample the rank needs.
* ``memory`` — the arrays already in RAM: no operation at all.

Shuffles (:data:`SHUFFLES`): ``local`` — a rank keeps its contiguous shard every epoch and
shuffles inside it (``data.shard``); ``global`` — every epoch a new permutation of all samples is
dealt to the ranks, so a rank needs samples stored anywhere: ``remote`` counts the samples
outside its own shard (the reads that would cross the network once each node holds only its
shard), and a packed store reads nearly every chunk (read amplification).

Everything here is NumPy and ``os``; the counts are of the calls this module makes, and the
tests check them against the kernel's own counter of read system calls (``/proc/self/io``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

LAYOUTS = ("files", "packed", "memory")
SHUFFLES = ("local", "global")
CHUNK_BYTES = 256 * 1024  # tf.data.TFRecordDataset's default read buffer
PER_FOLDER = 1000  # samples per sub-folder of a files store (as sharded image folders are)
SEED_STRIDE = 1_000_003


@dataclass
class EpochIO:
    """What one rank's epoch cost: operations counted, bytes, real and simulated seconds."""

    rank: int
    epoch: int
    layout: str
    shuffle: str
    samples: int
    stat: int = 0
    open: int = 0
    read: int = 0
    bytes: int = 0
    remote: int = 0  # samples outside this rank's shard (global shuffle)
    real_s: float = 0.0  # measured here (the page cache serves every read)
    simulated_s: float = 0.0  # (stat + open) × latency: a slow shared path, simulated

    def row(self) -> dict:
        return asdict(self)


def write(layout: str, x: np.ndarray, y: np.ndarray, root: str | Path) -> Path:
    """Write `x` (float32) and `y` (int32) as a `layout` store under ``root/<layout>``, once:
    a store whose ``meta.json`` exists is complete (written last) and is reused."""
    _check(layout, LAYOUTS, "layout")
    folder = Path(root) / layout
    if (folder / "meta.json").exists() or layout == "memory":
        return folder
    tmp = folder.with_name(f".{layout}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    records = _records(x, y)
    if layout == "files":
        for i, record in enumerate(records):
            sub = tmp / f"{i // PER_FOLDER:04d}"
            if i % PER_FOLDER == 0:
                sub.mkdir()
            (sub / f"{i:07d}.bin").write_bytes(record.tobytes())
    else:
        records.tofile(tmp / "packed.bin")
    meta = {"n": len(x), "input_shape": list(x.shape[1:]), "record_bytes": records.shape[1]}
    (tmp / "meta.json").write_text(json.dumps(meta))
    try:
        tmp.rename(folder)
    except OSError:  # another rank wrote it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _records(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One row of bytes per sample: its float32 inputs, then its int32 label."""
    xs = np.ascontiguousarray(x, dtype=np.float32).reshape(len(x), -1).view(np.uint8)
    ys = np.ascontiguousarray(y, dtype=np.int32).reshape(len(y), 1).view(np.uint8)
    return np.concatenate([xs, ys], axis=1)


def epoch_indices(n: int, rank: int, world: int, epoch: int, shuffle: str, seed: int = 0):
    """The sample indices rank `rank` reads in `epoch`, in order, and its own shard's range."""
    _check(shuffle, SHUFFLES, "shuffle")
    per = n // world
    lo, hi = rank * per, (rank + 1) * per
    rng = np.random.default_rng([seed * SEED_STRIDE + rank, epoch])
    if shuffle == "local":
        return lo + rng.permutation(per), (lo, hi)
    everyone = np.random.default_rng([seed, epoch]).permutation(n)  # the same on every rank
    return everyone[lo:hi], (lo, hi)


def read_epoch(
    folder: str | Path,
    layout: str,
    indices: np.ndarray,
    *,
    rank: int = 0,
    epoch: int = 0,
    shuffle: str = "local",
    shard: tuple[int, int] | None = None,
    latency_ms: float = 0.0,
    arrays: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, EpochIO]:
    """Read the samples `indices` (in that order) from a store; (x, y, what it cost).

    `arrays` is the in-memory copy for layout ``memory``; `shard` the rank's own range."""
    _check(layout, LAYOUTS, "layout")
    io = EpochIO(rank, epoch, layout, shuffle, len(indices))
    if shard is not None:
        io.remote = int(np.count_nonzero((indices < shard[0]) | (indices >= shard[1])))
    t0 = time.perf_counter()
    if layout == "memory":
        x, y = arrays[0][indices], arrays[1][indices]
    else:
        meta = json.loads((Path(folder) / "meta.json").read_text())
        reader = _read_files if layout == "files" else _read_packed
        records = reader(Path(folder), indices, int(meta["record_bytes"]), io)
        x, y = _unpack(records, tuple(meta["input_shape"]))
    io.real_s = time.perf_counter() - t0
    io.simulated_s = (io.stat + io.open) * latency_ms / 1000.0
    return x, y, io


def _read_files(folder: Path, indices, record_bytes: int, io: EpochIO) -> np.ndarray:
    out = np.empty((len(indices), record_bytes), np.uint8)
    for k, i in enumerate(indices):
        path = folder / f"{i // PER_FOLDER:04d}" / f"{i:07d}.bin"
        size = os.stat(path).st_size  # what a loader does before it opens: a metadata call
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.read(fd, size)
        finally:
            os.close(fd)
        io.stat, io.open, io.read, io.bytes = io.stat + 1, io.open + 1, io.read + 1, io.bytes + size
        out[k] = np.frombuffer(data, np.uint8)
    return out


def _read_packed(folder: Path, indices, record_bytes: int, io: EpochIO) -> np.ndarray:
    """Read, in file order, every CHUNK_BYTES chunk that holds a needed record, then pick."""
    path = folder / "packed.bin"
    size = os.stat(path).st_size
    io.stat, io.open = io.stat + 1, io.open + 1
    starts = np.asarray(indices, np.int64) * record_bytes
    first, last = starts // CHUNK_BYTES, (starts + record_bytes - 1) // CHUNK_BYTES
    chunks = np.unique(np.concatenate([first, last]))
    needed = {}
    fd = os.open(path, os.O_RDONLY)
    try:
        for c in chunks:
            data = os.pread(fd, min(CHUNK_BYTES, size - int(c) * CHUNK_BYTES), int(c) * CHUNK_BYTES)
            io.read, io.bytes = io.read + 1, io.bytes + len(data)
            needed[int(c)] = data
    finally:
        os.close(fd)
    out = np.empty((len(indices), record_bytes), np.uint8)
    for k, start in enumerate(starts):
        c, off = divmod(int(start), CHUNK_BYTES)
        data = needed[c][off : off + record_bytes]
        if len(data) < record_bytes:  # the record runs into the next chunk
            data += needed[c + 1][: record_bytes - len(data)]
        out[k] = np.frombuffer(data, np.uint8)
    return out


def _unpack(records: np.ndarray, input_shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    x = records[:, :-4].copy().view(np.float32).reshape((len(records), *input_shape))
    y = records[:, -4:].copy().view(np.int32).reshape(len(records))
    return x, y


def stage(folder: str | Path, layout: str, target: str | Path, latency_ms: float = 0.0):
    """Copy a store to node-local storage (``/dev/shm`` here) once; (new folder, what the copy
    cost on the shared path: every file read once, counted as an epoch is)."""
    folder, target = Path(folder), Path(target) / Path(folder).name
    meta = json.loads((folder / "meta.json").read_text())
    io = EpochIO(-1, -1, layout, "stage", int(meta["n"]))
    t0 = time.perf_counter()
    if not (target / "meta.json").exists():
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder, target)
    files = [p for p in folder.rglob("*") if p.is_file()]
    io.stat = io.open = io.read = len(files)
    io.bytes = sum(p.stat().st_size for p in files)
    io.real_s = time.perf_counter() - t0
    io.simulated_s = (io.stat + io.open) * latency_ms / 1000.0
    return target, io


def rank_epochs(
    folder: str,
    layout: str,
    shuffle: str,
    epochs: int,
    *,
    seed: int = 0,
    latency_ms: float = 0.0,
    stage_to: str = "",
) -> list[dict]:
    """On an engine: this rank reads its part of the store for `epochs` epochs; one row per
    epoch (and one for staging to `stage_to`, epoch -1), as :class:`EpochIO` rows.

    Layout ``memory`` loads the packed store once (not counted: it happens before epoch 0)."""
    import horovod.tensorflow as hvd  # initialised by engine.init_worker

    rank, world = hvd.rank(), hvd.size()
    source = Path(folder) / ("packed" if layout == "memory" else layout)
    rows, local = [], None
    if stage_to and layout != "memory":
        local = Path(stage_to) / f"rank{rank}"
        source, cost = stage(source, layout, local, latency_ms)
        cost.rank = rank
        rows.append(cost.row())
    try:
        meta = json.loads((source / "meta.json").read_text())
        n, arrays = int(meta["n"]), None
        if layout == "memory":
            records = np.fromfile(source / "packed.bin", np.uint8).reshape(n, -1)
            arrays = _unpack(records, tuple(meta["input_shape"]))
        for e in range(int(epochs)):
            idx, shard = epoch_indices(n, rank, world, e, shuffle, seed)
            *_, io = read_epoch(
                source,
                layout,
                idx,
                rank=rank,
                epoch=e,
                shuffle=shuffle,
                shard=shard,
                latency_ms=0.0 if local else latency_ms,
                arrays=arrays,
            )
            rows.append(io.row())
    finally:
        if local is not None:  # node-local space is scarce: leave nothing behind
            shutil.rmtree(local, ignore_errors=True)
            try:
                os.rmdir(stage_to)  # the last rank out on this node removes the folder
            except OSError:
                pass
    return rows


def _check(value: str, allowed: tuple[str, ...], field: str) -> None:
    if value not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(allowed)}; you passed {value!r}.")
