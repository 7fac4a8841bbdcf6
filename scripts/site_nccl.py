"""Which NCCL a GPU Horovod build compiles against, and the NCCL network plugin a node offers.

`scripts/gpu_toolkit.py` asks :func:`find_nccl` before anything compiles. The first of

1. ``$HPCLAB_NCCL_HOME`` (hpclab's own switch), then ``$NCCL_HOME``, ``$NCCL_ROOT``,
   ``$NCCL_DIR`` (what sites' ``module load nccl`` files set): a site's NCCL, with
   ``include/nccl.h`` and ``lib/`` or ``lib64/`` holding ``libnccl.so*``;
2. the ``nvidia-nccl-cu12`` wheel that ``tensorflow[and-cuda]==2.15.1`` installs (NCCL 2.16.5:
   ``include/nccl.h``, ``lib/libnccl.so.2``, no unversioned ``libnccl.so``);

is used. A home that is set but lacks a piece is refused with one sentence naming the variable,
its value and the missing piece, never passed over in silence. Horovod's
``cmake/Modules/FindNCCL.cmake`` looks for the unversioned ``libnccl.so``
(``find_library(NAMES nccl)``); where a folder lacks it, a private folder with links to the
versioned file is made. The version is read from ``nccl.h`` (``NCCL_MAJOR``/``MINOR``/``PATCH``)
and, for a site's NCCL, checked against the library file's own version suffix. The library's
real path goes into the wheel-cache key (``scripts/horovod_cache.py``), so a wheel built
against one site's NCCL is never reused with another.

NCCL network plugins (NCCL's environment variables, ``NCCL_NET_PLUGIN``; the aws-ofi-nccl
README): NCCL ``dlopen``\\ s ``libnccl-net.so`` from the library path, or
``libnccl-net-<NAME>.so`` for ``NCCL_NET_PLUGIN=<NAME>`` (``none`` loads none), and then uses the
plugin's transport instead of its own InfiniBand and socket ones. aws-ofi-nccl (libfabric: EFA on
AWS, the ``cxi`` provider on HPE Slingshot) is the common one on HPC systems; NVIDIA's
nccl-rdma-sharp-plugins (HPC-X) and Google's gIB are others. :func:`plugin_sentence` names what
is on the path; whether NCCL loaded it is in its ``NCCL_DEBUG=INFO`` log ("Loaded net plugin"),
which ``hpclab.core.gpu_node.parse_nccl_log`` reads.

Pure apart from reading folders; unit-tested with fake trees in ``tests/test_site_nccl.py``::

    python scripts/site_nccl.py find --site-packages SP --dest DIR   # the NCCL, as JSON
    python scripts/site_nccl.py plugins                              # the plugin sentence
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

#: Variables naming a site's NCCL, in the order they are tried.
NCCL_HOME_VARS = ("HPCLAB_NCCL_HOME", "NCCL_HOME", "NCCL_ROOT", "NCCL_DIR")
PIP_SOURCE = "pip (nvidia-nccl-cu12)"


class NcclError(RuntimeError):
    """The NCCL cannot be used; the message is one sentence saying what to do."""


@dataclass(frozen=True)
class NcclFound:
    """The NCCL a build uses."""

    source: str  # "HPCLAB_NCCL_HOME", "NCCL_HOME", ... or PIP_SOURCE
    home: str
    include: str  # the folder holding nccl.h (HOROVOD_NCCL_INCLUDE)
    lib_dir: str  # a folder holding libnccl.so (HOROVOD_NCCL_LIB; may be a private link folder)
    lib: str  # real path of the shared library the ops will load
    version: str  # "2.18.5"

    @property
    def site(self) -> bool:
        """Whether this is a site's NCCL (not the pip wheel's)."""
        return self.source != PIP_SOURCE

    def to_dict(self) -> dict:
        """Plain JSON-able dict, with ``site``."""
        return {**asdict(self), "site": self.site}


def parse_nccl_header(text: str) -> str:
    """``2.16.5`` from the NCCL_MAJOR/NCCL_MINOR/NCCL_PATCH defines of ``nccl.h``."""
    parts = []
    for name in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"):
        match = re.search(rf"^\s*#define\s+{name}\s+(\d+)", text, re.M)
        if not match:
            raise NcclError(f"nccl.h defines no {name}; is it NVIDIA's NCCL header?")
        parts.append(match.group(1))
    return ".".join(parts)


def _libraries(folder: str) -> list[str]:
    """``libnccl.so*`` files in `folder` (not ``libnccl-net*``, not static), shortest name first."""
    found = glob.glob(os.path.join(folder, "libnccl.so*"))
    return sorted((p for p in found if os.path.exists(p)), key=lambda p: (len(p), p))


def nccl_at(home: str, source: str) -> tuple[str, list[str]]:
    """(folder of nccl.h, its ``libnccl.so*`` files) under a site NCCL `home` set by `source`."""
    header = os.path.join(home, "include", "nccl.h")
    if not os.path.isfile(header):
        raise NcclError(
            f"{source}={home!r} has no include/nccl.h; point {source} at the NCCL folder that holds "
            "include/ and lib/ (e.g. the one `module show nccl` names), or unset it to use the pip NCCL."
        )
    for sub in ("lib", "lib64"):
        libs = _libraries(os.path.join(home, sub))
        if libs:
            return os.path.dirname(header), libs
    raise NcclError(
        f"{source}={home!r} has include/nccl.h but no lib/ or lib64/ with libnccl.so*; a shared "
        "NCCL is needed (Horovod is linked with HOROVOD_NCCL_LINK=SHARED)."
    )


def check_lib_version(version: str, libs: Sequence[str], source: str, home: str) -> None:
    """Refuse a header whose version is not the library's (``libnccl.so.2.18.5``)."""
    for lib in libs:
        real = os.path.basename(os.path.realpath(lib))
        match = re.fullmatch(r"libnccl\.so\.(\d+\.\d+\.\d+)", real)
        if match and match.group(1) != version:
            raise NcclError(
                f"{source}={home!r}: include/nccl.h says NCCL {version} but the library is "
                f"{real}; the module mixes two NCCL installs, so point {source} at one of them."
            )


def private_link_dir(lib: str, dest: str) -> str:
    """A folder in `dest` with ``libnccl.so`` and ``libnccl.so.2`` linked to `lib`."""
    libdir = os.path.join(dest, "nccl-lib")
    os.makedirs(libdir, exist_ok=True)
    for name in ("libnccl.so", "libnccl.so.2"):
        link = os.path.join(libdir, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(lib, link)
    return libdir


def find_nccl(environ: Mapping[str, str], site_packages: str, dest: str) -> NcclFound:
    """The NCCL a GPU build uses (see the module docstring for the order)."""
    for var in NCCL_HOME_VARS:
        home = environ.get(var, "")
        if not home:
            continue
        include, libs = nccl_at(home, var)
        with open(os.path.join(include, "nccl.h"), encoding="utf-8", errors="replace") as f:
            version = parse_nccl_header(f.read())
        check_lib_version(version, libs, var, home)
        lib = os.path.realpath(libs[0])
        has_plain = os.path.basename(libs[0]) == "libnccl.so"
        lib_dir = os.path.dirname(libs[0]) if has_plain else private_link_dir(lib, dest)
        return NcclFound(var, home, include, lib_dir, lib, version)
    root = os.path.join(site_packages, "nvidia", "nccl")
    header = os.path.join(root, "include", "nccl.h")
    lib = os.path.join(root, "lib", "libnccl.so.2")
    if not (os.path.isfile(header) and os.path.isfile(lib)):
        raise NcclError(
            f"{root} has no include/nccl.h and lib/libnccl.so.2 and no site NCCL is set "
            f"({', '.join(NCCL_HOME_VARS)}); install tensorflow[and-cuda]==2.15.1 (it brings "
            "nvidia-nccl-cu12) or `module load nccl`."
        )
    with open(header, encoding="utf-8", errors="replace") as f:
        version = parse_nccl_header(f.read())
    return NcclFound(
        PIP_SOURCE, root, os.path.dirname(header), private_link_dir(lib, dest), lib, version
    )


# ----------------------------------------------------------------------------------------------
# NCCL network plugins
# ----------------------------------------------------------------------------------------------

#: (pattern in the plugin's path, what it is), first match wins.
PLUGIN_KINDS = (
    (
        "ofi",
        "aws-ofi-nccl, NCCL over libfabric (EFA on AWS, the cxi provider on HPE Slingshot)",
    ),
    ("sharp", "NVIDIA's nccl-rdma-sharp-plugins (InfiniBand verbs with SHARP, from HPC-X)"),
    ("gib", "Google's gIB plugin (GPUDirect-RDMA over Google Cloud's network)"),
)


def plugin_kind(path: str) -> str:
    """What the plugin at `path` is, from its name and folder."""
    lowered = path.lower()
    for pattern, kind in PLUGIN_KINDS:
        if pattern in lowered:
            return kind
    return "a NCCL network plugin (its NCCL_DEBUG=INFO log line 'Loaded net plugin' names it)"


def plugin_files(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(path, how it was found) of each NCCL network plugin NCCL could load on this node:
    ``libnccl-net*.so*`` in the folders of ``LD_LIBRARY_PATH``, or the file ``NCCL_NET_PLUGIN``
    names (a path, or a NAME for ``libnccl-net-NAME.so``)."""
    wanted = environ.get("NCCL_NET_PLUGIN", "")
    found: list[tuple[str, str]] = []
    if "/" in wanted and os.path.isfile(wanted):
        found.append((wanted, "NCCL_NET_PLUGIN"))
    for folder in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if not folder:
            continue
        for path in sorted(glob.glob(os.path.join(folder, "libnccl-net*.so*"))):
            if all(os.path.realpath(path) != os.path.realpath(p) for p, _ in found):
                found.append((path, "LD_LIBRARY_PATH"))
    return found


def plugin_sentence(environ: Mapping[str, str]) -> str | None:
    """One sentence naming the NCCL network plugin on this node and what it is (None: none)."""
    wanted = environ.get("NCCL_NET_PLUGIN", "")
    found = plugin_files(environ)
    if not found:
        if wanted and wanted != "none":
            return (
                f"NCCL_NET_PLUGIN={wanted!r} names a plugin that is not on LD_LIBRARY_PATH "
                f"(libnccl-net-{wanted}.so) nor a file, so NCCL will use its own transports; "
                "load the plugin's module or fix the name."
            )
        return None
    names = "; ".join(f"{path} (on {how}): {plugin_kind(path)}" for path, how in found)
    if wanted == "none":
        return f"NCCL network plugin found but NCCL_NET_PLUGIN=none turns it off: {names}."
    if wanted and "/" not in wanted:
        chosen = [p for p, _ in found if os.path.basename(p).startswith(f"libnccl-net-{wanted}.so")]
        pick = (
            f"NCCL_NET_PLUGIN={wanted} picks {chosen[0]}"
            if chosen
            else (
                f"but NCCL_NET_PLUGIN={wanted} names libnccl-net-{wanted}.so, which is not among them"
            )
        )
        return f"NCCL network plugin found: {names}; {pick}."
    return (
        f"NCCL network plugin found: {names}; NCCL loads it at its first communicator instead of "
        "its own InfiniBand and socket transports (its NCCL_DEBUG=INFO log says 'Loaded net plugin')."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python scripts/site_nccl.py``; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python scripts/site_nccl.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("find", help="print the NCCL a GPU build uses, as JSON")
    p.add_argument("--site-packages", required=True)
    p.add_argument("--dest", required=True)
    sub.add_parser("plugins", help="print the NCCL network plugin sentence (nothing: none)")
    args = parser.parse_args(argv)
    if args.command == "plugins":
        sentence = plugin_sentence(os.environ)
        if sentence:
            print(sentence)
        return 0
    try:
        found = find_nccl(os.environ, args.site_packages, args.dest)
    except NcclError as err:
        print(f"NCCL refused: {err}", file=sys.stderr)
        return 2
    print(json.dumps(found.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
