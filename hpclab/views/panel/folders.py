"""The panel's dataset menu: the catalogue's datasets and your own folders of files.

A file dataset is a folder holding a ``dataset.json`` (:mod:`hpclab.core.filedata`). The menu
offers the catalogue's names (the knob table's choices), then every such folder under the data
root (the lab's ``data_dir``, or ``Panel(data_root=...)``): the root's folders and their folders,
:data:`MAX_DEPTH` levels, labelled by their path under the root; and a text field takes any
other folder's path: Enter adds it to the menu and picks it, or a note says in one sentence why
it cannot (the description's own refusal). A folder's models are those of its input's kind
(one axis: 1-D signals; three: images), and your own model (``package.module:function``) of
the panel's base config stays offered. ipywidgets comes in as the ``W`` argument.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpclab.core.catalog import MODEL_INPUT, MODELS, is_user_model
from hpclab.core.catalog import models_for as catalogue_models
from hpclab.core.errors import ConfigError
from hpclab.core.filedata import DESCRIPTION, describe, is_file_dataset
from hpclab.core.knobs import knob
from hpclab.views.panel.text import GREY, esc

MAX_DEPTH = 2  # folder levels under the data root searched for a dataset.json
KINDS = {1: "1d", 3: "image"}  # input axes -> the catalogue's input kind


def find(root: str | Path | None) -> list[Path]:
    """The folders under ``root`` (at most :data:`MAX_DEPTH` levels down, hidden ones skipped)
    that hold a dataset.json, sorted by path; none without a readable root."""
    found: list[Path] = []
    if root is None:
        return found
    level = [Path(root)]
    for _ in range(MAX_DEPTH):
        below = []
        for folder in level:
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for e in entries:
                if e.name.startswith(".") or not e.is_dir():
                    continue
                below.append(Path(e.path))
                if os.path.isfile(os.path.join(e.path, DESCRIPTION)):
                    found.append(Path(e.path).resolve())
        level = below
    return sorted(found)


def options(root: str | Path | None, current: str) -> list:
    """The menu: each catalogue name, each folder under ``root`` and ``current`` if it is a
    folder found elsewhere; (label, value) pairs where a label differs from its value."""
    out = [(name, name) for name in knob("dataset").choices]
    for folder in find(root):
        out.append((f"{folder.relative_to(Path(root).resolve())}/", str(folder)))
    return with_folder(out, current)


def with_folder(menu, path: str) -> list:
    """``menu`` (values, or (label, value) pairs) with the folder ``path`` offered (labelled by
    its path) if it is not yet; plain values when every label is its value (as ipywidgets
    takes either form, not a mix)."""
    pairs = [(o, o) if isinstance(o, str) else tuple(o) for o in menu]
    if is_file_dataset(path) and path not in [v for _, v in pairs]:
        pairs.append((path, path))
    if all(label == value for label, value in pairs):
        return [value for _, value in pairs]
    return pairs


def models_for(dataset: str, keep: Any = None) -> list[str]:
    """The models to offer for ``dataset`` (a catalogue name or a folder), with ``keep`` added
    when it is your own model."""
    if not is_file_dataset(dataset):
        fits = list(catalogue_models(dataset))
    else:
        try:
            kind = KINDS.get(len(describe(dataset)["input_shape"]))
        except ConfigError:
            kind = None  # (the config's refusal says why; every model stays offered)
        fits = [m for m in MODELS if kind is None or kind in MODEL_INPUT[m]]
        if kind is None:  # 2 axes (or unreadable): the models that take either kind
            fits = [m for m in MODELS if len(MODEL_INPUT[m]) > 1] or list(MODELS)
    return fits + [keep] if is_user_model(keep) else fits


def path_field(W: Any) -> tuple[Any, Any]:
    """The text field for a folder's path, and the note beside it."""
    field = W.Text(
        placeholder="or a folder with a dataset.json, then Enter",
        description="folder",
        continuous_update=False,
        tooltip="a folder of your own files described by a dataset.json (docs/user-guide.md)",
        style={"description_width": "130px"},
        layout={"width": "300px"},
    )
    return field, W.HTML()


def take_path(menu: Any, field: Any, note: Any) -> None:
    """The field's path: added to the menu and picked if its description is readable, else the
    note says why (one sentence)."""
    path = field.value.strip()
    if not path:
        note.value = ""
        return
    path = os.path.abspath(os.path.expanduser(path))
    try:
        describe(path)
    except ConfigError as exc:
        note.value = f"<div style='color:#b00;font-size:12px;max-width:300px'>{esc(exc)}</div>"
        return
    menu.options = with_folder(list(menu.options), path)
    menu.value = path
    note.value = f"<div style='color:{GREY};font-size:12px'>{esc(path)}: in the menu</div>"


__all__ = ["MAX_DEPTH", "find", "options", "with_folder", "models_for", "path_field", "take_path"]
