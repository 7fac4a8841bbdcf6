"""Your own data as a folder of files: its description, checked before any engine starts.

A file dataset is a folder with a ``dataset.json`` and the shard files it names
(``RunConfig.dataset`` = the folder's path; a relative path is made absolute where the config
is made). The description::

    {"format": "tfrecord",                       # or "npy", "npz", "hdf5"
     "x": {"key": "x", "shape": [64], "dtype": "float32"},   # dtype: float32 or uint8
     "y": {"key": "y"},                          # int labels 0 .. classes-1
     "classes": 10,
     "train": [{"file": "train-00000.tfrecord", "records": 2048}, ...],
     "validation": [{"file": "val-00000.tfrecord", "records": 512}]}

* ``tfrecord``: each record a ``tf.train.Example`` with ``x`` as one bytes feature holding the
  raw array (C order, ``dtype``) and ``y`` as one int64 feature; the pipeline decodes it with
  ``tf.io.parse_example`` + ``tf.io.decode_raw``. A file's framing (length and its masked
  CRC-32C, the TFRecord format of ``tensorflow/core/lib/io/record_writer.cc``) is checked here,
  without TensorFlow; its features are checked on every rank before the first step.
* ``npy``: a shard is a pair of plain NumPy files named by the entry's ``file`` and the keys:
  ``{"file": "train-00000", ...}`` is ``train-00000.x.npy`` (``x`` ``[records, *shape]``) and
  ``train-00000.y.npy`` (``y`` ``[records]``) for keys ``x`` and ``y`` — the ``.npz`` layout with
  the archive unpacked. Both headers are read here; the ranks map the files
  (``np.load(mmap_mode="r")``) and read only the records they are dealt.
* ``npz``: each file a NumPy ``.npz`` holding ``x`` ``[records, *shape]`` and ``y``
  ``[records]``; both array headers are read here (``numpy.lib.format``), not the data.
* ``hdf5``: each file an HDF5 file with datasets ``x`` and ``y`` shaped as for ``npz`` (read
  with ``h5py``, which the lock pins); their shapes and dtypes are checked here.

uint8 inputs become float32 in [0, 1] (``/255``), as the staged image datasets do.

How the ranks feed it (``RunConfig.input``): ``resident`` reads all training files into memory
and cuts batches in the graph (:mod:`hpclab.rank.feed`), ``stream`` reads them during training
through ``tf.data`` (:mod:`hpclab.rank.stream`); ``auto`` is resident when the decoded training
set a rank holds (its 1/world shard; the whole set with ``shuffle="global"``) is at most
:data:`RESIDENT_LIMIT_MB`, else stream. Validation files are always read whole (resident).
"""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from pathlib import Path

from hpclab.core.errors import ConfigError

DESCRIPTION = "dataset.json"
FORMATS = ("tfrecord", "npy", "npz", "hdf5")
DTYPES = ("float32", "uint8")
#: auto input: resident when the decoded float32 training data a rank holds fits in this many MiB
RESIDENT_LIMIT_MB = 512
MAX_RANK = 3  # input dims: (length,), (H, W) or (H, W, C)


def is_file_dataset(value: object) -> bool:
    """Whether ``value`` names a folder (a path with a ``/``), not a catalogue dataset."""
    return isinstance(value, str) and "/" in value


def _bad(folder, field: str, value, allowed: str) -> ConfigError:
    return ConfigError(
        f"dataset {str(folder)!r}: {DESCRIPTION} field {field!r} must be {allowed}; "
        f"it is {value!r}."
    )


_CACHE: dict = {}


def describe(folder: str | Path) -> dict:
    """The checked description of the file dataset at ``folder`` (cached by the file's mtime):
    the JSON's fields plus ``input_shape``, ``train_records``, ``validation_records`` and
    absolute ``train_files``/``validation_files``. A ConfigError of one sentence otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(
            f"RunConfig.dataset must be a folder holding {DESCRIPTION} (or a catalogue name); "
            f"{str(folder)!r} is not a folder."
        )
    path = folder / DESCRIPTION
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        raise ConfigError(
            f"dataset {str(folder)!r} has no {DESCRIPTION}; a file dataset needs one naming its "
            "format, x, y, classes, train and validation files (docs/user-guide.md)."
        ) from None
    if _CACHE.get(path, (None,))[0] == stamp:
        return _CACHE[path][1]
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}).") from None
    d = _check(folder, raw)
    _CACHE[path] = (stamp, d)
    return d


def _check(folder: Path, raw) -> dict:
    if not isinstance(raw, dict):
        raise _bad(folder, "(top level)", type(raw).__name__, "a JSON object")
    if raw.get("format") not in FORMATS:
        raise _bad(folder, "format", raw.get("format"), "one of " + ", ".join(FORMATS))
    x, y = raw.get("x"), raw.get("y")
    if not isinstance(x, dict) or not isinstance(x.get("key"), str):
        raise _bad(folder, "x", x, 'an object with "key", "shape" and "dtype"')
    shape = x.get("shape")
    if not (
        isinstance(shape, list)
        and 1 <= len(shape) <= MAX_RANK
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape)
    ):
        raise _bad(folder, "x.shape", shape, f"a list of 1 to {MAX_RANK} positive integers")
    if x.get("dtype") not in DTYPES:
        raise _bad(folder, "x.dtype", x.get("dtype"), "one of " + ", ".join(DTYPES))
    if not isinstance(y, dict) or not isinstance(y.get("key"), str):
        raise _bad(folder, "y", y, 'an object with "key"')
    classes = raw.get("classes")
    if not isinstance(classes, int) or isinstance(classes, bool) or not 2 <= classes <= 100_000:
        raise _bad(folder, "classes", classes, "an integer from 2 to 100000")
    d = dict(raw, input_shape=tuple(shape))
    for split in ("train", "validation"):
        entries = raw.get(split)
        if not isinstance(entries, list) or not entries:
            raise _bad(folder, split, entries, 'a non-empty list of {"file", "records"} objects')
        files, counts = [], []
        for e in entries:
            ok = isinstance(e, dict) and isinstance(e.get("file"), str)
            n = e.get("records") if ok else None
            if not ok or not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise _bad(folder, split, e, 'a list of {"file": name, "records": n >= 1}')
            p = (folder / e["file"]).resolve()
            if raw["format"] == "npy":
                if not all(Path(f).is_file() for f in npy_pair(str(p), x["key"], y["key"])):
                    raise _bad(
                        folder,
                        f"{split}.file",
                        e["file"],
                        f"a shard name NAME with NAME.{x['key']}.npy and NAME.{y['key']}.npy "
                        "in the folder",
                    )
            elif not p.is_file():
                raise _bad(folder, f"{split}.file", e["file"], "a file in the folder")
            files.append(str(p))
            counts.append(n)
        d[f"{split}_files"], d[f"{split}_counts"] = files, counts
        d[f"{split}_records"] = sum(counts)
    return d


def npy_pair(shard: str, kx: str, ky: str) -> tuple[str, str]:
    """The two files of an ``npy`` shard: ``NAME.<x key>.npy`` and ``NAME.<y key>.npy``."""
    return f"{shard}.{kx}.npy", f"{shard}.{ky}.npy"


def shard_files(d: dict, shard: str) -> list[str]:
    """The files on disk behind one ``train_files``/``validation_files`` entry (two for npy)."""
    if d["format"] == "npy":
        return list(npy_pair(shard, d["x"]["key"], d["y"]["key"]))
    return [shard]


def check_files(folder: str | Path) -> None:
    """Every file is what the description says (a ConfigError naming the first that is not):
    TFRecord framing of its first record, or the ``x``/``y`` headers of an npy pair, an npz or an
    HDF5 file against the shape, dtype and record count. Reads a few bytes per file, not the data."""
    d = describe(folder)
    for split in ("train", "validation"):
        for path, n in zip(d[f"{split}_files"], d[f"{split}_counts"]):
            why = _PROBLEMS[d["format"]](path, d, n)
            if why:
                raise ConfigError(
                    f"dataset {str(folder)!r}: {split} file {Path(path).name!r} is not a "
                    f"{d['format']} file as {DESCRIPTION} says: {why}."
                )


def _tfrecord_problem(path: str, d=None, records=0) -> str:
    """'' if the file starts with a whole TFRecord (length, its masked CRC-32C, data, CRC)."""
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12:
            return f"it holds {len(head)} bytes, less than one record's 12-byte header"
        (length,) = struct.unpack("<Q", head[:8])
        (crc,) = struct.unpack("<I", head[8:])
        if crc != masked_crc32c(head[:8]):
            return "its first record's length CRC does not match (not TFRecord framing)"
        size = os.fstat(f.fileno()).st_size
        if 12 + length + 4 > size:
            return f"its first record claims {length} bytes but the file holds {size}"
    return ""


def _npz_problem(path: str, d: dict, records: int) -> str:
    import numpy as np

    if not zipfile.is_zipfile(path):
        return "it is not a zip archive (an .npz is one)"
    keys = (d["x"]["key"], d["y"]["key"])
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        for key in keys:
            if f"{key}.npy" not in names:
                return f"it has no array {key!r} (it has {', '.join(n[:-4] for n in names)})"
        shapes = {}
        for key in keys:
            with z.open(f"{key}.npy") as f:
                version = np.lib.format.read_magic(f)
                shape, _, dtype = np.lib.format._read_array_header(f, version)
                shapes[key] = (tuple(shape), str(dtype))
    return _shapes_problem(shapes, d, records)


def _npy_header(path: str) -> tuple[tuple, str, bool]:
    """(shape, dtype, fortran_order) from a ``.npy`` header (``numpy.lib.format``), no data."""
    import numpy as np

    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format._read_array_header(f, version)
    return tuple(shape), str(dtype), fortran


def _npy_problem(shard: str, d: dict, records: int) -> str:
    shapes = {}
    for key, path in zip((d["x"]["key"], d["y"]["key"]), shard_files(d, shard)):
        try:
            shape, dtype, fortran = _npy_header(path)
        except (OSError, ValueError) as exc:
            return f"{Path(path).name} is not a .npy file ({exc})"
        if fortran:  # a record must be one contiguous run of bytes to be read alone
            return f"{Path(path).name} is stored in Fortran order; save it in C order"
        shapes[key] = (shape, dtype)
    return _shapes_problem(shapes, d, records)


def _shapes_problem(shapes: dict, d: dict, records: int) -> str:
    """'' if x is [records, *shape] of the described dtype and y [records] integers."""
    keys = (d["x"]["key"], d["y"]["key"])
    want_x = ((records, *d["input_shape"]), d["x"]["dtype"])
    if shapes[keys[0]] != want_x:
        return f"{keys[0]} is {shapes[keys[0]]}, the description says {want_x}"
    yshape, ydtype = shapes[keys[1]]
    if yshape != (records,) or not ydtype.startswith(("int", "uint")):
        return f"{keys[1]} is {shapes[keys[1]]}, the description says ({records},) integers"
    return ""


def _hdf5_problem(path: str, d: dict, records: int) -> str:
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError:
        return "it is not an HDF5 file"
    with f:
        shapes = {}
        for key in (d["x"]["key"], d["y"]["key"]):
            if key not in f:
                return f"it has no dataset {key!r} (it has {', '.join(f.keys())})"
            shapes[key] = (tuple(f[key].shape), str(f[key].dtype))
    return _shapes_problem(shapes, d, records)


def decoded_mb(d: dict, records: int) -> float:
    """MiB of ``records`` inputs as float32 (what the resident path holds)."""
    return records * math.prod(d["input_shape"]) * 4 / 2**20


def resident(cfg, workers: int) -> bool:
    """Whether run ``cfg`` on ``workers`` ranks holds its file dataset in memory (the rule of
    the module doc) or streams it."""
    if cfg.input != "auto":
        return cfg.input == "resident"
    d = describe(cfg.dataset)
    held = d["train_records"] if cfg.shuffle == "global" else d["train_records"] // workers
    return decoded_mb(d, held) <= RESIDENT_LIMIT_MB


_PROBLEMS = {
    "tfrecord": _tfrecord_problem,
    "npy": _npy_problem,
    "npz": _npz_problem,
    "hdf5": _hdf5_problem,
}


# -- CRC-32C (Castagnoli), masked as TFRecord masks it ------------------------------------------
def _table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's mask: ``((crc >> 15) | (crc << 17)) + 0xa282ead8`` (record_writer.cc)."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


__all__ = [
    "DESCRIPTION",
    "FORMATS",
    "RESIDENT_LIMIT_MB",
    "is_file_dataset",
    "describe",
    "check_files",
    "npy_pair",
    "shard_files",
    "resident",
    "decoded_mb",
    "masked_crc32c",
]
