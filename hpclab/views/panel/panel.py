"""The control panel: ipywidgets for every knob a workshop turns, wired to `Lab.run` and `Run.stop`.

The panel owns widgets and nothing else. It turns widget values into a `RunConfig` in one place
(:meth:`Panel.config_from_widgets`), shows the numbers of the run plan (`RunPlan.derived`) (never its own
math), starts runs with ``lab.run(cfg)``, stops them with ``run.stop()``, and hands each new run
to a live :class:`hpclab.views.panel.live.Dashboard` with the earlier runs of this panel overlaid. It never
touches ipyparallel and holds no training logic::

    lab = hpclab.Lab(workers=2)
    lab.panel()                                   # or: Panel(lab, base=preset)

``Panel(None, workers=2)`` is a preview: every knob and derived number works, Run stays disabled
(no engines are started).

This module is the wiring (state, reactions, Run and Stop); the widgets and their layout are built
in :mod:`hpclab.views.panel.widgets`, and the words and HTML it shows come from
:mod:`hpclab.views.panel.text`.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from hpclab.core import presets
from hpclab.core.catalog import STAGED_DATASETS
from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError, LabError
from hpclab.core.filedata import is_file_dataset
from hpclab.views.panel import folders, text
from hpclab.views.panel.widgets import (
    KNOBS,
    PREFERRED_MODELS,
    arrange,
    build_widgets,
    models_for,
)

MAX_OVERLAYS = 6  # earlier runs drawn under the live one (more is unreadable)

STATUS_EVERY_S = 1.0  # the status line follows a training run at most this often


class Panel:
    """Widgets for one Lab: knobs, derived numbers, Run/Stop, status line, live dashboard.

    lab:     a started `hpclab.Lab`, or None for a preview (Run disabled).
    workers: the initial value of the workers knob (default: the lab's workers, else 2).
    base:    the RunConfig the knobs start from; fields without a knob (steps_per_call, seed, …)
             are taken from it unchanged.
    preset:  without `base`, the named preset (:mod:`hpclab.core.presets`) it starts from instead.
    data_root: where the dataset menu looks for folders with a dataset.json (default: the lab's
             data_dir; :mod:`hpclab.views.panel.folders`).
    """

    def __init__(
        self,
        lab: Any = None,
        *,
        workers: int | None = None,
        base: RunConfig | None = None,
        preset: str = "workshop",
        dashboard: bool = True,
        data_root: Any = None,
    ):
        if base is not None and not isinstance(base, RunConfig):
            raise ConfigError(f"Panel.base must be a RunConfig; you passed {type(base).__name__}.")
        self.lab = lab
        self.base = base or presets.preset(preset)  # the knobs start here
        self.runs: list = []  # runs started from this panel, oldest first
        self.run = None  # the newest of them
        self.derived: dict | None = None  # RunPlan.derived() for the current knobs (None: invalid)
        self.config_error: str | None = None
        self._starting = False  # Run clicked, the lab is (re)starting or launching
        self._stopping = False
        self._note = ""  # lab/run state shown in the status line
        self._note_error = False
        self._status_at = -math.inf  # when a run's update last changed the status line
        self._lock = threading.RLock()  # widget state: kernel thread and run monitor thread
        if workers is None:
            workers = getattr(lab, "workers", None) or 2

        root = data_root if data_root is not None else getattr(lab, "data_dir", None)
        self.widgets = w = build_widgets(self.base, workers, root)

        self.dashboard = None
        if dashboard:
            from hpclab.views.panel.live import Dashboard

            self.dashboard = Dashboard(title="")

        w["dataset"].observe(self._on_dataset, names="value")
        w["dataset_path"].observe(
            lambda _change: folders.take_path(w["dataset"], w["dataset_path"], w["dataset_note"]),
            names="value",
        )
        for name in ("workers", *KNOBS):
            if name != "dataset":
                w[name].observe(lambda _change: self._refresh(), names="value")
        w["run"].on_click(self._on_run)
        w["stop"].on_click(self._on_stop)

        self.widget = arrange(w, self.dashboard.widget if self.dashboard else None)
        self._on_dataset()

    def _repr_mimebundle_(self, **kwargs):  # display(panel) shows the widget
        return self.widget._repr_mimebundle_(**kwargs)

    # -- the one place widget values become a RunConfig ---------------------------------------
    def config_from_widgets(self) -> RunConfig:
        """The RunConfig the knobs describe (`base` with every knob's value); raises ConfigError."""
        return self.base.replace(**{name: self.widgets[name].value for name in KNOBS})

    @property
    def workers(self) -> int:
        return self.widgets["workers"].value

    # -- reacting to knobs ------------------------------------------------------------------------
    def _on_dataset(self, _change: Any = None) -> None:
        w = self.widgets
        fits = models_for(w["dataset"].value, keep=w["model"].value)
        if tuple(w["model"].options) != tuple(fits):
            keep = w["model"].value
            if keep not in fits:
                keep = next((m for m in PREFERRED_MODELS if m in fits), fits[0])
            w["model"].options = fits
            w["model"].value = keep
        staged, files = w["dataset"].value in STAGED_DATASETS, is_file_dataset(w["dataset"].value)
        w["num_samples"].disabled = staged or files
        for name, plain in (("input", "auto"), ("stage", "shared")):  # a folder's knobs only
            w[name].disabled = not files
            w[name].layout.display = None if files else "none"  # (shown with a folder)
            if not files:
                w[name].value = plain
        size = (
            "its dataset.json gives its size" if files else "it is read from data/ (stage it first)"
        )
        w["samples_hint"].value = (
            f"<div style='color:{text.GREY};font-size:12px'>{text.esc(w['dataset'].value)} has a "
            f"fixed size: {size}</div>"
            if staged or files
            else ""
        )
        self._refresh()

    def _refresh(self) -> None:
        """Recompute the derived numbers and the enabled state of everything from the knobs."""
        with self._lock:
            w = self.widgets
            w["lars_eta"].layout.display = None if w["optimizer"].value == "lars" else "none"
            cfg = None
            try:
                cfg = self.config_from_widgets()
                derived = cfg.for_workers(self.workers).derived()
            except ConfigError as exc:
                self.derived, self.config_error = None, str(exc)
            else:
                self.derived, self.config_error = derived, None
            w["global_batch"].value = text.global_batch_html(self.derived)
            w["derived"].value = text.derived_html(cfg, self.derived)
            lab_workers = getattr(self.lab, "workers", None) if self.lab is not None else None
            w["workers_note"].value = text.workers_note_html(lab_workers, self.workers)
            self._show_status()

    def _show_status(self) -> None:
        w = self.widgets
        busy = self._starting or (self.run is not None and not self.run.done)
        w["run"].disabled = self.lab is None or busy or self.config_error is not None
        w["stop"].disabled = self.run is None or self.run.done or self._stopping or self._starting
        if self.lab is None:
            note, bad = text.preview_note(self.workers), False
        elif self.run is not None and not self._starting:
            note, bad = text.status_line(self.run)
            if self._stopping and not self.run.done:
                note = "stopping: every rank leaves after the same step… · " + note
        elif self._note:
            note, bad = self._note, self._note_error
        else:
            note, bad = "ready", False
        w["status"].value = text.status_html(note, bad, self.config_error)

    @property
    def status(self) -> str:
        """The status line as plain text (for tests and logs)."""
        return text.plain_text(self.widgets["status"].value)

    # -- Run and Stop -------------------------------------------------------------------------
    def _say(self, note: str, error: bool = False) -> None:
        with self._lock:
            self._note, self._note_error = note, error
            self._show_status()

    def _on_run(self, _button: Any = None) -> None:
        with self._lock:
            if self.lab is None or self._starting or (self.run is not None and not self.run.done):
                return
            try:
                cfg = self.config_from_widgets()
                cfg.for_workers(self.workers)
            except ConfigError:
                self._refresh()
                return
            self._starting, self._stopping = True, False
            self.run = None
            self._say("starting the run…")
        try:
            if self.workers != self.lab.workers:
                self._say(
                    f"restarting the engines with {text.n_workers(self.workers)} (the lab had "
                    f"{self.lab.workers}); this takes 10–30 s…"
                )
                self.lab.restart(workers=self.workers, cfg=cfg)
            elif getattr(self.lab, "lost", None):  # lab.run restarts them; say why it takes long
                self._say(
                    f"the previous engines were lost ({self.lab.lost}); restarting them, "
                    "this takes 10–30 s…"
                )
            run = self.lab.run(cfg)
        except (ConfigError, LabError) as exc:
            self._finish_start(None, f"could not start the run: {exc}")
            return
        except Exception as exc:  # shown in the panel, then raised for the kernel's log
            self._finish_start(None, f"could not start the run: {type(exc).__name__}: {exc}")
            raise
        self._finish_start(run, "")

    def _finish_start(self, run: Any, error: str) -> None:
        with self._lock:
            self._starting = False
            if run is None:
                self._say(error, error=True)
                self._refresh()
                return
            earlier = [r for r in self.runs if len(r.history)][-MAX_OVERLAYS:]
            self.runs.append(run)
            self.run = run
            self._note = ""
            if self.dashboard is not None:
                self.dashboard.clear_overlays()
                if self.widgets["overlay"].value and earlier:
                    self.dashboard.overlay([r.record() for r in earlier])
                self.dashboard.attach(run)
            self._refresh()
        run.on_update(self._on_run_update)

    def _on_run_update(self, run: Any) -> None:
        """From the run's monitor thread: new rows arrived, or the run ended.

        The status line changes at most once a second while the run trains (the run reports
        every 0.2 s; each change is a browser repaint that a 2-core machine takes from the
        ranks), and always when it ends.
        """
        with self._lock:
            if run is not self.run:
                return
            now = time.monotonic()
            if run.done:
                self._stopping = False
            elif now - self._status_at < STATUS_EVERY_S:
                return
            self._status_at = now
            self._show_status()

    def _on_stop(self, _button: Any = None) -> None:
        with self._lock:
            run = self.run
            if run is None or run.done or self._stopping:
                return
            self._stopping = True
            self._show_status()
        run.stop(timeout=0)  # writes the stop request; the run calls back when the ranks stopped


__all__ = ["Panel"]
