"""HPCLAB_MPI=system with compiler wrappers that are not `mpicc` (scripts/horovod_cache.py).

Cray has no `mpicc`: its `cc`/`CC` add Cray MPICH when the module is loaded, answer
`--cray-print-opts=all` instead of `-show`, and link `libmpi_cray` (or `libmpi_gnu_123`). No Cray
system is available here, so the wrapper is a small script that answers as Cray's does; the
rules are checked, not a Cray build. Open MPI's real wrapper is tested by tests/slurm/test_openmpi.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import horovod_cache as hc  # noqa: E402

CRAY_OPTS = (
    "-I/opt/cray/pe/mpich/8.1.28/ofi/gnu/12.3/include "
    "-L/opt/cray/pe/mpich/8.1.28/ofi/gnu/12.3/lib -lmpi_gnu_123"
)


def tool(folder: Path, name: str, answer: str = "", show_flag: str = "--cray-print-opts=all"):
    """An executable `name` in `folder` printing `answer` for `show_flag`, failing otherwise."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = "{show_flag}" ]; then echo "{answer}"; exit 0; fi\n'
        'echo "unrecognized option $1" >&2; exit 1\n'
    )
    path.chmod(0o755)
    return path


def test_cray_pe_without_mpicc_finds_cc_and_an_explicit_wrapper_wins(tmp_path):
    bin_ = tmp_path / "bin"
    cc = tool(bin_, "cc", CRAY_OPTS)
    tool(bin_, "mycc")
    path = str(bin_)
    cray = {"PE_ENV": "GNU", "PATH": path}
    assert hc.find_mpicc("system", str(tmp_path / "venv"), path, cray) == str(cc)
    explicit = {"HPCLAB_MPICC": "mycc", "PATH": path}
    assert hc.find_mpicc("system", str(tmp_path / "venv"), path, explicit) == str(bin_ / "mycc")
    with pytest.raises(hc.BuildEnvError, match="HPCLAB_MPICC \\(Cray: cc\\)"):
        hc.find_mpicc("system", str(tmp_path / "venv"), path, {"PATH": path})  # no Cray PE
    with pytest.raises(hc.BuildEnvError, match="HPCLAB_MPICC='nope' is not an executable"):
        hc.find_mpicc("system", str(tmp_path / "venv"), path, {"HPCLAB_MPICC": "nope"})


def test_cray_mpich_version_and_its_library_from_the_wrapper_options(tmp_path):
    assert hc.parse_cray_mpich(CRAY_OPTS, {}) == "8.1.28"
    assert hc.parse_cray_mpich(CRAY_OPTS, {"CRAY_MPICH_VERSION": "8.1.29"}) == "8.1.29"
    assert hc.parse_cray_mpich("-I/opt/gcc/include", {}) == ""  # cc without cray-mpich loaded
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libmpi_gnu_123.so.12").write_bytes(b"")
    (lib / "libmpi.so.40").write_bytes(b"")  # another MPI's library in the same folder
    show = f"-I/x -L{lib} -lmpi_gnu_123"
    assert hc.libmpi_from_show(show) == str((lib / "libmpi_gnu_123.so.12").resolve())
    assert hc.libmpi_from_show(f"-L{lib} -lmpi") == str((lib / "libmpi.so.40").resolve())


def test_read_mpi_describes_a_cray_wrapper_as_cray_mpich(tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    tool(bin_, "cc", CRAY_OPTS)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("PE_ENV", "GNU")
    monkeypatch.delenv("HPCLAB_MPICC", raising=False)
    monkeypatch.delenv("CRAY_MPICH_VERSION", raising=False)
    if any(Path(d, "mpicc").exists() for d in ("/usr/bin", "/bin")):
        monkeypatch.setenv("HPCLAB_MPICC", "cc")  # a system mpicc would come first otherwise
    info = hc.read_mpi("system", str(tmp_path / "venv"))
    assert (info.flavour, info.version, info.mpicc) == ("cray-mpich", "8.1.28", str(bin_ / "cc"))
    env = dataclass_env(info)
    assert "system-cray-mpich8.1.28-" in hc.wheel_cache_key(env)


def dataclass_env(mpi: hc.MPIInfo) -> hc.BuildEnv:
    return hc.BuildEnv(
        horovod="0.28.1",
        tensorflow="2.15.1",
        python="3.11.7",
        python_tag="cp311",
        platform="linux-x86_64",
        mpi=mpi,
    )
