"""What `hpclab doctor` demands of a site stack: a TensorFlow + Horovod + mpi4py that a site module
or container provides, under a venv made by ``make STACK=site setup`` (scripts/site_stack.py).
Pure: the doctor gathers the facts, :func:`site_problems` judges them.

hpclab needs TensorFlow 2.15 (Keras 2: ``tf.keras`` as the notebooks and hpclab.rank use it,
and Horovod 0.28's TensorFlow ops build against it; TensorFlow 2.16 makes Keras 3 the default),
a Horovod built with TensorFlow and MPI (the engines are MPI ranks: ``horovod.tensorflow.
mpi_built()``), and mpi4py on the same MPI library as Horovod's ops (two MPIs in one process do
not work). On a GPU, a Horovod without NCCL reduces GPU tensors through host buffers over MPI:
slower, so a warning, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: TensorFlow versions a site stack may have: [low, high) as (major, minor).
SUPPORTED_TF = ((2, 15), (2, 16))
#: The Horovod release hpclab is tested with (scripts/setup.sh builds it).
TESTED_HOROVOD = "0.28.1"
#: The file in a venv that says which stack made it (scripts/setup.sh writes "site").
STACK_FILE = "hpclab-stack"


@dataclass(frozen=True)
class SiteFacts:
    """What the doctor found in the site's stack."""

    tf_version: str
    tf_cuda: bool  # TensorFlow built with CUDA
    horovod_version: str
    horovod_tf: bool  # Horovod's TensorFlow ops are there
    built_against: str | None  # the TensorFlow Horovod recorded at build time
    mpi_built: bool
    nccl_built: int | bool  # Horovod's nccl_built(): the NCCL version, or False
    horovod_libmpi: str | None  # what Horovod's ops link (ldd), None: unknown
    mpi4py_libmpi: str | None  # what mpi4py loaded, None: unknown


def version_tuple(text: str) -> tuple[int, ...]:
    """``"2.15.1"`` -> (2, 15, 1); ``"2.15.0rc1"``/``"2.15.0+nv24.1"`` -> (2, 15, 0)."""
    out = []
    for part in text.split("+", 1)[0].split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def is_site_stack(prefix: str) -> bool:
    """Whether the venv at `prefix` (``sys.prefix``) was made by ``make STACK=site setup``."""
    try:
        return (Path(prefix) / STACK_FILE).read_text().strip() == "site"
    except OSError:
        return False


def site_problems(f: SiteFacts) -> tuple[list[str], list[str]]:
    """(errors, warnings): each one sentence naming what was found and what to do."""
    errors: list[str] = []
    warnings: list[str] = []
    low, high = SUPPORTED_TF
    tf = version_tuple(f.tf_version)[:2]
    if not low <= tf < high:
        errors.append(
            f"the site's TensorFlow is {f.tf_version}, but hpclab needs {low[0]}.{low[1]}.x "
            "(Keras 2, and Horovod 0.28's ops); load a module or container with TensorFlow 2.15, "
            "or use the default stack (`make setup`: PyPI's TensorFlow 2.15.1)."
        )
    if not f.horovod_tf:
        errors.append(
            f"the site's Horovod {f.horovod_version} was built without TensorFlow; ask for a "
            "Horovod built with HOROVOD_WITH_TENSORFLOW=1 against this TensorFlow."
        )
    elif f.built_against and f.built_against != f.tf_version:
        errors.append(
            f"the site's Horovod was built against TensorFlow {f.built_against} but TensorFlow "
            f"{f.tf_version} is loaded; load the matching pair of modules."
        )
    if not f.mpi_built:
        errors.append(
            f"the site's Horovod {f.horovod_version} was built without MPI (mpi_built() is "
            "False), and hpclab's engines are MPI ranks; ask for a Horovod built with "
            "HOROVOD_WITH_MPI=1."
        )
    if f.horovod_libmpi and f.mpi4py_libmpi and f.horovod_libmpi != f.mpi4py_libmpi:
        errors.append(
            f"the site's Horovod links {f.horovod_libmpi} but its mpi4py loads "
            f"{f.mpi4py_libmpi}; both must use the same MPI, so load the mpi4py built for the "
            "site's MPI module."
        )
    if f.tf_cuda and not f.nccl_built:
        warnings.append(
            "TensorFlow has CUDA but Horovod was built without NCCL: GPU tensors are reduced "
            "through host memory over MPI (slower; a Horovod with HOROVOD_GPU_OPERATIONS=NCCL "
            "reduces them on the GPUs)."
        )
    if f.horovod_version != TESTED_HOROVOD:
        warnings.append(
            f"the site's Horovod is {f.horovod_version}; hpclab is tested with {TESTED_HOROVOD}."
        )
    return errors, warnings


__all__ = [
    "STACK_FILE",
    "SUPPORTED_TF",
    "TESTED_HOROVOD",
    "SiteFacts",
    "is_site_stack",
    "site_problems",
    "version_tuple",
]
