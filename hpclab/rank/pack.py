"""Packing a file dataset into one file on node-local storage (``RunConfig.stage="pack"``).

FanStore's idea: Zhang, Z., Huang, L., Manor, U., Fang, L., Merlo, G., Michoski, C., Cazes, J.,
Gaffney, N., "FanStore: Enabling Efficient and Scalable I/O for Distributed Deep Learning",
arXiv:1809.10799, 2018 (TACC). FanStore packs a dataset's many small files into a few large
ones spread over the nodes' local storage, keeps their index in memory and serves the
application's POSIX calls from it, so training stops sending an ``open``/``stat`` per file to
the shared file system's metadata servers. Here, simpler: one rank per node writes every shard
file of the dataset once, back to back, into ``pack.bin`` (each member at a 4 KiB boundary) with
an index ``pack.json`` (member → offset, size; the sources' sizes and modification times, so a
pack of unchanged files is kept), and the rank's readers take their bytes from the pack through
one open file (``os.pread``) — no interception, the lab's own readers know the pack.

What packing saves is file opens and metadata operations, not bytes: a rank opens the pack once
(and maps each ``npy`` member once) instead of opening each of its shard files every epoch on the
shared file system; the bytes read are the same. On one machine's page cache the two cost about
the same; the difference is a shared file system's per-operation latency times the opens
(:mod:`hpclab.rank.probes.stores` counts them for the I/O lesson).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import threading
import time
from pathlib import Path

import numpy as np

from hpclab.core.filedata import shard_files

PACK, INDEX = "pack.bin", "pack.json"
ALIGN = 4096  # members start on a page: a mapped npy member's rows stay aligned


def _members(d: dict, folder: str) -> dict[str, str]:
    """Every file behind the description, by its name relative to the dataset's folder."""
    out = {}
    for split in ("train", "validation"):
        for shard in d[f"{split}_files"]:
            for src in shard_files(d, shard):
                out[os.path.relpath(src, folder)] = src
    return out


def write(d: dict, folder: str, target: Path, writer: bool) -> tuple[dict, dict]:
    """The description with its files read from the pack in ``target``, and what packing did.
    Only the ``writer`` (local rank 0) writes; the caller's barrier makes the others wait."""
    t0 = time.perf_counter()
    members = _members(d, folder)
    info = {"to": str(target / PACK), "files": len(members), "packed_mb": 0.0, "kept_mb": 0.0}
    info["shared_opens"] = 0  # files this rank opened on the dataset's own storage to pack them
    if writer:
        stats = {rel: os.stat(src) for rel, src in members.items()}
        sources = {rel: [st.st_size, st.st_mtime_ns] for rel, st in stats.items()}
        size = sum(s for s, _ in sources.values()) / 2**20
        try:  # kept: the same sources, and the pack the index describes is whole
            index = json.loads((target / INDEX).read_text())
            kept = index["sources"] == sources and (target / PACK).stat().st_size == index["size"]
        except (OSError, ValueError, KeyError):
            kept = False
        if kept:
            info["kept_mb"] = size
        else:
            _write_pack(members, sources, target)
            info["packed_mb"], info["shared_opens"] = size, len(members)
    moved = dict(d, pack=Pack(target))
    for split in ("train", "validation"):
        moved[f"{split}_files"] = [
            str(target / os.path.relpath(s, folder)) for s in d[f"{split}_files"]
        ]
    info["seconds"] = time.perf_counter() - t0
    return moved, info


def _write_pack(members: dict, sources: dict, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    (target / INDEX).unlink(missing_ok=True)  # (no index ever describes another pack)
    tmp = target / f"{PACK}.{os.getpid()}.tmp"
    index = {}
    with open(tmp, "wb") as out:
        for rel, src in members.items():
            out.seek(-out.tell() % ALIGN, os.SEEK_CUR)  # (a hole, not written bytes)
            offset = out.tell()
            with open(src, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
            index[rel] = [offset, out.tell() - offset]
        out.truncate()
        size = out.tell()
    os.replace(tmp, target / PACK)  # (a reader never sees half a pack)
    tmp_index = target / f"{INDEX}.{os.getpid()}.tmp"
    tmp_index.write_text(json.dumps({"members": index, "sources": sources, "size": size}))
    os.replace(tmp_index, target / INDEX)


class Pack:
    """A node's pack, opened on first use: its members' bytes by the path a member would have
    in the pack's folder, read through one file descriptor. ``opens`` counts the opens of the
    pack (once, plus one per npy member it maps)."""

    def __init__(self, folder: Path):
        self.folder, self.fd, self.members, self.opens = Path(folder), None, None, 0
        self.maps: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # (tf.data's parallel calls: one map per member)
        self._open_lock = threading.Lock()

    def where(self, path: str) -> tuple[int, int]:
        with self._open_lock:  # (parallel readers: one open)
            if self.fd is None:
                self.members = json.loads((self.folder / INDEX).read_text())["members"]
                self.fd = os.open(self.folder / PACK, os.O_RDONLY)
                self.opens += 1
        return tuple(self.members[os.path.relpath(path, self.folder)])

    def read(self, path: str) -> bytes:
        """A member's bytes (one ``pread``)."""
        offset, size = self.where(path)
        return os.pread(self.fd, size, offset)

    def file(self, path: str) -> io.BytesIO:
        """A member as a file object in memory (for np.load of an npz, h5py of an HDF5 file)."""
        return io.BytesIO(self.read(path))

    def records(self, path: str) -> np.ndarray:
        """A TFRecord member's records (framing of record_writer.cc: length, its CRC, data, the
        data's CRC; the CRCs were checked before engines started, on the sources)."""
        buf, out, at = self.read(path), [], 0
        while at + 12 <= len(buf):
            (length,) = struct.unpack_from("<Q", buf, at)
            out.append(buf[at + 12 : at + 12 + length])
            at += 12 + length + 4
        return np.array(out, dtype=object)

    def mapped(self, path: str) -> np.ndarray:
        """An npy member mapped read-only from the pack (its rows read only when touched),
        once per pack."""
        with self._lock:
            if path not in self.maps:
                self.maps[path] = self._map(path)
            return self.maps[path]

    def _map(self, path: str) -> np.ndarray:
        offset, size = self.where(path)
        f = io.BytesIO(os.pread(self.fd, min(size, 1 << 16), offset))
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format._read_array_header(f, version)
        self.opens += 1  # (np.memmap opens the file to map it)
        order = "F" if fortran else "C"
        return np.memmap(self.folder / PACK, dtype, "r", offset + f.tell(), shape, order)

    def __del__(self, _close=os.close):
        # os.close bound at definition: at interpreter exit the module's globals may already be
        # None when the last Pack is collected ("'NoneType' object has no attribute 'close'").
        if self.fd is not None:
            _close(self.fd)


__all__ = ["PACK", "INDEX", "Pack", "write"]
