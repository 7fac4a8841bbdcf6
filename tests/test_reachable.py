"""An install other users cannot reach (hpclab.tools.reachable): the first closed folder on the
way to its Python or package is named by the check, by `make kernel` for every user and by the
doctor, instead of every student's "Permission denied" (exit 126).

The folders are real, made with the modes a `mktemp -d` (0700) and an admin's `chmod` (0711)
give; the venv reached through a closed folder is this checkout's own, behind a symlink.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hpclab.tools import doctor, reachable

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def top():
    """A folder under /tmp that everyone may enter (pytest's own tmp_path is 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="hpclab-reach-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    for p in [folder, *folder.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(folder)


def test_the_first_folder_closed_to_others_is_named(top):
    closed = top / "open" / "closed"
    (closed / "inner" / "bin").mkdir(parents=True)
    closed.chmod(0o700)
    python = closed / "inner" / "bin" / "python"
    assert reachable.closed_folder(python) == closed
    assert reachable.closed_folder(top / "open" / "x") is None
    said = reachable.sentence({"Python": python})
    assert said.startswith(f"other users cannot enter {closed} (mode 0700)")
    assert f"`chmod o+x {closed}`" in said and f"({python})" in said
    closed.chmod(0o711)  # enter, not list: what an admin gives
    assert reachable.closed_folder(python) is None
    assert reachable.sentence({"Python": python, "package": top / "open"}) is None


def _venv_behind_a_closed_folder(top: Path) -> Path:
    """This venv's python, reached through a folder only its owner may enter."""
    closed = top / "closed"
    closed.mkdir()
    (closed / "venv").symlink_to(Path(sys.prefix))
    closed.chmod(0o700)
    return closed / "venv" / "bin" / "python"


def test_make_kernel_for_every_user_warns_with_the_closed_folder(top):
    python = _venv_behind_a_closed_folder(top)
    prefix = top / "prefix"
    done = subprocess.run(
        [str(python), str(REPO / "scripts" / "install_kernel.py"), "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert (prefix / "share" / "jupyter" / "kernels" / "hpclab" / "kernel.json").exists()
    warning = [line for line in done.stderr.splitlines() if line.startswith("WARNING: ")]
    assert len(warning) == 1, done.stderr
    assert f"other users cannot enter {top / 'closed'} (mode 0700)" in warning[0]


def test_the_doctor_row_names_the_closed_folder(top, monkeypatch, capsys):
    python = _venv_behind_a_closed_folder(top)
    monkeypatch.setattr(sys, "executable", str(python))
    doctor.check_reach()
    out = capsys.readouterr().out
    assert f"warning: other users cannot enter {top / 'closed'} (mode 0700)" in out
