"""What this host offers a launch: the `mpiexec` Horovod was built against, interface addresses,
and whether it is a Slurm login node (a cluster's client without an allocation).

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


#: Where a node of a Slurm cluster finds the cluster's configuration when SLURM_CONF is unset:
#: the compiled-in default of Debian/Ubuntu and RHEL packages, older Debian's, a source build's
#: (`--prefix=/usr/local`), and the cache of a configless node (slurmd or sackd, Slurm >= 21.08).
SLURM_CONFS = (
    "/etc/slurm/slurm.conf",
    "/etc/slurm-llnl/slurm.conf",
    "/usr/local/etc/slurm.conf",
    "/run/slurm/conf/slurm.conf",
)


def slurm_login_node(env: dict[str, str] | None = None, confs=SLURM_CONFS) -> str:
    """What shows this host is a node of a Slurm cluster outside any allocation (a login node),
    e.g. '/usr/bin/sinfo and /etc/slurm/slurm.conf'; '' if it is not.

    A Slurm client alone is not enough (a workstation may carry the packages, as the CI machine
    does for its throw-away test cluster): it also needs the configuration of a cluster,
    `$SLURM_CONF` when set, else a file of `confs`. Inside an allocation (`SLURM_JOB_ID`) this
    is a compute node, so ''. Nothing is run: a login node's controller may be slow to answer.
    """
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_ID"):
        return ""
    search = env.get("PATH", os.defpath)
    client = shutil.which("sinfo", path=search) or shutil.which("srun", path=search)
    if not client:
        return ""
    candidates = [env["SLURM_CONF"]] if env.get("SLURM_CONF") else list(confs)
    conf = next((c for c in candidates if os.path.isfile(c)), "")
    return f"{client} and {conf}" if conf else ""


__all__ = ["find_mpiexec", "interfaces", "slurm_login_node"]
