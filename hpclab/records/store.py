"""Run records on disk: one folder per run, written atomically, readable after a kernel restart.

Layout (see docs/architecture.md)::

    runs/<run_id>/config.json     what was asked for, plus the derived numbers
    runs/<run_id>/metrics.jsonl   one live-history row per line (appended as rows arrive)
    runs/<run_id>/epochs.jsonl    one row per finished epoch
    runs/<run_id>/summary.json    the outcome (written last, atomically)
    runs/<run_id>/STOP            present while a stop is requested

JSON files are replaced atomically (write to a temp file in the same folder, fsync, rename), so
a crash or a full disk leaves the previous complete version, never half a file. JSONL appends
are line-sized; a torn last line (crash mid-write) is skipped when reading.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hpclab.core.engine_settings import FORMER_RUN_CONFIG_FIELDS
from hpclab.core.errors import RecordError
from hpclab.records.jsonio import (
    append_jsonl,
    dumps,
    read_json,
    read_jsonl,
    write_json_atomic,
    write_text_atomic,
)

STOP_FILE = "STOP"
log = logging.getLogger(__name__)


def read_record_json(path: Path) -> dict:
    """A run folder's JSON object ({} when the file is absent); RecordError naming the file when
    it is half-written, not JSON, not an object, or not a file at all."""
    try:
        data = read_json(path)
    except (ValueError, OSError) as exc:  # JSONDecodeError, UnicodeDecodeError, IsADirectoryError
        raise RecordError(
            f"{path} is not a run file hpclab can read ({type(exc).__name__}: {exc}); "
            "a half-written or foreign file: remove it, or the run folder"
        ) from None
    if not isinstance(data, dict):
        raise RecordError(
            f"{path} holds a JSON {type(data).__name__}, not the object hpclab writes; "
            "remove it, or the run folder"
        )
    for key, kinds in _SHAPE.get(path.name, {}).items():
        if data.get(key) is not None and not isinstance(data[key], kinds):
            raise RecordError(
                f"{path} holds {key}={data[key]!r}, where hpclab writes a "
                f"{' or '.join(k.__name__ for k in kinds)}; a foreign file: remove it, or the "
                "run folder"
            )
    return data


_NUMBER = (int, float)
#: The keys listings, reports and sweeps read from a run's files, and the types hpclab writes
#: there (None is always allowed: a key may be absent or unknown).
_SHAPE: dict[str, dict[str, tuple]] = {
    "config.json": {
        "config": (dict,),
        "workers": (int,),
        "derived": (dict,),
        "created": (str,),
        "client": (dict,),
        "lab": (dict,),
        "run_id": (str,),
    },
    "summary.json": {
        "status": (str,),
        "error": (str,),
        "val_accuracy": _NUMBER,
        "samples_per_sec": _NUMBER,
        "wall_time_s": _NUMBER,
        "steps": (int,),
        "time_split": (dict,),
        "sdc": (dict,),
    },
}


def _readable(cfg_path: Path) -> tuple[dict, dict] | None:
    """(config.json, summary.json) of a run folder, or None after one warning naming the file."""
    try:
        return read_record_json(cfg_path), read_record_json(cfg_path.parent / "summary.json")
    except RecordError as exc:
        log.warning("skipping a run: %s", exc)
        return None


def settle_engine_settings(meta: dict) -> dict:
    """A config.json's content with the engine settings where this version keeps them.

    The rule: Horovod's cycle time and fusion buffer were RunConfig fields
    (``hvd_cycle_time_ms``, ``hvd_fusion_mb``) before the Lab owned them as
    :class:`hpclab.core.engine_settings.EngineSettings`; a record written then holds them in
    ``meta["config"]``. They move to ``meta["lab"]["engine_settings"]`` (``cycle_time_ms``,
    ``fusion_mb``), where the Lab records its settings now, so the config loads as a RunConfig and
    every reader finds the settings in one place. A value already under ``lab`` wins. ``meta`` is
    not changed (a new dict is returned) and the file is never rewritten."""
    config = meta.get("config")
    if not isinstance(config, dict) or not set(FORMER_RUN_CONFIG_FIELDS) & set(config):
        return meta
    moved = {new: config[old] for old, new in FORMER_RUN_CONFIG_FIELDS.items() if old in config}
    lab = dict(meta.get("lab") or {})
    lab["engine_settings"] = {**moved, **(lab.get("engine_settings") or {})}
    kept = {k: v for k, v in config.items() if k not in FORMER_RUN_CONFIG_FIELDS}
    return {**meta, "config": kept, "lab": lab}


def engine_settings_of(meta: dict) -> dict:
    """The engine settings a record names (``meta["lab"]["engine_settings"]``, after
    :func:`settle_engine_settings`); {} for a record that names none."""
    lab = settle_engine_settings(meta).get("lab")
    found = lab.get("engine_settings") if isinstance(lab, dict) else None
    return dict(found) if isinstance(found, dict) else {}


def default_root() -> Path:
    """Where runs are recorded: $HPCLAB_RUNS, else <checkout>/runs (see hpclab.records.paths)."""
    from hpclab.records.paths import runs_dir

    return runs_dir()


def new_run_id() -> str:
    now = _dt.datetime.now()
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


@dataclass
class RunRecord:
    """A run as recorded on disk (also what `compare`, `report` and the dashboard overlay read)."""

    path: Path
    meta: dict = field(default_factory=dict)  # config.json
    summary: dict = field(default_factory=dict)  # summary.json ({} while running)
    history: pd.DataFrame = field(default_factory=pd.DataFrame)
    epochs: pd.DataFrame = field(default_factory=pd.DataFrame)

    def __post_init__(self) -> None:
        self.meta = settle_engine_settings(self.meta)  # records from before EngineSettings

    @property
    def run_id(self) -> str:
        return self.meta.get("run_id", self.path.name)

    @property
    def config(self) -> dict:
        return self.meta.get("config", {})

    @property
    def workers(self) -> int:
        return int(self.meta.get("workers", self.summary.get("world_size", 1)))

    @property
    def status(self) -> str:
        if self.summary.get("status"):
            return self.summary["status"]
        return unfinished_status(self.meta, alive="running") if self.meta else "unknown"

    @property
    def label(self) -> str:
        """Legend text: the config's label plus the worker count."""
        from hpclab.core.config import RunConfig

        try:
            return RunConfig.from_dict(self.config).label(self.workers)
        except ValueError:
            return f"{self.run_id} ×{self.workers}"

    def to_csv(self, path=None, table: str = "history"):
        """The run's `history` (default) or `epochs` as CSV text, or written to `path`
        (:func:`hpclab.records.export.run_csv`; one column per rank for per-rank lists)."""
        from hpclab.records.export import run_csv

        return run_csv(self, table, path)


#: Set to "group" to share a runs folder with your Unix group (files 0640 in 0750 folders; give
#: the runs root to the group and set its setgid bit yourself). Default: private to you.
SHARE_ENV = "HPCLAB_SHARE_RUNS"


def modes() -> tuple[int, int]:
    """(file mode, folder mode) of run records: (0o600, 0o700), or group-readable when
    $HPCLAB_SHARE_RUNS is 'group' (run records hold paths, hosts and pids)."""
    return (0o640, 0o750) if os.environ.get(SHARE_ENV) == "group" else (0o600, 0o700)


class RunStore:
    """Writes one run's folder. The client-side `Run` owns one; nothing else writes there."""

    def __init__(self, root: Path | str | None = None, run_id: str | None = None):
        self.root = Path(root) if root is not None else default_root()
        self.run_id = run_id or new_run_id()
        self.path = self.root / self.run_id
        self.file_mode, self.folder_mode = modes()

    def create(self, meta: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=False)
        os.chmod(self.path, self.folder_mode)  # whatever the umask
        write_json_atomic(
            self.path / "config.json",
            {**meta, "run_id": self.run_id, "created": _dt.datetime.now().isoformat()},
            self.file_mode,
        )

    def reopen(self, from_step: int, meta: dict) -> None:
        """Continue this existing run folder from step ``from_step`` (a resume from a
        checkpoint): history and epoch rows after that step go (the resumed ranks train those
        steps again and send them anew), so do the previous summary (the run is running again;
        its word goes into ``meta``) and a STOP file left behind; ``meta`` is merged into
        config.json (the client that runs it now, the resumes so far)."""
        if not (self.path / "config.json").is_file():
            raise RecordError(f"{self.path} is not an hpclab run folder (no config.json in it).")
        kept = [r for r in read_jsonl(self.path / "metrics.jsonl") if r.get("step", 0) <= from_step]
        self.rewrite_history(kept)
        epochs = read_jsonl(self.path / "epochs.jsonl")
        self.rewrite_epochs([r for r in epochs if r.get("step", 0) <= from_step])
        config = read_record_json(self.path / "config.json")
        write_json_atomic(self.path / "config.json", {**config, **meta}, self.file_mode)
        (self.path / "summary.json").unlink(missing_ok=True)
        self.stop_file.unlink(missing_ok=True)

    def append_history(self, rows: list[dict]) -> None:
        append_jsonl(self.path / "metrics.jsonl", rows, self.file_mode)

    def rewrite_history(self, rows: list[dict]) -> None:
        """Replace the history with `rows` in one atomic write (rows that arrived late, after
        the client was away longer than the live messages reach back, take their place)."""
        text = "".join(dumps(r, sort_keys=True) + "\n" for r in rows)
        write_text_atomic(self.path / "metrics.jsonl", text, self.file_mode)

    def append_epochs(self, rows: list[dict]) -> None:
        append_jsonl(self.path / "epochs.jsonl", rows, self.file_mode)

    def rewrite_epochs(self, rows: list[dict]) -> None:
        """Replace the epoch rows with `rows` in one atomic write (as rewrite_history)."""
        text = "".join(dumps(r, sort_keys=True) + "\n" for r in rows)
        write_text_atomic(self.path / "epochs.jsonl", text, self.file_mode)

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(self.path / "summary.json", summary, self.file_mode)

    @property
    def stop_file(self) -> Path:
        return self.path / STOP_FILE

    def request_stop(self) -> None:
        """Write the STOP file rank 0 polls; a deleted run folder is made again for it (and an
        empty file needs no free blocks, so a full disk still takes it)."""
        self.path.mkdir(mode=self.folder_mode, parents=True, exist_ok=True)
        self.stop_file.touch(mode=self.file_mode)


def load_run(path: Path | str) -> RunRecord:
    """Read a run folder (finished or not). Raises FileNotFoundError naming the folder."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not an hpclab run folder (no config.json in it).")
    return RunRecord(
        path=path,
        meta=read_record_json(path / "config.json"),
        summary=read_record_json(path / "summary.json"),
        history=pd.DataFrame(read_jsonl(path / "metrics.jsonl")),
        epochs=pd.DataFrame(read_jsonl(path / "epochs.jsonl")),
    )


def unfinished_status(meta: dict, alive: str = "running?") -> str:
    """A run without a summary: 'abandoned' when the process that ran it (config.json's
    `client`, on this host) is gone — killed before it could record an end (its engines were
    ended by hpclab.cluster.reaper) — else `alive` (it may still run, or runs on another host)."""
    import platform

    import psutil

    client = meta.get("client") or {}
    pid, created = client.get("pid"), meta.get("created")
    if client.get("host") != platform.node() or not isinstance(pid, int):
        return alive
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return "abandoned"
    # the same pid, reused by a process started after the run was created, is not its client
    created_s = _created_epoch(created)
    return "abandoned" if created_s is not None and started > created_s + 1 else alive


def _created_epoch(created) -> float | None:
    try:
        return _dt.datetime.fromisoformat(str(created)).timestamp()
    except ValueError:
        return None


#: End states that are results of the config (seeded: a re-run ends the same way); a sweep reuses
#: them. Stopped and failed runs are not results.
RESULTS = ("finished", "diverged", "collapsed")
