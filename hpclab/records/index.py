"""A runs root's listing (:func:`list_runs`, :func:`find_finished`), cached, so a listing or a
sweep reads only the run folders that changed.

`hpclab runs`, :func:`list_runs` and a sweep's planning
(:func:`hpclab.records.sweep.plan`: which points already have a result) each needed every run's
``config.json`` and ``summary.json`` parsed, and a sweep did so once per point: O(points × runs)
JSON parses, each a file open (milliseconds apiece on a shared file system). One file beside the
runs, :data:`INDEX`, keeps what those readers take from each run folder, keyed by the folder's
name, with the inode, size and modification time (ns) its two files had when they were read (a
record is rewritten by replacing the file, so a new inode marks it even within the clock's
granularity). A look at the root stats every run folder's two files and parses only those whose
stamp moved (a new run, a run that ended, a record rewritten).

The index is a cache and never the record: when it is missing, unreadable, of another
:data:`VERSION` or cannot be written (a read-only, shared runs root), the listing is rebuilt in
memory from the run folders and reads the same. A run folder whose files cannot be read is left
out with one warning (:func:`hpclab.records.store._readable`), as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hpclab.core.config import RunConfig
from hpclab.core.engine_settings import THROUGHPUT_FIELDS, EngineSettings
from hpclab.records.store import (
    RESULTS,
    _readable,
    default_root,
    engine_settings_of,
    settle_engine_settings,
    unfinished_status,
)

log = logging.getLogger(__name__)

INDEX = ".hpclab-index.json"
VERSION = 2
#: (listing column, title, format) of a table of runs, as ``hpclab runs`` prints it; the HTML
#: report lists the runs it does not draw with the same columns
COLUMNS = (
    ("run_id", "run_id", "s"),
    ("status", "status", "s"),
    ("label", "label", "s"),
    ("workers", "workers", "d"),
    ("global_batch", "batch", "d"),
    ("val_accuracy", "val_acc", ".3f"),
    ("samples_per_sec", "samples/s", ",.0f"),
    ("wall_time_s", "wall_s", ".1f"),
)


def _plain(value):
    """Numbers as floats (a config read back from JSON may hold 1 where the RunConfig holds 1.0,
    and the two are the same setting), tuples as lists, recursively."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def config_key(config: dict, workers) -> str:
    """What makes two records the same experiment for a sweep: the config and the worker
    count (compared as ``==`` compares them: 1 and 1.0 alike), as a digest — the index stores
    this, not the whole config; :meth:`Finished.find` confirms a match with ``==``."""
    text = json.dumps(_plain({"config": config, "workers": workers}), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    """What the readers of a runs root take from one run folder."""

    name: str
    stamp: list  # [inode, size, mtime_ns] of config.json, then of summary.json (0s: absent)
    row: dict  # the listing's columns (status from summary.json, None while unfinished)
    key: str  # config_key of the settled config and the workers
    throughput: dict  # the engine settings that change throughput, as recorded
    client: dict  # config.json's `client` and `created`: whether an unfinished run still runs

    def to_json(self) -> dict:
        return self.__dict__


def _stamp(folder: Path) -> list | None:
    out = []
    for name in ("config.json", "summary.json"):
        try:
            st = os.stat(folder / name)
        except FileNotFoundError:
            if name == "config.json":
                return None
            st = None
        except OSError:
            return None
        out += [st.st_ino, st.st_size, st.st_mtime_ns] if st else [0, 0, 0]
    return out


def _label(meta: dict, fallback: str) -> str:
    try:
        return RunConfig.from_dict(meta["config"]).label(meta["workers"])
    except (ValueError, KeyError, TypeError):  # ConfigError is a ValueError
        return fallback or "?"


def listing_row(
    meta: dict,
    summary: dict,
    *,
    run_id,
    status,
    label,
    config: dict | None = None,
    workers=None,
    derived: dict | None = None,
) -> dict:
    """A run's row of a listing (``hpclab runs``, a report's table) from its ``config.json``
    (``meta``) and ``summary.json`` dicts; ``config``, ``workers`` and ``derived`` default to
    meta's own (a live run passes what it holds)."""
    if config is None:
        config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    derived = derived or meta.get("derived") or {}
    return {
        "run_id": run_id,
        "status": status,
        "name": config.get("name", ""),
        "dataset": config.get("dataset"),
        "model": config.get("model"),
        "workers": meta.get("workers") if workers is None else workers,
        "global_batch": derived.get("global_batch"),
        "lr_scaling": config.get("lr_scaling"),
        "optimizer": config.get("optimizer"),
        "precision": config.get("precision"),
        "val_accuracy": summary.get("val_accuracy"),
        "samples_per_sec": summary.get("samples_per_sec"),
        "wall_time_s": summary.get("wall_time_s"),
        "created": meta.get("created"),
        "label": label,
    }


def _read(folder: Path, stamp: list) -> Entry | None:
    files = _readable(folder / "config.json")
    if files is None:
        return None
    meta, summary = files
    meta = settle_engine_settings(meta)
    cfg = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    recorded = {**EngineSettings().to_dict(), **engine_settings_of(meta)}
    return Entry(
        name=folder.name,
        stamp=stamp,
        row=listing_row(
            meta,
            summary,
            run_id=meta.get("run_id", folder.name),
            status=summary.get("status"),
            label=_label(meta, cfg.get("name", "")),
        ),
        key=config_key(cfg, meta.get("workers")),
        throughput={k: recorded.get(k) for k in THROUGHPUT_FIELDS},
        client={"client": meta.get("client"), "created": meta.get("created")},
    )


def _load(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _save(path: Path, entries: list[Entry]) -> None:
    """Write the index atomically; a root this user cannot write keeps no index (said once at
    debug level: the listing is the same, only slower)."""
    data = {"version": VERSION, "entries": {e.name: e.to_json() for e in entries}}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:  # private, as the run folders it lists are
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, default=str))
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("runs index %s not written: %s", path, exc)
        tmp.unlink(missing_ok=True)


def scan(root: Path | str) -> list[Entry]:
    """Every readable run folder under ``root``, in name order, each parsed only if its files
    changed since the index saw them; the index is brought up to date."""
    root = Path(root)
    cached = _load(root / INDEX)
    try:
        names = sorted(d.name for d in os.scandir(root) if d.is_dir(follow_symlinks=False))
    except OSError:
        return []
    entries, changed = [], False
    for name in names:
        folder = root / name
        stamp = _stamp(folder)
        if stamp is None:
            continue
        known = cached.get(name)
        if isinstance(known, dict) and known.get("stamp") == stamp:
            try:
                entries.append(Entry(**known))
                continue
            except TypeError:  # an entry of another shape: read the folder again
                pass
        entry = _read(folder, stamp)
        changed = True
        if entry is not None:
            entries.append(entry)
    if changed or len(cached) != len(entries):
        _save(root / INDEX, entries)
    return entries


class Finished:
    """The runs under a root that ended as a result (:data:`hpclab.records.store.RESULTS`),
    looked up by config and workers — one scan for a whole sweep's planning; and the ones that
    did not (stopped, failed, abandoned) but left a checkpoint to resume from."""

    def __init__(self, root: Path | str, engine: EngineSettings | None = None):
        self.root, self.engine = Path(root), engine
        self._by_key: dict[str, list[Entry]] = {}
        self._unfinished: dict[str, list[Entry]] = {}
        for e in scan(self.root):
            into = self._by_key if e.row.get("status") in RESULTS else self._unfinished
            into.setdefault(e.key, []).append(e)

    def find(self, config: dict, workers: int) -> Path | None:
        """The folder of a run with exactly this config and worker count (and, with ``engine``,
        the same throughput settings), confirmed from its config.json; None if there is none."""
        return self._match(self._by_key, config, workers)

    def resumable(self, config: dict, workers: int) -> Path | None:
        """The newest stopped, failed or abandoned run with exactly this config and worker count
        that has a checkpoint file (``checkpoints/ckpt-*.npz``, :mod:`hpclab.rank.checkpoint`;
        whether one reads back whole is checked when it is resumed); None if there is none."""

        def can_resume(e: Entry) -> bool:
            status = e.row.get("status") or unfinished_status(e.client)
            folder = self.root / e.name / "checkpoints"
            return status in ("stopped", "failed", "abandoned") and any(folder.glob("ckpt-*.npz"))

        found = [e for e in self._unfinished.get(config_key(config, workers), []) if can_resume(e)]
        newest = sorted(found, key=lambda e: str(e.client.get("created") or ""), reverse=True)
        return self._match({"k": newest}, config, workers, key="k")

    def _match(self, table: dict, config: dict, workers: int, key: str | None = None):
        for e in table.get(key or config_key(config, workers), []):
            if self.engine is not None and any(
                e.throughput.get(k) != getattr(self.engine, k) for k in THROUGHPUT_FIELDS
            ):
                continue
            files = _readable(self.root / e.name / "config.json")  # the digest, confirmed
            if files is None:
                continue
            meta = settle_engine_settings(files[0])
            if meta.get("config") == config and meta.get("workers") == workers:
                return self.root / e.name
        return None


def list_runs(root: Path | str | None = None) -> pd.DataFrame:
    """One row per recorded run under `root` (default: hpclab.records.paths.runs_dir()), newest
    first. Read through the runs root's index (:mod:`hpclab.records.index`): only run folders
    that changed since the last look are parsed."""
    root = Path(root) if root is not None else default_root()
    rows = []
    for entry in scan(root):
        row = dict(entry.row)
        if not row.get("status"):  # no end recorded: is its client still there?
            meta = {"client": entry.client.get("client"), "created": entry.client.get("created")}
            row["status"] = unfinished_status(meta)
        row["path"] = str(root / entry.name)
        rows.append(row)
    df = pd.DataFrame(rows)
    if not df.empty:
        df = df.sort_values("created", ascending=False, na_position="last").reset_index(drop=True)
    return df


def find_finished(
    root: Path | str | None,
    config: dict,
    workers: int,
    engine: EngineSettings | None = None,
) -> Path | None:
    """The folder of a run with exactly this config and worker count that ended as one of
    :data:`RESULTS`, if any; with ``engine``, also made under the same settings that change
    throughput (:data:`hpclab.core.engine_settings.THROUGHPUT_FIELDS`; a record naming none
    was made under the defaults). For many lookups, build one :class:`Finished` instead."""
    return Finished(Path(root) if root is not None else default_root(), engine).find(
        config, workers
    )


__all__ = [
    "COLUMNS",
    "INDEX",
    "VERSION",
    "Entry",
    "Finished",
    "config_key",
    "find_finished",
    "list_runs",
    "listing_row",
    "scan",
]
