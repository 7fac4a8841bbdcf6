"""The throw-away Slurm cluster works, and the Slurm facts hpclab relies on hold (Slurm 22.05).

Each srun here takes well under a second; the whole file runs in a few seconds.
"""

from __future__ import annotations

import shlex
import sys

import pytest

pytestmark = pytest.mark.slurm

PY = sys.executable  # the project venv's interpreter: mpi4py + the PyPI MPICH wheel
MPI_HELLO = (
    "import os; from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "sh = c.Split_type(MPI.COMM_TYPE_SHARED); "
    "print(os.environ['SLURMD_NODENAME'], c.Get_size(), c.Get_rank(), sh.Get_size(), "
    "c.allreduce(c.Get_rank() + 1.0), flush=True)"
)


def _ok(slurm, args, **kw):
    r = slurm.run(args, timeout=60, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, args))} → {r.returncode}\n{r.stderr}\n" + (
        slurm.log_tails()
    )
    return r


def _rows(stdout: str) -> list[list[str]]:
    return sorted(line.split() for line in stdout.splitlines() if line.strip())


def _one_node(stdout: str) -> list[list[str]]:
    """The rows without the node column, after checking every task ran on the same node
    (n1 or n2: a node still cleaning up the previous step makes Slurm pick the other)."""
    rows = _rows(stdout)
    assert len({r[0] for r in rows}) == 1 and rows[0][0] in ("n1", "n2"), rows
    return [r[1:] for r in rows]


def test_cluster_has_two_idle_emulated_nodes(slurm):
    r = _ok(slurm, ["sinfo", "-h", "-N", "-p", slurm.partition, "-o", "%N %T %c"])
    assert _rows(r.stdout) == [["n1", "idle", "2"], ["n2", "idle", "2"]]
    config = _ok(slurm, ["scontrol", "show", "config"]).stdout
    settings = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in config.splitlines())
    )
    assert settings["MULTIPLE_SLURMD"] == "Yes"  # several slurmd on one host (Debian builds it)
    assert settings["MpiDefault"] == "none"  # hpclab must ask for --mpi=pmi2 itself


def test_srun_mpi_pmi2_gives_one_mpi_world(slurm):
    r = _ok(slurm, ["srun", "-n2", "--mpi=pmi2", PY, "-c", MPI_HELLO])
    # size, rank, ranks sharing memory, allreduce of rank+1
    assert _one_node(r.stdout) == [["2", "0", "2", "3.0"], ["2", "1", "2", "3.0"]]


def test_srun_mpi_none_gives_singletons(slurm):
    """The trap: without a PMI plugin every task is rank 0 of its own size-1 world."""
    r = _ok(slurm, ["srun", "-n2", "--mpi=none", PY, "-c", MPI_HELLO])
    assert _one_node(r.stdout) == [["1", "0", "1", "1.0"]] * 2


def test_two_tasks_on_two_nodes_land_on_n1_and_n2(slurm):
    r = _ok(slurm, ["srun", "-N2", "-n2", "printenv", "SLURMD_NODENAME"])
    assert r.stdout.split() in (["n1", "n2"], ["n2", "n1"])


@pytest.mark.parametrize(
    "netmod_env",
    [
        pytest.param({}, id="default-ucx"),
        # the libfabric fallback (MPICH's other netmod); tcp is what a namespace test would pin
        pytest.param({"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}, id="ofi-tcp"),
    ],
)
def test_mpi_across_two_emulated_nodes(slurm, netmod_env):
    """MPICH sees two nodes (one rank per shared-memory domain) and the allreduce works.

    No FI_PROVIDER is needed: the PyPI MPICH's default netmod is UCX, which works over loopback.
    """
    env = {**slurm.env, **netmod_env}
    r = _ok(slurm, ["srun", "-N2", "-n2", "--mpi=pmi2", PY, "-c", MPI_HELLO], env=env)
    assert _rows(r.stdout) == [["n1", "2", "0", "1", "3.0"], ["n2", "2", "1", "1", "3.0"]]


def test_srun_inside_a_step_needs_overlap(slurm):
    """hpclab inside a job step (batchspawner's singleuser server): the step holds every CPU of
    the job, so a nested srun must pass --overlap; without it srun waits forever ("step creation
    temporarily disabled"), which -I (immediate) turns into an error."""
    inner = f"srun --overlap -n2 -c1 --mpi=pmi2 {PY} -c {shlex.quote(MPI_HELLO)}"
    r = _ok(slurm, ["salloc", "-n1", "-c2", "srun", "-n1", "-c2", "bash", "-c", inner])
    assert _one_node(r.stdout) == [["2", "0", "2", "3.0"], ["2", "1", "2", "3.0"]]
    r = slurm.run(
        ["salloc", "-n1", "-c2", "srun", "-n1", "-c2", "bash", "-c", "srun -I2 -n2 -c1 true"],
        timeout=60,
    )
    assert r.returncode != 0
    assert "Requested nodes are busy" in r.stderr
