"""Which runs a report draws: its cost follows what the reader looks at, not what the root holds.

A runs root grows to thousands of records, and a report that opened and drew every one of them
cost about 45 ms and 28 kB of HTML per run (measured: 2,000 records 90 s and 56 MB). So a report
draws the curves of at most :data:`CURVES` runs, chosen by a stated rule (:data:`PICKS`: the
newest, the best by final validation accuracy, or the best of each label) among those the
reader selects (``runs``: run-id patterns;
``where``: column filters) — and lists the rest in a table read from the runs root's index
(:mod:`hpclab.records.index`), which never opens a run's history. A report of at most
:data:`CURVES` runs draws every run, as it always did.

Each drawn run's history is read thinned (:class:`hpclab.core.thinning.Thinned`): of a run
with more rows than its share of :data:`ROWS_BUDGET`, the newest half of that share exact and
the older rows evenly thinned, so one long run does not dominate the time or the file; rows
holding a held-out evaluation are all kept (steps to a target stay exact). The raw lines are
thinned before they are parsed, so a run of 10⁵ rows costs one read, not 10⁵ parses.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hpclab.core.errors import ConfigError, RecordError
from hpclab.core.thinning import Thinned
from hpclab.records import index
from hpclab.records.jsonio import read_jsonl
from hpclab.records.store import RunRecord, read_record_json
from hpclab.views.charts.facts import attr_or, column

#: The most runs whose curves one report draws (every run of a smaller report is drawn). 50:
#: a sweep of a lesson (tens of points) keeps all its curves; more lines than that are not read
#: apart in one chart anyway.
CURVES = 50
#: How to choose the drawn runs among the selected ones.
PICKS = {
    "newest": "the newest",
    "best": "the best by final validation accuracy",
    "best-per-label": "the best of each label (one per sweep point) by final validation accuracy",
}
#: History rows drawn over all drawn runs together (each run gets an equal share, at least
#: :data:`MIN_ROWS`): what bounds the report's size whatever the runs' lengths.
ROWS_BUDGET = 10_000
MIN_ROWS = 200
#: Rows of the table of the runs not drawn (the rest are counted; ``hpclab runs`` lists all).
TABLE_ROWS = 500
#: The columns a filter may name: those of :func:`hpclab.records.index.list_runs`.
FILTER_KEYS = tuple(
    "run_id status name label dataset model workers global_batch lr_scaling optimizer "
    "precision val_accuracy samples_per_sec wall_time_s created".split()
)
_EVAL = re.compile(rb'"eval_accuracy":\s*[-0-9]')  # a row holding a held-out evaluation


@dataclass
class Selection:
    """What a report draws and lists: ``drawn`` (run-likes, in the order given), ``rows`` (the
    listing row of every selected run, pick order first), ``total`` runs found, the ``rule``."""

    drawn: list
    rows: list[dict]
    total: int
    pick: str
    curves: int
    filtered: bool
    rows_each: int  # history rows kept of each drawn run
    thinned: int  # drawn runs whose history had more rows and is drawn thinned

    @property
    def hidden(self) -> int:
        """Runs found whose curves are not drawn."""
        return self.total - len(self.drawn)

    def sentence(self) -> str:
        """The rule, said in the report; empty when every run found is drawn."""
        if not self.hidden:
            return ""
        among = f" of the {len(self.rows):,} selected" if self.filtered else ""
        return (
            f"Showing curves of {len(self.drawn):,} of {self.total:,} runs: "
            f"{PICKS[self.pick]}{among} (at most {self.curves}). Pass --runs/--filter to choose "
            "and --curves to draw more (hpclab report), or runs=/where=/curves= (write_report); "
            "the table below lists the others."
        )


def rows_per_run(drawn: int) -> int:
    """History rows kept of each drawn run: an equal share of :data:`ROWS_BUDGET`."""
    return max(MIN_ROWS, ROWS_BUDGET // max(1, drawn))


def read_history(path: Path, rows: int) -> tuple[list[dict], bool]:
    """A ``metrics.jsonl`` thinned to about `rows` rows (the newest half exact) plus every
    evaluation row, as :func:`hpclab.records.jsonio.read_jsonl` reads it (lines that are not JSON
    objects skipped), and whether any row was thinned out; only the kept lines are parsed."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return [], False
    if len(lines) <= rows + 1:
        return read_jsonl(path), False
    kept = Thinned(recent=max(1, rows // 2), older=max(2, rows - rows // 2))
    for n, line in enumerate(lines):
        if line.strip():
            kept.append((n, line))
    evals = [(n, line) for n, line in enumerate(lines) if _EVAL.search(line)]
    out = []
    for _, line in sorted(set(kept.items()) | set(evals)):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out, not kept.complete


def load_thinned(folder: Path, rows: int) -> tuple[RunRecord, bool]:
    """A run folder as :func:`hpclab.records.store.load_run` reads it, history thinned (and
    whether it was)."""
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder} is not an hpclab run folder (no config.json in it).")
    history, thinned = read_history(folder / "metrics.jsonl", rows)
    record = RunRecord(
        path=folder,
        meta=read_record_json(folder / "config.json"),
        summary=read_record_json(folder / "summary.json"),
        history=pd.DataFrame(history),
        epochs=pd.DataFrame(read_jsonl(folder / "epochs.jsonl")),
    )
    return record, thinned


def _thin_frame(frame: pd.DataFrame, rows: int) -> pd.DataFrame:
    kept = Thinned(recent=max(1, rows // 2), older=max(2, rows - rows // 2))
    kept.extend(range(len(frame)))
    evals = np.flatnonzero(np.isfinite(column(frame, "eval_accuracy")))
    at = sorted(set(kept.items()) | {int(i) for i in evals})
    return frame.iloc[at].reset_index(drop=True)


def _row_of(obj: Any) -> dict:
    """A listing row of a run object (a Run, RunRecord or RunFacts) from what it holds."""
    meta = attr_or(obj, "meta", {}) or {}
    summary = attr_or(obj, "summary", {}) or {}
    cfg = attr_or(obj, "config", {}) or {}
    label = attr_or(obj, "label", "")
    return index.listing_row(
        meta,
        summary,
        run_id=str(attr_or(obj, "run_id", "") or ""),
        status=str(attr_or(obj, "status", "") or summary.get("status") or "unknown"),
        label=label() if callable(label) else label,
        config=cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg),
        workers=attr_or(obj, "workers", None),
        derived=attr_or(obj, "derived", None),
    )


def _listed(items: Iterable[Any], on_skip: Callable[[RecordError], None] | None) -> list[tuple]:
    """(listing row, the run: a folder path as text, or the object) of every run named. A runs
    root and run folders named one by one are read through their root's index (no history is
    opened). A folder of a root whose files cannot be read is skipped (``on_skip`` hears why);
    one named by itself raises the RecordError naming its file."""
    if isinstance(items, (str, os.PathLike)) or hasattr(items, "history"):
        items = [items]
    out: list[tuple[dict, Any]] = []
    named: dict[Path, list[tuple[int, str]]] = {}  # parent → (position, folder name)
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            out.append((_row_of(item), item))
            continue
        path = Path(item)
        if (path / "config.json").is_file():
            named.setdefault(path.parent, []).append((len(out), path.name))
            out.append(({}, str(path)))  # its row comes from the index below
        elif path.is_dir():
            entries = index.scan(path)
            out += [(_entry_row(e), os.path.join(path, e.name)) for e in entries]
            if on_skip is not None:
                _said_skipped(path, {e.name for e in entries}, on_skip)
        else:
            raise FileNotFoundError(
                f"{path} is neither an hpclab run folder (no config.json) nor a runs root."
            )
    for parent, wanted in named.items():
        entries = {e.name: e for e in index.scan(parent)}
        for position, name in wanted:
            entry = entries.get(name)
            if entry is None:  # unreadable: say which file, as load_run does
                record = load_thinned(parent / name, MIN_ROWS)[0]
                out[position] = (_row_of(record), record)
            else:
                out[position] = (_entry_row(entry), out[position][1])
    return [(row, run) for row, run in out if row]


def _said_skipped(root: Path, listed: set[str], on_skip: Callable[[RecordError], None]) -> None:
    """Tell `on_skip` why each run folder of `root` the index left out could not be read."""
    for d in os.scandir(root):
        folder = Path(d.path)
        if d.name in listed or not (folder / "config.json").is_file():
            continue
        try:
            read_record_json(folder / "config.json")
            read_record_json(folder / "summary.json")
        except RecordError as exc:
            on_skip(exc)


def _entry_row(entry: index.Entry) -> dict:
    row = dict(entry.row)
    row["status"] = row.get("status") or "running?"
    return row


def _matches(row: dict, runs: Sequence[str], where: dict[str, str]) -> bool:
    if runs and not any(fnmatch.fnmatchcase(str(row.get("run_id")), p) for p in runs):
        return False
    return all(_holds(row.get(key), test) for key, test in where.items())


def _holds(value: Any, test: str) -> bool:
    """`test` is a glob (``status=fin*``) or a bound (``>=0.9``, ``<=4``) on a number."""
    for op in (">=", "<="):
        if test.startswith(op):
            bound = float(test[2:])
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                return False
            return value >= bound if op == ">=" else value <= bound
    shown = format(value, "g") if isinstance(value, float) else str(value)
    return fnmatch.fnmatchcase(shown, test)


def check_where(where: dict[str, str] | None) -> dict[str, str]:
    """`where` with its keys checked against :data:`FILTER_KEYS` and its bounds as numbers."""
    where = dict(where or {})
    for key, test in where.items():
        if key not in FILTER_KEYS:
            raise ConfigError(
                f"a filter names columns of the runs listing ({', '.join(FILTER_KEYS)}); "
                f"you passed {key}={test!r}."
            )
        if test.startswith((">=", "<=")):
            try:
                float(test[2:])
            except ValueError:
                raise ConfigError(
                    f"filter {key}{test} compares with {test[2:]!r}, which is not a number."
                ) from None
    return where


def _score(item: tuple[int, dict]) -> float:
    acc = item[1].get("val_accuracy")
    return -acc if isinstance(acc, (int, float)) and math.isfinite(acc) else math.inf


def _order(pick: str, rows: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    if pick == "best":
        return sorted(rows, key=_score)
    if pick == "best-per-label":  # a sweep's points: the best seed of each, then the others
        seen: set = set()
        firsts, rest = [], []
        for r in sorted(rows, key=_score):
            (rest if r[1].get("label") in seen else firsts).append(r)
            seen.add(r[1].get("label"))
        return firsts + rest
    # newest: ISO timestamps sort as text; a run without one (old record, object) goes last
    dated = sorted((r for r in rows if r[1].get("created")), key=lambda r: str(r[1]["created"]))
    return dated[::-1] + [r for r in rows if not r[1].get("created")]


def select(
    items: Iterable[Any],
    *,
    curves: int = CURVES,
    pick: str = "newest",
    runs: Sequence[str] = (),
    where: dict[str, str] | None = None,
    on_skip: Callable[[RecordError], None] | None = None,
) -> Selection:
    """Choose the runs a report draws (see the module docstring). `items`: runs roots, run
    folders, or run objects; `runs`: run-id globs (any may match); `where`: column → glob or
    ``>=x``/``<=x`` (all must hold). Drawn runs come back loaded, history thinned."""
    if not isinstance(curves, int) or isinstance(curves, bool) or curves < 1:
        raise ConfigError(f"curves must be a whole number ≥ 1; you passed curves={curves!r}.")
    if pick not in PICKS:
        raise ConfigError(f"pick must be one of {', '.join(PICKS)}; you passed pick={pick!r}.")
    where = check_where(where)
    listed = _listed(items, on_skip)
    chosen = [(i, row) for i, (row, _) in enumerate(listed) if _matches(row, runs, where)]
    ordered = _order(pick, chosen)
    drawn_at = sorted(i for i, _ in ordered[:curves])  # drawn in the order given
    rows = rows_per_run(len(drawn_at))
    drawn, thinned = [], 0
    for i in drawn_at:
        run = listed[i][1]
        if isinstance(run, str):  # a run folder: read now
            run, cut = load_thinned(Path(run), rows)
        elif isinstance(run, RunRecord) and len(run.history) > rows:
            history, cut = _thin_frame(run.history, rows), True
            run = RunRecord(run.path, run.meta, run.summary, history, run.epochs)
        else:
            cut = False
        drawn.append(run)
        thinned += cut
    at = set(drawn_at)
    table = [dict(row, drawn=i in at) for i, row in ordered]
    return Selection(
        drawn=drawn,
        rows=table,
        total=len(listed),
        pick=pick,
        curves=curves,
        filtered=bool(runs or where),
        rows_each=rows,
        thinned=thinned,
    )


__all__ = [
    "CURVES",
    "FILTER_KEYS",
    "MIN_ROWS",
    "PICKS",
    "ROWS_BUDGET",
    "TABLE_ROWS",
    "Selection",
    "check_where",
    "load_thinned",
    "read_history",
    "rows_per_run",
    "select",
]
