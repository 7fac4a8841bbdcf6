"""The `slurm` fixture: one real single-host Slurm cluster (2 emulated nodes) per test session.

Needs root and the Debian Slurm/MUNGE packages (`scripts/install-slurm.sh`). Where either is
missing the Slurm tests skip with the reason; with HPCLAB_REQUIRE_SLURM=1 (CI) they fail instead,
so CI can never pass by skipping them. Nothing is installed here. On a failed test (or a dirty
teardown) the daemons' logs are copied to test-artifacts/slurm/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .cluster import SlurmCluster, SlurmClusterError, missing_tools

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "slurm"
_FAILED = pytest.StashKey[bool]()


def slurm_unavailable() -> str | None:
    """Why the Slurm tests cannot run here, or None."""
    missing = missing_tools()
    if missing:
        return (
            f"Slurm/MUNGE are not installed (missing {', '.join(missing)}); run "
            "scripts/install-slurm.sh as root"
        )
    if os.geteuid() != 0:
        return "the throw-away Slurm cluster needs root (slurmd runs job steps as their user)"
    return None


def _need_slurm() -> None:
    reason = slurm_unavailable()
    if reason is None:
        return
    if os.environ.get("HPCLAB_REQUIRE_SLURM") == "1":
        pytest.fail(f"HPCLAB_REQUIRE_SLURM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and "slurm" in getattr(item, "fixturenames", ()):
        item.session.stash[_FAILED] = True
    return report


def _save_logs(cluster: SlurmCluster) -> Path:
    dest = ARTIFACTS / time.strftime("%Y%m%d-%H%M%S")
    dest.mkdir(parents=True, exist_ok=True)
    for f in [*cluster.log_files(), cluster.conf]:
        if f.is_file():
            shutil.copy2(f, dest / f.name)
    return dest


@pytest.fixture(scope="session")
def slurm(request) -> SlurmCluster:
    """A started SlurmCluster (nodes n1, n2 × 2 CPUs, partition `debug`) under a fresh /tmp dir.

    Pass `slurm.env` to every subprocess that talks to it (SLURM_CONF); `slurm.run([...])` does.
    Teardown cancels all jobs, stops the daemons and fails if anything had to be killed."""
    _need_slurm()
    # Not pytest's tmp_path: /tmp/pytest-of-root is 0700, and jobs of the hub test's non-root
    # user must read slurm.conf and reach the MUNGE socket.
    root = Path(tempfile.mkdtemp(prefix="hpclab-slurm-"))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except (SlurmClusterError, OSError, subprocess.SubprocessError) as exc:
        problems = cluster.stop()
        dest = _save_logs(cluster)
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(
            f"the Slurm test cluster did not start (logs in {dest}): {exc}"
            + (f"\nstop: {problems}" if problems else ""),
            pytrace=False,
        )
    yield cluster
    problems = cluster.stop()
    if problems or request.session.stash.get(_FAILED, False):
        dest = _save_logs(cluster)
        print(f"\nSlurm logs copied to {dest}")
    shutil.rmtree(root, ignore_errors=True)
    if problems:
        pytest.fail(
            "the Slurm cluster did not stop cleanly:\n" + "\n".join(problems), pytrace=False
        )
