"""Is the MPI world what the lab asked for? Checked once after start, in every launch mode.

`check_world` reads the identities every rank reported (`rank/engine.py:init_worker`) and returns
the errors that make training wrong and the warnings that make it slow, each one sentence naming
the fix. The traps it catches are real: `srun` without an MPI plugin starts N engines that are N
separate 1-rank worlds (Slurm's default `MpiDefault=none`), so a "4-worker" run would silently
train 4 independent models; a runs folder the ranks cannot read makes Stop unreachable; srun
without `-c` gives each engine one CPU (ipyparallel #906).
"""

from __future__ import annotations


def check_world(identities: list[dict], workers: int, threads: int, mode: str) -> tuple[list, list]:
    """(errors, warnings) about the world the engines formed; empty lists when all is well."""
    errors: list[str] = []
    warnings: list[str] = []
    sizes = sorted({ident["size"] for ident in identities})
    ranks = sorted(ident["rank"] for ident in identities)
    how = {
        "srun": "srun started them without a working MPI plugin: pass --mpi=pmi2 (or the "
        "plugin your MPI needs, `srun --mpi=list`) through the profile's slurm.srun_mpi",
        "sbatch": "the job's srun had no working MPI plugin: set slurm.srun_mpi in the profile "
        "(`srun --mpi=list` shows the plugins)",
        "mpiexec": "this mpiexec is not the MPI Horovod and mpi4py were built with: run "
        "`hpclab doctor` and pass Lab(mpiexec=...) or rebuild with `make setup`",
    }[mode]
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


__all__ = ["check_world"]
