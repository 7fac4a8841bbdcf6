"""Checkpoints of a run's whole training state, written by rank 0 into its run folder.

A checkpoint is ``<run_dir>/checkpoints/ckpt-<step:09d>.npz``: every value of the state the
trainer broadcasts from rank 0 (weights, optimizer state, the step features' own — see
:meth:`hpclab.rank.trainer.Trainer._build_step`), in that order, plus a small JSON ``meta``
(the step, the config's model/dataset/workers, the values' shapes, and the host-side state a
call does not hold: the loss-spike detector's running mean, the noise-scale EMAs). Horovod's
own examples checkpoint the same way: rank 0 writes, a restart loads it on rank 0 and
broadcasts (``broadcast_variables``). Nothing is pickled (``allow_pickle=False``).

The write is atomic — a temporary file in the same folder, ``fsync``, ``os.replace``, then the
folder's ``fsync`` — so a crash or a walltime kill mid-write leaves the previous checkpoints
intact, never half a file under a checkpoint's name. The newest ``checkpoint_keep`` (default
:data:`KEEP`) are kept.
:func:`latest` returns the newest checkpoint that reads back whole (a zip member's CRC is
checked as it is read); a corrupt or partial one is skipped with a warning naming it.

The learning rate needs no entry: the schedule is a function of the optimizer's step, which is
part of the state; nor the data order: it is a function of (seed, epoch, step in the epoch)
(:mod:`hpclab.rank.feed`). NumPy only at import (the client calls :func:`latest`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np

FOLDER = "checkpoints"
KEEP = 2  # checkpoints kept: the newest, and one to fall back to if it is damaged
PREFIX, SUFFIX = "ckpt-", ".npz"

log = logging.getLogger(__name__)


def folder(run_dir: Path | str) -> Path:
    return Path(run_dir) / FOLDER


def name(step: int) -> str:
    return f"{PREFIX}{int(step):09d}{SUFFIX}"


def listed(run_dir: Path | str) -> list[Path]:
    """The run's checkpoint files, oldest first (names sort by step)."""
    d = folder(run_dir)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.startswith(PREFIX) and p.suffix == SUFFIX)


def write(run_dir: Path | str, step: int, values: list, meta: dict, keep: int = KEEP) -> dict:
    """Write ``values`` (arrays, in state order) and ``meta`` as step ``step``'s checkpoint,
    atomically; drop all but the newest ``keep``. Returns {"path", "bytes", "seconds"}."""
    t0 = time.perf_counter()
    d = folder(run_dir)
    d.mkdir(exist_ok=True)
    arrays = {f"v{i:05d}": np.asarray(v) for i, v in enumerate(values)}
    meta = {**meta, "step": int(step), "shapes": [list(a.shape) for a in arrays.values()]}
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    final = d / name(step)
    tmp = d / f".{final.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(d)
    for old in listed(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return {
        "path": str(final),
        "bytes": final.stat().st_size,
        "seconds": time.perf_counter() - t0,
    }


def _fsync_dir(d: Path) -> None:
    """Make the rename itself durable (POSIX: a directory's entries are its data)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load(path: Path | str) -> tuple[list[np.ndarray], dict]:
    """(values in state order, meta) of one checkpoint; ValueError naming the file if it does
    not read back whole."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(bytes(npz["meta"]).decode())
            keys = sorted(k for k in npz.files if k != "meta")
            values = [npz[k] for k in keys]  # (reading a member checks its CRC)
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise ValueError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # noqa: BLE001 — zipfile.BadZipFile and kin: a damaged file
        raise ValueError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc})") from None
    shapes = [list(v.shape) for v in values]
    if not isinstance(meta, dict) or meta.get("shapes") != shapes:
        raise ValueError(f"checkpoint {path} is unreadable (its values do not match its meta)")
    return values, meta


def read_meta(path: Path | str) -> dict:
    """Only the meta of a checkpoint (the values stay on disk)."""
    with np.load(path, allow_pickle=False) as npz:
        return json.loads(bytes(npz["meta"]).decode())


def latest(run_dir: Path | str) -> Path | None:
    """The newest checkpoint of the run that reads back whole, or None; each newer one that
    does not is named in a warning and skipped (a walltime kill mid-write, a damaged disk)."""
    for path in reversed(listed(run_dir)):
        try:
            load(path)
        except ValueError as exc:
            log.warning("%s; falling back to the previous checkpoint", exc)
            continue
        return path
    return None


class Checkpointer:
    """The trainer's side: when a call must end (a multiple of ``every`` steps), when a save is
    due (that, or ``minutes`` since the last save), the write on rank 0 (the newest ``keep``
    kept), and what the summary reports. ``every`` and ``minutes`` 0: off (and no write on a
    stop)."""

    def __init__(
        self, run_dir: Path, every: int, rank: int, meta: dict, minutes: float = 0.0, keep=KEEP
    ):
        self.run_dir, self.every, self.rank, self.meta = run_dir, int(every), rank, meta
        self.minutes, self.keep = float(minutes), int(keep)
        self.on = bool(self.every or self.minutes)
        self.written, self.seconds, self.bytes = 0, 0.0, 0
        self.last: str | None = None
        self.t_last = time.monotonic()  # (the run's start counts as a save for ``minutes``)

    def steps_to(self, step: int, total: int) -> int:
        """Steps from ``step`` to the next checkpoint (calls end there); ``total`` if off."""
        return self.every - step % self.every if self.every else total

    def due(self, step: int, status: str, total: int) -> bool:
        """A checkpoint after the call that ended at ``step``: at a multiple of ``every`` or
        ``minutes`` after the last save while the run goes on, and at the last step of a
        stopped run (to resume from). Only rank 0 writes, so only rank 0's clock matters."""
        if not self.on or step >= total:
            return False
        if status == "stopped":
            return True
        if status != "finished":
            return False
        by_steps = bool(self.every) and step % self.every == 0
        by_time = bool(self.minutes) and time.monotonic() - self.t_last >= 60 * self.minutes
        return by_steps or by_time

    def save(self, step: int, values: list, host: dict) -> float:
        """Rank 0: write step ``step``'s checkpoint; the seconds it took (0 on other ranks)."""
        if self.rank != 0:
            return 0.0
        out = write(self.run_dir, step, values, {**self.meta, "host": host}, keep=self.keep)
        self.t_last = time.monotonic()
        self.written += 1
        self.seconds += out["seconds"]
        self.bytes = out["bytes"]
        self.last = out["path"]
        return out["seconds"]

    def summary(self) -> dict | None:
        if not self.on:
            return None
        return {
            "every": self.every,
            "minutes": self.minutes,
            "keep": self.keep,
            "written": self.written,
            "seconds": self.seconds,
            "bytes": self.bytes,  # of the last one
            "last": self.last,
        }


def restore(path: str | None, state: list, rank: int, expect: dict) -> tuple[int, dict]:
    """Resume from checkpoint ``path`` (None: a fresh run, step 0): rank 0 assigns its values to
    ``state`` (the trainer broadcasts them next); every rank gets (its step, its host state).
    ValueError in one sentence if it was written by a run of another model, data set or world
    (``expect``), or for another state."""
    if path is None:
        return 0, {}
    meta = read_meta(path)
    for key, want in expect.items():
        if meta.get(key) != want:
            raise ValueError(
                f"checkpoint {path} was written with {key}={meta.get(key)!r}; this run has "
                f"{key}={want!r}, and a resume needs the same"
            )
    if rank == 0:
        values, meta = load(path)
        shapes = [list(v.shape) for v in state]
        if len(values) != len(state) or meta["shapes"] != shapes:
            raise ValueError(
                f"checkpoint {path} holds {len(values)} values of other shapes than this run's "
                f"{len(state)} state variables; it was written by another kind of run"
            )
        for variable, value in zip(state, values):
            variable.assign(value)
    return int(meta["step"]), dict(meta.get("host") or {})


def host_state(watch, noise) -> dict:
    """What a call does not carry and a bit-exact resume needs: the loss-spike detector's
    running mean (hpclab.rank.features.sdc.Guard) and the noise-scale EMAs
    (hpclab.core.metrics.NoiseScale), as JSON numbers."""
    out = {"guard_mean": [float(x) for x in watch.guard.mean]}
    if noise is not None:
        # each EMA with its dtype: float32 arithmetic must go on in float32
        out["noise"] = {
            k: None if v is None else [float(v), np.asarray(v).dtype.str]
            for k, v in (("_g2", noise._g2), ("_trace", noise._trace))
        }
        out["noise"]["count"] = int(noise.count)
    return out


def restore_host(host: dict, watch, noise, step: int) -> None:
    """Put :func:`host_state`'s values back (every rank); a rollback may return to ``step``."""
    if "guard_mean" in host:
        watch.guard.mean = np.asarray(host["guard_mean"], dtype=np.float32)
    if noise is not None and host.get("noise"):
        for key, value in host["noise"].items():
            if isinstance(value, list):
                value = np.dtype(value[1]).type(value[0])
            setattr(noise, key, value)
    if step:
        watch.guard.snapshot(step)


__all__ = [
    "Checkpointer",
    "host_state",
    "restore",
    "restore_host",
    "FOLDER",
    "KEEP",
    "folder",
    "latest",
    "listed",
    "load",
    "write",
]
