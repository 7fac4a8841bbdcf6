"""The control panel's widgets and their layout: one widget per knob, Run/Stop, status, notes.

:func:`build_widgets` makes them (named, each with a `hpclab-<name>` CSS class for browser tests
and workshop CSS) with their starting values from a RunConfig; :func:`arrange` lays them out in
three columns above the actions row and the dashboard. Nothing here reacts to a change: that
wiring lives in :class:`hpclab.views.panel.Panel`. ipywidgets is imported inside the functions,
so importing this module stays fast.
"""

from __future__ import annotations

from typing import Any

from hpclab.catalog import (
    AUGMENTS,
    DATASETS,
    FLOAT32_BITS,
    LR_SCALINGS,
    LR_SCHEDULES,
    MAX_AUGMENT_COST,
    MAX_WORKERS,
    OPTIMIZERS,
    PRECISIONS,
    SDC_TARGETS,
    SHARDS,
    SHUFFLES,
    UPDATES,
    VALIDATIONS,
)
from hpclab.catalog import models_for as _models_for
from hpclab.config import RunConfig
from hpclab.views.panel_text import GREY, esc

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
    # "where the time goes" (notebooks 06 and 07), in a section of their own
    "straggler_rank",
    "straggler_slowdown",
    "batch_skew",
    "validation",
    "augment",
    "augment_cost",
    "shards",
    "shuffle",
    "timeline_steps",
    # "beyond synchronous SGD" (notebooks 08 and 09), folded too
    "update",
    "average_every",
    "staleness",
    "sdc_target",
    "sdc_layer",
    "sdc_bit",
    "sdc_rank",
    "sdc_step",
    "spike_factor",
    "rollback",
)
TIME_KNOBS = KNOBS[KNOBS.index("straggler_rank") : KNOBS.index("update")]
ADVANCED_KNOBS = KNOBS[KNOBS.index("update") :]
PREFERRED_MODELS = ("cnn1d", "resnet20")  # picked when a dataset change rules the model out

PRECISION_HINT = (
    "<b>float16</b> speed-ups need a GPU with Tensor Cores; on a CPU mixed_float16 is usually "
    "<i>slower</i>. <b>bfloat16</b> on a CPU is for studying the numerics (loss curves, "
    "divergence), not for speed."
)
_DESC = {"description_width": "130px"}
_WIDE = {"width": "300px"}


def models_for(dataset: str) -> list[str]:
    """Models RunConfig accepts for `dataset` (the rule lives in hpclab.catalog)."""
    return list(_models_for(dataset))


def build_widgets(base: RunConfig, workers: int) -> dict[str, Any]:
    """Every widget of the panel by name: the KNOBS (starting at `base`'s values), `workers`,
    the notes and hints, `overlay`, `derived`, `run`, `stop` and `status`."""
    import ipywidgets as W

    b = base
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
        f"<div style='color:{GREY};font-size:12px;line-height:1.35;"
        f"max-width:300px'>{PRECISION_HINT}</div>"
    )
    w["samples_hint"] = W.HTML()
    _time_widgets(w, b, W)
    _advanced_widgets(w, b, W)
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
    return w


def _time_widgets(w: dict[str, Any], b: RunConfig, W: Any) -> None:
    """The knobs of "where the time goes": a straggler, who validates, the input's work, the
    shards and shuffle, and a Horovod timeline of n steps (hpclab.pop, hpclab.timeline)."""
    numbers = (  # name, widget, min, max, step, label, tooltip
        ("straggler_rank", W.BoundedIntText, -1, MAX_WORKERS - 1, 1, "straggler rank",
         "the rank slowed on purpose (-1: none)"),
        ("straggler_slowdown", W.BoundedFloatText, 0, 95, 5, "its speed lost %",
         "30: that rank's useful work takes 1/0.7 = 1.43x as long"),
        ("batch_skew", W.BoundedFloatText, 0, 90, 10, "rank 0's batch +%",
         "rank 0's batch this % larger, the others' smaller (the same global batch)"),
        ("augment_cost", W.BoundedIntText, 1, MAX_AUGMENT_COST, 10, "augment cost",
         "noise passes per batch: more work, the same statistics"),
        ("timeline_steps", W.BoundedIntText, 0, 100_000, 50, "timeline steps",
         "record Horovod's timeline over this many steps into the run folder (0: off)"),
    )  # fmt: skip
    _numbers(w, b, W, numbers)
    choices = (("validation", VALIDATIONS), ("augment", AUGMENTS), ("shards", SHARDS))
    for name, options in (*choices, ("shuffle", SHUFFLES)):
        w[name] = W.ToggleButtons(
            options=options, value=getattr(b, name), style={"button_width": "72px"}
        )


def _advanced_widgets(w: dict[str, Any], b: RunConfig, W: Any) -> None:
    """The knobs of "beyond synchronous SGD": model averaging, one bit flip and the loss-spike
    detector with rollback (hpclab.rank.averaging, hpclab.rank.sdc)."""
    numbers = (  # name, widget, min, max, step, label, tooltip
        ("average_every", W.BoundedIntText, 1, 100_000, 1, "average every H",
         "local_sgd: steps between model averages (1: the same as sync)"),
        ("staleness", W.BoundedIntText, 0, 64, 1, "stale by steps",
         "sync: apply the averaged gradient of this many steps ago (asynchrony's cost)"),
        ("sdc_layer", W.BoundedIntText, 0, 10_000, 1, "flip: layer",
         "which layer with weights (0: the first convolution or dense layer)"),
        ("sdc_bit", W.BoundedIntText, 0, FLOAT32_BITS - 1, 1, "flip: bit",
         "31 sign, 30-23 exponent, 22-0 mantissa (float32)"),
        ("sdc_rank", W.BoundedIntText, 0, MAX_WORKERS - 1, 1, "flip: rank", "the rank hit"),
        ("sdc_step", W.BoundedIntText, 0, 10_000_000, 10, "flip: step", "the step hit"),
        ("spike_factor", W.BoundedFloatText, 0, 1e6, 0.5, "spike factor",
         "the detector fires when a step's loss > this x its running mean (0: off)"),
    )  # fmt: skip
    _numbers(w, b, W, numbers)
    for name, options in (("update", UPDATES), ("sdc_target", SDC_TARGETS)):
        w[name] = W.ToggleButtons(
            options=options, value=getattr(b, name), style={"button_width": "80px"}
        )
    w["rollback"] = W.Checkbox(
        value=b.rollback, description="roll back on a spike", indent=False, layout=_WIDE
    )


def _numbers(w: dict[str, Any], b: RunConfig, W: Any, numbers) -> None:
    """Number fields from a table of (name, widget, min, max, step, label, tooltip)."""
    for name, kind, lo, hi, step, label, tip in numbers:
        w[name] = kind(
            value=getattr(b, name), min=lo, max=hi, step=step, description=label, tooltip=tip,
            style=_DESC, layout=_WIDE,
        )  # fmt: skip


def arrange(w: dict[str, Any], below: Any = None) -> Any:
    """The panel's one widget: three knob columns, the derived numbers, the actions row, and
    `below` (the live dashboard's widget) if given."""
    import ipywidgets as W

    def labelled(label: str, widget: Any) -> W.HBox:  # ToggleButtons' own label wraps
        return W.HBox(
            [
                W.HTML(
                    f"<div style='text-align:right;padding-right:8px;"
                    f"line-height:28px'>{esc(label)}</div>",
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
                labelled("LR scaling", w["lr_scaling"]),
                w["warmup_epochs"],
                labelled("after warm-up", w["lr_schedule"]),
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
    time_box = W.HBox(
        [
            column(
                "Imbalance, and who validates",
                w["straggler_rank"],
                w["straggler_slowdown"],
                w["batch_skew"],
                labelled("validation", w["validation"]),
                w["timeline_steps"],
            ),
            column(
                "Input and shuffle",
                labelled("augment", w["augment"]),
                w["augment_cost"],
                labelled("shards", w["shards"]),
                labelled("shuffle", w["shuffle"]),
            ),
        ],
        layout={"flex_flow": "row wrap"},
    )
    time_section = W.Accordion(children=[time_box], selected_index=None)
    time_section.set_title(0, "Where the time goes: straggler, validation, input, timeline")
    time_section.add_class("hpclab-time-section")
    advanced_box = W.HBox(
        [
            column(
                "Model averaging",
                labelled("update", w["update"]),
                w["average_every"],
                w["staleness"],
            ),
            column(
                "Silent data corruption",
                labelled("flip", w["sdc_target"]),
                w["sdc_layer"], w["sdc_bit"], w["sdc_rank"], w["sdc_step"],
                w["spike_factor"], w["rollback"],
            ),
        ],
        layout={"flex_flow": "row wrap"},
    )  # fmt: skip
    advanced = W.Accordion(children=[advanced_box], selected_index=None)
    advanced.set_title(0, "Beyond synchronous SGD: model averaging, silent data corruption")
    advanced.add_class("hpclab-advanced-section")
    actions = W.HBox(
        [w["run"], w["stop"], w["overlay"], w["status"]], layout={"align_items": "center"}
    )
    parts = [columns, time_section, advanced, w["derived"], actions]
    if below is not None:
        parts.append(below)
    box = W.VBox(parts)
    box.add_class("hpclab-panel")
    return box


__all__ = [
    "KNOBS",
    "TIME_KNOBS",
    "ADVANCED_KNOBS",
    "PRECISION_HINT",
    "PREFERRED_MODELS",
    "models_for",
    "build_widgets",
    "arrange",
]
