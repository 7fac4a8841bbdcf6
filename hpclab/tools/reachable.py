"""Whether other users can reach an install: the first folder on its path they cannot enter.

A centre installs hpclab once for everyone (docs/cluster.md, "For centre staff"). Every user's
kernel and engines then run the install's Python and import its package, so each folder above
them needs the "search" (x) permission for other users (POSIX ``open``/``execve``: every
directory component of a path must grant search permission, or the call fails with EACCES). A
clone under a folder only its owner may enter (mode 0700, as ``mktemp -d`` and most home folders
make) works for the admin and fails for every student with ``env: '.../python': Permission
denied``, exit 126, which names no folder. :func:`closed_folder` finds that folder and
:func:`sentence` names it; ``hpclab doctor`` and ``make kernel`` for every user print it.

The test is on the mode bits for "others", not ``os.access``: staff often check as root, whom
``access`` lets in everywhere.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path


def closed_folder(path: Path | str) -> Path | None:
    """The first folder from ``/`` down to ``path``'s own folder that other users cannot enter
    (no ``x`` for others), or None. The path is taken as written, not resolved: a venv's
    ``bin/python`` is reached through the venv's folders, and its symlink's target separately
    (:func:`install_paths` lists both)."""
    path = Path(os.path.abspath(path))
    for folder in reversed(path.parents):  # from / downwards
        try:
            mode = folder.stat().st_mode
        except OSError:
            return None  # not there: nothing to say about reaching it
        if not mode & stat.S_IXOTH:
            return folder
    return None


def install_paths() -> dict[str, Path]:
    """What another user's kernel and engines must reach: the venv's Python as the kernel spec
    names it, the interpreter it links to, and the hpclab package folder."""
    import hpclab

    return {
        "Python": Path(os.path.abspath(sys.executable)),
        "interpreter": Path(os.path.realpath(sys.executable)),
        "package": Path(hpclab.__file__).resolve().parent,
    }


def sentence(paths: dict[str, Path] | None = None) -> str | None:
    """One sentence naming the first folder other users cannot enter on the way to ``paths``
    (:func:`install_paths` by default) and what to do, or None when they reach everything."""
    paths = install_paths() if paths is None else paths
    for what, path in paths.items():
        folder = closed_folder(path)
        if folder is not None:
            mode = stat.S_IMODE(folder.stat().st_mode)
            return (
                f"other users cannot enter {folder} (mode {mode:04o}), which holds this "
                f"install's {what} ({path}), so every other user's kernel and engines would "
                f"fail with 'Permission denied': run `chmod o+x {folder}` (and o+x on the "
                "folders below it), or install under a folder every user can enter."
            )
    return None
