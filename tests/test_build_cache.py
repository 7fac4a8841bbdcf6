"""hpclab._build: Horovod wheel cache keys, build metadata, linkage parsing; and the real warm setup.

Everything except the `slow` test is pure (no TensorFlow, no MPI run) and takes milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # install-time tooling lives beside setup.sh

import horovod_cache as _build  # noqa: E402
from horovod_cache import BuildEnv, MPIInfo  # noqa: E402

from hpclab.tools.linkage import parse_ldd_libmpi  # noqa: E402


def make_env(**changes) -> BuildEnv:
    """A PyPI-MPI environment like the test machines'; `mpi_*` keys change the MPI fields."""
    mpi_changes = {k[4:]: changes.pop(k) for k in list(changes) if k.startswith("mpi_")}
    mpi = MPIInfo(
        mode="pypi",
        flavour="mpich",
        version="5.0.2",
        mpicc="/repo/.venv/bin/mpicc",
        libmpi="/repo/.venv/lib/libmpi.so.12",
        fingerprint="ab" * 32,
    )
    env = BuildEnv(
        horovod="0.28.1",
        tensorflow="2.15.1",
        python="3.11.7",
        python_tag="cp311",
        platform="linux-x86_64",
        mpi=mpi,
    )
    return dataclasses.replace(env, mpi=dataclasses.replace(mpi, **mpi_changes), **changes)


# -- keys ---------------------------------------------------------------------------------------


def test_key_names_horovod_tf_mpi_and_python():
    assert _build.wheel_cache_key(make_env()) == "horovod0.28.1-tf2.15.1-mpich5.0.2-cp311"


@pytest.mark.parametrize(
    "changes",
    [
        {"tensorflow": "2.15.0"},
        {"mpi_version": "4.3.2"},
        {"mpi_flavour": "openmpi"},
        {"python_tag": "cp312"},
        {"mpi_mode": "system"},
    ],
)
def test_different_tf_mpi_or_python_gives_a_different_key(changes):
    assert _build.wheel_cache_key(make_env(**changes)) != _build.wheel_cache_key(make_env())


def test_site_mpi_key_carries_a_fingerprint_hash():
    a = make_env(
        mpi_mode="system", mpi_flavour="openmpi", mpi_version="4.1.5", mpi_fingerprint="1" * 64
    )
    b = dataclasses.replace(a, mpi=dataclasses.replace(a.mpi, fingerprint="2" * 64))
    assert (
        _build.wheel_cache_key(a) == "horovod0.28.1-tf2.15.1-system-openmpi4.1.5-1111111111-cp311"
    )
    assert _build.wheel_cache_key(a) != _build.wheel_cache_key(b)


def test_key_is_a_safe_directory_name():
    key = _build.wheel_cache_key(make_env(mpi_version="4.1/rc 2", tensorflow="2.15.1+local"))
    assert "/" not in key and " " not in key and "+" not in key


# -- metadata ---------------------------------------------------------------------------------


def test_matching_metadata_is_reused():
    env = make_env()
    ok, reason = _build.wheel_matches(_build.make_meta(env, "horovod.whl", 120.0), env)
    assert ok, reason
    assert "2.15.1" in reason and "5.0.2" in reason


@pytest.mark.parametrize(
    "changes, label",
    [
        ({"tensorflow": "2.15.0"}, "TensorFlow version"),
        ({"mpi_version": "4.3.2"}, "MPI version"),
        ({"mpi_libmpi": "/elsewhere/lib/libmpi.so.12"}, "MPI library path"),
        ({"mpi_fingerprint": "cd" * 32}, "MPI fingerprint"),
        ({"mpi_mode": "system"}, "MPI source"),
        ({"python_tag": "cp312"}, "Python ABI"),
    ],
)
def test_metadata_mismatch_is_not_reused_and_says_why(changes, label):
    meta = _build.make_meta(make_env(), "horovod.whl", 120.0)
    ok, reason = _build.wheel_matches(meta, make_env(**changes))
    assert not ok
    assert label in reason and "built with" in reason


def _clone_env(venv: str, mode: str = "pypi") -> BuildEnv:
    """The environment of a clone whose venv is `venv`: its MPI as the wrapper reports it."""
    show = f"cc -I{venv}/include -L{venv}/lib -Wl,-rpath -Wl,{venv}/lib -lmpi"
    report = "MPICH Version:      5.0.2"
    return make_env(
        mpi_mode=mode,
        mpi_mpicc=f"{venv}/bin/mpicc",
        mpi_libmpi=f"{venv}/lib/libmpi.so.12",
        mpi_fingerprint=_build.mpi_fingerprint(show, report),
        mpi_show=show,
        mpi_report=report,
    )


def test_a_wheel_built_in_another_clones_venv_is_reused_with_pypi_mpi_only():
    """PyPI's MPI lives in the venv: another clone's venv is the same MPI at another folder (the
    ops' RUNPATH is made venv-relative at install). A site MPI at another path is another MPI."""
    built = _build.make_meta(_clone_env("/work/main/.venv"), "horovod.whl", 1.0)
    ok, reason = _build.wheel_matches(built, _clone_env("/ci/clone/.venv"))
    assert ok, reason
    older = json.loads(json.dumps(built))
    del older["env"]["mpi"]["show"], older["env"]["mpi"]["report"]  # records before they were kept
    assert _build.wheel_matches(older, _clone_env("/ci/clone/.venv"))[0]
    other_mpi = dataclasses.replace(
        _clone_env("/ci/clone/.venv"),
        mpi=dataclasses.replace(
            _clone_env("/ci/clone/.venv").mpi, report="MPICH Version:      4.3.2"
        ),
    )
    assert "MPI fingerprint" in _build.wheel_matches(built, other_mpi)[1]
    site = _build.make_meta(_clone_env("/opt/mpi-a", "system"), "horovod.whl", 1.0)
    ok, reason = _build.wheel_matches(site, _clone_env("/opt/mpi-b", "system"))
    assert not ok and "MPI library path" in reason


def test_the_ops_runpath_points_at_the_installing_venv_and_keeps_the_rest():
    meta = _build.make_meta(_clone_env("/work/main/.venv"), "horovod.whl", 1.0)
    nccl = "$ORIGIN/../../nvidia/nccl/lib"
    new = _build.relocated_rpath(f"{nccl}:/work/main/.venv/lib", meta)
    assert new == f"$ORIGIN/../../../..:{nccl}"
    assert _build.relocated_rpath(new, meta) == new  # installing twice changes nothing
    assert _build.relocated_rpath("/work/main/.venv/lib", meta) == "$ORIGIN/../../../.."


def test_old_schema_or_broken_metadata_is_not_reused():
    env = make_env()
    meta = _build.make_meta(env, "horovod.whl", 1.0)
    assert not _build.wheel_matches({**meta, "schema": 0}, env)[0]
    assert not _build.wheel_matches({"schema": _build.META_SCHEMA}, env)[0]


def test_metadata_round_trips_through_json():
    env = make_env()
    meta = json.loads(json.dumps(_build.make_meta(env, "horovod.whl", 1.0)))
    assert BuildEnv.from_dict(meta["env"]) == env


def test_cached_wheel_checks_the_directory(tmp_path):
    env = make_env()
    ok_dir = tmp_path / "ok"
    ok_dir.mkdir()
    (ok_dir / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"wheel")
    (ok_dir / _build.META_NAME).write_text(
        json.dumps(_build.make_meta(env, "horovod-0.28.1-cp311-cp311-linux_x86_64.whl", 1.0))
    )
    wheel, reason = _build.cached_wheel(str(ok_dir), env)
    assert wheel == str(ok_dir / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"), reason

    wheel, reason = _build.cached_wheel(str(ok_dir), make_env(tensorflow="2.15.0"))
    assert wheel is None and "TensorFlow" in reason

    assert _build.cached_wheel(str(tmp_path / "missing"), env) == (
        None,
        f"no cached wheel in {tmp_path / 'missing'}",
    )

    no_wheel = tmp_path / "no-wheel"
    no_wheel.mkdir()
    (no_wheel / _build.META_NAME).write_text(json.dumps(_build.make_meta(env, "gone.whl", 1.0)))
    wheel, reason = _build.cached_wheel(str(no_wheel), env)
    assert wheel is None and "not there" in reason


# -- parsing ----------------------------------------------------------------------------------

LDD_OK = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibmpi.so.12 => /repo/.venv/lib/libmpi.so.12 (0x00007fee)
\tlibtensorflow_framework.so.2 => not found
"""


def test_parse_ldd_libmpi():
    assert parse_ldd_libmpi(LDD_OK) == ("libmpi.so.12", "/repo/.venv/lib/libmpi.so.12")
    assert parse_ldd_libmpi("\tlibmpi.so.40 => not found\n") == ("libmpi.so.40", None)
    assert parse_ldd_libmpi("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n") is None


def test_libmpi_from_show_prefers_the_versioned_library(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libmpi.so").write_text("INPUT(libmpi.so.12)\n")  # linker script, as in the mpich wheel
    (lib / "libmpi.so.12").write_bytes(b"\x7fELF")
    show = f"cc -I{tmp_path}/include -L{lib} -Wl,-rpath -Wl,{lib} -lmpi"
    assert _build.libmpi_from_show(show) == str((lib / "libmpi.so.12").resolve())
    assert _build.libmpi_from_show("cc -lmpi") == ""


def test_version_parsers():
    assert (
        _build.parse_mpichversion("MPICH Version:      5.0.2\nMPICH Release date: x\n") == "5.0.2"
    )
    assert _build.parse_ompi_info("Open MPI v4.1.5\n\nhttps://www.open-mpi.org/\n") == "4.1.5"
    assert _build.parse_mpiexec_version(
        "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619"
    ) == ("intelmpi", "2021.10")
    assert _build.parse_mpiexec_version("mpiexec (OpenRTE) 4.1.2\n") == ("openmpi", "4.1.2")
    assert _build.parse_mpiexec_version("mpiexec (Open MPI) 5.0.3\n") == ("openmpi", "5.0.3")
    assert _build.parse_mpiexec_version("srun 23.02.7\n") == ("unknown", "")
    assert _build.parse_mpiexec_version("HYDRA build details:\n    Version:  4.1.2\n") == (
        "mpich",
        "4.1.2",
    )
    with pytest.raises(_build.BuildEnvError):
        _build.parse_mpichversion("something else")


def test_requirements_without_drops_only_named_packages():
    lines = ["# MPI\n", "mpich\n", "mpi4py>=4\n", "mpi4py-extra\n", "numpy<2\n", "-c lock.txt\n"]
    assert _build.requirements_without(lines, ["mpich", "MPI4PY"]) == [
        "# MPI\n",
        "mpi4py-extra\n",
        "numpy<2\n",
        "-c lock.txt\n",
    ]


def test_mpi_mode_rejects_unknown_values():
    assert _build.mpi_mode({}) == "pypi"
    assert _build.mpi_mode({"HPCLAB_MPI": "system"}) == "system"
    with pytest.raises(_build.BuildEnvError, match="HPCLAB_MPI must be"):
        _build.mpi_mode({"HPCLAB_MPI": "openmpi"})


def test_system_mode_without_mpicc_says_what_to_do(tmp_path):
    with pytest.raises(_build.BuildEnvError, match="module load"):
        _build.find_mpicc("system", prefix=str(tmp_path), path=str(tmp_path))


# -- the real environment ------------------------------------------------------------------------


@pytest.mark.skipif(
    os.environ.get("HPCLAB_MPI", "pypi") != "pypi", reason="describes the PyPI-MPI venv"
)
def test_read_env_describes_this_venv():
    env = _build.read_env({})
    assert env.horovod == "0.28.1" and env.tensorflow == "2.15.1" and env.python_tag == "cp311"
    assert env.mpi.flavour == "mpich" and env.mpi.libmpi.endswith("libmpi.so.12")
    assert _build.wheel_cache_key(env).startswith("horovod0.28.1-tf2.15.1-mpich")


@pytest.mark.slow
def test_warm_setup_reuses_everything_and_is_fast():
    """`scripts/setup.sh` on a set-up checkout: no pip install, no Horovod build."""
    start = time.perf_counter()
    result = subprocess.run(
        ["bash", "scripts/setup.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    elapsed = time.perf_counter() - start
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "building Horovod" not in output, output[-3000:]
    assert "already installed and verified" in output or "reusing cached wheel" in output, output[
        -3000:
    ]
    assert "up to date (stamp matches" in output, output[-3000:]
    assert "hpclab doctor: OK" in output, output[-3000:]
    assert elapsed < 120, f"warm setup took {elapsed:.0f} s"
    print(f"warm scripts/setup.sh: {elapsed:.1f} s", file=sys.stderr)


# -- GPU builds (HPCLAB_GPU; no GPU here: the key and metadata logic is what can be tested) ------


def test_an_nccl_build_has_its_own_key():
    cpu, gpu = make_env(), make_env(gpu_operations="NCCL")
    assert _build.wheel_cache_key(gpu) == "horovod0.28.1-tf2.15.1-mpich5.0.2-nccl-cp311"
    assert _build.wheel_cache_key(cpu) != _build.wheel_cache_key(gpu)


def test_a_cpu_wheel_is_not_reused_for_a_gpu_build_and_old_metadata_means_cpu():
    cpu_meta = _build.make_meta(make_env(), "horovod-0.28.1-cp311-linux_x86_64.whl", 1.0)
    ok, why = _build.wheel_matches(cpu_meta, make_env(gpu_operations="NCCL"))
    assert not ok and "GPU operations" in why and "'NCCL'" in why
    # build.json files written before the field existed describe CPU builds: still reusable.
    del cpu_meta["env"]["gpu_operations"]
    assert _build.wheel_matches(cpu_meta, make_env())[0]


@pytest.mark.parametrize("value,expected", [("", ""), ("nccl", "NCCL"), (" NCCL ", "NCCL")])
def test_gpu_operations_come_from_setup(value, expected):
    assert _build.gpu_operations({"HPCLAB_GPU_OPS": value}) == expected


def test_unknown_gpu_operations_are_refused_by_name():
    with pytest.raises(_build.BuildEnvError, match="HPCLAB_GPU_OPS must be empty or NCCL"):
        _build.gpu_operations({"HPCLAB_GPU_OPS": "ROCM"})
