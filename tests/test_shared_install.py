"""A centre-wide, read-only install used by a second Unix user (issue 26, item 1).

Centre staff install hpclab once, read-only, for everyone; a student's `Lab()` must then keep its
run records, engine state and generated-data caches in places of the student's own
(`hpclab.records.paths`), read a read-only staged dataset, and write nothing into the install.

The test creates that student (`useradd`, a home of its own; removed at the end), so it needs
root; elsewhere it is skipped with the reason. The install is a read-only copy of this checkout's
`hpclab` package and `pyproject.toml` (so it looks like a checkout, the workshop layout) put
first on `PYTHONPATH` of this venv's interpreter; the staged data folder is read-only and holds
the MNIST-1D cache the run reads.

On this CI machine the venv's interpreter is pyenv's, under `/root` (mode 0700), which no other
user can reach (a centre installs Python where every user can). The student's processes then run
in a private mount namespace (`unshare --mount`) where the closed folder is a world-readable
view holding only the interpreter's subtree; nothing outside that namespace changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from hpclab.tools import reachable

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable  # the project's .venv python (not resolved: the venv's site-packages)
SAMPLES = 2000  # a small MNIST-1D: the staged cache is made in about a second

STUDENT_SCRIPT = textwrap.dedent(
    """
    import json, time
    import hpclab
    from hpclab import Lab, RunConfig

    t0 = time.perf_counter()
    with Lab(workers=2) as lab:
        run = lab.run(RunConfig(num_samples={samples}, max_steps=4, steps_per_call=2))
        run.wait(timeout=120)
        out = {{
            "package": hpclab.__file__,
            "runs_dir": str(lab.runs_dir),
            "data_dir": str(lab.data_dir),
            "state_dir": lab.plan.state_dir,
            "record": str(run.path),
            "status": run.status,
            "seconds": time.perf_counter() - t0,
        }}
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def _closed_ancestor(path: Path) -> tuple[Path, Path] | None:
    """(the first folder above `path` other users cannot enter, its child on the way), or None."""
    folder = reachable.closed_folder(path)
    return None if folder is None else (folder, folder / path.relative_to(folder).parts[0])


def _as_user(name: str, argv: list[str], env: dict, cwd: str, timeout: float):
    """Run `argv` as `name` with exactly `env`; inside a private mount namespace that opens the
    interpreter's closed ancestor (see the module docstring) when there is one."""
    command = ["runuser", "-u", name, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()]]
    closed = _closed_ancestor(Path(os.path.realpath(PY)))
    if closed is None:
        return subprocess.run(
            [*command, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
    folder, child = closed
    stage = Path(tempfile.mkdtemp(prefix="hpclab-view-"))
    script = (
        'set -e; mount --bind "$CHILD" "$STAGE"; '
        'mount -t tmpfs -o mode=0755,size=1m hpclab-view "$FOLDER"; '
        'mkdir "$CHILD"; mount --bind "$STAGE" "$CHILD"; exec "$@"'
    )
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
            + command
            + argv,
            cwd=cwd,
            env={**os.environ, "CHILD": str(child), "STAGE": str(stage), "FOLDER": str(folder)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        stage.rmdir()
    if done.returncode != 0 and done.stderr.startswith(("unshare:", "mount:")):
        pytest.skip(
            f"this venv's interpreter is under {folder} (closed to other users) and no mount "
            f"namespace can open it here: {done.stderr.strip()}"
        )
    return done


def _student_env(name: str, home: Path, **extra: str) -> dict[str, str]:
    """A login-like environment of the student's own (nothing of the test process leaks in)."""
    return {
        "HOME": str(home),
        "USER": name,
        "LOGNAME": name,
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        **extra,
    }


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` -> (size, mtime_ns): what a write would change."""
    return {
        str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in [root, *root.rglob("*")]
    }


def _read_only(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)


@pytest.fixture
def student():
    """A throw-away non-root Unix user with a home of its own: (name, home)."""
    if os.geteuid() != 0:
        pytest.skip("creating a second Unix user needs root (useradd); run as root in CI")
    if not (shutil.which("useradd") and shutil.which("runuser")):
        pytest.skip("useradd/runuser are not installed")
    # The second user runs this venv's Python and imports this checkout's package; a folder
    # above them closed to others (a clone under `mktemp -d`) fails them all with "Permission
    # denied". That is the install's precondition, said by the lab's own check, not a failure.
    # (The interpreter the venv links to is opened by `_as_user`'s mount namespace instead.)
    closed = reachable.sentence({"Python": Path(os.path.abspath(PY)), "package": REPO / "hpclab"})
    if closed:
        pytest.skip(closed)
    name = f"hpcstu{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
    try:
        yield name, Path(os.path.expanduser(f"~{name}"))
    finally:
        _end_processes_of(name)
        subprocess.run(["userdel", "--remove", name], capture_output=True)


def _end_processes_of(name: str) -> None:
    """Kill, by pid, whatever the test's own user left running (engines of a failed start)."""
    import psutil

    left = [p for p in psutil.process_iter(["username"]) if p.info["username"] == name]
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=5)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.own_lab
def test_a_second_user_trains_from_a_read_only_install(student):
    from hpclab.rank.data import load_arrays, mnist1d_cache_path

    name, home = student
    top = Path(tempfile.mkdtemp(prefix="hpclab-shared-", dir="/tmp"))
    try:
        top.chmod(0o755)
        install, datasets = top / "sw" / "hpclab", top / "datasets" / "hpclab"
        shutil.copytree(
            REPO / "hpclab", install / "hpclab", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copy2(REPO / "pyproject.toml", install / "pyproject.toml")
        load_arrays({"dataset": "mnist1d", "num_samples": SAMPLES, "seed": 0}, datasets)
        assert mnist1d_cache_path(SAMPLES, 0, datasets).exists()
        for lock in datasets.glob("*.lock"):
            lock.unlink()
        _read_only(top / "sw")
        _read_only(top / "datasets")
        before = {"install": _tree(top / "sw"), "data": _tree(top / "datasets")}

        env = _student_env(name, home, PYTHONPATH=str(install), HPCLAB_DATA=str(datasets))
        t0 = time.perf_counter()
        done = _as_user(
            name, [PY, "-c", STUDENT_SCRIPT.format(samples=SAMPLES)], env, str(home), 240
        )
        seconds = time.perf_counter() - t0
        result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and result, (
            f"the student's Lab failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}"
        )
        out = json.loads(result[0][len("RESULT ") :])
        print(f"student lab: {out['seconds']:.1f} s inside, {seconds:.1f} s as a process")

        assert out["package"].startswith(str(install))  # the read-only install was used
        said = [line for line in done.stdout.splitlines() if line.startswith("hpclab: runs in ")]
        assert len(said) == 1 and "the install is read-only" in said[0]  # one line says where
        own = home / ".local" / "share" / "hpclab"  # XDG_DATA_HOME unset, no SCRATCH
        assert Path(out["runs_dir"]) == own / "runs"
        assert Path(out["record"]).parent == own / "runs"
        assert Path(out["state_dir"]).is_relative_to(own)
        assert Path(out["data_dir"]) == datasets  # read-only staged data, read in place
        assert out["status"] == "finished"
        summary = json.loads((Path(out["record"]) / "summary.json").read_text())
        assert summary["status"] == "finished"
        assert Path(out["record"]).stat().st_uid == os.stat(home).st_uid  # the student's own
        after = {"install": _tree(top / "sw"), "data": _tree(top / "datasets")}
        assert after == before  # nothing was written into the install or the staged data
    finally:
        for p in [top, *top.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(top, ignore_errors=True)


FOLDER_CHECKS = textwrap.dedent(
    """
    import json, os
    from hpclab.core.config import RunConfig
    from hpclab.core.errors import ConfigError
    from hpclab.records import paths

    data, runs = os.environ["RO_DATA"], os.environ["SHARED_RUNS"]
    said = {{"data_ok": str(paths.check_folder(data, "data_dir"))}}
    for which, call in [
        ("runs_refused", lambda: paths.check_folder(data, "runs_dir")),
        ("cached_ok", lambda: paths.check_staged(RunConfig(num_samples={samples}), data)),
        ("uncached_refused", lambda: paths.check_staged(RunConfig(num_samples={samples}, seed=7), data)),
    ]:
        try:
            said[which] = call()
        except ConfigError as exc:
            said[which] = str(exc)
    said["state"] = str(paths.state_root(runs))
    print("RESULT " + json.dumps(said), flush=True)
    """
)


@pytest.mark.slow
def test_read_only_data_is_read_and_a_shared_runs_folder_gets_per_user_state(student):
    """As the second user: a read-only data folder passes `check_folder` and a cached MNIST-1D
    run; a run that would have to write the cache there, or a read-only runs folder, is refused
    with a sentence; in a runs folder shared with another user whose `.state` is there already,
    this user's engine state goes to a folder of its own."""
    from hpclab.rank.data import load_arrays

    name, home = student
    top = Path(tempfile.mkdtemp(prefix="hpclab-shared-", dir="/tmp"))
    try:
        top.chmod(0o755)
        data, runs = top / "data", top / "runs"
        load_arrays({"dataset": "mnist1d", "num_samples": SAMPLES, "seed": 0}, data)
        _read_only(data)
        (runs / ".state").mkdir(parents=True)  # the first user's (root's), private
        (runs / ".state").chmod(0o700)
        runs.chmod(0o1777)  # shared like /tmp: everyone may add, nobody may remove another's
        env = _student_env(
            name, home, PYTHONPATH=str(REPO), RO_DATA=str(data), SHARED_RUNS=str(runs)
        )
        done = _as_user(name, [PY, "-c", FOLDER_CHECKS.format(samples=SAMPLES)], env, str(home), 60)
        result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and result, done.stdout[-2000:] + done.stderr[-2000:]
        said = json.loads(result[0][len("RESULT ") :])
        assert said["data_ok"] == str(data) and said["cached_ok"] is None
        assert (
            said["runs_refused"]
            == f"{paths_label('runs_dir')} {data} is not writable by this user."
        )
        assert "num_samples=" in said["uncached_refused"] and "seed=7" in said["uncached_refused"]
        assert "is not writable by this user" in said["uncached_refused"]
        assert "HPCLAB_DATA" in said["uncached_refused"]
        assert said["state"] == str(runs / f".state-{name}")
    finally:
        for p in [top, *top.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(top, ignore_errors=True)


def paths_label(which: str) -> str:
    from hpclab.records.paths import FOLDERS

    return FOLDERS[which]


def test_a_writable_checkout_keeps_runs_and_data_beside_the_code(monkeypatch):
    """This checkout is writable: runs/ and data/ stay in it (the workshop layout)."""
    from hpclab.records import paths

    for var in ("HPCLAB_RUNS", "HPCLAB_DATA"):
        monkeypatch.delenv(var, raising=False)
    assert paths.project_root() == REPO
    assert paths.default_root() == (REPO, "the checkout")
    assert paths.runs_dir() == REPO / "runs" and paths.data_dir() == REPO / "data"
    line, own = paths.where(REPO / "runs", REPO / "data", REPO / "runs" / ".state")
    assert own is False and line.startswith(f"runs in {REPO / 'runs'}")


def test_the_user_folder_chain_and_which_setting_wins(tmp_path):
    """$HPCLAB_RUNS → the profile's paths → (the checkout) → $SCRATCH/hpclab → XDG_DATA_HOME."""
    from hpclab.records import paths

    home = Path.home()
    assert paths.user_root({"SCRATCH": str(tmp_path)}) == tmp_path / "hpclab"
    both = {"SCRATCH": str(tmp_path / "s"), "XDG_DATA_HOME": str(tmp_path / "x")}
    assert paths.user_root(both) == tmp_path / "s" / "hpclab"
    assert paths.user_root({"XDG_DATA_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "hpclab"
    assert paths.user_root({"XDG_DATA_HOME": "relative"}) == home / ".local/share/hpclab"
    assert paths.user_root({}) == home / ".local" / "share" / "hpclab"
    env = {"HPCLAB_RUNS": str(tmp_path / "mine")}
    assert paths.folder("runs", str(tmp_path / "site"), env) == tmp_path / "mine"
    assert paths.folder("runs", str(tmp_path / "site"), {}) == tmp_path / "site"
    assert paths.folder("data", "", {}) == paths.default_root()[0] / "data"


def test_the_mnist1d_cache_name_is_the_ranks_own(tmp_path):
    from hpclab.rank.data import mnist1d_cache_path
    from hpclab.records.paths import mnist1d_cache

    assert mnist1d_cache(4000, 3, tmp_path) == mnist1d_cache_path(4000, 3, tmp_path)


KERNEL_CLIENT = textwrap.dedent(
    """
    import json
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="hpclab", startup_timeout=60)
    said = []
    try:
        kc.execute_interactive(
            "import json, os, sys; print(json.dumps([os.environ.get('FROM_SETUP'), "
            "os.environ.get('HPCLAB_PROFILE'), sys.executable, os.getuid()]))",
            output_hook=lambda m: said.append(m["content"].get("text", "")),
            timeout=60,
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    print("RESULT " + "".join(said).strip(), flush=True)
    """
)


@pytest.mark.slow
def test_make_kernel_for_every_user_carries_environment_and_setup(student):
    """`make kernel KERNEL_PREFIX=... KERNEL_ENV=... KERNEL_SETUP=...` as staff (root) into a
    read-only prefix; the second user's Jupyter client starts that kernel, whose environment has
    the spec's variable and what the setup line exported. (`-o setup`: the venv exists; `make
    setup` is not re-run by a test.)"""
    name, home = student
    top = Path(tempfile.mkdtemp(prefix="hpclab-kernel-", dir="/tmp"))
    try:
        top.chmod(0o755)
        made = subprocess.run(
            [
                "make",
                "-s",
                "-o",
                "setup",
                "kernel",
                f"KERNEL_PREFIX={top}",
                "KERNEL_ENV=HPCLAB_PROFILE=gpu",
                "KERNEL_SETUP=export FROM_SETUP=yes",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stdout + made.stderr
        spec = top / "share" / "jupyter" / "kernels" / "hpclab" / "kernel.json"
        assert json.loads(spec.read_text())["env"] == {"HPCLAB_PROFILE": "gpu"}
        _read_only(top)
        env = _student_env(name, home, JUPYTER_PATH=str(top / "share" / "jupyter"))
        done = _as_user(name, [PY, "-c", KERNEL_CLIENT], env, str(home), 120)
        result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and result, done.stdout[-2000:] + done.stderr[-2000:]
        setup, profile, python, uid = json.loads(result[0][len("RESULT ") :])
        assert (setup, profile, python) == ("yes", "gpu", PY)
        assert uid == os.stat(home).st_uid  # the student's kernel, not staff's
    finally:
        for p in [top, *top.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(top, ignore_errors=True)
