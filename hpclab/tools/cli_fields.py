"""RunConfig fields as command-line options: ``--batch-per-worker 128``, ``--lr-scaling sqrt``.

One option per :class:`hpclab.core.config.RunConfig` field, generated from its row of the knob
table (:mod:`hpclab.core.knobs`): the option's kind and choices, its help and its default come
from the row, and the options are listed in one argument group per section of the table, so
``hpclab run --help`` reads in sections. ``hpclab run`` takes one value per option; ``hpclab
sweep`` takes comma-separated values and runs every combination. Bounds are left to RunConfig,
whose sentence names the field, the value and what is allowed.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from hpclab.core.knobs import KNOBS, SECTIONS, Knob, by_section

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def dest(knob: Knob) -> str:
    """Where argparse keeps the option's value (``field_<name>``)."""
    return "field_" + knob.name


def metavar(knob: Knob, many: bool) -> str:
    if knob.kind == "choice":
        return "{" + ",".join(knob.choices) + "}" + ("[,...]" if many else "")
    if knob.kind == "shape":
        return "H,W,C" if not many else "HxWxC[,...]"
    if knob.kind == "tags":
        return "TAG[,TAG...]"
    if knob.kind == "text":
        return "TEXT"  # one value, also in a sweep
    base = {"int": "N", "float": "X", "bool": "BOOL"}[knob.kind]
    return base + ("[,...]" if many else "")


def default_text(knob: Knob) -> str:
    d = knob.default
    if knob.kind == "shape":
        return ",".join(map(str, d))
    if knob.kind == "tags":
        return ",".join(d) or "none"
    if knob.kind == "text":
        return repr(d)
    return f"{d:g}" if isinstance(d, float) else str(d)


def convert(knob: Knob, text: str) -> Any:
    """One value of `knob` from text; argparse turns ArgumentTypeError into one sentence."""
    text = text.strip()
    try:
        if knob.kind == "int":
            return int(text)
        if knob.kind == "float":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
    except ValueError:
        kind = "an integer" if knob.kind == "int" else "a finite number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if knob.kind == "choice":
        if not knob.admits(text):
            more = f", or {knob.or_else[1]}" if knob.or_else else ""
            raise argparse.ArgumentTypeError(
                f"{text!r} is not one of {', '.join(knob.choices)}{more}"
            )
        return text
    if knob.kind == "bool":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    if knob.kind == "shape":
        parts = re.split(r"[,x]", text)
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            shape = ()
        if len(shape) != 3:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not an image shape: give height, width and channels, e.g. 32,32,3"
            )
        return shape
    if knob.kind == "tags":
        return tuple(t.strip() for t in text.split(",") if t.strip())
    return text


def _one(knob: Knob) -> Callable[[str], Any]:
    return lambda text: convert(knob, text)


def _many(knob: Knob) -> Callable[[str], list]:
    """Comma-separated values for a sweep (a shape is HxWxC there; 32,32,3 alone is one shape)."""

    def parse(text: str) -> list:
        if knob.kind in ("tags", "text"):
            return [convert(knob, text)]  # a name / a tag list is one value, not swept
        if knob.kind == "shape" and "x" not in text:
            return [convert(knob, text)]
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("no value given")
        return [convert(knob, t) for t in items]

    return parse


def add_field_options(parser: argparse.ArgumentParser, *, many: bool) -> None:
    """One option per RunConfig field, one argument group per section of the knob table; with
    `many`, each takes comma-separated values (a sweep).

    Options not given are absent from the namespace, so RunConfig's own defaults apply.
    """
    group = parser.add_argument_group(
        "run configuration (hpclab.RunConfig fields, in the sections of docs/knobs.md)"
        if not many
        else "run configuration (hpclab.RunConfig fields; comma-separated values are swept)"
    )
    group.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help="start from a named preset (hpclab.core.presets: workshop, quick, cluster_gpu); the "
        "options below override it (their defaults shown are the workshop preset's)",
    )
    for section, rows in by_section(KNOBS).items():
        group = parser.add_argument_group(f"{section}: {SECTIONS[section]}")
        for knob in rows:
            _add_option(group, knob, many)


def _add_option(group, knob: Knob, many: bool) -> None:
    help_text = f"{knob.help} (default: {default_text(knob)})".replace("%", "%%")
    if knob.kind != "bool":
        group.add_argument(
            knob.option,
            dest=dest(knob),
            type=_many(knob) if many else _one(knob),
            default=argparse.SUPPRESS,
            metavar=metavar(knob, many),
            help=help_text,
        )
    elif not many:
        group.add_argument(
            knob.option,
            dest=dest(knob),
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=help_text,
        )
    else:
        group.add_argument(
            knob.option,
            dest=dest(knob),
            nargs="?",
            const=[True],
            type=_many(knob),
            default=argparse.SUPPRESS,
            metavar="true,false",
            help=help_text[:-1] + f"; --no-{knob.option[2:]} for false, true,false to sweep both)",
        )
        group.add_argument(
            "--no-" + knob.option[2:],
            dest=dest(knob),
            action="store_const",
            const=[False],
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )


def base_config(args: argparse.Namespace, **fields: Any):
    """``--preset``'s RunConfig (the workshop's when none is named) with `fields` applied."""
    from hpclab.core.presets import preset

    return preset(getattr(args, "preset", None) or "workshop").replace(**fields)


def field_values(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig fields given on the command line: name -> value (a list for a sweep)."""
    return {k[len("field_") :]: v for k, v in vars(args).items() if k.startswith("field_")}


__all__ = [
    "dest",
    "metavar",
    "default_text",
    "convert",
    "add_field_options",
    "base_config",
    "field_values",
]
