"""Which MPI the engines speak, and the `srun --mpi=` plugin that starts them as one world.

Horovod and mpi4py link one MPI library; under `srun` its ranks find each other through the
process-management interface that library speaks, so the plugin follows the MPI:

- MPICH (the PyPI wheel, a site MPICH) and Intel MPI: PMI-2, ``pmi2`` (Slurm's pmi2 plugin also
  serves the PMI-1 wire protocol of MPICH's simple client, ``src/plugins/mpi/pmi2/agent.c``;
  tests/slurm/test_slurm_smoke.py runs it).
- Open MPI: PMIx, ``pmix`` or a site's ``pmix_vN`` (Open MPI's docs, "Launching with Slurm":
  ``srun --mpi=pmix``; tests/slurm/test_openmpi.py runs it).
- Cray MPICH: ``cray_shasta`` (Slurm's mpi/cray_shasta plugin, which sets up Cray PMI).

A site's ``MpiDefault`` (slurm.conf(5), read from ``scontrol show config``) wins when it belongs
to the same family (``pmix_v4`` for Open MPI: the site knows which PMIx version it built); one
of another family (or ``none``, Slurm's default, which makes every rank a 1-rank world) does not.
Everything here but :func:`horovod_flavour` is pure and unit-tested (tests/test_site_mpi.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

#: MPI flavour -> the srun plugin it needs (see the module docstring).
PLUGIN = {"mpich": "pmi2", "intelmpi": "pmi2", "openmpi": "pmix", "cray-mpich": "cray_shasta"}
NAMES = {
    "mpich": "MPICH",
    "intelmpi": "Intel MPI",
    "openmpi": "Open MPI",
    "cray-mpich": "Cray MPICH",
}
#: Written into the venv by scripts/setup.sh (horovod_cache.py mark-installed): the build record
#: of the installed Horovod, whose ``env.mpi.flavour`` names the MPI it was compiled against.
INSTALLED_MARKER = "hpclab-horovod.json"


def family(plugin: str) -> str:
    """``pmix_v4`` -> ``pmix``: the protocol, whatever the version of its library."""
    return re.sub(r"_v\d+$", "", plugin.strip())


def default_srun_mpi(mpi_flavour: str, site_mpi_default: str = "") -> tuple[str, str]:
    """(plugin, why) for ``srun --mpi=`` when the profile leaves ``slurm.srun_mpi = "auto"``.

    `mpi_flavour` is the MPI Horovod was built with (``mpich``, ``openmpi``, ``cray-mpich``,
    ``intelmpi``, or anything else when unknown); `site_mpi_default` the site's ``MpiDefault``
    (empty when it could not be read)."""
    site = site_mpi_default.strip()
    wanted = PLUGIN.get(mpi_flavour)
    if wanted is None:
        if site and site != "none":
            return (
                site,
                f"the site's MpiDefault={site} (the MPI Horovod was built with is not known)",
            )
        return "pmi2", (
            "neither the MPI Horovod was built with nor a site MpiDefault is known "
            "(set slurm.srun_mpi in a profile)"
        )
    name = NAMES[mpi_flavour]
    if site and family(site) == family(wanted):
        return site, f"the site's MpiDefault={site}, which {name} speaks"
    other = f"; the site's MpiDefault={site} is not for it" if site and site != "none" else ""
    return wanted, f"Horovod was built with {name}{other}"


def flavour_of(library_version: str) -> str:
    """The flavour named by ``MPI_Get_library_version`` text (what each rank reports), or ""."""
    text = library_version.lower()
    for needle, flavour in (
        ("cray mpich", "cray-mpich"),
        ("intel(r) mpi", "intelmpi"),
        ("open mpi", "openmpi"),
        ("mpich", "mpich"),
    ):
        if needle in text:
            return flavour
    return ""


def flavour_of_soname(soname: str) -> str:
    """The flavour of a ``libmpi`` soname: ``libmpi.so.40`` Open MPI, ``libmpi_cray`` Cray
    MPICH, ``libmpi.so.12`` the MPICH ABI (MPICH, Intel MPI); "" when unknown."""
    if soname.startswith("libmpi_cray") or re.match(r"libmpi_(gnu|intel|cray|nvidia|amd)", soname):
        return "cray-mpich"
    if soname.startswith("libmpi.so.4"):
        return "openmpi"
    if soname.startswith("libmpi.so.12"):
        return "mpich"
    return ""


def horovod_flavour(prefix: str = sys.prefix) -> str:
    """The MPI flavour the installed Horovod was built with: the build record setup.sh keeps in
    the venv, else the ``libmpi`` its MPI ops link (``ldd``; a Horovod installed some other way,
    e.g. from environment.yml); "" when neither says."""
    try:
        record = json.loads((Path(prefix) / INSTALLED_MARKER).read_text())
        flavour = record["env"]["mpi"]["flavour"]
        if flavour in PLUGIN:
            return flavour
    except (OSError, ValueError, KeyError, TypeError):
        pass
    libs = sorted(Path(prefix).glob("lib/python3*/site-packages/horovod/tensorflow/mpi_lib*.so"))
    if not libs:
        return ""
    try:
        out = subprocess.run(
            ["ldd", str(libs[0])], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    # Open MPI's C++/Fortran/Java bindings (libmpi_cxx, ...) are listed before the library
    match = re.search(r"^\s*(libmpi(?:_(?!cxx|mpifh|usempi|java)\w+)?\.so[\w.]*)\s", out, re.M)
    return flavour_of_soname(match.group(1)) if match else ""


#: What an MPI prints when srun gave it no PMI it speaks, and the flavour that prints it.
#: Open MPI 4.1 under --mpi=pmi2 or none: its MPI_Init aborts (ess_slurm's "direct launch"
#: help text, seen with Debian's Open MPI 4.1.4 and Slurm 22.05 in tests/slurm/test_openmpi.py).
_INIT_FAILURES = (("openmpi", re.compile(r"OMPI was not built with SLURM's PMI support")),)


def init_failure(output: str, srun_mpi: str) -> str:
    """The sentence for engines whose MPI_Init failed because srun's plugin is not the one
    their MPI speaks (read from the launcher's output); "" when the output shows no such
    failure."""
    for flavour, pattern in _INIT_FAILURES:
        if pattern.search(output):
            good = PLUGIN[flavour]
            return (
                f"the engines' MPI ({NAMES[flavour]}) could not start under srun "
                f"--mpi={srun_mpi or 'none'}, since {NAMES[flavour]} needs {good}: set "
                f'slurm.srun_mpi = "{good}" in the profile, or "auto" to follow the MPI Horovod '
                "was built with (`srun --mpi=list` shows the site's plugins)."
            )
    return ""


def plan_facts(srun_mpi: str, local: bool, python: str = "") -> dict[str, str]:
    """What `plan_launch` needs to resolve ``srun_mpi = "auto"`` (the flavour of the engines'
    Horovod, the site's MpiDefault); nothing when the profile names a plugin or engines start
    locally. `python` is the profile's engine interpreter (its venv holds that Horovod)."""
    if srun_mpi != "auto" or local:
        return {}
    from hpclab.cluster import slurm

    prefix = str(Path(python).parent.parent) if python else sys.prefix
    return {"mpi_flavour": horovod_flavour(prefix), "site_mpi_default": slurm.mpi_default()}


__all__ = [
    "PLUGIN",
    "plan_facts",
    "default_srun_mpi",
    "family",
    "flavour_of",
    "flavour_of_soname",
    "horovod_flavour",
    "init_failure",
]
