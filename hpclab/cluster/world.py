"""Is the MPI world what the lab asked for? Checked once after start, in every launch mode.

`check_world` reads the identities every rank reported (`rank/engine.py:init_worker`) and returns
the errors that make training wrong and the warnings that make it slow, each one sentence naming
the fix. The traps it catches are real: `srun` without an MPI plugin starts N engines that are N
separate 1-rank worlds (Slurm's default `MpiDefault=none`), so a "4-worker" run would silently
train 4 independent models (the error names the plugin the ranks' MPI library needs); a runs
folder the ranks cannot read makes Stop unreachable; an MPI thread level below
MPI_THREAD_MULTIPLE makes Horovod's background thread unsafe (Horovod warns of crashes at init);
srun without `-c` gives each engine one CPU (ipyparallel #906).
"""

from __future__ import annotations

import re

from hpclab.cluster.site_mpi import NAMES, PLUGIN, family, flavour_of


def _fix(identities: list[dict], mode: str, srun_mpi: str) -> str:
    """How to get one world, naming the srun plugin the ranks' MPI library needs."""
    if mode == "mpiexec":
        return (
            "this mpiexec is not the MPI Horovod and mpi4py were built with: run "
            "`hpclab doctor` and pass Lab(mpiexec=...) or rebuild with `make setup`"
        )
    flavour = next((f for i in identities if (f := flavour_of(i.get("mpi_library", "")))), "")
    used = f"srun --mpi={srun_mpi}" if srun_mpi else "srun without an MPI plugin"
    good = PLUGIN.get(flavour)
    if good and family(good) != family(srun_mpi):
        return (
            f"{used} does not start {NAMES[flavour]} (the MPI Horovod was built with) as one "
            f'world: set slurm.srun_mpi = "{good}" in the profile, or "auto" to follow the MPI '
            "(`srun --mpi=list` shows the site's plugins)"
        )
    if good:
        return (
            f"{used} is the plugin {NAMES[flavour]} needs, yet each rank started alone: check that "
            f"`srun --mpi=list` offers it and that its library (libpmix for pmix) is on every node"
        )
    return (
        f"{used} started them without a working MPI plugin: set slurm.srun_mpi in the profile "
        "to the plugin your MPI needs (MPICH: pmi2, Open MPI: pmix, Cray MPICH: cray_shasta; "
        "`srun --mpi=list` shows the site's plugins)"
    )


def check_world(
    identities: list[dict],
    workers: int,
    threads: int,
    mode: str,
    srun_mpi: str = "",
    engine_env: dict[str, str] | None = None,
) -> tuple[list, list]:
    """(errors, warnings) about the world the engines formed; empty lists when all is well.

    `srun_mpi` is the plugin srun used (modes srun, sbatch); `engine_env` the engines'
    environment (``HOROVOD_MPI_THREADS_DISABLE=1`` there accepts a lower MPI thread level)."""
    errors: list[str] = []
    warnings: list[str] = []
    sizes = sorted({ident["size"] for ident in identities})
    ranks = sorted(ident["rank"] for ident in identities)
    how = _fix(identities, mode, srun_mpi)
    if len(identities) != workers:
        errors.append(f"{len(identities)} engines answered, but the lab started {workers}.")
    elif workers > 1 and sizes == [1]:
        errors.append(
            f"the {workers} engines formed {workers} separate 1-rank MPI worlds instead of one "
            f"world of {workers}, so each would train its own model; {how}."
        )
    elif sizes != [workers] or ranks != list(range(workers)):
        errors.append(
            f"the engines report MPI world sizes {sizes} and ranks {ranks}, not one world of "
            f"{workers} with ranks 0..{workers - 1}; {how}."
        )
    unshared = [ident for ident in identities if not ident.get("runs_dir_shared", True)]
    if unshared:
        where = ", ".join(f"rank {i['rank']} on {i.get('node') or i['host']}" for i in unshared)
        errors.append(
            f"{where} cannot read the runs folder the client writes to; it must be on a file "
            "system every node shares (set HPCLAB_RUNS or the profile's paths.runs to one), or "
            "Stop could never reach the ranks."
        )
    low = [i for i in identities if i.get("mpi_thread", "multiple") != "multiple"]
    if low and (engine_env or {}).get("HOROVOD_MPI_THREADS_DISABLE") != "1":
        levels = "/".join(sorted({i["mpi_thread"] for i in low}))
        errors.append(
            f"MPI gave {len(low)} rank(s) the thread level {levels!r}, but Horovod needs "
            "MPI_THREAD_MULTIPLE (its background thread calls MPI while the engine runs): use an "
            'MPI built with thread support (Cray MPICH: MPICH_MAX_THREAD_SAFETY = "multiple" in '
            'the profile\'s environment.vars), or set HOROVOD_MPI_THREADS_DISABLE = "1" there if '
            "your MPI has none."
        )
    starved = [ident for ident in identities if 0 < ident.get("cpus", threads) < threads]
    if starved:
        worst = min(ident["cpus"] for ident in starved)
        warnings.append(
            f"{len(starved)} rank(s) may use only {worst} CPU(s) for {threads} threads each: "
            "srun gives one CPU per task unless `-c` (--cpus-per-task) is passed, and it is not "
            "inherited from salloc/sbatch since Slurm 22.05; hpclab passes it, so check the "
            "profile's node.threads_per_worker and the allocation."
        )
    return errors, warnings


_NO_PROFILE_DIR = re.compile(r"Profile directory '([^']+)' not found")


def missing_state_folder(output: str) -> str:
    """The sentence for an engine that quit because it could not find the lab's state folder
    (ipyparallel's profile folder, under the runs folder unless `paths.state` moves it): its
    node does not share this host's file system there. '' if the launcher's output shows none."""
    found = _NO_PROFILE_DIR.search(output)
    if not found:
        return ""
    return (
        f"an engine could not find the lab's state folder {found.group(1)}, so its node does not "
        "see this host's files there; put the runs folder (HPCLAB_RUNS or the profile's "
        "paths.runs) and the profile's paths.state on a file system every node shares."
    )


__all__ = ["check_world", "missing_state_folder"]
