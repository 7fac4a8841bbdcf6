"""Generate a file dataset of 1-D signals (nothing is downloaded): a folder of shards plus the
``dataset.json`` that describes them (the format of hpclab.core.filedata).

Class c of 10 is a sine of c + 1 cycles over the signal, random phase and amplitude, plus
Gaussian noise: learnable by a small 1-D CNN in a few epochs.

    python examples/byo/make_dataset.py /tmp/signals --format tfrecord --files 8 --records 512

``--format npy`` writes each shard as a pair ``train-00000.x.npy`` / ``train-00000.y.npy``
(listed in dataset.json as ``"file": "train-00000"``); npz and hdf5 one file per shard.

Size: files x records x length x 4 bytes (+ 1/4 of it for validation); the defaults make 1 MB.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np

CLASSES = 10


def signals(n: int, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, CLASSES, size=n).astype(np.int64)
    t = np.arange(length) / length
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1))
    amp = rng.uniform(0.5, 1.5, size=(n, 1))
    x = amp * np.sin(2 * np.pi * (y[:, None] + 1) * t + phase)
    x += rng.normal(scale=0.5, size=x.shape)
    return x.astype(np.float32), y


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(x: np.ndarray, y: int) -> bytes:
    """A serialized ``tf.train.Example`` {x: bytes_list [raw x], y: int64_list [y]}, written by
    hand from example.proto / feature.proto (Features = 1: map<string, Feature>; Feature:
    bytes_list = 1, int64_list = 3), so making data needs no TensorFlow."""
    fx = _field(1, _field(1, x.tobytes()))  # Feature.bytes_list{value}
    fy = _field(3, _field(1, _varint(int(y))))  # Feature.int64_list{packed value}
    entries = b"".join(
        _field(1, _field(1, key) + _field(2, feature)) for key, feature in ((b"x", fx), (b"y", fy))
    )
    return _field(1, entries)  # Example.features


def _write(path: Path, fmt: str, x: np.ndarray, y: np.ndarray) -> None:
    if fmt == "npy":  # a shard is a pair: NAME.x.npy and NAME.y.npy (hpclab.core.filedata)
        np.save(f"{path}.x.npy", x)
        np.save(f"{path}.y.npy", y)
        return
    if fmt == "npz":
        np.savez(path, x=x, y=y)
        return
    if fmt == "hdf5":
        import h5py

        with h5py.File(path, "w") as f:
            f["x"], f["y"] = x, y
        return
    from hpclab.core.filedata import masked_crc32c  # TFRecord framing (record_writer.cc)

    with open(path, "wb") as f:
        for xi, yi in zip(x, y):
            data = example(xi, yi)
            head = struct.pack("<Q", len(data))
            f.write(head + struct.pack("<I", masked_crc32c(head)))
            f.write(data + struct.pack("<I", masked_crc32c(data)))


def make(
    folder, fmt: str = "tfrecord", files: int = 8, records: int = 512, length: int = 64, seed=0
) -> Path:
    """Write ``files`` training shards of ``records`` signals each, and validation shards of a
    quarter as many records in total (at least one shard), into ``folder``; return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ext = {"tfrecord": ".tfrecord", "npy": "", "npz": ".npz", "hdf5": ".h5"}[fmt]
    desc = {
        "format": fmt,
        "x": {"key": "x", "shape": [length], "dtype": "float32"},
        "y": {"key": "y"},
        "classes": CLASSES,
        "train": [],
        "validation": [],
    }
    val_files = max(1, files // 4)
    for split, count in (("train", files), ("validation", val_files)):
        for i in range(count):
            name = f"{split}-{i:05d}{ext}"
            _write(folder / name, fmt, *signals(records, length, rng))
            desc[split].append({"file": name, "records": records})
    (folder / "dataset.json").write_text(json.dumps(desc, indent=1))
    return folder


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--format", default="tfrecord", choices=("tfrecord", "npy", "npz", "hdf5"))
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--records", type=int, default=512, help="records per file")
    p.add_argument("--length", type=int, default=64, help="samples per signal")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(make(a.folder, a.format, a.files, a.records, a.length, a.seed))
