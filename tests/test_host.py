"""Which `mpiexec` a Lab launches engines with (fast: fake files, no MPI started)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpclab.cluster.host import find_mpiexec
from hpclab.core.errors import LabError


def fake_exe(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return path


@pytest.fixture
def venv(tmp_path, monkeypatch):
    """A fake venv bin/ holding `sys.executable`, and a PATH of one folder with its own mpiexec."""
    python = fake_exe(tmp_path / "venv" / "bin" / "python")
    on_path = fake_exe(tmp_path / "site" / "bin" / "mpiexec")
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", str(on_path.parent))
    return python.parent, on_path


def test_prefers_the_mpiexec_beside_sys_executable(venv):
    bin_dir, _ = venv
    beside = fake_exe(bin_dir / "mpiexec")
    assert find_mpiexec() == str(beside)


def test_the_one_beside_sys_executable_must_be_executable(venv):
    bin_dir, on_path = venv
    fake_exe(bin_dir / "mpiexec", mode=0o644)  # present but not executable: not usable
    assert find_mpiexec() == str(on_path)


def test_falls_back_to_path(venv):
    _, on_path = venv
    assert find_mpiexec() == str(on_path)


def test_none_found_says_what_to_do(venv, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LabError, match="make setup"):
        find_mpiexec()


def test_an_explicit_mpiexec_is_checked(venv, tmp_path):
    _, on_path = venv
    assert find_mpiexec(str(on_path)) == str(on_path)
    assert find_mpiexec("mpiexec") == "mpiexec"  # a command name found on PATH
    not_executable = fake_exe(tmp_path / "mine" / "mpiexec", mode=0o644)
    with pytest.raises(LabError, match="not an executable file"):
        find_mpiexec(str(not_executable))
