"""`make STACK=site setup` for real, with this checkout's .venv standing in for a site module (its
bin/ on PATH, as `module load` would put it; scripts/site_stack.py, hpclab.tools.site_checks)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # install-time tooling lives beside setup.sh
import site_stack as ss  # noqa: E402


@pytest.mark.slow
def test_site_setup_over_a_stand_in_module_installs_nothing_of_the_sites(tmp_path):
    """`make STACK=site setup` with the venv running the tests as the site's Python (its bin/ on PATH,
    as `module load` would put it): the new venv installs no TensorFlow, Horovod, mpi4py or
    numpy of its own, and `hpclab doctor --quick` passes its site checks."""
    try:
        tf = importlib.metadata.version("tensorflow-cpu")
    except importlib.metadata.PackageNotFoundError:
        tf = importlib.metadata.version("tensorflow")
    if not tf.startswith("2.15."):
        pytest.skip(f"this venv's TensorFlow is {tf}; the site stack is for TensorFlow 2.15")
    site_bin = Path(sys.executable).parent
    venv = tmp_path / "venv-site"
    env = {
        **os.environ,
        "PATH": f"{site_bin}{os.pathsep}{os.environ['PATH']}",
        # a module also sets the library path: mpi4py finds the mpich wheel's libmpi under
        # sys.prefix, which is the new venv's, else falls back to the system's MPI
        "LD_LIBRARY_PATH": os.pathsep.join(
            [str(site_bin.parent / "lib"), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        ),
        "HPCLAB_STACK": "site",
        "HPCLAB_VENV": str(venv),
        "HPCLAB_SITE_PYTHON": str(site_bin / "python"),
        "PIP_NO_INDEX": "1",  # everything the venv needs is the site's: no download allowed
    }
    t0 = time.perf_counter()
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/setup.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    took = time.perf_counter() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Site stack" in done.stdout and "hpclab doctor: OK" in done.stdout
    own = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    names = {ss.requirement_name(p.name.split("-")[0]) for p in own.glob("*.dist-info")}
    assert not names & {"tensorflow", "tensorflow-cpu", "horovod", "mpi4py", "numpy", "mpich"}
    print(f"site setup took {took:.1f} s")
