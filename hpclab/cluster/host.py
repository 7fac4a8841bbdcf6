"""What this host offers a launch: the `mpiexec` Horovod was built against, interface addresses.

`Lab` and `hpclab doctor` both find `mpiexec` here, so what the doctor checks is what a lab uses;
`hpclab.cluster.launch.plan_launch` stays pure by receiving these facts as arguments.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

from hpclab.core.errors import LabError


def _executable(path: str | os.PathLike) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_mpiexec(explicit: str | None = None) -> str:
    """`mpiexec` of the MPI Horovod was built against; raises LabError naming the fix.

    An explicit path or command name is checked and returned. Otherwise: next to
    `sys.executable` first (the PyPI `mpich` wheel puts it in the venv's bin/, which a Jupyter
    kernel may not have on PATH; `sys.executable` is not resolved, since the venv's
    `bin/python` is a symlink to the base interpreter), then PATH (a site MPI from
    `module load`).
    """
    if explicit:
        found = explicit if _executable(explicit) else shutil.which(explicit)
        if not found:
            raise LabError(
                f"mpiexec={explicit!r} is not an executable file or a command on PATH; "
                "pass the path of your MPI's mpiexec (or srun)."
            )
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if _executable(beside):
        return str(beside)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise LabError(
        "no mpiexec found next to this Python or on PATH; run `make setup` "
        "(installs MPICH into .venv) or load your site's MPI module."
    )


def interfaces() -> dict[str, str]:
    """IPv4 address of every network interface (psutil: ipyparallel's own dependency)."""
    import psutil

    return {
        name: addr.address
        for name, addrs in psutil.net_if_addrs().items()
        for addr in addrs
        if addr.family == socket.AF_INET
    }


__all__ = ["find_mpiexec", "interfaces"]
