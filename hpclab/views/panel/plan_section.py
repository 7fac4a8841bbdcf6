"""The planner's panel: knobs for the choices and the target cluster, Plan, and the plan drawn.

The widgets hold no planning logic. They turn their values into the keyword arguments of
``hpclab.plan`` (:meth:`PlanSection.plan_kwargs`: workers, batches, target, and a target cluster's
``Network`` and per-device rate when entered), call the ``plan`` function they were given with
them, and show what it returns: the paragraph, the Pareto chart (time to target vs GPU-hours),
the Pareto rows and the assumptions (measured here / entered / extrapolated). ``measure``, when
given, takes a new measurement on the lab (minutes) on a background thread; otherwise the
section plans from the measurement it was given. Built by :func:`hpclab.tools.plan_panel`::

    hpclab.plan_panel(lab)                                   # measure here, then plan
    hpclab.plan_panel(measurements="plan-measurement.json")  # plan from a recorded one

ipywidgets and IPython are imported when a section is made, so importing this module stays fast.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from typing import Any

from hpclab.core.errors import ConfigError
from hpclab.core.hardware_model import Link, Network

DEFAULT_WORKERS = "1, 2, 4, 8, 16, 32, 64"
DEFAULT_BATCHES = "32, 64, 128, 256, 512, 1024, 2048"
SHOWN = ("workers", "global_batch", "steps", "step_s", "time_s", "gpu_hours", "named")


def parse_counts(field: str, text: str) -> list[int]:
    """``"1, 2, 4"`` -> [1, 2, 4]; a sentence naming the field, the value and what is allowed."""
    try:
        values = [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise ConfigError(
            f"{field} must be whole numbers ≥ 1 separated by commas (e.g. {DEFAULT_WORKERS!r}); "
            f"got {text!r}."
        )
    return sorted(set(values))


class PlanSection:
    """Knobs, Plan (and Measure), and the plan's paragraph, chart, table and assumptions."""

    def __init__(
        self,
        plan: Callable[..., Any],
        *,
        measurements: Any = None,
        measure: Callable[[], Any] | None = None,
        target: float = 0.8,
    ):
        import ipywidgets as W

        self._plan, self._measure = plan, measure
        self.measurements = measurements
        self.result = None  # the newest PlanResult
        self.error: str | None = None
        self._busy = threading.Lock()
        style = {"description_width": "initial"}
        self.widgets = w = {
            "target": W.BoundedFloatText(
                target, min=0.01, max=1.0, step=0.01, description="target accuracy", style=style
            ),
            "workers": W.Text(DEFAULT_WORKERS, description="ranks (GPUs)", style=style),
            "batches": W.Text(DEFAULT_BATCHES, description="global batches", style=style),
            "per_node": W.BoundedIntText(
                0, min=0, max=1024, description="GPUs per node (0: this machine)", style=style
            ),
            "inter_gbit": W.BoundedFloatText(
                0.0, min=0.0, max=1e5, description="network Gbit/s (0: none entered)", style=style
            ),
            "inter_us": W.BoundedFloatText(
                2.0, min=0.0, max=1e4, description="network latency µs", style=style
            ),
            "device_rate": W.BoundedFloatText(
                0.0,
                min=0.0,
                max=1e9,
                description="samples/s per device (0: measured here)",
                style=style,
            ),
            "plan": W.Button(description="Plan", button_style="primary"),
            "measure": W.Button(description="Measure here (minutes)", disabled=measure is None),
            "status": W.HTML(),
            "out": W.Output(),
        }
        w["plan"].on_click(lambda _b: self.update())
        w["measure"].on_click(lambda _b: self.measure_then_plan())
        self.widget = W.VBox(
            [
                W.HTML("<b>Plan an allocation</b> (notebook 10): time to target and GPU-hours"),
                W.HBox([w["target"], w["workers"], w["batches"]], layout={"flex_flow": "row wrap"}),
                W.HBox(
                    [w["per_node"], w["inter_gbit"], w["inter_us"], w["device_rate"]],
                    layout={"flex_flow": "row wrap"},
                ),
                W.HBox([w["plan"], w["measure"], w["status"]]),
                w["out"],
            ]
        )
        self.widget.add_class("hpclab-plan-section")
        self._say("" if measurements is not None else "no measurement yet: Measure here first")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def _say(self, text: str, error: bool = False) -> None:
        color = "#b00" if error else "#555"
        self.widgets["status"].value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    def plan_kwargs(self) -> dict:
        """The widgets' values as ``hpclab.plan`` keyword arguments (ConfigError if invalid)."""
        w = self.widgets
        kwargs: dict = {
            "workers": parse_counts("ranks (GPUs)", w["workers"].value),
            "batches": parse_counts("global batches", w["batches"].value),
            "target": float(w["target"].value),
        }
        if w["device_rate"].value > 0:
            kwargs["device_samples_per_s"] = float(w["device_rate"].value)
        if w["inter_gbit"].value > 0 or w["per_node"].value > 0:
            if w["inter_gbit"].value <= 0 or w["per_node"].value <= 0:
                raise ConfigError(
                    "a target cluster needs both GPUs per node and the network's Gbit/s "
                    f"(got {w['per_node'].value} per node, {w['inter_gbit'].value} Gbit/s); "
                    "leave both 0 to plan for this machine."
                )
            inter = Link.from_gbit(w["inter_gbit"].value, w["inter_us"].value, "entered")
            # intra=None: the link between ranks of a node stays the one measured here
            kwargs["network"] = Network(intra=None, inter=inter, per_node=w["per_node"].value)
        return kwargs

    def update(self) -> None:
        """Plan from the current measurement with the widgets' choices, and show it."""
        if self.measurements is None:
            self._say("no measurement yet: Measure here first", error=True)
            return
        try:
            kwargs = self.plan_kwargs()
            result = self._plan(measurements=self.measurements, **kwargs)
        except ConfigError as exc:
            self.error = str(exc)
            self._say(self.error, error=True)
            return
        self.result, self.error = result, None
        self._show(result)
        self._say(f"planned {len(result.allocation.rows)} choices")

    def measure_then_plan(self) -> threading.Thread | None:
        """Take a new measurement on a background thread (the notebook stays responsive), then
        plan. Returns the thread (None when a measurement is already running)."""
        if self._measure is None or not self._busy.acquire(blocking=False):
            return None
        self.widgets["measure"].disabled = self.widgets["plan"].disabled = True
        self._say("measuring on the lab's ranks (a few minutes) ...")

        def work():
            try:
                self.measurements = self._measure()
                self.update()
            except Exception as exc:  # noqa: BLE001 — shown in the panel, not lost on a thread
                self.error = f"the measurement failed: {exc}"
                self._say(self.error, error=True)
            finally:
                self.widgets["measure"].disabled = self.widgets["plan"].disabled = False
                self._busy.release()

        thread = threading.Thread(target=work, name="hpclab-plan-measure", daemon=True)
        thread.start()
        return thread

    def _show(self, result) -> None:
        from IPython.display import HTML, display

        from hpclab.views.charts.allocation_chart import pareto_figure

        plan = result.allocation
        table = plan.table()
        rows = table[table["pareto"]][list(SHOWN)]
        notes = "".join(f"<li>[{a.kind}] {html.escape(a.what)}</li>" for a in plan.assumptions)
        out = self.widgets["out"]
        out.clear_output(wait=True)
        with out:
            display(HTML(f"<p>{html.escape(plan.paragraph)}</p>"))
            display(pareto_figure(plan))
            display(HTML(rows.to_html(index=False, float_format=lambda v: f"{v:.4g}")))
            display(HTML(f"<p>Assumptions:</p><ul>{notes}</ul>"))


__all__ = ["PlanSection", "parse_counts"]
