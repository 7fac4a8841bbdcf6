"""Open MPI as a second MPI flavour, for real (issue 26, item 4).

Debian's Open MPI 4.1 and libpmix2 (scripts/install-openmpi.sh; Debian's slurm-wlm ships the
PMIx plugin, mpi_pmix -> mpi_pmix_v4.so, which loads that libpmix.so.2). The module fixture runs
`make VENV=.venv-ompi HPCLAB_MPI=system setup` with Open MPI's wrappers first on PATH: mpi4py and
Horovod are compiled against it under their own wheel-cache keys (a warm per-user cache makes
this a reuse; an empty one compiles both). Then, with that venv's Python:

- inside an allocation, `srun_mpi = "auto"` picks `--mpi=pmix` (Horovod's build record says
  Open MPI; the test Slurm's MpiDefault is none), the engines form one world and a Lab trains;
- the wrong plugin (`--mpi=pmi2`) fails with the sentence that names `pmix`;
- mode mpiexec with the profile's arguments (`--oversubscribe`, `--bind-to none`, and
  `--allow-run-as-root` when root: Open MPI's mpirun refuses root without it) trains.

Needs root (the Slurm cluster, apt) and Open MPI: `make test` runs scripts/install-openmpi.sh
first, and with HPCLAB_REQUIRE_SLURM=1 (as `make test` sets) a missing Open MPI fails instead of
skipping. Measured quiet on the 2-core machine (2026-11-27), a fresh .venv-ompi with the
per-user wheel cache warm, as CI has it: 3 passed in 115 s and in 130 s (setup 72 s and
87 s: mpi4py and Horovod reused, their keys hash the MPI's `mpicc -show`, its
version report, the wrapper's real path and the Python, never the clone's path; srun ~20 s,
wrong plugin ~3 s, mpiexec ~19 s). An empty wheel cache compiles both (Horovod ~5 min quiet,
1,570 s once at load ~20). Under load ~35 both trainings once failed (no rank's heartbeat for
8 s). To run alone:

    scripts/install-openmpi.sh && .venv/bin/python -m pytest tests/slurm/test_openmpi.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_modes import assert_nothing_left

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VENV = ROOT / ".venv-ompi"
WRAPPERS = ROOT / ".cache" / "openmpi-bin"  # Open MPI's tools under their plain names
ARTIFACTS = ROOT / "test-artifacts" / "openmpi"
TOOLS = {
    "mpicc": "mpicc.openmpi",
    "mpicxx": "mpicxx.openmpi",
    "mpic++": "mpic++.openmpi",
    "mpiexec": "mpiexec.openmpi",
    "mpirun": "mpirun.openmpi",
    "ompi_info": "ompi_info",
}
PMIX = ("/usr/lib/x86_64-linux-gnu/libpmix.so.2", "/usr/lib/libpmix.so.2")
SETUP_TIMEOUT_S = 1800  # an empty wheel cache compiles mpi4py and Horovod on 2 busy cores


def openmpi_unavailable() -> str | None:
    missing = [tool for tool in TOOLS.values() if not shutil.which(tool)]
    if missing or not any(Path(p).exists() for p in PMIX):
        return (
            f"Open MPI/PMIx are not installed (missing {', '.join(missing) or 'libpmix.so.2'}); "
            "run scripts/install-openmpi.sh as root"
        )
    return None


def _env_with_wrappers() -> dict[str, str]:
    WRAPPERS.mkdir(parents=True, exist_ok=True)
    for name, target in TOOLS.items():
        link = WRAPPERS / name
        if not link.is_symlink():
            link.symlink_to(shutil.which(target))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCLAB_"))}
    return {**env, "PATH": f"{WRAPPERS}{os.pathsep}{env.get('PATH', '')}"}


@pytest.fixture(scope="module")
def ompi_python(slurm) -> str:
    """The Python of .venv-ompi (built now if needed), whose mpi4py and Horovod link Open MPI."""
    reason = openmpi_unavailable()
    if reason:
        if os.environ.get("HPCLAB_REQUIRE_SLURM") == "1":
            pytest.fail(f"HPCLAB_REQUIRE_SLURM=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    env = {
        **_env_with_wrappers(),
        "HPCLAB_MPI": "system",
        "HPCLAB_PYTHON": getattr(sys, "_base_executable", sys.executable),  # the stack's Python
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / "setup.log"
    t0 = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            ["make", f"VENV={VENV}", "setup"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=SETUP_TIMEOUT_S,
            check=False,
        )
    said = log.read_text()
    print(f"make VENV=.venv-ompi HPCLAB_MPI=system setup: {time.monotonic() - t0:.0f} s")
    assert done.returncode == 0, f"the Open MPI setup failed; {log}:\n{said[-3000:]}"
    python = str(VENV / "bin" / "python")
    record = json.loads((VENV / "hpclab-horovod.json").read_text())["env"]["mpi"]
    assert (record["mode"], record["flavour"]) == ("system", "openmpi"), record
    assert "system-openmpi" in said or "already installed" in said
    return python


def inner(slurm, python, tmp_path, *launch, extra=(), env=None, timeout=300):
    """inner_lab.py with the Open MPI venv's Python under `launch`; its JSON line."""
    args = [*launch, python, HERE / "inner_lab.py", "--runs-dir", tmp_path / "runs", *extra]
    r = slurm.run(args, timeout=timeout, cwd=ROOT, **({"env": env} if env else {}))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}\n{slurm.log_tails()}"
    print("inner_lab seconds:", json.loads(lines[-1]).get("seconds"))
    return json.loads(lines[-1]), r


def test_srun_auto_picks_pmix_for_open_mpi_and_a_lab_trains_as_one_world(
    slurm, ompi_python, tmp_path
):
    out, _ = inner(
        slurm,
        ompi_python,
        tmp_path,
        "salloc",
        "-p",
        "debug",
        "-N1",
        "-n2",
        "-c1",
        extra=["--epochs", "1"],
    )
    assert out.get("status") == "finished", out
    assert "--mpi=pmix" in out["plan"]["srun"], out["plan"]
    assert any(
        n.startswith("srun --mpi=pmix: Horovod was built with Open MPI") for n in out["notes"]
    )
    ranks = out["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["size"] for r in ranks} == {2}
    assert all(r["mpi_library"].startswith("Open MPI v") for r in ranks), ranks
    assert {r["mpi_thread"] for r in ranks} == {"multiple"}
    assert len(set(out["summary"]["weights_digest"])) == 1  # one model, not two
    assert_nothing_left(slurm)


def test_the_wrong_plugin_fails_with_the_sentence_naming_pmix(slurm, ompi_python, tmp_path):
    profile = tmp_path / "pmi2.toml"
    profile.write_text(
        '[launch]\nmode = "srun"\n[slurm]\nsrun_mpi = "pmi2"\nstep_wait_s = 30\n'
        "registration_timeout_s = 60\n"
    )
    out, r = inner(
        slurm,
        ompi_python,
        tmp_path,
        "salloc",
        "-p",
        "debug",
        "-N1",
        "-n2",
        "-c1",
        extra=["--profile", str(profile)],
    )
    assert r.returncode == 3 and "error" in out, out
    assert 'slurm.srun_mpi = "pmix"' in out["error"], out["error"]
    assert not list((tmp_path / "runs").glob("*/config.json"))  # nothing trained
    assert_nothing_left(slurm)


def test_mpiexec_mode_passes_the_profiles_open_mpi_arguments(ompi_python, tmp_path):
    root_args = ', "--allow-run-as-root"' if os.geteuid() == 0 else ""
    profile = tmp_path / "ompi-local.toml"
    profile.write_text(
        f'[launch]\nmode = "mpiexec"\nmpiexec = "{shutil.which("mpiexec.openmpi")}"\n'
        f'mpiexec_args = ["--oversubscribe", "--bind-to", "none"{root_args}]\n'
    )
    args = [ompi_python, HERE / "inner_lab.py", "--runs-dir", tmp_path / "runs"]
    r = subprocess.run(
        [*args, "--profile", str(profile), "--epochs", "1"],
        cwd=ROOT,
        env=_env_with_wrappers(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    out = json.loads(lines[-1])
    print("inner_lab seconds:", out.get("seconds"))
    assert out.get("status") == "finished", out
    assert out["plan"]["mode"] == "mpiexec"
    assert {r["size"] for r in out["ranks"]} == {2}
    assert all(r["mpi_library"].startswith("Open MPI v") for r in out["ranks"])
    assert len(set(out["summary"]["weights_digest"])) == 1
