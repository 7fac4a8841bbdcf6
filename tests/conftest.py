"""Shared fixtures. Engines are expensive (~9 s to start), so MPI tests share one 2-worker Lab."""

import pytest


@pytest.fixture(scope="session")
def lab2(tmp_path_factory):
    """A real 2-worker Lab: ipyparallel MPI engines + Horovod, runs recorded in a temp folder."""
    from hpclab import Lab

    lab = Lab(workers=2, runs_dir=tmp_path_factory.mktemp("runs"), verbose=False)
    yield lab
    lab.stop()


@pytest.fixture
def lab(lab2):
    """The shared Lab, healthy (restarted if an earlier test killed its engines)."""
    if not lab2.healthy:
        lab2.restart()
    return lab2
