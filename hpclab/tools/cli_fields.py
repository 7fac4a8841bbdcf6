"""RunConfig fields as command-line options: ``--batch-per-worker 128``, ``--lr-scaling sqrt``.

One option per :class:`hpclab.core.config.RunConfig` field, generated from the dataclass: the option's
kind from the field's type (choices from :mod:`hpclab.core.catalog`), its help from the field's
``metadata["help"]`` — the explanation written beside the field in core/config.py — and its default
from the field's default. ``hpclab run`` takes one value per option; ``hpclab sweep`` takes
comma-separated values and runs every combination.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpclab.core import catalog
from hpclab.core.config import RunConfig

#: Fields whose value is one name from a catalogue.
CHOICES = catalog.CHOICES

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Field:
    """One RunConfig field as the command line sees it."""

    name: str
    kind: str  # choice | int | float | bool | shape | strings | str
    default: Any
    choices: tuple = ()
    help: str = ""

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "field_" + self.name

    def metavar(self, many: bool) -> str:
        if self.kind == "choice":
            return "{" + ",".join(self.choices) + "}" + ("[,...]" if many else "")
        if self.kind == "shape":
            return "H,W,C" if not many else "HxWxC[,...]"
        if self.kind == "strings":
            return "TAG[,TAG...]"
        if self.kind == "str":
            return "TEXT"  # one value, also in a sweep
        base = {"int": "N", "float": "X", "bool": "BOOL"}[self.kind]
        return base + ("[,...]" if many else "")

    def default_text(self) -> str:
        d = self.default
        if self.kind == "shape":
            return ",".join(map(str, d))
        if self.kind == "strings":
            return ",".join(d) or "none"
        if self.kind == "str":
            return repr(d)
        return f"{d:g}" if isinstance(d, float) else str(d)


def _kind(name: str, hint: Any) -> str:
    if name in CHOICES:
        return "choice"
    if hint is bool:
        return "bool"
    if hint is int:
        return "int"
    if hint is float:
        return "float"
    if name == "image_shape":
        return "shape"
    if hint is tuple:
        return "strings"
    return "str"


def fields() -> list[Field]:
    """Every RunConfig field, in declaration order, with the help text from its metadata."""
    hints = typing.get_type_hints(RunConfig)
    out = []
    for f in dataclasses.fields(RunConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append(
            Field(
                name=f.name,
                kind=_kind(f.name, hints[f.name]),
                default=default,
                choices=tuple(CHOICES.get(f.name, ())),
                help=f.metadata["help"],  # every field has one (tests/test_cli.py)
            )
        )
    return out


def convert(field: Field, text: str) -> Any:
    """One value of `field` from text; argparse turns ArgumentTypeError into one sentence."""
    text = text.strip()
    try:
        if field.kind == "int":
            return int(text)
        if field.kind == "float":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
    except ValueError:
        kind = "an integer" if field.kind == "int" else "a finite number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if field.kind == "choice":
        if text not in field.choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(field.choices)}")
        return text
    if field.kind == "bool":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    if field.kind == "shape":
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
    if field.kind == "strings":
        return tuple(t.strip() for t in text.split(",") if t.strip())
    return text


def _one(field: Field) -> Callable[[str], Any]:
    return lambda text: convert(field, text)


def _many(field: Field) -> Callable[[str], list]:
    """Comma-separated values for a sweep (a shape is HxWxC there; 32,32,3 alone is one shape)."""

    def parse(text: str) -> list:
        if field.kind in ("strings", "str"):
            return [convert(field, text)]  # a name / a tag list is one value, not swept
        if field.kind == "shape" and "x" not in text:
            return [convert(field, text)]
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("no value given")
        return [convert(field, t) for t in items]

    return parse


def add_field_options(parser: argparse.ArgumentParser, *, many: bool) -> None:
    """One option per RunConfig field; with `many`, each takes comma-separated values (a sweep).

    Options not given are absent from the namespace, so RunConfig's own defaults apply.
    """
    group = parser.add_argument_group(
        "run configuration (hpclab.RunConfig fields)"
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
    for f in fields():
        help_text = f"{f.help} (default: {f.default_text()})".replace("%", "%%")
        if f.kind == "bool":
            if many:
                group.add_argument(
                    f.option,
                    dest=f.dest,
                    nargs="?",
                    const=[True],
                    type=_many(f),
                    default=argparse.SUPPRESS,
                    metavar="true,false",
                    help=help_text[:-1] + f"; --no-{f.option[2:]} for false, "
                    "true,false to sweep both)",
                )
                group.add_argument(
                    "--no-" + f.option[2:],
                    dest=f.dest,
                    action="store_const",
                    const=[False],
                    default=argparse.SUPPRESS,
                    help=argparse.SUPPRESS,
                )
            else:
                group.add_argument(
                    f.option,
                    dest=f.dest,
                    action=argparse.BooleanOptionalAction,
                    default=argparse.SUPPRESS,
                    help=help_text,
                )
            continue
        group.add_argument(
            f.option,
            dest=f.dest,
            type=_many(f) if many else _one(f),
            default=argparse.SUPPRESS,
            metavar=f.metavar(many),
            help=help_text,
        )


def base_config(args: argparse.Namespace, **fields: Any):
    """``--preset``'s RunConfig (the workshop's when none is named) with `fields` applied."""
    from hpclab.core.presets import preset

    return preset(getattr(args, "preset", None) or "workshop").replace(**fields)


def field_values(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig fields given on the command line: name -> value (a list for a sweep)."""
    return {k[len("field_") :]: v for k, v in vars(args).items() if k.startswith("field_")}


__all__ = [
    "CHOICES",
    "Field",
    "fields",
    "convert",
    "add_field_options",
    "base_config",
    "field_values",
]
