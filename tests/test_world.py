"""World validation (hpclab.cluster.world.check_world) on identities as ranks report them."""

from __future__ import annotations

from hpclab.cluster.world import check_world


def ident(rank, size, **kw):
    return {"rank": rank, "size": size, "host": "n1", "node": "n1", "cpus": 2, **kw}


def test_one_world_of_the_right_size_passes():
    assert check_world([ident(0, 2), ident(1, 2)], 2, 1, "srun") == ([], [])


def test_singleton_worlds_under_srun_name_the_mpi_plugin():
    errors, _ = check_world([ident(0, 1), ident(0, 1)], 2, 1, "srun", "none")
    assert len(errors) == 1  # a rank that names no MPI library: the plugin of each MPI
    assert "2 separate 1-rank MPI worlds" in errors[0] and "--mpi=none" in errors[0]
    assert "MPICH: pmi2, Open MPI: pmix" in errors[0]
    errors, _ = check_world([ident(0, 1), ident(0, 1)], 2, 1, "mpiexec")
    assert "hpclab doctor" in errors[0]


def test_wrong_sizes_ranks_or_counts_are_errors():
    assert check_world([ident(0, 3), ident(1, 3)], 2, 1, "srun")[0]
    assert check_world([ident(0, 2), ident(0, 2)], 2, 1, "srun")[0]  # duplicate rank
    assert "1 engines answered" in check_world([ident(0, 2)], 2, 1, "srun")[0][0]


def test_a_rank_that_cannot_read_the_runs_folder_is_named():
    errors, _ = check_world(
        [ident(0, 2), ident(1, 2, node="n2", runs_dir_shared=False)], 2, 1, "sbatch"
    )
    assert "rank 1 on n2 cannot read the runs folder" in errors[0] and "HPCLAB_RUNS" in errors[0]


def test_fewer_cpus_than_threads_is_a_warning_naming_c():
    errors, warnings = check_world([ident(0, 2, cpus=1), ident(1, 2, cpus=4)], 2, 4, "srun")
    assert not errors and len(warnings) == 1
    assert "1 rank(s) may use only 1 CPU(s) for 4 threads" in warnings[0] and "-c" in warnings[0]


def test_an_engine_without_the_state_folder_is_named_with_the_shared_file_system():
    """ipyparallel's engine quits at once when its profile folder (the lab's state folder) is
    missing on its node; the launcher's output then gives the sentence (tests/test_multihost.py
    shows it for real on a namespace host with a private runs folder)."""
    from hpclab.cluster.world import missing_state_folder

    said = "[IPEngine] CRITICAL | Profile directory '/scratch/u/runs/.state/ipp-1-a' not found.\n"
    sentence = missing_state_folder("2026 [IPEngine] Loading connection info\n" + said)
    assert "/scratch/u/runs/.state/ipp-1-a" in sentence and "every node shares" in sentence
    assert missing_state_folder("[IPEngine] Completed registration with id 0") == ""
