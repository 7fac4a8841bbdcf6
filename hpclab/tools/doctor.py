"""`hpclab doctor`: check the whole stack, from versions to a real 2-rank Horovod allreduce.

Stages, each timed:

1. versions   Python, TensorFlow, Keras, Horovod, the MPI library (via mpi4py) and `mpiexec`,
              ipyparallel, JupyterLab, plotly, numpy;
2. horovod    what Horovod was built with: frameworks, controllers (MPI, Gloo) and tensor ops,
              and that its ops link the same libmpi that mpi4py loads; on a site stack
              (``make STACK=site setup``) first the site's TensorFlow version and Horovod's
              flags (:mod:`hpclab.tools.site_checks`);
   install    whether other users can enter every folder above this install's Python and
              package (a warning naming the first they cannot: :mod:`hpclab.tools.reachable`);
3. devices    TensorFlow's CPU and GPU devices, and whether this CPU runs bfloat16 (oneDNN needs
              AVX-512; :func:`hpclab.rank.bfloat16.probe`, in a child process); on a node with
              ``nvidia-smi``, what it and ``nvcc`` say (:mod:`hpclab.tools.doctor_gpu`: driver
              and toolkit CUDA, compute capability, MIG), an error stopping a CUDA stack;
4. engines    (skipped with ``--quick``) start 2 ipyparallel MPI engines, ``hvd.init()`` on both,
              allreduce each rank's ``rank + 1`` and check that every rank got ``1 + 2 = 3``
              (:func:`hpclab.tools.doctor_profile.check_allreduce`, shared with ``--profile``).

``--profile X`` checks a cluster profile instead (:mod:`hpclab.tools.doctor_profile`).
Any failure ends the run with exit code 1 and one sentence that says what to do
(:class:`DoctorError`); no traceback.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from hpclab.cluster.host import find_mpiexec
from hpclab.core.errors import LabError
from hpclab.rank.bfloat16 import describe, probe
from hpclab.tools import doctor_gpu, doctor_profile, linkage, reachable, site_checks

#: Engines started by the full check; the expected allreduce result is 1 + 2 + ... + N.
WORKERS = 2
#: Default seconds to wait for the engines to register, and for Horovod on them.
DEFAULT_TIMEOUT = 90.0


class DoctorError(Exception):
    """A failed check; ``str(err)`` is one sentence telling the user what to do."""


# ----------------------------------------------------------------------------------------------
# Output helpers
# ----------------------------------------------------------------------------------------------


def _row(label: str, value: object) -> None:
    print(f"  {label:<14}{value}", flush=True)


@contextmanager
def _stage(title: str) -> Iterator[None]:
    """Print a stage header, then its elapsed time when it ends (also on failure)."""
    print(f"{title}", flush=True)
    start = time.perf_counter()
    try:
        yield
    finally:
        print(f"  {'time':<14}{time.perf_counter() - start:.1f} s", flush=True)


def _yes(flag: object) -> str:
    return "yes" if flag else "no"


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ----------------------------------------------------------------------------------------------
# Finding MPI
# ----------------------------------------------------------------------------------------------


def _mpiexec() -> str:
    """The `mpiexec` a Lab uses: :func:`hpclab.cluster.host.find_mpiexec`, the one rule for finding it."""
    try:
        return find_mpiexec()
    except LabError:
        raise DoctorError(
            f"No mpiexec found next to {sys.executable} or on PATH; run `make setup` "
            "(or load your site MPI, e.g. `module load mpich`, and set HPCLAB_MPI=system)."
        ) from None


def _loaded_libmpi() -> str | None:
    """Real path of the libmpi mapped into this process (Linux), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libmpi.so"):
                    return os.path.realpath(path)
    except FileNotFoundError:
        return None
    return None


def _horovod_libmpi() -> str | None:
    """Real path of the libmpi that Horovod's TensorFlow ops resolve to (ldd), or None."""
    libs = linkage.horovod_mpi_libs()
    ldd = shutil.which("ldd")
    if not libs or not ldd:
        return None
    result = subprocess.run([ldd, libs[0]], capture_output=True, text=True, check=False)
    entry = linkage.parse_ldd_libmpi(result.stdout)
    if entry is None or entry[1] is None:
        return None
    return os.path.realpath(entry[1])


def horovod_frameworks() -> dict[str, bool]:
    """Which framework bindings the installed Horovod was compiled with.

    Horovod 0.28 has no ``tensorflow_built()``; ``horovodrun --check-build`` imports each
    extension in a forked process. The compiled op library of each binding is looked for on
    disk instead, which needs neither PyTorch nor MXNet installed.
    """
    spec = importlib.util.find_spec("horovod")
    roots = list(spec.submodule_search_locations or []) if spec else []
    patterns = {
        "TensorFlow": "tensorflow/mpi_lib*.so",
        "PyTorch": "torch/mpi_lib*.so",
        "MXNet": "mxnet/mpi_lib*.so",
    }
    return {
        name: any(glob.glob(os.path.join(root, pattern)) for root in roots)
        for name, pattern in patterns.items()
    }


def horovod_built_against_tf() -> str | None:
    """The TensorFlow version Horovod recorded at build time (``horovod/metadata.json``)."""
    spec = importlib.util.find_spec("horovod")
    for root in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(root, "metadata.json"), encoding="utf-8") as f:
                return json.load(f).get("tensorflow")
        except FileNotFoundError:
            continue
    return None


# ----------------------------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------------------------


def check_versions() -> dict[str, Any]:
    """Stage 1: import the stack and print its versions; returns the imported modules."""
    with _stage("Versions"):
        _row("Python", f"{platform.python_version()} ({sys.executable})")

        # mpi4py first, without MPI_Init (MPI_Get_library_version may be called before it), so
        # the libmpi mapped into this process is the one mpi4py itself chose.
        try:
            import mpi4py

            mpi4py.rc.initialize = False
            mpi4py.rc.finalize = False
            from mpi4py import MPI
        except ImportError as err:
            raise DoctorError(
                f"mpi4py does not import ({err}); run `make setup` to install it with its MPI."
            ) from None
        _row("MPI library", " ".join(MPI.Get_library_version().strip().splitlines()[0].split()))
        mpi4py_libmpi = _loaded_libmpi()
        _row("mpi4py loads", mpi4py_libmpi or "unknown")
        _row("mpiexec", _mpiexec())

        try:
            import tensorflow as tf
        except ImportError as err:
            raise DoctorError(
                f"TensorFlow does not import ({err}); run `make setup` to install TensorFlow 2.15.1."
            ) from None
        _row("TensorFlow", tf.__version__)
        # tf.keras is tf_keras where it is installed (the py312 stack; hpclab/__init__.py sets
        # TF_USE_LEGACY_KERAS=1), not the Keras 3 that TensorFlow >= 2.16 also installs.
        legacy = _dist_version("tf-keras")
        if os.environ.get("TF_USE_LEGACY_KERAS") == "1" and legacy != "not installed":
            _row("Keras", f"{legacy} (tf-keras)")
        else:
            _row("Keras", _dist_version("keras"))

        try:
            import horovod
            import horovod.tensorflow as hvd
        # ImportError covers a missing extension and Horovod's TF-version mismatch error; a
        # library its ops need but the loader cannot find (libmpi) surfaces as TF's NotFoundError.
        except (ImportError, OSError, tf.errors.NotFoundError) as err:
            raise DoctorError(
                f"Horovod's TensorFlow module does not import ({err}); run `make setup` to build Horovod 0.28.1 against this TensorFlow."
            ) from None
        _row("Horovod", horovod.__version__)
        for label, dist in (
            ("ipyparallel", "ipyparallel"),
            ("JupyterLab", "jupyterlab"),
            ("plotly", "plotly"),
            ("numpy", "numpy"),
        ):
            _row(label, _dist_version(dist))
    return {"tf": tf, "hvd": hvd, "mpi4py_libmpi": mpi4py_libmpi}


def check_horovod(hvd: Any, tf_version: str, mpi4py_libmpi: str | None) -> None:
    """Stage 2: what Horovod was built with, and that it uses mpi4py's MPI."""
    with _stage("Horovod build"):
        frameworks = horovod_frameworks()
        _row(
            "frameworks", "   ".join(f"{name}: {_yes(built)}" for name, built in frameworks.items())
        )
        built_against = horovod_built_against_tf()
        _row("built for", f"TensorFlow {built_against or 'unknown'}")
        _row("controllers", f"MPI: {_yes(hvd.mpi_built())}   Gloo: {_yes(hvd.gloo_built())}")
        nccl = hvd.nccl_built()
        _row(
            "tensor ops",
            f"NCCL: {_yes(nccl)}{f' ({nccl})' if nccl and nccl is not True else ''}   "
            f"DDL: {_yes(hvd.ddl_built())}   CCL: {_yes(hvd.ccl_built())}   "
            f"CUDA: {_yes(hvd.cuda_built())}   ROCm: {_yes(hvd.rocm_built())}",
        )
        if not frameworks["TensorFlow"]:
            raise DoctorError(
                "Horovod was built without TensorFlow support; run `make setup` to rebuild it against TensorFlow 2.15.1."
            )
        if built_against and built_against != tf_version:
            raise DoctorError(
                f"Horovod was built against TensorFlow {built_against} but TensorFlow {tf_version} is installed; "
                "run `make setup` to rebuild Horovod for it."
            )
        if not hvd.mpi_built():
            raise DoctorError(
                "Horovod was built without MPI support; run `make setup` to rebuild it with HOROVOD_WITH_MPI=1."
            )
        horovod_libmpi = _horovod_libmpi()
        _row("Horovod links", horovod_libmpi or "unknown")
        if horovod_libmpi and mpi4py_libmpi and horovod_libmpi != mpi4py_libmpi:
            raise DoctorError(
                f"Horovod links {horovod_libmpi} but mpi4py loads {mpi4py_libmpi}; they must be the "
                "same MPI, so run `make setup` again (with HPCLAB_MPI=system if you use the site MPI)."
            )


def check_site(tf: Any, hvd: Any, mpi4py_libmpi: str | None) -> None:
    """On a site stack (``make STACK=site setup``): the site's versions and build flags
    (:func:`hpclab.tools.site_checks.site_problems`), each failure with a site's remedy."""
    import horovod

    facts = site_checks.SiteFacts(
        tf_version=tf.__version__,
        tf_cuda=bool(tf.test.is_built_with_cuda()),
        horovod_version=horovod.__version__,
        horovod_tf=horovod_frameworks()["TensorFlow"],
        built_against=horovod_built_against_tf(),
        mpi_built=bool(hvd.mpi_built()),
        nccl_built=hvd.nccl_built(),
        horovod_libmpi=_horovod_libmpi(),
        mpi4py_libmpi=mpi4py_libmpi,
    )
    with _stage("Site stack"):
        _row(
            "venv over",
            f"{sys.base_prefix} (TensorFlow from {os.path.dirname(os.path.dirname(tf.__file__))})",
        )
        errors, warnings = site_checks.site_problems(facts)
        for text in warnings:
            _row("warning", text)
        if errors:
            raise DoctorError(" ".join(errors))
        _row("checked", f"TensorFlow {facts.tf_version}, Horovod with TensorFlow and MPI, one MPI")


def check_reach() -> None:
    """Whether other users can reach this install (a centre's one install for everyone): a
    warning row naming the first folder they cannot enter (:mod:`hpclab.tools.reachable`);
    a personal install is fine behind a private folder, so this never fails the check."""
    with _stage("Install"):
        said = reachable.sentence()
        _row("other users", f"warning: {said}" if said else "can reach its Python and package")


def check_devices(tf: Any, bf16: Future | None = None) -> None:
    """Stage 3: the devices TensorFlow sees, and whether this CPU runs bfloat16 (``bf16``: the
    child probe started at the beginning, so its TensorFlow import overlaps the others)."""
    with _stage("TensorFlow devices"):
        cpus = tf.config.list_physical_devices("CPU")
        gpus = tf.config.list_physical_devices("GPU")
        _row("CPU", ", ".join(d.name.replace("/physical_device:", "") for d in cpus) or "none")
        _row(
            "GPU",
            ", ".join(d.name.replace("/physical_device:", "") for d in gpus)
            or "none (CPU-only TensorFlow or no CUDA device visible)",
        )
        if bf16 is not None:
            _row("bfloat16", describe(bf16.result()))
        rows, errors = doctor_gpu.gpu_node_rows(bool(tf.test.is_built_with_cuda()))
        for label, sentence in rows:  # what nvidia-smi and nvcc say (none without a driver)
            _row(label, sentence)
        if errors:
            raise DoctorError(" ".join(errors))


def check_engines(timeout: float, workers: int = WORKERS) -> None:
    """Stage 4: real MPI engines, real Horovod, one allreduce with a known answer.

    Goes through :class:`hpclab.cluster.lab.Lab`, the same path the notebooks and the CLI use.
    """
    import ipyparallel as ipp

    from hpclab.cluster.lab import Lab

    mpiexec = _mpiexec()
    print(f"Engines ({workers} MPI ranks via {mpiexec})", flush=True)
    start = time.perf_counter()
    try:
        lab = Lab(workers=workers, start_timeout=timeout, verbose=False)
    except LabError:
        raise DoctorError(
            f"The {workers} MPI engines did not start with Horovod within {timeout:.0f} s; check that "
            f"`{mpiexec} -n {workers} hostname` works, or give a slow machine more time with --timeout."
        ) from None
    except ipp.error.EngineError as err:
        raise DoctorError(
            f"The MPI engines exited while starting ({err}); check that `{mpiexec} -n {workers} hostname` works."
        ) from None
    except ipp.error.RemoteError as err:
        raise DoctorError(
            f"Horovod failed to initialise on the engines ({_remote_reason(err)}); run `make setup` to rebuild it."
        ) from None
    with lab:
        _row(
            "started",
            f"{workers} engines with Horovod initialised in {time.perf_counter() - start:.1f} s",
        )
        check = doctor_profile.check_allreduce(lab, timeout)
        for label, text in check.details:
            _row(label, text)
        if not check.ok:
            raise DoctorError(check.text)
        _row("allreduce", check.text)
        start = time.perf_counter()
    _row("stopped", f"engines and controller in {time.perf_counter() - start:.1f} s")


def _remote_reason(err: Exception) -> str:
    """``ename: evalue`` of the first engine error in an ipyparallel RemoteError/CompositeError."""
    elist = getattr(err, "elist", None)
    if elist:
        return f"{elist[0][0]}: {elist[0][1]}"
    return f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', err)}"


# ----------------------------------------------------------------------------------------------
# Command
# ----------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpclab doctor``."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only versions, Horovod build flags and devices; start no engines",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for engines and for Horovod on them (default {DEFAULT_TIMEOUT:g})",
    )
    doctor_profile.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the checks; 0 when everything works, 1 with one sentence when something does not."""
    if not 1 <= args.timeout <= 3600:
        print(
            f"hpclab doctor: --timeout must be between 1 and 3600 seconds; you passed {args.timeout:g}.",
            file=sys.stderr,
        )
        return 1
    if args.profile:
        return doctor_profile.run(args)
    os.environ.setdefault(
        "TF_CPP_MIN_LOG_LEVEL", "2"
    )  # keep TensorFlow's C++ banner out of the report
    start = time.perf_counter()
    bf16 = ThreadPoolExecutor(max_workers=1).submit(probe)  # a child process: see check_devices
    try:
        found = check_versions()
        if site_checks.is_site_stack(sys.prefix):
            check_site(found["tf"], found["hvd"], found["mpi4py_libmpi"])
        check_horovod(found["hvd"], found["tf"].__version__, found["mpi4py_libmpi"])
        check_reach()
        check_devices(found["tf"], bf16)
        if not args.quick:
            check_engines(args.timeout)
    except DoctorError as err:
        print(f"\nhpclab doctor: {err}", file=sys.stderr, flush=True)
        return 1
    what = "quick check" if args.quick else f"all checks, {WORKERS} MPI ranks"
    print(f"\nhpclab doctor: OK ({what}) in {time.perf_counter() - start:.1f} s", flush=True)
    return 0
