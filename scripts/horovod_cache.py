"""Horovod wheel cache: cache keys, build metadata and linkage checks.

Horovod 0.28.1 is source-only and its compiled ops link one particular MPI library and one
particular TensorFlow. pip's own wheel cache keys wheels by name and version only, so it can
hand back a Horovod linked against a different MPI. `scripts/setup.sh` therefore builds Horovod
with ``--no-cache-dir`` and keeps the wheel under ``.cache/wheels/<key>/`` together with a
``build.json`` that records what the wheel was built against. Before a cached wheel is reused,
or an installed Horovod is trusted, the recorded facts are compared with the current
environment.

This module is pure Python (it never imports TensorFlow, Horovod or mpi4py) so it runs in
milliseconds and is unit-tested in ``tests/test_build_cache.py``. `scripts/setup.sh` calls it as::

    python scripts/horovod_cache.py key                 # print the cache key of this environment
    python scripts/horovod_cache.py env                 # print the environment as JSON
    python scripts/horovod_cache.py check-cache DIR     # exit 0 and print the wheel if DIR can be reused
    python scripts/horovod_cache.py write-meta DIR WHEEL --seconds S
    python scripts/horovod_cache.py mark-installed DIR  # record which cached wheel is installed
    python scripts/horovod_cache.py check-installed     # exit 0 if the installed Horovod is the right one
    python scripts/horovod_cache.py requirements FILE --without mpich mpi4py

The MPI comes from ``$HPCLAB_MPI``: ``pypi`` (default; the ``mpich`` wheel installed in the
venv) or ``system`` (the ``mpicc`` found on ``PATH``, e.g. after ``module load``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The Horovod release hpclab builds (the last one; it needs TensorFlow < 2.16).
HOROVOD_VERSION = "0.28.1"
#: Distributions that provide the ``tensorflow`` module, in the order they are looked for.
TF_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-intel", "tensorflow-macos")
#: File written beside each cached wheel.
META_NAME = "build.json"
#: Bumped when the metadata layout changes; older caches are then rebuilt.
META_SCHEMA = 1
#: Marker inside the venv naming the cached wheel that is installed there.
INSTALLED_MARKER = "hpclab-horovod.json"
MPI_MODES = ("pypi", "system")


class BuildEnvError(RuntimeError):
    """The environment cannot be described; the message says what to fix."""


@dataclass(frozen=True)
class MPIInfo:
    """The MPI that Horovod and mpi4py are (to be) built against."""

    mode: str  # "pypi" (mpich wheel in the venv) or "system" (mpicc on PATH)
    flavour: str  # "mpich", "openmpi", "intelmpi" or "unknown"
    version: str  # e.g. "5.0.2"
    mpicc: str  # absolute path of the compiler wrapper
    libmpi: str  # real path of the libmpi the wrapper links ("" if it could not be found)
    fingerprint: str  # sha256 of `mpicc -show` and the MPI's version report
    # What the fingerprint hashes, kept so that a wheel built in another clone's venv can be
    # matched with that venv's folder put back (:func:`as_built_by`); "" in older records.
    show: str = ""
    report: str = ""


@dataclass(frozen=True)
class BuildEnv:
    """Everything a Horovod wheel depends on."""

    horovod: str
    tensorflow: str
    python: str  # "3.11.9"
    python_tag: str  # "cp311"
    platform: str  # sysconfig platform, e.g. "linux-x86_64"
    mpi: MPIInfo
    gpu_operations: str = ""  # HOROVOD_GPU_OPERATIONS of the build: "" (CPU only) or "NCCL"
    # sha256 of the patch applied to Horovod's sdist ("" = PyPI's Horovod as released): a stack
    # whose TensorFlow needs patches/horovod-*.patch (HPCLAB_STACK=py312) gets its own wheels.
    horovod_patch: str = ""
    # GPU builds only (scripts/gpu_toolkit.py): CUDA "12.2", NCCL "2.16.5", compute caps "70,80,90".
    cuda: str = ""
    nccl: str = ""
    cuda_cc: str = ""
    nccl_lib: str = ""  # a site's NCCL (scripts/site_nccl.py): its library's real path; "" = pip's

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildEnv:
        """Inverse of :meth:`to_dict`."""
        fields = {k: v for k, v in data.items() if k != "mpi"}
        return cls(mpi=MPIInfo(**data["mpi"]), **fields)


# ----------------------------------------------------------------------------------------------
# Pure parsing helpers
# ----------------------------------------------------------------------------------------------


def parse_mpichversion(text: str) -> str:
    """Version from ``mpichversion`` output (``MPICH Version:      5.0.2``)."""
    match = re.search(r"MPICH Version:\s*(\S+)", text)
    if not match:
        raise BuildEnvError("mpichversion printed no 'MPICH Version:' line; is this MPICH?")
    return match.group(1)


def parse_ompi_info(text: str) -> str:
    """Version from ``ompi_info --version`` output (``Open MPI v4.1.5``)."""
    match = re.search(r"Open MPI v?(\d[\w.]*)", text)
    if not match:
        raise BuildEnvError("ompi_info --version printed no 'Open MPI v...' line.")
    return match.group(1)


def parse_mpiexec_version(text: str) -> tuple[str, str]:
    """(flavour, version) from ``mpiexec --version`` output, ("unknown", "") if unrecognised."""
    patterns = (
        ("intelmpi", r"Intel\(R\) MPI Library.*?Version\s+(\S+)"),
        ("openmpi", r"\((?:OpenRTE|Open MPI)\)\s+v?(\d[\w.]*)"),
        ("mpich", r"HYDRA build details:.*?Version:\s*(\S+)"),
    )
    for flavour, pattern in patterns:
        match = re.search(pattern, text, re.S)
        if match:
            return flavour, match.group(1).rstrip(",")
    return "unknown", ""


def libmpi_from_show(show: str) -> str:
    """Real path of the ``libmpi`` a compiler wrapper links, from its ``-show`` output.

    Looks in the ``-L`` directories for a versioned ``libmpi.so.N`` (the unversioned
    ``libmpi.so`` may be a linker script, as in the PyPI ``mpich`` wheel). Returns "" when no
    ``-L`` directory holds one (e.g. the library lives in the linker's default path).
    """
    tokens = show.split()
    dirs = [t[2:] for t in tokens if t.startswith("-L") and len(t) > 2]
    dirs += [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "-L"]
    # the library the wrapper links: -lmpi, or a Cray MPICH's -lmpi_cray / -lmpi_gnu_123
    names = [t[2:] for t in tokens if re.fullmatch(r"-lmpi(_\w+)?", t)] or ["mpi"]
    for directory in dirs:
        for name in names:
            candidates = sorted(glob.glob(os.path.join(directory, f"lib{name}.so.[0-9]*")), key=len)
            if candidates:
                return os.path.realpath(candidates[0])
    return ""


def _safe(text: str) -> str:
    """Keep a version string usable in a directory name."""
    return re.sub(r"[^A-Za-z0-9._]+", "_", text) or "unknown"


# ----------------------------------------------------------------------------------------------
# Key and metadata comparison (pure)
# ----------------------------------------------------------------------------------------------


def wheel_cache_key(env: BuildEnv) -> str:
    """Directory name under ``.cache/wheels`` for a wheel built in `env`.

    PyPI MPI: ``horovod0.28.1-tf2.15.1-mpich5.0.2-cp311``. A site MPI adds ``system`` and a
    short hash of its fingerprint, because two sites' "MPICH 4.1" builds are not the same
    library: ``horovod0.28.1-tf2.15.1-system-openmpi4.1.5-1a2b3c4d5e-cp311``.
    """
    mpi = env.mpi
    mpi_part = f"{mpi.flavour}{_safe(mpi.version)}"
    if mpi.mode == "system":
        mpi_part = f"system-{mpi_part}-{mpi.fingerprint[:10]}"
    gpu_part = f"-{env.gpu_operations.lower()}" if env.gpu_operations else ""
    if env.gpu_operations and env.cuda:  # a wheel is only right for its CUDA, NCCL and GPU archs
        site = (
            f"-site{hashlib.sha256(env.nccl_lib.encode()).hexdigest()[:8]}" if env.nccl_lib else ""
        )
        gpu_part = (
            f"-nccl{_safe(env.nccl)}{site}-cuda{_safe(env.cuda)}-sm{env.cuda_cc.replace(',', '.')}"
        )
    patch_part = f"-patch{env.horovod_patch[:10]}" if env.horovod_patch else ""
    return (
        f"horovod{_safe(env.horovod)}-tf{_safe(env.tensorflow)}-{mpi_part}{gpu_part}{patch_part}"
        f"-{env.python_tag}"
    )


# (path in BuildEnv.to_dict(), what to call it in a sentence)
_COMPARED = (
    (("horovod",), "Horovod version"),
    (("tensorflow",), "TensorFlow version"),
    (("python_tag",), "Python ABI"),
    (("platform",), "platform"),
    (("mpi", "mode"), "MPI source (HPCLAB_MPI)"),
    (("mpi", "flavour"), "MPI flavour"),
    (("mpi", "version"), "MPI version"),
    (("mpi", "libmpi"), "MPI library path"),
    (("mpi", "fingerprint"), "MPI fingerprint (mpicc -show and version report)"),
    (("gpu_operations",), "GPU operations (HOROVOD_GPU_OPERATIONS)"),
    (("horovod_patch",), "patch applied to Horovod's source (sha256)"),
    (("cuda",), "CUDA version"),
    (("nccl",), "NCCL version"),
    (("cuda_cc",), "CUDA compute capabilities (HOROVOD_BUILD_CUDA_CC_LIST)"),
    (("nccl_lib",), "site NCCL library (HPCLAB_NCCL_HOME/NCCL_HOME)"),
)
# Absent from older build.json files: their default.
_OPTIONAL = {("gpu_operations",): "", ("cuda",): "", ("nccl",): "", ("cuda_cc",): ""}
_OPTIONAL[("nccl_lib",)] = ""  # wheels built before a site's NCCL was keyed used pip's
_OPTIONAL[("horovod_patch",)] = ""  # wheels built before patches were keyed


def _venv_of(mpicc: str) -> str:
    return os.path.dirname(os.path.dirname(mpicc))  # <venv>/bin/mpicc


def as_built_by(built: Mapping[str, Any], env: BuildEnv) -> dict[str, Any]:
    """``env`` as the wheel's builder saw it: with PyPI's MPI, which lives inside the venv
    (``<venv>/bin/mpicc``, ``<venv>/lib/libmpi.so.12``), another clone's venv folder is the only
    difference between two clones' MPI, so this venv's folder is put back to the builder's in
    the wrapper's output and the library's path before they are compared. The wheel's
    ``RUNPATH`` is made venv-relative at install (``scripts/setup.sh``), so the same wheel links
    this venv's libmpi. A site MPI (``system``) at another path is another MPI: unchanged."""
    current = env.to_dict()
    mpi = built.get("mpi") if isinstance(built.get("mpi"), Mapping) else {}
    if env.mpi.mode != "pypi" or mpi.get("mode") != "pypi" or not mpi.get("mpicc"):
        return current
    then, now = _venv_of(str(mpi["mpicc"])), _venv_of(env.mpi.mpicc)
    if then == now or not env.mpi.show:
        return current
    current["mpi"] = {
        **current["mpi"],
        "mpicc": env.mpi.mpicc.replace(now, then, 1),
        "libmpi": env.mpi.libmpi.replace(now, then, 1),
        "fingerprint": mpi_fingerprint(env.mpi.show.replace(now, then), env.mpi.report),
    }
    return current


#: <venv>/lib seen from ``<venv>/lib/pythonX.Y/site-packages/horovod/tensorflow/mpi_lib*.so``.
VENV_LIB_FROM_OPS = "$ORIGIN/../../../.."


def relocated_rpath(old: str, meta: Mapping[str, Any]) -> str:
    """The ops' RUNPATH with the builder's venv lib folder (PyPI's MPI: where its libmpi was)
    replaced by :data:`VENV_LIB_FROM_OPS`, put first; every other entry (a GPU build's NCCL
    folder) kept in order."""
    mpi = meta.get("env", {}).get("mpi", {})
    builder = {os.path.dirname(str(mpi.get("libmpi", "")))}
    if mpi.get("mpicc"):
        builder.add(os.path.join(_venv_of(str(mpi["mpicc"])), "lib"))
    kept = [p for p in old.split(":") if p and p not in builder and p != VENV_LIB_FROM_OPS]
    return ":".join([VENV_LIB_FROM_OPS, *kept])


def wheel_matches(meta: Mapping[str, Any], env: BuildEnv) -> tuple[bool, str]:
    """Whether a wheel described by `meta` (a ``build.json``) fits `env`, and why (not)."""
    if meta.get("schema") != META_SCHEMA:
        return (
            False,
            f"the cache metadata has schema {meta.get('schema')!r}, expected {META_SCHEMA}",
        )
    built = meta.get("env")
    if not isinstance(built, Mapping):
        return False, "the cache metadata has no 'env' record"
    current = as_built_by(built, env)
    for path, label in _COMPARED:
        then: Any = built
        now: Any = current
        for part in path:
            then = then.get(part) if isinstance(then, Mapping) else None
            now = now[part]
        if then is None and path in _OPTIONAL:
            then = _OPTIONAL[path]
        if then != now:
            return (
                False,
                f"the {label} differs: the wheel was built with {then!r}, this environment has {now!r}",
            )
    return (
        True,
        f"built against TensorFlow {env.tensorflow} and {env.mpi.flavour} {env.mpi.version} ({env.mpi.libmpi or 'libmpi in the default path'})",
    )


def make_meta(env: BuildEnv, wheel_name: str, build_seconds: float) -> dict[str, Any]:
    """The ``build.json`` record for a freshly built wheel."""
    return {
        "schema": META_SCHEMA,
        "wheel": wheel_name,
        "built_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "build_seconds": round(build_seconds, 1),
        "env": env.to_dict(),
    }


def requirements_without(lines: Sequence[str], names: Sequence[str]) -> list[str]:
    """Requirement lines minus the ones naming a package in `names` (PEP 503 normalised)."""
    drop = {_normalise(n) for n in names}
    kept = []
    for line in lines:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if (
            match
            and not line.lstrip().startswith(("#", "-"))
            and _normalise(match.group(1)) in drop
        ):
            continue
        kept.append(line)
    return kept


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------------------------
# Reading the real environment (subprocesses and the filesystem; still no TF import)
# ----------------------------------------------------------------------------------------------


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False, timeout=120)


def mpi_mode(environ: Mapping[str, str] = os.environ) -> str:
    """The MPI source chosen by ``$HPCLAB_MPI`` (default ``pypi``)."""
    mode = environ.get("HPCLAB_MPI", "pypi") or "pypi"
    if mode not in MPI_MODES:
        raise BuildEnvError(f"HPCLAB_MPI must be 'pypi' or 'system', you set HPCLAB_MPI={mode!r}.")
    return mode


def parse_cray_mpich(show: str, environ: Mapping[str, str] = os.environ) -> str:
    """Cray MPICH's version when `show` (``cc --cray-print-opts=all``) links it, else "".

    Cray's compiler wrappers ``cc``/``CC`` add MPI implicitly when ``cray-mpich`` is loaded; the
    module sets ``CRAY_MPICH_VERSION`` and the libraries live under ``.../cray/pe/mpich/<ver>/``
    (HPE Cray Programming Environment docs, "Compiler drivers")."""
    if not re.search(r"/mpich/|-lmpi_cray|-lmpi_\w+", show):
        return ""
    match = re.search(r"/mpich/(\d[\w.]*)/", show)
    return environ.get("CRAY_MPICH_VERSION") or (match.group(1) if match else "unknown")


def is_cray_pe(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the HPE Cray Programming Environment is loaded (its modules set these)."""
    return bool(environ.get("PE_ENV") or environ.get("CRAYPE_VERSION"))


def find_mpicc(
    mode: str,
    prefix: str = sys.prefix,
    path: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """The MPI C compiler wrapper for `mode`: the venv's ``mpicc`` (pypi); for a site MPI
    ``$HPCLAB_MPICC`` if set, else the first ``mpicc`` on PATH outside the venv, else Cray's
    ``cc`` when the Cray Programming Environment is loaded (Cray has no ``mpicc``)."""
    venv_bin = os.path.join(prefix, "bin")
    if mode == "pypi":
        mpicc = os.path.join(venv_bin, "mpicc")
        if not os.access(mpicc, os.X_OK):
            raise BuildEnvError(
                f"{mpicc} does not exist: the PyPI 'mpich' wheel is not installed in this venv; "
                "run `make setup` (or set HPCLAB_MPI=system to use your site MPI)."
            )
        return mpicc
    search = os.pathsep.join(
        d
        for d in (path if path is not None else environ.get("PATH", "")).split(os.pathsep)
        if d and os.path.realpath(d) != os.path.realpath(venv_bin)
    )
    wanted = environ.get("HPCLAB_MPICC", "")
    mpicc = shutil.which(wanted, path=search) if wanted else shutil.which("mpicc", path=search)
    if not mpicc and not wanted and is_cray_pe(environ):
        mpicc = shutil.which("cc", path=search)
    if not mpicc:
        raise BuildEnvError(
            f"HPCLAB_MPI=system but HPCLAB_MPICC={wanted!r} is not an executable on PATH."
            if wanted
            else "HPCLAB_MPI=system but no mpicc is on PATH; load your site MPI first (e.g. "
            "`module load mpich`), or name its C compiler wrapper in HPCLAB_MPICC (Cray: cc)."
        )
    return os.path.abspath(mpicc)


def _mpicc_show(mpicc: str) -> str:
    # MPICH/Intel MPI, Open MPI, Cray's cc (whose -show is not an option)
    for flag in ("-show", "--showme", "--cray-print-opts=all"):
        result = _run([mpicc, flag])
        if result.returncode == 0 and result.stdout.strip():
            return result.stdout.strip()
    raise BuildEnvError(f"`{mpicc} -show` failed; is {mpicc} an MPI compiler wrapper?")


def read_mpi(mode: str, prefix: str = sys.prefix) -> MPIInfo:
    """Describe the MPI that `mode` selects, by asking its own tools."""
    mpicc = find_mpicc(mode, prefix)
    show = _mpicc_show(mpicc)
    bindir = os.path.dirname(mpicc)
    report = ""
    mpichversion = os.path.join(bindir, "mpichversion")
    ompi_info = os.path.join(bindir, "ompi_info")
    cray = parse_cray_mpich(show) if is_cray_pe() else ""
    if cray:
        report = f"CRAY_MPICH_VERSION={cray}"
        flavour, version = "cray-mpich", cray
    elif os.access(mpichversion, os.X_OK):
        report = _run([mpichversion]).stdout
        flavour, version = "mpich", parse_mpichversion(report)
    elif os.access(ompi_info, os.X_OK):
        report = _run([ompi_info, "--version"]).stdout
        flavour, version = "openmpi", parse_ompi_info(report)
    else:
        # Neither MPICH's nor Open MPI's version tool: ask mpiexec (Intel MPI, Cray, ...).
        mpiexec = shutil.which("mpiexec", path=bindir) or shutil.which("mpiexec")
        if mpiexec:
            result = _run([mpiexec, "--version"])
            report = result.stdout + result.stderr
        flavour, version = parse_mpiexec_version(report)
    return MPIInfo(
        mode=mode,
        flavour=flavour,
        version=version or "unknown",
        mpicc=mpicc,
        libmpi=libmpi_from_show(show),
        fingerprint=mpi_fingerprint(show, report),
        show=show,
        report=report,
    )


def mpi_fingerprint(show: str, report: str) -> str:
    """sha256 of the wrapper's ``-show`` output and the MPI's version report."""
    return hashlib.sha256(f"{show}\n--\n{report}".encode()).hexdigest()


def tensorflow_version() -> str:
    """Installed TensorFlow version, read from package metadata (no import)."""
    for dist in TF_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise BuildEnvError("TensorFlow is not installed in this Python; run `make setup` first.")


def read_env(environ: Mapping[str, str] = os.environ) -> BuildEnv:
    """Describe the current environment (this interpreter, its TensorFlow, the chosen MPI)."""
    return BuildEnv(
        horovod=HOROVOD_VERSION,
        tensorflow=tensorflow_version(),
        python=".".join(map(str, sys.version_info[:3])),
        python_tag=f"cp{sys.version_info[0]}{sys.version_info[1]}",
        platform=sysconfig.get_platform(),
        mpi=read_mpi(mpi_mode(environ)),
        gpu_operations=gpu_operations(environ),
        horovod_patch=horovod_patch(environ),
        **gpu_toolkit(environ),
    )


def horovod_patch(environ: Mapping[str, str] = os.environ) -> str:
    """sha256 of the patch file scripts/setup.sh applies to Horovod (HPCLAB_HOROVOD_PATCH), or ""."""
    path = environ.get("HPCLAB_HOROVOD_PATCH", "")
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as err:
        raise BuildEnvError(
            f"HPCLAB_HOROVOD_PATCH={path!r} cannot be read ({err.strerror}); it must name "
            "the patch file scripts/setup.sh applies (patches/horovod-*.patch)."
        ) from None


def gpu_operations(environ: Mapping[str, str] = os.environ) -> str:
    """HOROVOD_GPU_OPERATIONS for the build, as scripts/setup.sh decided it (HPCLAB_GPU_OPS)."""
    ops = environ.get("HPCLAB_GPU_OPS", "").strip().upper()
    if ops not in ("", "NCCL"):
        raise BuildEnvError(f"HPCLAB_GPU_OPS must be empty or NCCL; it is {ops!r}.")
    return ops


def gpu_toolkit(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """CUDA, NCCL (a site's: its library) and compute capabilities of a GPU build, as
    scripts/gpu_toolkit.py found them."""
    if not gpu_operations(environ) or not environ.get("HPCLAB_CUDA_VERSION"):
        return {}
    found = {
        "cuda": environ["HPCLAB_CUDA_VERSION"],
        "nccl": environ.get("HPCLAB_NCCL_VERSION", ""),
        "cuda_cc": environ.get("HOROVOD_BUILD_CUDA_CC_LIST", ""),
    }
    if environ.get("HPCLAB_NCCL_SITE_LIB"):  # a site's NCCL, which scripts/site_nccl.py found
        found["nccl_lib"] = environ["HPCLAB_NCCL_SITE_LIB"]
    return found


# ----------------------------------------------------------------------------------------------
# Cache directories and the installed Horovod
# ----------------------------------------------------------------------------------------------


def read_meta(path: str) -> dict[str, Any] | None:
    """A ``build.json``-style record, or None if the file is missing."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def cached_wheel(cache_dir: str, env: BuildEnv) -> tuple[str | None, str]:
    """(wheel path, reason) when `cache_dir` holds a reusable wheel; (None, reason) otherwise."""
    meta = read_meta(os.path.join(cache_dir, META_NAME))
    if meta is None:
        return None, f"no cached wheel in {cache_dir}"
    wheel = os.path.join(cache_dir, str(meta.get("wheel", "")))
    if not meta.get("wheel") or not os.path.isfile(wheel):
        return None, f"{cache_dir}/{META_NAME} names a wheel that is not there"
    ok, reason = wheel_matches(meta, env)
    return (wheel if ok else None), reason


def check_linkage(env: BuildEnv, ldd: str = "ldd") -> tuple[bool, str]:
    """Whether the installed ``horovod/tensorflow/mpi_lib*.so`` links the expected libmpi."""
    # Imported here: `setup.sh` runs this script's `requirements` command before hpclab is
    # installed in the venv (HPCLAB_MPI=system), and that command needs no hpclab module.
    from hpclab.tools.linkage import horovod_mpi_libs, parse_ldd_libmpi

    libs = horovod_mpi_libs()
    if not libs:
        return (
            False,
            "horovod/tensorflow/mpi_lib*.so is missing: Horovod was built without TensorFlow",
        )
    result = _run([ldd, libs[0]])
    if result.returncode != 0:
        return False, f"ldd {libs[0]} failed: {result.stderr.strip()}"
    entry = parse_ldd_libmpi(result.stdout)
    if entry is None:
        return (
            False,
            f"{os.path.basename(libs[0])} does not link any libmpi: Horovod was built without MPI",
        )
    soname, resolved = entry
    if resolved is None:
        return False, f"{os.path.basename(libs[0])} needs {soname} but the loader cannot find it"
    if env.mpi.libmpi and os.path.realpath(resolved) != env.mpi.libmpi:
        return False, f"Horovod's ops link {os.path.realpath(resolved)}, expected {env.mpi.libmpi}"
    return True, f"Horovod's ops link {os.path.realpath(resolved)}"


def check_installed(env: BuildEnv, prefix: str = sys.prefix) -> tuple[bool, str]:
    """Whether the venv's Horovod is the right version, built for `env`, and linked correctly."""
    try:
        version = importlib.metadata.version("horovod")
    except importlib.metadata.PackageNotFoundError:
        return False, "Horovod is not installed"
    if version != env.horovod:
        return False, f"Horovod {version} is installed, expected {env.horovod}"
    marker = read_meta(os.path.join(prefix, INSTALLED_MARKER))
    if marker is None:
        return False, "the installed Horovod was not installed from the hpclab wheel cache"
    ok, reason = wheel_matches(marker, env)
    if not ok:
        return False, reason
    return check_linkage(env)


# ----------------------------------------------------------------------------------------------
# Command line used by scripts/setup.sh
# ----------------------------------------------------------------------------------------------


def _write_json(path: str, data: Mapping[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python scripts/horovod_cache.py``; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python scripts/horovod_cache.py", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("key", help="print the wheel cache key of this environment")
    sub.add_parser("env", help="print this environment as JSON")
    p = sub.add_parser("check-cache", help="exit 0 and print the wheel path if DIR is reusable")
    p.add_argument("dir")
    p = sub.add_parser("write-meta", help="write DIR/build.json for WHEEL")
    p.add_argument("dir")
    p.add_argument("wheel")
    p.add_argument("--seconds", type=float, default=0.0)
    p = sub.add_parser("mark-installed", help="record in the venv which cached wheel is installed")
    p.add_argument("dir")
    sub.add_parser("check-installed", help="exit 0 if the installed Horovod fits this environment")
    p = sub.add_parser("requirements", help="print a requirements file without some packages")
    p.add_argument("file")
    p.add_argument("--without", nargs="+", default=[])
    p = sub.add_parser("relocated-rpath", help="print the ops' venv-relative RUNPATH (PyPI MPI)")
    p.add_argument("dir", help="the cached wheel's folder (its build.json names the builder)")
    p.add_argument("old", help="the installed ops' RUNPATH (patchelf --print-rpath)")
    args = parser.parse_args(argv)

    if args.command == "requirements":
        with open(args.file, encoding="utf-8") as f:
            sys.stdout.writelines(requirements_without(f.readlines(), args.without))
        return 0
    if args.command == "relocated-rpath":
        meta = read_meta(os.path.join(args.dir, META_NAME))
        if meta is None:
            print(f"error: {args.dir}/{META_NAME} does not exist", file=sys.stderr)
            return 2
        print(relocated_rpath(args.old, meta))
        return 0
    try:
        env = read_env()
    except BuildEnvError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    if args.command == "key":
        print(wheel_cache_key(env))
    elif args.command == "env":
        print(json.dumps(env.to_dict(), indent=2, sort_keys=True))
    elif args.command == "check-cache":
        wheel, reason = cached_wheel(args.dir, env)
        if wheel is None:
            print(f"not reusing the cache: {reason}", file=sys.stderr)
            return 1
        print(wheel)
        print(f"reusing cached wheel {wheel}: {reason}", file=sys.stderr)
    elif args.command == "write-meta":
        meta = make_meta(env, os.path.basename(args.wheel), args.seconds)
        _write_json(os.path.join(args.dir, META_NAME), meta)
    elif args.command == "mark-installed":
        meta = read_meta(os.path.join(args.dir, META_NAME))
        if meta is None:
            print(f"error: {args.dir}/{META_NAME} does not exist", file=sys.stderr)
            return 2
        _write_json(os.path.join(sys.prefix, INSTALLED_MARKER), meta)
    elif args.command == "check-installed":
        ok, reason = check_installed(env)
        print(reason, file=sys.stderr)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
