"""The second supported stack (HPCLAB_STACK=py312): its Horovod patch, wheel-cache key and files.

Pure tests (no TensorFlow, no MPI run; milliseconds): the patch's hash is part of the wheel cache
key, the default stack's key is unchanged, and the stack's files agree with each other.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # install-time tooling lives beside setup.sh

import horovod_cache as _build  # noqa: E402
from horovod_cache import BuildEnv  # noqa: E402
from test_build_cache import make_env as _default_env  # noqa: E402

PATCH = ROOT / "patches" / "horovod-0.28.1-tf2.21.patch"


def make_env(**changes) -> BuildEnv:
    """A PyPI-MPI environment of the py312 stack (test_build_cache's, moved to 3.12 + TF 2.21)."""
    py312 = {
        "tensorflow": "2.21.0",
        "python": "3.12.1",
        "python_tag": "cp312",
        "horovod_patch": "cd" * 32,
        "mpi_mpicc": "/repo/.venv-py312/bin/mpicc",
        "mpi_libmpi": "/repo/.venv-py312/lib/libmpi.so.12",
    }
    return _default_env(**{**py312, **changes})


def test_key_names_python_tf_and_the_patch_hash():
    key = _build.wheel_cache_key(make_env())
    assert key == f"horovod0.28.1-tf2.21.0-mpich5.0.2-patch{'cd' * 5}-cp312"


def test_without_a_patch_the_key_is_the_default_stacks_form():
    env = make_env(tensorflow="2.15.1", python="3.11.7", python_tag="cp311", horovod_patch="")
    assert _build.wheel_cache_key(env) == "horovod0.28.1-tf2.15.1-mpich5.0.2-cp311"


@pytest.mark.parametrize(
    "changes",
    [
        {"horovod_patch": "ef" * 32},
        {"horovod_patch": ""},
        {"tensorflow": "2.20.0"},
        {"python_tag": "cp313"},
    ],
)
def test_another_patch_tf_or_python_gives_another_key_and_no_reuse(changes):
    env = make_env()
    other = make_env(**changes)
    assert _build.wheel_cache_key(other) != _build.wheel_cache_key(env)
    ok, reason = _build.wheel_matches(_build.make_meta(env, "horovod.whl", 1.0), other)
    assert not ok and "differs" in reason


def test_an_unpatched_wheel_from_before_patches_is_not_reused_for_a_patched_build():
    old = _build.make_meta(make_env(horovod_patch=""), "horovod.whl", 1.0)
    del old["env"]["horovod_patch"]  # build.json files written before the field existed
    assert _build.wheel_matches(old, make_env(horovod_patch=""))[0]
    ok, reason = _build.wheel_matches(old, make_env())
    assert not ok and "patch applied to Horovod" in reason


def test_the_patch_hash_is_the_files_sha256(tmp_path):
    assert _build.horovod_patch({}) == ""
    assert _build.horovod_patch({"HPCLAB_HOROVOD_PATCH": str(PATCH)}) == (
        hashlib.sha256(PATCH.read_bytes()).hexdigest()
    )
    missing = tmp_path / "nope.patch"
    with pytest.raises(_build.BuildEnvError, match="HPCLAB_HOROVOD_PATCH="):
        _build.horovod_patch({"HPCLAB_HOROVOD_PATCH": str(missing)})


def test_every_hunk_of_the_patch_says_why():
    """Each hunk adds an `hpclab:` comment (the patch is read by people, not only by `patch`)."""
    hunks = re.split(r"^@@ ", PATCH.read_text(), flags=re.M)[1:]
    assert hunks
    for hunk in hunks:
        added = [line for line in hunk.splitlines() if line.startswith("+")]
        assert any("hpclab:" in line for line in added), hunk.splitlines()[0]


def test_setup_names_the_files_of_each_stack():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    stack_in = (ROOT / "requirements" / "base-py312.in").read_text()
    lock = (ROOT / "requirements" / "lock-py312.txt").read_text()
    for name in ("requirements/lock-py312.txt", "requirements/base-py312.in", PATCH.name):
        assert name in setup
    pins = {
        re.sub(r"[-_.]+", "-", name).lower(): version
        for name, version in (
            line.split("==", 1) for line in lock.splitlines() if "==" in line and line[0] != "#"
        )
    }
    tf = re.search(r"^tensorflow==(\S+)", stack_in, re.M).group(1)
    keras = re.search(r"^tf-keras==(\S+)", stack_in, re.M).group(1)
    assert pins["tensorflow"] == tf and pins["tf-keras"] == keras
    assert tf.split(".")[:2] == keras.split(".")[:2], "tf-keras must match TensorFlow's minor"
    assert "horovod" not in pins and "hpclab" not in pins


def test_an_unknown_stack_is_refused_with_one_sentence(tmp_path):
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HPCLAB_STACK": "py39"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert (
        "HPCLAB_STACK must be 'py311', 'py312' or 'site', you set HPCLAB_STACK='py39'"
        in result.stderr
    )
