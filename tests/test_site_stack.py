"""The site stack (``make STACK=site setup``): what the venv installs and pins
(scripts/site_stack.py), what `hpclab doctor` demands of the site's TensorFlow and Horovod
(hpclab.tools.site_checks, with fake version tuples and flags)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from hpclab.tools import site_checks as sc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # install-time tooling lives beside setup.sh
import site_stack as ss  # noqa: E402

GOOD = sc.SiteFacts(
    tf_version="2.15.1",
    tf_cuda=False,
    horovod_version="0.28.1",
    horovod_tf=True,
    built_against="2.15.1",
    mpi_built=True,
    nccl_built=False,
    horovod_libmpi="/opt/mpich/lib/libmpi.so.12.3.0",
    mpi4py_libmpi="/opt/mpich/lib/libmpi.so.12.3.0",
)


def test_a_good_site_stack_passes():
    assert sc.site_problems(GOOD) == ([], [])


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tf_version": "2.16.1", "built_against": "2.16.1"}, "TensorFlow is 2.16.1"),
        ({"tf_version": "2.14.0", "built_against": "2.14.0"}, "needs 2.15.x"),
        ({"horovod_tf": False}, "built without TensorFlow"),
        ({"built_against": "2.15.0"}, "built against TensorFlow 2.15.0"),
        ({"mpi_built": False}, "mpi_built() is False"),
        ({"mpi4py_libmpi": "/usr/lib/libmpi.so.40"}, "same MPI"),
    ],
)
def test_each_broken_flag_is_an_error_naming_it(change, needle):
    errors, _ = sc.site_problems(dataclasses.replace(GOOD, **change))
    assert len(errors) == 1 and needle in errors[0]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tf_cuda": True}, "without NCCL"),
        ({"horovod_version": "0.28.0"}, "tested with 0.28.1"),
    ],
)
def test_slower_or_untested_is_a_warning(change, needle):
    errors, warnings = sc.site_problems(dataclasses.replace(GOOD, **change))
    assert not errors and len(warnings) == 1 and needle in warnings[0]
    gpu = dataclasses.replace(GOOD, tf_cuda=True, nccl_built=21605)
    assert sc.site_problems(gpu) == ([], [])
    unknown = dataclasses.replace(GOOD, horovod_libmpi=None)
    assert sc.site_problems(unknown) == ([], [])  # ldd missing: not judged


@pytest.mark.parametrize(
    ("text", "parts"),
    [("2.15.1", (2, 15, 1)), ("2.15.0rc1", (2, 15, 0)), ("2.15.0+nv24.01", (2, 15, 0)), ("", ())],
)
def test_version_tuple(text, parts):
    assert sc.version_tuple(text) == parts


def test_is_site_stack_reads_the_venvs_mark(tmp_path):
    assert not sc.is_site_stack(str(tmp_path))
    (tmp_path / sc.STACK_FILE).write_text("site\n")
    assert sc.is_site_stack(str(tmp_path))


def test_base_in_without_what_the_site_provides():
    lines = (ROOT / "requirements/base.in").read_text().splitlines()
    kept = {ss.requirement_name(line) for line in ss.site_requirements(lines)}
    assert not kept & ss.NEVER
    assert {"ipyparallel", "plotly", "psutil"} <= kept
    assert ss.requirement_name("Tensorflow_CPU==2.15.1  # x") == "tensorflow-cpu"
    assert ss.requirement_name("# comment") == ss.requirement_name("-r other.in") == ""


def test_constraints_pin_the_site_and_take_the_lock_for_the_rest():
    site = {"numpy": "1.26.2", "Jupyter_Core": "5.0.0", "pip": "23.0", "setuptools": "59.0"}
    lock = ["# header", "numpy==1.26.4", "jupyter-core==5.7.2", "plotly==6.3.0"]
    out = ss.site_constraints(site, lock)
    assert out == ["jupyter-core==5.0.0", "numpy==1.26.2", "plotly==6.3.0"]
    assert ss.missing_parts({"tensorflow", "mpi4py"}) == ["Horovod"]
    assert ss.missing_parts({"tensorflow-cpu", "horovod", "mpi4py"}) == []
