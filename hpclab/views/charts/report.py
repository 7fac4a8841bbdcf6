"""One self-contained HTML report of recorded runs: opens offline, in any browser, years later.

plotly.js is embedded inline once (``include_plotlyjs=True`` for the first figure, ``False``
after it); there are no CDN links. Every piece of text that comes from a config (names, labels,
statuses, versions) is HTML-escaped. Built from the static charts only (never the live widget).
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import plotly
import plotly.graph_objects as go

from hpclab.core.errors import ConfigError
from hpclab.records.export import run_csv
from hpclab.records.index import COLUMNS as LISTING_COLUMNS
from hpclab.records.jsonio import write_text_atomic
from hpclab.views.charts.batch_charts import accuracy_vs_batch, steps_to_target_chart
from hpclab.views.charts.comparison import compare, table_html
from hpclab.views.charts.facts import facts_of
from hpclab.views.charts.lessons import findings, in_window
from hpclab.views.charts.lr_window import lr_window_chart
from hpclab.views.charts.outcomes import default_target, describe_target
from hpclab.views.charts.report_select import CURVES, TABLE_ROWS, Selection, select
from hpclab.views.charts.scaling_charts import scaling_efficiency
from hpclab.views.charts.traces import figure

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.meta { color: #555; } .note { color: #555; font-size: 0.95em; }
table.hpclab-table, table.versions { border-collapse: collapse; font-size: 0.9em; }
table.hpclab-table th, table.hpclab-table td, table.versions td, table.versions th {
       padding: 3px 8px; border-bottom: 1px solid #eee; text-align: right; }
table.hpclab-table td:nth-child(-n+3), table.versions td { text-align: left; }
"""


def _versions(runs) -> dict[str, list[str]]:
    found: dict[str, set] = {}
    for f in runs:
        for pkg, ver in (f.summary.get("versions") or {}).items():
            found.setdefault(str(pkg), set()).add(str(ver))
    found.setdefault("plotly (report)", set()).add(plotly.__version__)
    return {k: sorted(v) for k, v in sorted(found.items())}


def _figure_html(fig: go.Figure, first: bool) -> str:
    return fig.to_html(
        full_html=False,
        include_plotlyjs=bool(first),
        include_mathjax=False,
        # the camera icon downloads the chart as SVG (vector, for slides); plotly.js does it in the
        # browser, so no image server (kaleido) is needed
        config={
            "displaylogo": False,
            "responsive": True,
            "toImageButtonOptions": {"format": "svg", "filename": "hpclab-chart"},
        },
    )


def _csv_link(run, table: str) -> str:
    """A download link carrying one of a run's tables as CSV inside the page (works offline)."""
    data = base64.b64encode(run_csv(run, table).encode()).decode()
    name = html.escape(f"{run.run_id or 'run'}-{table}.csv")
    return f'<a download="{name}" href="data:text/csv;charset=utf-8;base64,{data}">{table}</a>'


def _data_html(runs, sel: Selection) -> list[str]:
    """One row per drawn run: its label and the CSV of its history and epochs."""
    rows = "".join(
        f"<tr><td>{html.escape(f.label)}</td><td>{html.escape(f.run_id)}</td>"
        f"<td>{_csv_link(f, 'history')} · {_csv_link(f, 'epochs')}</td></tr>"
        for f in runs
    )
    return [
        "<h2>Data</h2>",
        '<p class="note">Each run\'s tables as CSV (history: one row per telemetry window; '
        "epochs: one row per epoch), exactly the numbers the charts draw. The camera icon on "
        f"every chart downloads it as SVG.{_thinned_note(sel)}</p>",
        f'<table class="hpclab-table"><tr><th>run</th><th>id</th><th>CSV</th></tr>{rows}</table>',
    ]


def _findings_html(sentences: list[str]) -> list[str]:
    """ "What these runs show": sentences computed from the runs (:mod:`hpclab.views.charts.lessons`)."""
    if not sentences:
        return []
    items = "".join(f"<li>{html.escape(s)}</li>" for s in sentences)
    return [
        "<h2>What these runs show</h2>",
        f'<ul class="findings">{items}</ul>',
        '<p class="note">Computed from the runs below (final validation accuracy, status, '
        "peak learning rate); nothing in this list is written by hand.</p>",
    ]


#: (listing column, title, format) of the table of runs not drawn: ``hpclab runs``'s columns
COLUMNS = (("run_id", "run", "s"), *LISTING_COLUMNS[1:])


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    try:
        return html.escape(format(value, fmt) if fmt != "d" else str(int(value)))
    except (TypeError, ValueError):
        return html.escape(str(value))


def rest_html(sel: Selection) -> list[str]:
    """The section listing the selected runs whose curves are not drawn (at most
    :data:`TABLE_ROWS`, in pick order; the others counted) and what all runs found ended as."""
    if not sel.hidden:
        return []
    rest = [r for r in sel.rows if not r["drawn"]]
    statuses: dict[str, int] = {}
    for r in rest:
        statuses[str(r.get("status"))] = statuses.get(str(r.get("status")), 0) + 1
    ended = ", ".join(f"{n:,} {html.escape(s)}" for s, n in statuses.items())
    head = "".join(f"<th>{t}</th>" for _, t, _ in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(k), f)}</td>" for k, _, f in COLUMNS) + "</tr>"
        for r in rest[:TABLE_ROWS]
    )
    more = len(rest) - TABLE_ROWS
    unselected = sel.total - len(sel.rows)
    notes = [f"{len(rest):,} selected runs without curves: {ended}."]
    if more > 0:
        notes.append(f"The first {TABLE_ROWS} are listed; hpclab runs lists them all.")
    if unselected:
        notes.append(f"{unselected:,} runs do not match --runs/--filter and are left out.")
    return [
        "<h2>Runs without curves</h2>",
        f'<p class="note">{" ".join(notes)}</p>',
        f'<table class="hpclab-table"><tr>{head}</tr>{body}</table>',
    ]


def _thinned_note(sel: Selection) -> str:
    if not sel.thinned:
        return ""
    return html.escape(
        f" {sel.thinned} run(s) with more than {sel.rows_each:,} history rows are drawn and "
        f"linked thinned to about {sel.rows_each:,} (the newest half exact, older rows evenly "
        "spaced, every held-out evaluation kept); the full table is in the run folder "
        "(metrics.jsonl, or RunRecord.to_csv())."
    )


def render_report(
    records_or_paths: Iterable[Any] | Selection,
    title: str = "hpclab report",
    target: float | None = None,
    *,
    curves: int = CURVES,
    pick: str = "newest",
    runs: Sequence[str] = (),
    where: dict[str, str] | None = None,
) -> str:
    """The report as one HTML string; :func:`write_report` writes it to a file.

    Contents: title, date and package versions (from the runs' summaries), the comparison table,
    the dashboard figure of all runs, and with ≥ 2 runs the sweep charts (accuracy vs batch,
    steps/time to `target` — default 90 % of the best final validation accuracy, named in the
    page — and scaling efficiency when worker counts differ).

    `records_or_paths`: runs, run folders or runs roots (every run recorded under it, listed
    through its index). The report draws the curves of at most `curves` runs: with more, those
    matching `runs` (run-id globs) and `where` (listing column → glob or ``>=x``/``<=x``),
    the `pick` first (``"newest"``, ``"best"`` final validation accuracy, or
    ``"best-per-label"``); the others are listed in a table and the page says the rule
    (:mod:`hpclab.views.charts.report_select`).
    """
    if isinstance(records_or_paths, Selection):
        sel = records_or_paths
    else:
        sel = select(records_or_paths, curves=curves, pick=pick, runs=runs, where=where)
    if not sel.drawn and sel.total:
        raise ConfigError(
            f"no run of the {sel.total:,} found matches runs={list(runs)!r}, where={where!r}; "
            "loosen --runs/--filter."
        )
    runs = facts_of(sel.drawn)
    if not runs:
        raise ValueError(
            "write_report needs at least one run; you passed none "
            "(give RunRecords, Runs or run folder paths)."
        )
    if target is None:
        target = default_target(runs)
    cmp = compare(runs, target=target)
    e = lambda s: html.escape(str(s))  # noqa: E731 - every config-derived string goes through this

    # different global batches: compare by samples seen (a step means different work per run)
    x = "samples" if len({f.global_batch for f in runs}) > 1 else "step"
    what = "samples seen" if x == "samples" else "optimizer steps"
    sections: list[tuple[str, str, go.Figure]] = [
        (
            "Runs",
            "Throughput (per rank for a single run), loss, accuracy, learning rate and "
            f"gradient noise scale of every run; x axis: {what}.",
            figure(runs, x=x),
        ),
        ("Validation accuracy and throughput", describe_target(target, runs), cmp.figure()),
    ]
    batch = [f for f in runs if not in_window(f)]  # lr-window runs get their own chart
    window = [f for f in runs if in_window(f)]
    if len(batch) >= 2:
        sections.append(
            (
                "Accuracy vs global batch",
                "Final validation accuracy per run, one line per learning-rate rule / optimizer.",
                accuracy_vs_batch(batch),
            )
        )
        sections.append(
            (
                "Steps and time to target",
                describe_target(target, runs)
                + " Open triangles: runs that never reached it, drawn at the steps/time "
                "they ran (a lower bound). Steps come from the held-out evaluations every "
                "few steps when the runs have them, else from epoch ends.",
                steps_to_target_chart(batch, target),
            )
        )
    if window:
        sections.append(
            (
                "The learning-rate window",
                "Runs tagged lr-window: one global batch, several peak learning rates per "
                "optimizer. The band where a line stays up is the range of LRs that train.",
                lr_window_chart(window),
            )
        )
    if len({f.workers for f in runs}) > 1:
        sections.append(
            (
                "Scaling efficiency",
                "Throughput and E(N) = T_N / (N·T_1) vs "
                "workers; weak scaling keeps the per-worker batch, strong scaling "
                "the global batch.",
                scaling_efficiency(runs),
            )
        )

    versions = _versions(runs)
    version_rows = "".join(
        f"<tr><th>{e(k)}</th><td>{e(', '.join(v))}</td></tr>" for k, v in versions.items()
    )
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="meta">Written {e(now)} · {_count(sel)}</p>',
        *([f'<p class="note rule">{e(sel.sentence())}</p>'] if sel.hidden else []),
        f'<table class="versions">{version_rows}</table>',
        *_findings_html(findings(runs)),
        "<h2>Comparison</h2>",
        f'<p class="note">{e(describe_target(target, runs))}</p>',
        table_html(cmp.table),
        *rest_html(sel),
    ]
    for i, (heading, note, fig) in enumerate(sections):
        parts += [
            f"<h2>{e(heading)}</h2>",
            f'<p class="note">{e(note)}</p>',
            _figure_html(fig, first=i == 0),
        ]
    parts += _data_html(runs, sel)
    parts.append("</body></html>")
    return "\n".join(parts)


def _count(sel: Selection) -> str:
    n = len(sel.drawn)
    if not sel.hidden:
        return f"{n} run{'s' if n != 1 else ''}"
    return f"{sel.total:,} runs, curves of {n}"


def write_report(
    records_or_paths: Iterable[Any] | Selection,
    path: str | os.PathLike,
    title: str = "hpclab report",
    **choose,
) -> Path:
    """Write ONE self-contained HTML file comparing the runs, atomically; returns its path.

    The page and `choose` (keywords ``target``, ``curves``, ``pick``, ``runs``, ``where``) are
    :func:`render_report`'s."""
    path = Path(path)
    page = render_report(records_or_paths, title=title, **choose)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, page, mode=0o644)  # readable by others: a report is meant to be shared
    return path
