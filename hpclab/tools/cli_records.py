"""``hpclab report`` and ``hpclab runs``: what is recorded on disk, as an HTML report or a table.

Neither starts engines; both read run folders (``runs/<run_id>/config.json`` and friends).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpclab.records.index import COLUMNS
from hpclab.tools.cli_progress import say

# ---------------------------------------------------------------------------------------------
# hpclab report
# ---------------------------------------------------------------------------------------------


def configure_report(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpclab report``."""
    parser.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="run folders, or a runs root (every run recorded under it)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("report.html"),
        metavar="FILE",
        help="the HTML file to write (default: report.html)",
    )
    parser.add_argument("--title", default="hpclab report", help="title of the report")
    parser.add_argument(
        "--curves",
        type=int,
        default=None,
        metavar="N",
        help="draw the curves of at most N runs (default: 50); the others are listed in a table",
    )
    parser.add_argument(
        "--pick",
        choices=("newest", "best", "best-per-label"),
        default="newest",
        help="which runs get curves when there are more than --curves: the newest (default), "
        "the best by final validation accuracy, or the best of each label (one per sweep point)",
    )
    parser.add_argument(
        "--runs",
        action="append",
        default=[],
        metavar="PATTERN",
        help="only runs whose run_id matches this glob (repeat: any of them)",
    )
    parser.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only runs whose listing column KEY (as in hpclab runs: status, model, workers, "
        "val_accuracy, ...) matches VALUE, a glob, or KEY>=X / KEY<=X for numbers (repeat: all)",
    )


def run_folders(paths: Sequence[Path]) -> list[Path]:
    """Run folders named directly, or every run under a runs root; FileNotFoundError otherwise."""
    found: list[Path] = []
    for path in paths:
        if (path / "config.json").is_file():
            found.append(path)
            continue
        if not path.is_dir():
            raise FileNotFoundError(
                f"{path} does not exist; give run folders (runs/<run_id>) or "
                "a runs root such as runs/."
            )
        inside = sorted(p.parent for p in path.glob("*/config.json"))
        if not inside:
            raise FileNotFoundError(
                f"{path} is neither an hpclab run folder (no config.json) nor "
                "a runs root with run folders in it."
            )
        found.extend(inside)
    return list(dict.fromkeys(found))


def _filters(given: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE``, ``KEY>=X``, ``KEY<=X`` → {KEY: VALUE or ">=X" or "<=X"}."""
    from hpclab.core.errors import ConfigError

    out = {}
    for text in given:
        for op in (">=", "<=", "="):
            key, sep, value = text.partition(op)
            if sep and key:
                out[key.strip()] = (op if op != "=" else "") + value.strip()
                break
        else:
            raise ConfigError(
                f"--filter takes KEY=VALUE, KEY>=X or KEY<=X (e.g. status=finished); "
                f"you passed --filter {text!r}."
            )
    return out


def report(args: argparse.Namespace) -> int:
    """``hpclab report``: write the HTML report and print its path. Runs roots are listed
    through their index; only the runs whose curves are drawn are opened
    (:mod:`hpclab.views.charts.report_select`)."""
    from hpclab.core.errors import RecordError
    from hpclab.views.charts.report import write_report
    from hpclab.views.charts.report_select import CURVES, select

    if missing := [p for p in args.paths if not p.is_dir()]:
        run_folders(missing)  # a mistyped path: one sentence before any work
    store_log = logging.getLogger("hpclab.records.store")
    level = store_log.level
    store_log.setLevel(logging.ERROR)  # a skipped run is said once, by the line below
    try:
        sel = select(
            args.paths,
            curves=CURVES if args.curves is None else args.curves,
            pick=args.pick,
            runs=args.runs,
            where=_filters(args.filter),
            on_skip=lambda exc: say(f"hpclab report: skipping a run: {exc}"),
        )
    finally:
        store_log.setLevel(level)
    if not sel.total:
        run_folders(args.paths)  # a folder with no run folders in it: said so
        raise RecordError(f"no readable run in {', '.join(map(str, args.paths))}")
    path = write_report(sel, args.output, title=args.title)
    print(path, flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# hpclab runs
# ---------------------------------------------------------------------------------------------


def configure_runs(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpclab runs``."""
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where runs are recorded (default: $HPCLAB_RUNS, the profile's, <checkout>/runs if writable, else your own folder)",
    )


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if fmt == "d" and isinstance(value, float) and value.is_integer():
        value = int(value)  # pandas stores an int column with a gap as float
    try:
        return format(value, fmt)
    except (TypeError, ValueError):
        return str(value)


def show_runs(args: argparse.Namespace) -> int:
    """``hpclab runs``: one table row per recorded run."""
    from hpclab.records import paths
    from hpclab.records.index import list_runs

    root = args.runs_dir or paths.runs_dir()
    if args.runs_dir is not None and root.is_file():
        raise FileNotFoundError(
            f"{root} is a file; give the folder your runs are recorded in (--runs-dir)."
        )
    if args.runs_dir is not None and not root.is_dir():
        raise FileNotFoundError(
            f"{root} does not exist; give the folder your runs are recorded in (--runs-dir)."
        )
    df = list_runs(root)
    if df.empty:
        print(f"no runs recorded in {root}")
        return 0
    rows = []
    for _, r in df.iterrows():
        row = r.to_dict()
        row["label"] = row.get("label") or row.get("name") or "?"
        rows.append([_fmt(row.get(key), fmt) for key, _, fmt in COLUMNS])
    header = [title for _, title, _ in COLUMNS]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    right = {i for i, (_, _, fmt) in enumerate(COLUMNS) if fmt != "s"}

    def line(cells):
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    print(line(header))
    for row in rows:
        print(line(row))
    print(f"{len(rows)} run(s) in {root}")
    return 0


__all__ = ["configure_report", "report", "run_folders", "configure_runs", "show_runs"]
