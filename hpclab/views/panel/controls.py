"""One panel control per knob, made from its row of the knob table (:mod:`hpclab.core.knobs`).

The row gives the control its bounds, choices, label, tooltip (the knob's help) and increment,
so the panel offers exactly what RunConfig accepts: a number field stops at the row's bounds
(an open bound such as ``epochs > 0`` is offered and refused by RunConfig in its own
sentence), a choice offers the row's names. Here only how a control looks is decided: which
choices read better as buttons, and how wide they are. ipywidgets comes in as the ``W``
argument, so importing this module stays fast.
"""

from __future__ import annotations

from typing import Any

from hpclab.core.knobs import Knob
from hpclab.views.panel.text import esc

DESC = {"description_width": "130px"}  # the knobs' label width
WIDE = {"width": "300px"}
NARROW = {"width": "210px"}  # a knob with a note beside it
#: Choices shown as a row of buttons (labelled beside the row), with their button width; every
#: other choice is a drop-down.
BUTTONS = {
    "lr_scaling": "64px",
    "lr_schedule": "80px",
    "validation": "72px",
    "augment": "72px",
    "shards": "72px",
    "shuffle": "72px",
    "update": "80px",
    "sdc_target": "80px",
}


def bounds(knob: Knob) -> tuple[float, float]:
    """The number field's (min, max): the row's bounds, widened to the value that means off."""
    lo = knob.lo if knob.off is None else min(knob.lo, knob.off)
    return lo, knob.hi


def control(knob: Knob, value: Any, W: Any, *, options: Any = None, layout=WIDE) -> Any:
    """The widget for ``knob`` starting at ``value``; ``options`` narrows a choice's names (the
    models that fit the dataset)."""
    if knob.kind == "choice":
        options = list(knob.choices if options is None else options)
        if knob.name in BUTTONS:
            return W.ToggleButtons(
                options=options,
                value=value,
                tooltip=knob.help,
                style={"button_width": BUTTONS[knob.name]},
            )
        return W.Dropdown(
            options=options,
            value=value,
            description=knob.label,
            tooltip=knob.help,
            style=DESC,
            layout=layout,
        )
    if knob.kind == "bool":
        return W.Checkbox(
            value=value, description=knob.label, tooltip=knob.help, indent=False, layout=layout
        )
    if knob.kind in ("int", "float"):
        lo, hi = bounds(knob)
        if hi is None:
            raise ValueError(f"knob {knob.name!r} has no upper bound: the panel cannot offer it.")
        kind = W.BoundedIntText if knob.kind == "int" else W.BoundedFloatText
        return kind(
            value=value,
            min=lo,
            max=hi,
            step=knob.step,
            description=knob.label,
            tooltip=knob.help,
            style=DESC,
            layout=layout,
        )
    raise ValueError(f"knob {knob.name!r} of kind {knob.kind!r} has no panel control.")


def labelled(knob: Knob, widget: Any, W: Any) -> Any:
    """``widget`` with the knob's label on its left, aligned with the other knobs' labels (a
    row of buttons has none of its own: ToggleButtons' own label wraps)."""
    caption = W.HTML(
        f"<div style='text-align:right;padding-right:8px;line-height:28px'>{esc(knob.label)}</div>",
        layout={"width": DESC["description_width"]},
    )
    return W.HBox([caption, widget])


__all__ = ["DESC", "WIDE", "NARROW", "BUTTONS", "bounds", "control", "labelled"]
