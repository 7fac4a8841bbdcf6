"""Shared fixtures and the MPI gate.

Engines are expensive (~9 s to start), so MPI tests share one 2-worker Lab. Tests marked `mpi`
(and the notebook tests, which start engines too) need the stack `make setup` builds: Horovod with
its TensorFlow op library and an `mpiexec`. Where that stack is missing they are skipped with the
reason; `make test` sets HPCLAB_REQUIRE_MPI=1, which turns the skip into an error, so CI can never
pass by skipping its real tests.
"""

import glob
import importlib.util
import os

import pytest

pytest_plugins = ("suite_clock",)  # where the time goes, and the budget stop


def _mpi_stack_missing() -> str | None:
    """Why real MPI engines with Horovod cannot run here, or None. Imports no TensorFlow."""
    from hpclab.cluster.host import find_mpiexec
    from hpclab.core.errors import LabError

    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return "Horovod is not installed (run `make setup`)"
    libs = [
        p for d in spec.submodule_search_locations for p in glob.glob(f"{d}/tensorflow/mpi_lib*")
    ]
    if not libs:
        return "Horovod was built without TensorFlow support (run `make setup`)"
    try:
        find_mpiexec()
    except LabError as exc:
        return str(exc)
    return None


def pytest_collection_modifyitems(config, items):
    needs_mpi = [
        i for i in items if i.get_closest_marker("mpi") or i.get_closest_marker("notebook")
    ]
    if not needs_mpi:
        return
    reason = _mpi_stack_missing()
    if reason is None:
        return
    if os.environ.get("HPCLAB_REQUIRE_MPI") == "1":
        raise pytest.UsageError(f"HPCLAB_REQUIRE_MPI=1 but the MPI stack is missing: {reason}")
    for item in needs_mpi:
        item.add_marker(pytest.mark.skip(reason=f"needs MPI engines with Horovod: {reason}"))


_SHARED: list = []  # the session's shared Lab, once a test asked for it


@pytest.fixture(scope="session")
def lab2(tmp_path_factory):
    """A real 2-worker Lab: ipyparallel MPI engines + Horovod, runs recorded in a temp folder."""
    from hpclab import Lab

    lab = Lab(workers=2, runs_dir=tmp_path_factory.mktemp("runs"), verbose=False)
    _SHARED.append(lab)
    yield lab
    lab.stop()


@pytest.fixture(autouse=True)
def _cores_to_themselves(request):
    """A test that starts labs of its own (a notebook, JupyterLab, the hub, Slurm) gets the
    cores to itself: the shared Lab's idle engines are not idle — MPICH busy-polls inside
    Horovod's background loop, about half a core per engine (benchmarks/README.md) — so it is
    stopped first; the next test that asks for `lab` restarts it."""
    own = ("notebook", "browser", "hub", "slurm", "own_lab")
    if any(request.node.get_closest_marker(m) for m in own):
        for shared in _SHARED:
            if shared.healthy:
                shared.stop()
    yield


@pytest.fixture
def lab(lab2):
    """The shared Lab, healthy (restarted if an earlier test killed its engines)."""
    if not lab2.healthy:
        lab2.restart()
    return lab2
