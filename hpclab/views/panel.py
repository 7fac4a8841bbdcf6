"""The control panel: ipywidgets for every knob a workshop turns, wired to `Lab.run` and `Run.stop`.

The panel owns widgets and nothing else. It turns widget values into a `RunConfig` in one place
(:meth:`Panel.config_from_widgets`), shows the numbers `RunConfig.derived` computes (never its own
math), starts runs with ``lab.run(cfg)``, stops them with ``run.stop()``, and hands each new run
to a live :class:`hpclab.views.live.Dashboard` with the earlier runs of this panel overlaid. It never
touches ipyparallel and holds no training logic::

    lab = hpclab.Lab(workers=2)
    lab.panel()                                   # or: Panel(lab, base=preset)

``Panel(None, workers=2)`` is a preview: every knob and derived number works, Run stays disabled
(no engines are started).
"""

from __future__ import annotations

import html
import math
import threading
from typing import Any

from hpclab.catalog import (
    DATASETS,
    LR_SCALINGS,
    LR_SCHEDULES,
    MAX_WORKERS,
    OPTIMIZERS,
    PRECISIONS,
    STAGED_DATASETS,
)
from hpclab.catalog import models_for as _models_for
from hpclab.config import RunConfig
from hpclab.errors import ConfigError, LabError

# The RunConfig fields that have a widget; every other field comes from the panel's `base` config.
KNOBS = (
    "dataset",
    "model",
    "num_samples",
    "epochs",
    "batch_per_worker",
    "base_lr",
    "base_batch",
    "lr_scaling",
    "warmup_epochs",
    "lr_schedule",
    "optimizer",
    "lars_eta",
    "precision",
)
MAX_OVERLAYS = 6  # earlier runs drawn under the live one (more is unreadable)
PREFERRED_MODELS = ("cnn1d", "resnet20")  # picked when a dataset change rules the model out

PRECISION_HINT = (
    "<b>float16</b> speed-ups need a GPU with Tensor Cores; on a CPU mixed_float16 is usually "
    "<i>slower</i>. <b>bfloat16</b> on a CPU is for studying the numerics (loss curves, "
    "divergence), not for speed."
)
_RED, _GREY = "#b00020", "#555"
_DESC = {"description_width": "130px"}
_WIDE = {"width": "300px"}


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=False)


def _n_workers(n: int) -> str:
    return f"{n} worker" + ("" if n == 1 else "s")


def models_for(dataset: str) -> list[str]:
    """Models RunConfig accepts for `dataset` (the rule lives in hpclab.catalog)."""
    return list(_models_for(dataset))


def _last_number(frame: Any, column: str) -> float | None:
    """The newest finite value of a history column (the first rows may carry None/NaN)."""
    if column not in frame:
        return None
    values = [
        v
        for v in frame[column].tolist()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ]
    return float(values[-1]) if values else None


def _status_line(run: Any) -> tuple[str, bool]:
    """(text, is_error) describing a run's state, for the status line."""
    history = run.history
    total = run.config.total_steps(run.workers)
    step = int(_last_number(history, "step") or 0)
    if run.status == "running":
        if not step:
            return (
                f"running on {_n_workers(run.workers)}: starting (the first run on fresh engines "
                "imports TensorFlow and builds the data, which takes a while)…",
                False,
            )
        parts = [f"running: step {step:,}/{total:,}"]
        epoch, speed = _last_number(history, "epoch"), _last_number(history, "samples_per_sec")
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
    if run.status == "stopped":
        return f"stopped at step {steps:,}/{total:,}: {acc} (run {run.run_id})", False
    return f"{run.status}: {run.error or 'no reason was recorded'}", True


class Panel:
    """Widgets for one Lab: knobs, derived numbers, Run/Stop, status line, live dashboard.

    lab:     a started `hpclab.Lab`, or None for a preview (Run disabled).
    workers: the initial value of the workers knob (default: the lab's workers, else 2).
    base:    the RunConfig the knobs start from; fields without a knob (steps_per_call, seed, …)
             are taken from it unchanged.
    """

    def __init__(
        self,
        lab: Any = None,
        *,
        workers: int | None = None,
        base: RunConfig | None = None,
        dashboard: bool = True,
    ):
        import ipywidgets as W  # here, so `import hpclab.views.panel` stays fast

        if base is not None and not isinstance(base, RunConfig):
            raise ConfigError(f"Panel.base must be a RunConfig; you passed {type(base).__name__}.")
        self.lab = lab
        self.base = base or RunConfig()
        self.runs: list = []  # runs started from this panel, oldest first
        self.run = None  # the newest of them
        self.derived: dict | None = None  # RunConfig.derived for the current knobs (None: invalid)
        self.config_error: str | None = None
        self._starting = False  # Run clicked, the lab is (re)starting or launching
        self._stopping = False
        self._note = ""  # lab/run state shown in the status line
        self._note_error = False
        self._lock = threading.RLock()  # widget state: kernel thread and run monitor thread
        if workers is None:
            workers = getattr(lab, "workers", None) or 2

        b = self.base
        w: dict[str, Any] = {}
        w["workers"] = W.BoundedIntText(
            value=workers,
            min=1,
            max=MAX_WORKERS,
            description="workers",
            style=_DESC,
            layout={"width": "210px"},
        )
        w["workers_note"] = W.HTML()
        w["dataset"] = W.Dropdown(
            options=DATASETS, value=b.dataset, description="dataset", style=_DESC, layout=_WIDE
        )
        w["model"] = W.Dropdown(
            options=models_for(b.dataset),
            value=b.model,
            description="model",
            style=_DESC,
            layout=_WIDE,
        )
        w["num_samples"] = W.BoundedIntText(
            value=b.num_samples,
            min=0,
            max=10_000_000,
            step=1000,
            description="num samples",
            style=_DESC,
            layout=_WIDE,
        )
        w["epochs"] = W.BoundedFloatText(
            value=b.epochs,
            min=0,
            max=10_000,
            step=1,
            description="epochs",
            style=_DESC,
            layout=_WIDE,
        )
        w["batch_per_worker"] = W.BoundedIntText(
            value=b.batch_per_worker,
            min=1,
            max=65536,
            description="batch per worker",
            style=_DESC,
            layout={"width": "210px"},
        )
        w["global_batch"] = W.HTML()
        w["base_lr"] = W.FloatText(
            value=b.base_lr, step=0.01, description="base LR", style=_DESC, layout=_WIDE
        )
        w["base_batch"] = W.BoundedIntText(
            value=b.base_batch,
            min=1,
            max=10_000_000,
            description="base batch",
            style=_DESC,
            layout=_WIDE,
        )
        w["lr_scaling"] = W.ToggleButtons(
            options=LR_SCALINGS,
            value=b.lr_scaling,
            tooltips=[
                "peak LR = base LR",
                "peak LR = base LR × global/base batch",
                "peak LR = base LR × √(global/base batch)",
            ],
            style={"button_width": "64px"},
        )
        w["warmup_epochs"] = W.BoundedFloatText(
            value=b.warmup_epochs,
            min=0,
            max=10_000,
            step=0.5,
            description="warm-up epochs",
            style=_DESC,
            layout=_WIDE,
        )
        w["lr_schedule"] = W.ToggleButtons(
            options=LR_SCHEDULES, value=b.lr_schedule, style={"button_width": "80px"}
        )
        w["optimizer"] = W.Dropdown(
            options=OPTIMIZERS,
            value=b.optimizer,
            description="optimizer",
            style=_DESC,
            layout=_WIDE,
        )
        w["lars_eta"] = W.BoundedFloatText(
            value=b.lars_eta,
            min=0,
            max=10,
            step=0.0005,
            description="LARS trust η",
            style=_DESC,
            layout=_WIDE,
        )
        w["precision"] = W.Dropdown(
            options=PRECISIONS,
            value=b.precision,
            description="precision",
            style=_DESC,
            layout=_WIDE,
        )
        w["precision_hint"] = W.HTML(
            f"<div style='color:{_GREY};font-size:12px;line-height:1.35;"
            f"max-width:300px'>{PRECISION_HINT}</div>"
        )
        w["samples_hint"] = W.HTML()
        w["overlay"] = W.Checkbox(
            value=True, description="overlay earlier runs", indent=False, layout={"width": "170px"}
        )
        w["derived"] = W.HTML()
        w["run"] = W.Button(
            description="Run",
            icon="play",
            button_style="success",
            tooltip="start a run with these settings",
            layout={"width": "110px"},
        )
        w["stop"] = W.Button(
            description="Stop",
            icon="stop",
            button_style="danger",
            tooltip="ask every rank to stop after the same step",
            layout={"width": "110px"},
            disabled=True,
        )
        w["status"] = W.HTML()
        for name, widget in w.items():  # stable hooks for browser tests and workshop CSS
            widget.add_class(f"hpclab-{name}")
        self.widgets = w

        self.dashboard = None
        if dashboard:
            from hpclab.views.live import Dashboard

            self.dashboard = Dashboard(title="")

        w["dataset"].observe(self._on_dataset, names="value")
        for name in ("workers", *KNOBS):
            if name != "dataset":
                w[name].observe(lambda _change: self._refresh(), names="value")
        w["run"].on_click(self._on_run)
        w["stop"].on_click(self._on_stop)

        def _labelled(label: str, widget: Any) -> W.HBox:  # ToggleButtons' own label wraps
            return W.HBox(
                [
                    W.HTML(
                        f"<div style='text-align:right;padding-right:8px;"
                        f"line-height:28px'>{_esc(label)}</div>",
                        layout={"width": _DESC["description_width"]},
                    ),
                    widget,
                ]
            )

        def column(title: str, *items) -> W.VBox:
            return W.VBox([W.HTML(f"<b>{title}</b>"), *items], layout={"margin": "0 18px 0 0"})

        columns = W.HBox(
            [
                column(
                    "Data and model",
                    w["dataset"],
                    w["model"],
                    w["num_samples"],
                    w["samples_hint"],
                    w["epochs"],
                ),
                column(
                    "Workers, batch and learning rate",
                    W.HBox([w["workers"], w["workers_note"]]),
                    W.HBox([w["batch_per_worker"], w["global_batch"]]),
                    w["base_lr"],
                    w["base_batch"],
                    _labelled("LR scaling", w["lr_scaling"]),
                    w["warmup_epochs"],
                    _labelled("after warm-up", w["lr_schedule"]),
                ),
                column(
                    "Optimizer and numerics",
                    w["optimizer"],
                    w["lars_eta"],
                    w["precision"],
                    w["precision_hint"],
                ),
            ],
            layout={"flex_flow": "row wrap"},
        )
        actions = W.HBox(
            [w["run"], w["stop"], w["overlay"], w["status"]], layout={"align_items": "center"}
        )
        parts = [columns, w["derived"], actions]
        if self.dashboard is not None:
            parts.append(self.dashboard.widget)
        self.widget = W.VBox(parts)
        self.widget.add_class("hpclab-panel")
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
        fits = models_for(w["dataset"].value)
        if tuple(w["model"].options) != tuple(fits):
            keep = w["model"].value
            if keep not in fits:
                keep = next((m for m in PREFERRED_MODELS if m in fits), fits[0])
            w["model"].options = fits
            w["model"].value = keep
        staged = w["dataset"].value in STAGED_DATASETS
        w["num_samples"].disabled = staged
        w["samples_hint"].value = (
            f"<div style='color:{_GREY};font-size:12px'>{_esc(w['dataset'].value)} has a fixed "
            "size and is read from data/ (stage it first)</div>"
            if staged
            else ""
        )
        self._refresh()

    def _refresh(self) -> None:
        """Recompute the derived numbers and the enabled state of everything from the knobs."""
        with self._lock:
            w = self.widgets
            w["lars_eta"].layout.display = None if w["optimizer"].value == "lars" else "none"
            try:
                cfg = self.config_from_widgets()
                derived = cfg.derived(self.workers)
            except ConfigError as exc:
                self.derived, self.config_error = None, str(exc)
            else:
                self.derived, self.config_error = derived, None
            d = self.derived
            if d is None:
                w["global_batch"].value = f"<span style='color:{_GREY}'>global batch —</span>"
                w["derived"].value = f"<span style='color:{_GREY}'>derived numbers: —</span>"
            else:
                w["global_batch"].value = (
                    f"<span style='line-height:28px'>× {_n_workers(d['workers'])} "
                    f"= <b>{d['global_batch']:,}</b> global</span>"
                )
                w["derived"].value = (
                    f"<div style='margin:6px 0'>global batch <b>{d['global_batch']:,}</b> · "
                    f"peak LR <b>{d['peak_lr']:.4g}</b> ({_esc(cfg.lr_scaling)} rule, base "
                    f"{cfg.base_lr:g} at batch {cfg.base_batch:,}) · "
                    f"<b>{d['steps_per_epoch']:,}</b> steps/epoch · "
                    f"<b>{d['total_steps']:,}</b> steps in all · warm-up "
                    f"<b>{d['warmup_steps']:,}</b> steps · "
                    f"{d['train_samples_per_worker']:,} samples per worker</div>"
                )
            lab_workers = getattr(self.lab, "workers", None)
            if self.lab is not None and lab_workers != self.workers:
                w["workers_note"].value = (
                    f"<span style='color:{_GREY};font-size:12px;line-height:1.3'>the lab has "
                    f"{lab_workers}: Run restarts<br>the engines first</span>"
                )
            else:
                w["workers_note"].value = ""
            self._show_status()

    def _show_status(self) -> None:
        w = self.widgets
        busy = self._starting or (self.run is not None and not self.run.done)
        w["run"].disabled = self.lab is None or busy or self.config_error is not None
        w["stop"].disabled = self.run is None or self.run.done or self._stopping or self._starting
        if self.lab is None:
            note, bad = (
                (
                    "preview: no lab is running — start one with "
                    f"lab = hpclab.Lab(workers={self.workers}) and show lab.panel()"
                ),
                False,
            )
        elif self.run is not None and not self._starting:
            note, bad = _status_line(self.run)
            if self._stopping and not self.run.done:
                note = "stopping: every rank leaves after the same step… · " + note
        elif self._note:
            note, bad = self._note, self._note_error
        else:
            note, bad = "ready", False
        lines = [f"<span style='color:{_RED if bad else 'inherit'}'>{_esc(note)}</span>"]
        if self.config_error is not None:
            lines.append(f"<span style='color:{_RED}'>{_esc(self.config_error)}</span>")
        w["status"].value = (
            "<div style='margin-left:10px;line-height:1.4'>" + "<br>".join(lines) + "</div>"
        )

    @property
    def status(self) -> str:
        """The status line as plain text (for tests and logs)."""
        import re

        return html.unescape(
            re.sub(r"<br>", "\n", re.sub(r"<(?!br>)[^>]+>", "", self.widgets["status"].value))
        )

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
                cfg.derived(self.workers)
            except ConfigError:
                self._refresh()
                return
            self._starting, self._stopping = True, False
            self.run = None
            self._say("starting the run…")
        try:
            if self.workers != self.lab.workers:
                self._say(
                    f"restarting the engines with {_n_workers(self.workers)} (the lab had "
                    f"{self.lab.workers}); this takes 10–30 s…"
                )
                self.lab.restart(workers=self.workers)
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
        """From the run's monitor thread: new rows arrived, or the run ended."""
        with self._lock:
            if run is not self.run:
                return
            if run.done:
                self._stopping = False
            self._show_status()

    def _on_stop(self, _button: Any = None) -> None:
        with self._lock:
            run = self.run
            if run is None or run.done or self._stopping:
                return
            self._stopping = True
            self._show_status()
        run.stop(timeout=0)  # writes the stop request; the run calls back when the ranks stopped


__all__ = ["Panel", "KNOBS", "models_for", "PRECISION_HINT"]
