"""What the control panel says: its status line and derived-number lines, as text and HTML.

Pure functions of a run, a RunConfig and `RunPlan.derived`'s numbers (never the panel's own
math); no ipywidgets here, so they test in microseconds. :mod:`hpclab.views.panel.panel` puts them on
screen.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from hpclab.core.config import RunConfig

RED, GREY = "#b00020", "#555"


def esc(value: Any) -> str:
    return html.escape(str(value), quote=False)


def n_workers(n: int) -> str:
    return f"{n} worker" + ("" if n == 1 else "s")


def last_number(frame: Any, column: str) -> float | None:
    """The newest finite value of a history column (the first rows may carry None/NaN)."""
    if column not in frame:
        return None
    values = [
        v
        for v in frame[column].tolist()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ]
    return float(values[-1]) if values else None


def status_line(run: Any) -> tuple[str, bool]:
    """(text, is_error) describing a run's state, for the status line."""
    history = run.history
    total = run.config.for_workers(run.workers).total_steps
    step = int(last_number(history, "step") or 0)
    if run.status == "running":
        if not step:
            return (
                f"running on {n_workers(run.workers)}: starting (the first run on fresh engines "
                "imports TensorFlow and builds the data, which takes a while)…",
                False,
            )
        parts = [f"running: step {step:,}/{total:,}"]
        epoch, speed = last_number(history, "epoch"), last_number(history, "samples_per_sec")
        if epoch is not None:
            parts.append(f"epoch {epoch:.2f}")
        if speed is not None:
            parts.append(f"{speed:,.0f} samples/s")
        return " · ".join(parts), False
    summary = run.summary or {}
    val = summary.get("val_accuracy")
    acc = f"val accuracy {val:.3f}" if isinstance(val, (int, float)) else "no validation yet"
    steps = summary.get("steps") or step
    wall = summary.get("wall_time_s")
    took = f" in {wall:.1f} s" if isinstance(wall, (int, float)) else ""
    if run.status == "finished":
        return f"finished: {acc} after {steps:,} steps{took} (run {run.run_id})", False
    if run.status == "collapsed":
        return f"collapsed: {run.error} (run {run.run_id})", True
    if run.status == "stopped":
        return f"stopped at step {steps:,}/{total:,}: {acc} (run {run.run_id})", False
    return f"{run.status}: {run.error or 'no reason was recorded'}", True


def global_batch_html(derived: dict | None) -> str:
    """`× 2 workers = 128 global`, beside the batch-per-worker knob."""
    if derived is None:
        return f"<span style='color:{GREY}'>global batch —</span>"
    return (
        f"<span style='line-height:28px'>× {n_workers(derived['workers'])} "
        f"= <b>{derived['global_batch']:,}</b> global</span>"
    )


def derived_html(cfg: RunConfig | None, derived: dict | None) -> str:
    """The derived-numbers line: global batch, peak LR and its rule, steps, warm-up, samples."""
    if cfg is None or derived is None:
        return f"<span style='color:{GREY}'>derived numbers: —</span>"
    d = derived
    return (
        f"<div style='margin:6px 0'>global batch <b>{d['global_batch']:,}</b> · "
        f"peak LR <b>{d['peak_lr']:.4g}</b> ({esc(cfg.lr_scaling)} rule, base "
        f"{cfg.base_lr:g} at batch {cfg.base_batch:,}) · "
        f"<b>{d['steps_per_epoch']:,}</b> steps/epoch · "
        f"<b>{d['total_steps']:,}</b> steps in all · {esc(cfg.for_workers(d['workers']).warmup_text())} · "
        f"{d['train_samples_per_worker']:,} samples per worker</div>"
    )


def workers_note_html(lab_workers: int | None, knob: int) -> str:
    """A note when the workers knob differs from the lab's size (Run restarts the engines)."""
    if lab_workers is None or lab_workers == knob:
        return ""
    return (
        f"<span style='color:{GREY};font-size:12px;line-height:1.3'>the lab has "
        f"{lab_workers}: Run restarts<br>the engines first</span>"
    )


def preview_note(workers: int) -> str:
    return (
        "preview: no lab is running — start one with "
        f"lab = hpclab.Lab(workers={workers}) and show lab.panel()"
    )


def status_html(note: str, bad: bool, config_error: str | None) -> str:
    """The status line: the lab/run note (red if bad), then any ConfigError sentence in red."""
    lines = [f"<span style='color:{RED if bad else 'inherit'}'>{esc(note)}</span>"]
    if config_error is not None:
        lines.append(f"<span style='color:{RED}'>{esc(config_error)}</span>")
    return "<div style='margin-left:10px;line-height:1.4'>" + "<br>".join(lines) + "</div>"


def plain_text(markup: str) -> str:
    """HTML as plain text, one line per <br> (for tests and logs)."""
    return html.unescape(re.sub(r"<br>", "\n", re.sub(r"<(?!br>)[^>]+>", "", markup)))


__all__ = [
    "status_line",
    "global_batch_html",
    "derived_html",
    "workers_note_html",
    "preview_note",
    "status_html",
    "plain_text",
]
