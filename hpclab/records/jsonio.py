"""Strict JSON on disk: cleaning values, atomic replacement, JSON-lines append and read.

One home for how hpclab writes files: run records, reports, benchmark results and the CLI's
`--json` output all go through here. Atomic writes use a temp file in the same folder, fsync and
rename, so a crash or a full disk leaves the previous complete version, never half a file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def clean(value: Any) -> Any:
    """A strict-JSON-safe copy: NaN/inf become None, numpy scalars and arrays become Python."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        try:
            return clean(value.tolist())
        except (TypeError, ValueError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` of the cleaned value (never writes NaN, which is not JSON)."""
    return json.dumps(clean(value), allow_nan=False, **kwargs)


def write_text_atomic(path: Path | str, text: str, mode: int | None = None) -> None:
    """Replace `path` with `text` atomically (temp file + fsync + rename).

    The file is private (0600, from mkstemp) unless `mode` says otherwise.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json_atomic(path: Path | str, data: Any, mode: int | None = None) -> None:
    """Replace `path` with `data` as indented, key-sorted strict JSON, atomically."""
    write_text_atomic(path, dumps(data, indent=1, sort_keys=True), mode)


def read_json(path: Path | str) -> dict:
    """The JSON object in `path`, or {} when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def append_jsonl(path: Path | str, rows: Iterable[dict], mode: int = 0o600) -> None:
    """Append rows to a JSON-lines file (one write call for the batch); a new file gets `mode`
    (private by default, like the atomic writes), whatever the umask."""
    text = "".join(dumps(r, sort_keys=True) + "\n" for r in rows)
    if text:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode & 0o666)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(text)


def read_jsonl(path: Path | str) -> list[dict]:
    """Rows of a JSON-lines file. A line that is not a JSON object is skipped: a torn last line
    (a crash mid-append) silently, any other (bytes that are not UTF-8, a foreign line) with
    one warning naming the file and how many lines were skipped."""
    rows, bad = [], 0
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return rows
    torn = lines[-1]  # the text after the last newline: empty, or a line cut short
    for line in lines[:-1]:
        row = _json_object(line)
        if row is None:
            bad += 1
        else:
            rows.append(row)
    if torn.strip() and (row := _json_object(torn)) is not None:
        rows.append(row)
    if bad:
        log.warning("%s: skipped %d line(s) that are not JSON objects", path, bad)
    return rows


def _json_object(line: bytes) -> dict | None:
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


__all__ = [
    "clean",
    "dumps",
    "write_text_atomic",
    "write_json_atomic",
    "read_json",
    "append_jsonl",
    "read_jsonl",
]
