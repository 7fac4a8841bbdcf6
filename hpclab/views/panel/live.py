"""The live dashboard widget: one run redrawn as it trains, earlier runs faded underneath.

:class:`Dashboard` owns a plotly ``FigureWidget`` (the six panels of
:mod:`hpclab.views.charts.skeleton`), three controls (x axis, smoothing, log-y loss) and a status line.
It draws only: it never talks to ipyparallel or the engines. It reads DataFrames (``history``,
``epochs``) from a run-like object — a :class:`hpclab.cluster.run.Run` while it trains, or a
:class:`hpclab.records.store.RunRecord` read from disk — and redraws from the same trace specs as the
static report figure (:func:`hpclab.views.charts.traces.trace_specs`).

The run calls back from its background thread (its monitor): the callback only takes the rows
that are new (``run.rows_since``, O(new)) into the dashboard's own bounded copy — the newest
1,000 rows exact, older ones thinned to at most 1,000 more (:class:`hpclab.core.thinning.Thinned`)
— so a redraw costs the same after ten hours as after ten seconds; redraws happen on the
dashboard's own drawing thread, never on the monitor's (which must keep polling, stopping and
watching the ranks), are throttled, and serialised with locks here. ipywidgets is imported only
when a :class:`Dashboard` is built. Static charts never import this module.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go

from hpclab.core.thinning import Thinned
from hpclab.views.charts.facts import (
    X_AXES,
    RunFacts,
    attr_or,
    check_x,
    column,
    ema,
    last_finite,
    run_facts,
    text,
)
from hpclab.views.charts.skeleton import RUN_COLORS, set_notes, set_x_titles, skeleton
from hpclab.views.charts.traces import TraceSpec, notes, single_rank_reference, trace_specs

SMOOTHING_MAX = 0.95
#: The smoothing slider's start: an EMA over about 2.5 rows, enough to read the loss of windows
#: that cover a few steps, short enough to follow a change within a few seconds.
DEFAULT_SMOOTHING = 0.6
#: Points a live trace keeps: the newest exactly, older ones thinned (≤ 2,000 a trace).
LIVE_RECENT, LIVE_OLDER = 1000, 1000


class _Follow:
    """A live run's rows as the dashboard draws them: its own bounded copy, fed O(new)."""

    def __init__(self, run: Any):
        self.run = run
        self.rows = Thinned(LIVE_RECENT, LIVE_OLDER)
        self.epochs = Thinned(LIVE_RECENT, LIVE_OLDER)
        self.next_row, self.last_epoch = 0, 0
        self.lock = threading.Lock()
        self.take()

    def take(self) -> None:
        """The rows and epoch rows that arrived since the last take (the monitor's thread)."""
        rows, n = self.run.rows_since(self.next_row)
        epochs = self.run.epoch_rows(after=self.last_epoch)
        with self.lock:
            self.rows.extend(rows)
            self.epochs.extend(epochs)
            self.next_row = n
            if epochs:
                self.last_epoch = epochs[-1]["epoch"]

    def view(self) -> Any:
        """The run as the charts read it, with ``history``/``epochs`` from the bounded copy."""
        import pandas as pd

        with self.lock:
            rows, epochs = self.rows.items(), self.epochs.items()
        return _LiveView(self.run, pd.DataFrame(rows), pd.DataFrame(epochs))


class _LiveView:
    def __init__(self, run: Any, history: Any, epochs: Any):
        self._run, self.history, self.epochs = run, history, epochs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)


class Dashboard:
    """Live charts of one run with earlier runs overlaid; display ``dash.widget``.

    ``dash.attach(run)`` follows a training run: the run calls back from its background thread
    after new rows arrive; redraws are throttled to one per ``min_interval_s`` and a trailing
    redraw makes sure the newest rows never wait longer than ``max_wait_s``; the final state is
    always drawn when the run is done. A redraw costs the browser CPU that, on a laptop, the
    ranks share, so redraws are rare (benchmarks/README.md has the measurement). Every redraw
    only replaces trace x/y arrays inside ``fig.batch_update()`` (one message to the browser).
    """

    def __init__(
        self,
        title: str = "",
        *,
        ideal_single_rank: float | None = None,
        smoothing: float = DEFAULT_SMOOTHING,
        min_interval_s: float = 2.0,
        max_wait_s: float = 2.0,
    ):
        import ipywidgets as W  # imported here so `import hpclab.views.panel.live` stays fast

        self.title = title
        self.ideal_single_rank = ideal_single_rank
        self.min_interval_s = float(min_interval_s)
        self.max_wait_s = float(max_wait_s)
        self.x = "step"
        ema([], smoothing)  # validates
        self.smoothing = min(float(smoothing), SMOOTHING_MAX)
        self.log_loss = False
        self.redraws = 0  # how many times the figure was (re)drawn
        self.fig = skeleton(go.FigureWidget, title, self.x)
        self._source: Any = None  # the run-like currently shown
        self._facts: RunFacts | None = None  # its snapshot for the redraw in progress
        self._overlays: list[RunFacts] = []
        self._keys: list[str] = []  # trace keys in figure order
        self._main_keys: list[str] = []
        self._lock = threading.RLock()  # drawing: drawing thread, widget events
        self._tlock = threading.Condition()  # throttle state; wakes the drawing thread
        self._attached: Any = None
        self._last_draw = -math.inf
        self._due: float | None = None  # monotonic time of the next scheduled redraw
        self._drawer: threading.Thread | None = None  # one drawing thread while attached
        self._follow: _Follow | None = None  # the attached run's bounded copy (a live Run)
        self._idle = threading.Event()  # no redraw scheduled or running
        self._idle.set()

        self._x_ctl = W.ToggleButtons(
            options=[(label, key) for key, label in X_AXES.items()],
            value="step",
            description="x axis",
            style={"button_width": "110px"},
        )
        self._smooth_ctl = W.FloatSlider(
            value=self.smoothing,
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
        self._x_ctl.value = check_x(x)

    def set_smoothing(self, smoothing: float) -> None:
        ema([], smoothing)  # validates
        self._smooth_ctl.value = min(float(smoothing), SMOOTHING_MAX)

    def set_log_loss(self, on: bool) -> None:
        self._log_ctl.value = bool(on)

    def _on_x(self, x: str) -> None:
        with self._lock:
            self.x = x
            with self.fig.batch_update():
                set_x_titles(self.fig, x)
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
        follow = self._follow
        source = follow.view() if follow is not None and follow.run is self._source else None
        source = source if source is not None else self._source
        self._facts = run_facts(source) if source is not None else None

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
        step = last_finite(column(f.history, "step"))
        if math.isfinite(step):
            parts.append(f"step {step:,.0f}")
        thr = last_finite(column(f.history, "samples_per_sec"))
        if math.isfinite(thr):
            parts.append(f"{thr:,.0f} samples/s")
        if f.global_batch:
            parts.append(
                f"global batch {f.global_batch:,} ({f.workers} × {f.global_batch // f.workers:,})"
            )
        return " · ".join(p for p in parts if p)

    def _decorate(self) -> None:
        set_notes(
            self.fig,
            notes(self._facts, self._ideal())
            if self._facts is not None
            else {"ideal_note": "", "noise_note": "", "pop_note": ""},
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
            self._follow = _Follow(run) if hasattr(run, "rows_since") else None
        self.show_run(run)
        run.on_update(self._on_run_update)

    def detach(self) -> None:
        """Stop following the attached run (its later callbacks are ignored)."""
        with self._tlock:
            self._attached = None
            self._follow = None
            self._due = None
            self._drawer = None  # (it ends by itself; the next attach starts its own)
            self._idle.set()
            self._tlock.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no redraw is scheduled or running (True), or ``timeout`` s (False)."""
        return self._idle.wait(timeout)

    def _on_run_update(self, run: Any) -> None:
        """The run's callback, on its monitor thread: take the new rows (O(new)) and schedule
        a redraw on the dashboard's drawing thread — at once if one is due or the run is done,
        else when the interval ends (the newest rows never wait longer than ``max_wait_s``)."""
        with self._tlock:
            if run is not self._attached:
                return
            follow = self._follow
        if follow is not None:
            follow.take()
        with self._tlock:
            if run is not self._attached:
                return
            now = time.monotonic()
            waited = now - self._last_draw
            if bool(attr_or(run, "done", False)) or waited >= self.min_interval_s:
                due = now
            else:
                due = now + min(self.min_interval_s - waited, self.max_wait_s)
            if self._due is not None and self._due <= due:
                return  # a redraw is scheduled already, as soon; it will read these rows
            self._due = due
            self._idle.clear()
            if self._drawer is None:
                # one long-lived thread draws (not a thread per redraw: glibc gives each new
                # thread's allocations an arena, and the arenas' pages stay with the process)
                self._drawer = threading.Thread(
                    target=self._draw_loop, args=(run,), name="hpclab-dashboard", daemon=True
                )
                self._drawer.start()
            self._tlock.notify_all()

    def _draw_loop(self, run: Any) -> None:
        """The drawing thread of one attached run: redraw when due; end when detached."""
        while True:
            with self._tlock:
                while True:
                    if run is not self._attached:
                        if self._drawer is threading.current_thread():
                            self._drawer = None
                        return
                    if self._due is None:
                        self._idle.set()
                        if bool(attr_or(run, "done", False)):  # its final state is drawn
                            self._drawer = None
                            return
                        self._tlock.wait()
                        continue
                    wait = self._due - time.monotonic()
                    if wait <= 0:
                        break
                    self._tlock.wait(wait)
                self._due = None
                self._last_draw = time.monotonic()
            self.update(run)
