#!/usr/bin/env python3
"""The site stack (``make STACK=site setup``): a venv over a TensorFlow 2.15 + Horovod + mpi4py
that a site module or container already provides. Standard library only: `probe` and `pth` run
under the site's Python before the venv exists.

- ``probe``: does the site's Python have TensorFlow, Horovod and mpi4py (package metadata, no
  import)? JSON on stdout, or one sentence and exit 1.
- ``pth``: the lines of a ``.pth`` file that make the venv see the site's packages. A venv made
  with ``--system-site-packages`` sees the *base* interpreter's packages only; when the site's
  Python is itself a venv (or conda env) its packages live elsewhere, so its site-packages are
  added with ``site.addsitedir`` (which also reads the ``.pth`` files there).
- ``requirements BASE_IN``: requirements/base.in without what the site provides and hpclab must
  never replace (:data:`NEVER`): TensorFlow, Keras, Horovod, mpi4py, MPICH, numpy, protobuf and
  Horovod's build tools.
- ``constraints LOCK``: every package found outside the venv pinned to the version it has (so pip
  adds only what is missing and changes nothing of the site's, or stops), then the lock's pins
  for packages the site lacks.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import site
import sys
import sysconfig
from pathlib import Path

#: Never installed into a site-stack venv: the site's builds of these are the point.
NEVER = frozenset(
    {
        "tensorflow",
        "tensorflow-cpu",
        "tensorflow-gpu",
        "tensorflow-intel",
        "tf-keras",
        "keras",
        "horovod",
        "mpi4py",
        "mpich",
        "numpy",
        "protobuf",
        "cmake",
    }
)
#: Never pinned: the venv's own installer and build backend (hpclab's editable install needs
#: setuptools >= 64, which an older site may not have; shadowing them changes nothing at run time).
UNPINNED = frozenset({"pip", "setuptools", "wheel", "hpclab"})
#: What the site must provide (distribution names; any one of each group).
REQUIRED = {
    "TensorFlow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel"),
    "Horovod": ("horovod",),
    "mpi4py": ("mpi4py",),
}
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 normalised name (``Tensorflow_CPU`` -> ``tensorflow-cpu``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    """The canonical project name of a requirements line, or "" (comment, blank, option)."""
    text = line.split("#", 1)[0]
    if not text.strip() or text.lstrip().startswith("-"):
        return ""
    match = _NAME.match(text)
    return canonical(match.group(1)) if match else ""


def site_requirements(lines: list[str]) -> list[str]:
    """The requirement lines of base.in a site-stack venv installs (all but :data:`NEVER`)."""
    out = []
    for line in lines:
        name = requirement_name(line)
        if name and name not in NEVER:
            out.append(line.split("#", 1)[0].strip())
    return out


def site_constraints(site_versions: dict[str, str], lock_lines: list[str]) -> list[str]:
    """Pins: each site package at its version (but :data:`UNPINNED`), then the lock's lines for
    packages the site does not have."""
    have = {canonical(name): version for name, version in site_versions.items()}
    out = [f"{name}=={version}" for name, version in sorted(have.items()) if name not in UNPINNED]
    for line in lock_lines:
        name = requirement_name(line)
        if name and name not in have and name not in UNPINNED:
            out.append(line.split("#", 1)[0].strip())
    return out


def missing_parts(installed: set[str]) -> list[str]:
    """Which of :data:`REQUIRED` the site lacks (display names)."""
    names = {canonical(n) for n in installed}
    return [part for part, dists in REQUIRED.items() if not names & set(dists)]


def _distributions(outside: str = "") -> dict[str, str]:
    """{name: version} of the installed distributions (those not under `outside`, if given)."""
    out = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if not name:
            continue
        where = str(Path(str(dist.locate_file(""))).resolve())
        if outside and (where == outside or where.startswith(outside + "/")):
            continue
        out.setdefault(canonical(name), dist.version)
    return out


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths()[key]
        if path not in dirs:
            dirs.append(path)
    return [d for d in dirs if Path(d).is_dir()]


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command == "probe":
        found = _distributions()
        missing = missing_parts(set(found))
        if missing:
            print(
                f"the site's Python ({sys.executable}) has no {', '.join(missing)}: load the module "
                "or enter the container that provides TensorFlow 2.15 with Horovod and mpi4py, or "
                "point HPCLAB_SITE_PYTHON at its python.",
                file=sys.stderr,
            )
            return 1
        keys = ("tensorflow", "tensorflow-cpu", "horovod", "mpi4py", "numpy")
        print(json.dumps({"python": sys.executable, "versions": {k: found.get(k) for k in keys}}))
        return 0
    if command == "pth":
        print("\n".join(f"import site; site.addsitedir({d!r})" for d in _site_dirs()))
        return 0
    if command == "requirements" and len(argv) == 2:
        print("\n".join(site_requirements(Path(argv[1]).read_text().splitlines())))
        return 0
    if command == "constraints" and len(argv) == 2:
        venv = str(Path(sys.prefix).resolve())
        lines = Path(argv[1]).read_text().splitlines()
        print("\n".join(site_constraints(_distributions(outside=venv), lines)))
        return 0
    print(
        "usage: site_stack.py probe | pth | requirements BASE_IN | constraints LOCK",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
