"""The live dashboard: plotly charts of one run (plus faded earlier runs), drawing only.

Five panels, one concept each:

1. throughput — one line per rank, the global figure, and the ideal line N × (1-rank throughput)
   when a single-rank reference is known;
2. loss — training loss (live rows) and validation loss (one marker per epoch);
3. accuracy — training accuracy (live rows) and validation accuracy (one marker per epoch);
4. learning rate — shows warm-up and the schedule as the run actually used them;
5. gradient noise scale B_noise (McCandlish et al. 2018, arXiv:1812.06162) against the current
   global batch: batch ≪ B_noise → a bigger batch is almost free in steps; batch ≫ B_noise →
   diminishing returns.

The dashboard never talks to ipyparallel or the engines: it reads DataFrames (``history``,
``epochs``) from a run-like object — a :class:`hpclab.run.Run` while it trains, or a
:class:`hpclab.runs.RunRecord` read from disk — and redraws. :func:`trace_specs` turns one run's
DataFrames into trace descriptions; both the live widget (:class:`Dashboard`) and the static
figure for reports (:func:`figure`) are built from it, so they always show the same thing.

Nothing here imports TensorFlow, Horovod or ipyparallel; ipywidgets is imported only when a
:class:`Dashboard` is built.
"""

from __future__ import annotations

import html
import math
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.metrics import throughput_stats

# x-axis choices: history/epoch column → axis title shown to the user
X_AXES = {"step": "step", "samples": "samples seen", "time_s": "wall time (s)"}

# panel → (x axis, y axis) of the subplot grid built by _skeleton (row-major cell order)
PANELS = ("throughput", "loss", "accuracy", "lr", "noise")
_AXES = {
    "throughput": ("x", "y"),
    "loss": ("x2", "y2"),
    "accuracy": ("x3", "y3"),
    "lr": ("x4", "y4"),
    "noise": ("x5", "y5"),
}
_TITLES = (
    "throughput (samples/s)",
    "loss",
    "accuracy",
    "learning rate",
    "gradient noise scale B_noise vs global batch",
)
_Y_TITLES = ("samples/s", "loss", "accuracy", "learning rate", "samples")

IDEAL_NOTE = "run with 1 worker to get the ideal line"
SMOOTHING_MAX = 0.95

# colours: the current run's metrics, its ranks, and one colour per other run
_C = {
    "global": "#222222",
    "ideal": "#8c8c8c",
    "train": "#1f77b4",
    "val": "#d62728",
    "lr": "#2ca02c",
    "noise": "#9467bd",
    "batch": "#8c8c8c",
}
RANK_COLORS = (
    "rgb(102,194,165)",
    "rgb(252,141,98)",
    "rgb(141,160,203)",
    "rgb(231,138,195)",
    "rgb(166,216,84)",
    "rgb(255,217,47)",
    "rgb(229,196,148)",
    "rgb(179,179,179)",
)
RUN_COLORS = (
    "rgb(27,158,119)",
    "rgb(217,95,2)",
    "rgb(117,112,179)",
    "rgb(231,41,138)",
    "rgb(102,166,30)",
    "rgb(230,171,2)",
    "rgb(166,118,29)",
    "rgb(102,102,102)",
)


def text(value: Any) -> str:
    """Text from configs, escaped for HTML and for plotly's HTML-like labels (shows literally)."""
    return html.escape(str(value), quote=False)


# ---------------------------------------------------------------------------------------------
# what a run looks like to the drawing code
# ---------------------------------------------------------------------------------------------


@dataclass
class RunFacts:
    """The numbers the charts need from one run, read duck-typed from a Run or RunRecord."""

    label: str
    run_id: str
    workers: int
    global_batch: int | None
    config: dict
    status: str
    summary: dict
    derived: dict
    history: pd.DataFrame = field(repr=False)
    epochs: pd.DataFrame = field(repr=False)
    path: str | None = None


def _frame(value: Any) -> pd.DataFrame:
    if isinstance(value, pd.DataFrame):
        return value
    if value is None:
        return pd.DataFrame()
    return pd.DataFrame(list(value))


def _attr(obj: Any, name: str, default: Any = None) -> Any:
    try:
        value = getattr(obj, name)
    except Exception:  # noqa: BLE001 — a property that cannot answer yet (e.g. a bad config) is "unknown"
        return default
    return default if value is None else value


def run_facts(run_like: Any) -> RunFacts:
    """Normalise a Run, a RunRecord (or anything with ``history``/``epochs``/``config``/
    ``workers``) or a run folder path into :class:`RunFacts`. Missing pieces become empty."""
    if isinstance(run_like, RunFacts):
        return run_like
    if isinstance(run_like, (str, os.PathLike)):
        from hpclab.runs import load_run

        run_like = load_run(run_like)
    meta = _attr(run_like, "meta", {}) or {}
    summary = dict(_attr(run_like, "summary", {}) or {})
    cfg = _attr(run_like, "config", {}) or {}
    cfg_obj = cfg if hasattr(cfg, "to_dict") else None
    config = cfg.to_dict() if cfg_obj is not None else dict(cfg)
    workers = _attr(run_like, "workers", None) or summary.get("world_size") or 1
    try:
        workers = max(1, int(workers))
    except (TypeError, ValueError):
        workers = 1
    derived = dict(meta.get("derived") or {})
    if not derived:
        try:
            if cfg_obj is None:
                from hpclab.config import RunConfig

                cfg_obj = RunConfig.from_dict(config)
            derived = cfg_obj.derived(workers)
        except (ValueError, TypeError):
            derived = {}
    gb = derived.get("global_batch") or summary.get("global_batch")
    if gb is None and isinstance(config.get("batch_per_worker"), int):
        gb = config["batch_per_worker"] * workers
    run_id = str(_attr(run_like, "run_id", "") or meta.get("run_id") or summary.get("run_id") or "")
    label = _attr(run_like, "label", None)
    if callable(label):
        label = label()
    if not isinstance(label, str) or not label:
        try:
            if cfg_obj is None:
                from hpclab.config import RunConfig

                cfg_obj = RunConfig.from_dict(config)
            label = f"{cfg_obj.label()} ×{workers}"
        except (ValueError, TypeError):
            label = run_id or "run"
    status = _attr(run_like, "status", None) or summary.get("status") or "unknown"
    path = _attr(run_like, "path", None)
    return RunFacts(
        label=label,
        run_id=run_id,
        workers=workers,
        global_batch=int(gb) if gb else None,
        config=config,
        status=str(status),
        summary=summary,
        derived=derived,
        history=_frame(_attr(run_like, "history", None)),
        epochs=_frame(_attr(run_like, "epochs", None)),
        path=str(path) if path is not None else None,
    )


# ---------------------------------------------------------------------------------------------
# columns → arrays (tolerant: a run that just started has no rows, old records miss columns)
# ---------------------------------------------------------------------------------------------


def column(df: pd.DataFrame, name: str) -> np.ndarray:
    """Column `name` as float64 (NaN where missing or not a number); all-NaN if absent."""
    if name not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def rank_matrix(df: pd.DataFrame, workers: int) -> np.ndarray:
    """The `rank_samples_per_sec` list column as an (rows, ranks) float array."""
    n = len(df)
    cells = df["rank_samples_per_sec"].tolist() if "rank_samples_per_sec" in df.columns else []
    width = max([workers] + [len(c) for c in cells if isinstance(c, (list, tuple, np.ndarray))])
    out = np.full((n, width), np.nan)
    for i, cell in enumerate(cells):
        if isinstance(cell, (list, tuple, np.ndarray)):
            vals = pd.to_numeric(pd.Series(list(cell), dtype=object), errors="coerce")
            out[i, : len(vals)] = vals.to_numpy(dtype=float, na_value=np.nan)
    return out


def ema(values: Sequence[float], smoothing: float) -> np.ndarray:
    """Exponential moving average s_t = a·s_(t-1) + (1−a)·y_t with a = `smoothing` (0 = off).

    Same length as the input; NaN inputs stay NaN (gaps) and do not disturb the average.
    """
    y = np.asarray(values, dtype=float)
    a = float(smoothing)
    if not 0.0 <= a < 1.0:
        raise ValueError(
            f"smoothing must be from 0 to below 1; you passed smoothing={smoothing!r}."
        )
    if a == 0.0 or y.size == 0:
        return y.copy()
    out = np.full_like(y, np.nan)
    state = math.nan
    for i, v in enumerate(y):
        if math.isfinite(v):
            state = v if not math.isfinite(state) else a * state + (1.0 - a) * v
            out[i] = state
    return out


def _check_x(x: str) -> str:
    if x not in X_AXES:
        raise ValueError(
            f"x must be one of {', '.join(repr(k) for k in X_AXES)}; you passed x={x!r}."
        )
    return x


def history_x(facts: RunFacts, x: str) -> np.ndarray:
    """x values of the history rows: step, samples seen or wall time."""
    h = facts.history
    if x == "samples" and "samples" not in h.columns:
        return column(h, "step") * (facts.global_batch or np.nan)
    return column(h, x)


def epoch_x(facts: RunFacts, x: str) -> np.ndarray:
    """x values of the epoch rows (samples = step × global batch when not recorded)."""
    e = facts.epochs
    if x == "samples" and "samples" not in e.columns:
        return column(e, "step") * (facts.global_batch or np.nan)
    return column(e, x)


def _span(xs: np.ndarray) -> np.ndarray:
    finite = xs[np.isfinite(xs)]
    return np.array([finite.min(), finite.max()]) if finite.size else np.array([])


def _last(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if finite.size else math.nan


# ---------------------------------------------------------------------------------------------
# one function turns a run into trace specs; the widget and the static figure both use it
# ---------------------------------------------------------------------------------------------


@dataclass
class TraceSpec:
    """One line on one panel: a stable key, the data, and plotly properties (name, style...)."""

    key: str
    panel: str
    x: np.ndarray
    y: np.ndarray
    props: dict = field(default_factory=dict)

    def trace(self) -> go.Scatter:
        xaxis, yaxis = _AXES[self.panel]
        return go.Scatter(x=self.x, y=self.y, xaxis=xaxis, yaxis=yaxis, **self.props)


def trace_specs(
    run_like: Any,
    *,
    x: str = "step",
    smoothing: float = 0.0,
    role: str = "main",
    ideal_single_rank: float | None = None,
    color: str | None = None,
    key_prefix: str = "",
) -> list[TraceSpec]:
    """The traces that draw one run.

    role="main": the run in full detail (per-rank throughput, ideal line, train/val curves,
    LR, noise scale with the global batch as a reference line). role="run" (one of several runs in
    a static figure) and role="overlay" (an earlier run under the live one, dashed and faded)
    draw the run in one colour, without per-rank lines, with legends naming its config.
    Smoothing (EMA) applies to loss, accuracy and throughput; epoch markers are never smoothed.
    """
    _check_x(x)
    if role not in ("main", "run", "overlay"):
        raise ValueError(f"role must be 'main', 'run' or 'overlay'; you passed role={role!r}.")
    f = run_facts(run_like)
    h, e = f.history, f.epochs
    hx, ex = history_x(f, x), epoch_x(f, x)
    sm = lambda v: ema(v, smoothing)  # noqa: E731 - a local shorthand
    specs: list[TraceSpec] = []

    def add(key, panel, xs, ys, **props):
        specs.append(
            TraceSpec(
                key_prefix + key,
                panel,
                np.asarray(xs, dtype=float),
                np.asarray(ys, dtype=float),
                props,
            )
        )

    if role == "main":
        ranks = rank_matrix(h, f.workers)
        for r in range(ranks.shape[1]):
            add(
                f"thr/rank{r}",
                "throughput",
                hx,
                sm(ranks[:, r]),
                name=f"rank {r}",
                mode="lines",
                line=dict(width=1, color=RANK_COLORS[r % len(RANK_COLORS)]),
            )
        add(
            "thr/global",
            "throughput",
            hx,
            sm(column(h, "samples_per_sec")),
            name="global",
            mode="lines",
            line=dict(width=2.5, color=_C["global"]),
        )
        ref = ideal_single_rank if ideal_single_rank and math.isfinite(ideal_single_rank) else None
        span = _span(hx)
        if ref is not None:
            add(
                "thr/ideal",
                "throughput",
                span,
                np.full(span.size, f.workers * ref),
                name=f"ideal {f.workers} × {ref:,.0f}",
                mode="lines",
                visible=True,
                line=dict(width=1.5, dash="dot", color=_C["ideal"]),
            )
        else:
            add(
                "thr/ideal",
                "throughput",
                [],
                [],
                name="ideal",
                mode="lines",
                visible=False,
                line=dict(width=1.5, dash="dot", color=_C["ideal"]),
            )
        add(
            "loss/train",
            "loss",
            hx,
            sm(column(h, "loss")),
            name="train loss",
            mode="lines",
            line=dict(color=_C["train"]),
        )
        add(
            "loss/val",
            "loss",
            ex,
            column(e, "val_loss"),
            name="val loss",
            mode="lines+markers",
            marker=dict(size=7, color=_C["val"]),
            line=dict(width=1, color=_C["val"]),
        )
        add(
            "acc/train",
            "accuracy",
            hx,
            sm(column(h, "accuracy")),
            name="train accuracy",
            mode="lines",
            line=dict(color=_C["train"]),
        )
        add(
            "acc/val",
            "accuracy",
            ex,
            column(e, "val_accuracy"),
            name="val accuracy",
            mode="lines+markers",
            marker=dict(size=7, color=_C["val"]),
            line=dict(width=1, color=_C["val"]),
        )
        add(
            "lr",
            "lr",
            hx,
            column(h, "lr"),
            name="learning rate",
            mode="lines",
            line=dict(color=_C["lr"]),
        )
        add(
            "noise",
            "noise",
            hx,
            column(h, "noise_scale"),
            name="B_noise",
            mode="lines",
            line=dict(color=_C["noise"]),
        )
        gb = f.global_batch
        add(
            "noise/batch",
            "noise",
            span if gb else [],
            np.full(span.size if gb else 0, gb or 0.0),
            name=f"global batch {gb}" if gb else "global batch",
            mode="lines",
            line=dict(width=1.5, dash="dash", color=_C["batch"]),
        )
        return specs

    overlay = role == "overlay"
    col = color or RUN_COLORS[0]
    name = text(f.label)
    style = dict(legendgroup=key_prefix or name, name=name, opacity=0.55 if overlay else 1.0)
    dash = "dash" if overlay else "solid"
    tip = lambda what: f"{name}<br>{what}: %{{y:.4g}}<extra></extra>"  # noqa: E731
    add(
        "thr/global",
        "throughput",
        hx,
        sm(column(h, "samples_per_sec")),
        mode="lines",
        showlegend=True,
        line=dict(color=col, dash=dash),
        hovertemplate=tip("samples/s"),
        **style,
    )
    add(
        "loss/train",
        "loss",
        hx,
        sm(column(h, "loss")),
        mode="lines",
        showlegend=False,
        line=dict(color=col, dash=dash),
        hovertemplate=tip("train loss"),
        **style,
    )
    add(
        "acc/train",
        "accuracy",
        hx,
        sm(column(h, "accuracy")),
        mode="lines",
        showlegend=False,
        line=dict(color=col, dash=dash, width=1),
        hovertemplate=tip("train accuracy"),
        **style,
    )
    add(
        "acc/val",
        "accuracy",
        ex,
        column(e, "val_accuracy"),
        mode="lines+markers",
        showlegend=False,
        marker=dict(size=6, color=col, symbol="circle-open" if overlay else "circle"),
        line=dict(color=col, dash=dash, width=1.5),
        hovertemplate=tip("val accuracy"),
        **style,
    )
    add(
        "lr",
        "lr",
        hx,
        column(h, "lr"),
        mode="lines",
        showlegend=False,
        line=dict(color=col, dash=dash),
        hovertemplate=tip("learning rate"),
        **style,
    )
    add(
        "noise",
        "noise",
        hx,
        column(h, "noise_scale"),
        mode="lines",
        showlegend=False,
        line=dict(color=col, dash=dash),
        hovertemplate=tip("B_noise"),
        **style,
    )
    return specs


def notes(run_like: Any, ideal_single_rank: float | None = None) -> dict[str, str]:
    """The short sentences shown inside panels (ideal-line hint, noise-scale lesson)."""
    f = run_facts(run_like)
    out = {"ideal_note": "", "noise_note": ""}
    if not ideal_single_rank and f.workers > 1:
        out["ideal_note"] = IDEAL_NOTE
    b_noise = _last(column(f.history, "noise_scale"))
    gb = f.global_batch
    if f.workers < 2:
        out["noise_note"] = "B_noise needs ≥ 2 workers (local vs global gradient)"
    elif gb and math.isfinite(b_noise) and b_noise > 0:
        ratio = gb / b_noise
        if ratio < 0.5:
            lesson = "batch ≪ B_noise: a bigger batch still cuts steps almost for free"
        elif ratio > 2:
            lesson = "batch ≫ B_noise: diminishing returns, more batch buys few fewer steps"
        else:
            lesson = "batch ≈ B_noise: near the critical batch size"
        out["noise_note"] = f"B = {gb:,}, B_noise ≈ {b_noise:,.0f} → {lesson}"
    return out


def single_rank_reference(current: Any, candidates: Iterable[Any]) -> float | None:
    """Throughput of a finished 1-worker run with the same data, model, per-worker batch and
    precision as `current` — the reference for the ideal line — or None."""
    cur = run_facts(current).config
    keys = ("dataset", "model", "batch_per_worker", "precision", "image_shape", "steps_per_call")
    for cand in candidates:
        f = run_facts(cand)
        if f.workers != 1 or any(f.config.get(k) != cur.get(k) for k in keys):
            continue
        value = f.summary.get("samples_per_sec")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            value = throughput_stats(column(f.history, "samples_per_sec")).mean
        if math.isfinite(value) and value > 0:
            return float(value)
    return None


# ---------------------------------------------------------------------------------------------
# figure skeleton shared by the widget and the static figure
# ---------------------------------------------------------------------------------------------


def _skeleton(cls: type, title: str, x: str) -> go.Figure:
    base = make_subplots(
        rows=3,
        cols=2,
        specs=[[{}, {}], [{}, {}], [{"colspan": 2}, None]],
        subplot_titles=_TITLES,
        vertical_spacing=0.1,
        horizontal_spacing=0.09,
    )
    fig = base if cls is go.Figure else cls(base)
    fig.update_layout(
        title=dict(text=text(title)) if title else None,
        height=860,
        template="plotly_white",
        margin=dict(l=60, r=20, t=80 if title else 50, b=50),
        legend=dict(orientation="v", groupclick="togglegroup", font=dict(size=11)),
    )
    for i, panel in enumerate(PANELS):
        xa, ya = _AXES[panel]
        fig.layout[xa.replace("x", "xaxis")].title = X_AXES[x]
        fig.layout[ya.replace("y", "yaxis")].title = _Y_TITLES[i]
    fig.layout.yaxis3.range = [0, 1.02]
    fig.layout.yaxis.rangemode = "tozero"  # throughput: scale differences read honestly
    for name, (xa, ya), where in (
        ("ideal_note", _AXES["throughput"], (0.01, 0.99)),
        ("noise_note", _AXES["noise"], (0.01, 0.99)),
    ):
        fig.add_annotation(
            name=name,
            text="",
            showarrow=False,
            xref=f"{xa} domain",
            yref=f"{ya} domain",
            x=where[0],
            y=where[1],
            xanchor="left",
            yanchor="top",
            font=dict(size=11, color="#555"),
            align="left",
        )
    return fig


def _set_notes(fig: go.Figure, texts: dict[str, str]) -> None:
    for ann in fig.layout.annotations:
        if ann.name in texts:
            ann.text = text(texts[ann.name])


def _set_x_titles(fig: go.Figure, x: str) -> None:
    for panel in PANELS:
        fig.layout[_AXES[panel][0].replace("x", "xaxis")].title.text = X_AXES[x]


def figure(
    records: Any,
    x: str = "step",
    *,
    title: str = "",
    smoothing: float = 0.0,
    ideal_single_rank: float | None = None,
) -> go.Figure:
    """A static plotly Figure with the dashboard's panels, for HTML reports.

    One run is drawn in full detail (per-rank throughput, ideal line when a single-rank
    reference is given or found among `records`); several runs are drawn one colour each.
    `records`: RunRecords, Runs or run folder paths (or one of them).
    """
    _check_x(x)
    if isinstance(records, (str, os.PathLike)) or hasattr(records, "history"):
        records = [records]
    facts = [run_facts(r) for r in records]
    fig = _skeleton(go.Figure, title, x)
    if len(facts) == 1:
        ref = ideal_single_rank or single_rank_reference(facts[0], facts)
        specs = trace_specs(facts[0], x=x, smoothing=smoothing, role="main", ideal_single_rank=ref)
        _set_notes(fig, notes(facts[0], ref))
    else:
        specs = []
        for i, f in enumerate(facts):
            specs += trace_specs(
                f,
                x=x,
                smoothing=smoothing,
                role="run",
                color=RUN_COLORS[i % len(RUN_COLORS)],
                key_prefix=f"run{i}/",
            )
    fig.add_traces([s.trace() for s in specs])
    return fig


# ---------------------------------------------------------------------------------------------
# the live widget
# ---------------------------------------------------------------------------------------------


class Dashboard:
    """Live charts of one run with earlier runs overlaid; display ``dash.widget``.

    ``dash.attach(run)`` follows a training run: the run calls back from its background thread
    after new rows arrive; redraws are throttled to one per ``min_interval_s`` and a trailing
    timer makes sure the newest rows never wait longer than ``max_wait_s``; the final state is
    always drawn when the run is done. Every redraw only replaces trace x/y arrays inside
    ``fig.batch_update()`` (one message to the browser).
    """

    def __init__(
        self,
        title: str = "",
        *,
        ideal_single_rank: float | None = None,
        min_interval_s: float = 0.5,
        max_wait_s: float = 2.0,
    ):
        import ipywidgets as W  # imported here so `import hpclab.views.live` stays fast

        self.title = title
        self.ideal_single_rank = ideal_single_rank
        self.min_interval_s = float(min_interval_s)
        self.max_wait_s = float(max_wait_s)
        self.x = "step"
        self.smoothing = 0.0
        self.log_loss = False
        self.redraws = 0  # how many times the figure was (re)drawn
        self.fig = _skeleton(go.FigureWidget, title, self.x)
        self._source: Any = None  # the run-like currently shown
        self._facts: RunFacts | None = None  # its snapshot for the redraw in progress
        self._overlays: list[RunFacts] = []
        self._keys: list[str] = []  # trace keys in figure order
        self._main_keys: list[str] = []
        self._lock = threading.RLock()  # drawing: run thread, timer thread, widget events
        self._tlock = threading.Lock()  # throttle state
        self._attached: Any = None
        self._last_draw = -math.inf
        self._timer: threading.Timer | None = None

        self._x_ctl = W.ToggleButtons(
            options=[(label, key) for key, label in X_AXES.items()],
            value="step",
            description="x axis",
            style={"button_width": "110px"},
        )
        self._smooth_ctl = W.FloatSlider(
            value=0.0,
            min=0.0,
            max=SMOOTHING_MAX,
            step=0.05,
            description="smoothing",
            readout_format=".2f",
            continuous_update=False,
        )
        self._log_ctl = W.Checkbox(value=False, description="log-y loss", indent=False)
        self._status = W.HTML(value="")
        self._x_ctl.observe(lambda c: self._on_x(c["new"]), names="value")
        self._smooth_ctl.observe(lambda c: self._on_smoothing(c["new"]), names="value")
        self._log_ctl.observe(lambda c: self._on_log(c["new"]), names="value")
        self.widget = W.VBox(
            [W.HBox([self._x_ctl, self._smooth_ctl, self._log_ctl]), self._status, self.fig]
        )

    def _repr_mimebundle_(self, **kwargs):  # display(dash) shows the widget
        return self.widget._repr_mimebundle_(**kwargs)

    # -- controls (programmatic setters move the widgets, whose observers redraw) ---------------
    def set_x(self, x: str) -> None:
        self._x_ctl.value = _check_x(x)

    def set_smoothing(self, smoothing: float) -> None:
        ema([], smoothing)  # validates
        self._smooth_ctl.value = min(float(smoothing), SMOOTHING_MAX)

    def set_log_loss(self, on: bool) -> None:
        self._log_ctl.value = bool(on)

    def _on_x(self, x: str) -> None:
        with self._lock:
            self.x = x
            with self.fig.batch_update():
                _set_x_titles(self.fig, x)
            self._redraw_all()

    def _on_smoothing(self, value: float) -> None:
        with self._lock:
            self.smoothing = float(value)
            self._redraw_all()

    def _on_log(self, on: bool) -> None:
        with self._lock:
            self.log_loss = bool(on)
            self.fig.layout.yaxis2.type = "log" if on else "linear"

    # -- what is drawn ------------------------------------------------------------------------
    # One snapshot of the main run per redraw: a live Run builds a fresh DataFrame on every
    # `history` access, so read it once and draw everything from that copy.
    def _snap(self) -> None:
        self._facts = run_facts(self._source) if self._source is not None else None

    def _ideal(self) -> float | None:
        if self.ideal_single_rank:
            return self.ideal_single_rank
        if self._facts is None:
            return None
        return single_rank_reference(self._facts, self._overlays)

    def _main_specs(self) -> list[TraceSpec]:
        if self._facts is None:
            return []
        return trace_specs(
            self._facts,
            x=self.x,
            smoothing=self.smoothing,
            role="main",
            ideal_single_rank=self._ideal(),
        )

    def _overlay_specs(self) -> list[TraceSpec]:
        specs = []
        for i, f in enumerate(self._overlays):
            specs += trace_specs(
                f,
                x=self.x,
                smoothing=self.smoothing,
                role="overlay",
                color=RUN_COLORS[i % len(RUN_COLORS)],
                key_prefix=f"ov{i}/",
            )
        return specs

    def _status_html(self) -> str:
        f = self._facts
        if f is None:
            return ""
        parts = [
            f"<b>{text(self.title)}</b>" if self.title else "",
            text(f.label),
            f"status: {text(f.status)}",
        ]
        step = _last(column(f.history, "step"))
        if math.isfinite(step):
            parts.append(f"step {step:,.0f}")
        thr = _last(column(f.history, "samples_per_sec"))
        if math.isfinite(thr):
            parts.append(f"{thr:,.0f} samples/s")
        if f.global_batch:
            parts.append(
                f"global batch {f.global_batch:,} ({f.workers} × {f.global_batch // f.workers:,})"
            )
        return " · ".join(p for p in parts if p)

    def _decorate(self) -> None:
        _set_notes(
            self.fig,
            notes(self._facts, self._ideal())
            if self._facts is not None
            else {"ideal_note": "", "noise_note": ""},
        )
        self._status.value = self._status_html()

    def _rebuild(self) -> None:
        """Replace all traces (structure changed: new run, overlays, rank count)."""
        self._snap()
        main, over = self._main_specs(), self._overlay_specs()
        specs = main + over
        self.fig.data = []
        if specs:
            self.fig.add_traces([s.trace() for s in specs])
        self._keys = [s.key for s in specs]
        self._main_keys = [s.key for s in main]
        with self.fig.batch_update():
            self._decorate()
        self.redraws += 1

    def _assign(self, specs: list[TraceSpec]) -> None:
        """The cheap path: same traces, new x/y arrays, one batched message."""
        index = {k: i for i, k in enumerate(self._keys)}
        with self.fig.batch_update():
            for s in specs:
                tr = self.fig.data[index[s.key]]
                tr.x, tr.y = s.x, s.y
                if "visible" in s.props:
                    tr.visible = s.props["visible"]
                if s.props.get("name") is not None:
                    tr.name = s.props["name"]
            self._decorate()
        self.redraws += 1

    def _redraw_all(self) -> None:
        self._snap()
        specs = self._main_specs() + self._overlay_specs()
        if [s.key for s in specs] != self._keys:
            self._rebuild()
        else:
            self._assign(specs)

    # -- public API -----------------------------------------------------------------------------
    def show_run(self, run_like: Any) -> None:
        """Show this run (a Run or RunRecord) as the main run, replacing the previous one."""
        with self._lock:
            self._source = run_like
            self._rebuild()

    def update(self, run_like: Any = None) -> None:
        """Redraw the main run from its current DataFrames (only x/y arrays are replaced)."""
        with self._lock:
            if run_like is not None and run_like is not self._source:
                self._source = run_like
            self._snap()
            specs = self._main_specs()
            if [s.key for s in specs] != self._main_keys:
                self._rebuild()
            else:
                self._assign(specs)

    def overlay(self, records: Iterable[Any]) -> None:
        """Draw earlier runs (RunRecords, Runs or run folder paths) dashed and faded underneath."""
        if isinstance(records, (str, os.PathLike)) or hasattr(records, "history"):
            records = [records]
        with self._lock:
            self._overlays += [run_facts(r) for r in records]
            self._rebuild()

    def clear_overlays(self) -> None:
        with self._lock:
            self._overlays = []
            self._rebuild()

    @property
    def overlays(self) -> list[RunFacts]:
        return list(self._overlays)

    def trace(self, key: str) -> Any:
        """The figure's trace for a spec key (e.g. 'thr/global', 'thr/rank1', 'ov0/acc/val')."""
        return self.fig.data[self._keys.index(key)]

    # -- following a live run -----------------------------------------------------------------
    def attach(
        self, run: Any, *, min_interval_s: float | None = None, max_wait_s: float | None = None
    ) -> None:
        """Follow `run`: show it now and redraw (throttled) whenever it calls back.

        `run` needs ``on_update(callback)`` (called as ``callback(run)`` after new rows and once
        at the end), ``done``, and the DataFrames every run-like has.
        """
        self.detach()
        if min_interval_s is not None:
            self.min_interval_s = float(min_interval_s)
        if max_wait_s is not None:
            self.max_wait_s = float(max_wait_s)
        with self._tlock:
            self._attached = run
            self._last_draw = time.monotonic()
        self.show_run(run)
        run.on_update(self._on_run_update)

    def detach(self) -> None:
        """Stop following the attached run (its later callbacks are ignored)."""
        with self._tlock:
            self._attached = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _on_run_update(self, run: Any) -> None:
        with self._tlock:
            if run is not self._attached:
                return
            now = time.monotonic()
            waited = now - self._last_draw
            if bool(_attr(run, "done", False)) or waited >= self.min_interval_s:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                self._last_draw = now
                draw = True
            else:
                draw = False
                if self._timer is None:  # trailing redraw: the newest rows never wait long
                    delay = min(self.min_interval_s - waited, self.max_wait_s)
                    self._timer = threading.Timer(delay, self._trailing, args=(run,))
                    self._timer.daemon = True
                    self._timer.start()
        if draw:
            self.update(run)

    def _trailing(self, run: Any) -> None:
        with self._tlock:
            self._timer = None
            if run is not self._attached:
                return
            self._last_draw = time.monotonic()
        self.update(run)
