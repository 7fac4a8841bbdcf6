"""The control panel's widgets and their layout: one widget per knob, Run/Stop, status, notes.

:func:`build_widgets` makes them (named, each with a `hpclab-<name>` CSS class for browser tests
and workshop CSS) with their starting values from a RunConfig; :func:`arrange` lays them out in
three columns above the actions row and the dashboard. Nothing here reacts to a change: that
wiring lives in :class:`hpclab.views.panel.panel.Panel`. Each knob's control, its bounds, choices,
label and tooltip come from the knob table (:mod:`hpclab.views.panel.controls`); this module says
which knobs the panel shows and where. ipywidgets is imported inside the functions, so importing
this module stays fast.
"""

from __future__ import annotations

from typing import Any

from hpclab.core.catalog import MAX_WORKERS
from hpclab.core.config import RunConfig
from hpclab.core.knobs import knob
from hpclab.views.panel import folders, sections
from hpclab.views.panel.controls import DESC, NARROW, WIDE, control, labelled
from hpclab.views.panel.text import GREY

# The knobs that have a control; every other field comes from the panel's `base` config.
KNOBS = (
    "dataset",
    "input",
    "stage",
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
    "groups",
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
    "divergence), not for speed, and needs AVX-512: below it the run fails with a sentence "
    "saying so."
)


def models_for(dataset: str, keep: Any = None) -> list[str]:
    """Models RunConfig accepts for `dataset` (the rule lives in hpclab.core.catalog; a folder's
    in hpclab.views.panel.folders), with `keep` when it is your own model."""
    return folders.models_for(dataset, keep)


def build_widgets(base: RunConfig, workers: int, data_root: Any = None) -> dict[str, Any]:
    """Every widget of the panel by name: the KNOBS (starting at `base`'s values; the dataset
    menu with the folders under `data_root`), `workers`, the folder field, the notes and hints,
    `overlay`, `derived`, `run`, `stop` and `status`."""
    import ipywidgets as W

    b = base
    w: dict[str, Any] = {}
    w["workers"] = W.BoundedIntText(
        value=workers,
        min=1,
        max=MAX_WORKERS,
        description="workers",
        style=DESC,
        layout=NARROW,
    )
    w["workers_note"] = W.HTML()
    menus = {
        "model": models_for(b.dataset, b.model),
        "dataset": folders.options(data_root, b.dataset),
    }
    for name in KNOBS:  # bounds, choices, label and tooltip from the knob table
        w[name] = control(
            knob(name),
            getattr(b, name),
            W,
            options=menus.get(name),
            layout=NARROW if name == "batch_per_worker" else WIDE,
        )
    w["dataset_path"], w["dataset_note"] = folders.path_field(W)
    w["lr_scaling"].tooltips = [
        "peak LR = base LR",
        "peak LR = base LR × global/base batch",
        "peak LR = base LR × √(global/base batch)",
    ]
    w["global_batch"] = W.HTML()
    w["precision_hint"] = W.HTML(
        f"<div style='color:{GREY};font-size:12px;line-height:1.35;"
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
    return w


def arrange(w: dict[str, Any], below: Any = None) -> Any:
    """The panel's one widget: three knob columns, the derived numbers, the actions row, and
    `below` (the live dashboard's widget) if given."""
    import ipywidgets as W

    def labelled_(name: str) -> W.HBox:
        return labelled(knob(name), w[name], W)

    def column(title: str, *items) -> W.VBox:
        return W.VBox([W.HTML(f"<b>{title}</b>"), *items], layout={"margin": "0 18px 0 0"})

    columns = W.HBox(
        [
            column(
                "Data and model",
                w["dataset"],
                w["dataset_path"],
                w["dataset_note"],
                w["input"],
                w["stage"],
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
                labelled_("lr_scaling"),
                w["warmup_epochs"],
                labelled_("lr_schedule"),
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
    time_section, advanced = sections.arrange(w, column, labelled_, W)
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
