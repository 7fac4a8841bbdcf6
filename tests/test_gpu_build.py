"""The GPU build's decisions, without a GPU (scripts/gpu_toolkit.py, scripts/horovod_cache.py).

Pure: fake nvcc outputs, nccl.h texts and folders; milliseconds. The build itself is
`make gpu-build` (never in `make test`; docs/cluster.md records what it gave).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # install-time tooling lives beside setup.sh

import gpu_toolkit as gt  # noqa: E402
import horovod_cache as _build  # noqa: E402
from test_build_cache import make_env  # noqa: E402

NVCC_13 = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
NVCC_12 = (
    "Cuda compilation tools, release 12.2, V12.2.140\nBuild cuda_12.2.r12.2/compiler.33191640_0\n"
)
NCCL_H = (
    '#define NCCL_MAJOR 2\n#define NCCL_MINOR 16\n#define NCCL_PATCH 5\n#define NCCL_SUFFIX ""\n'
)


def test_nvcc_version_is_read_from_its_release_line():
    assert gt.parse_nvcc_version(NVCC_13) == "13.0"
    assert gt.parse_nvcc_version(NVCC_12) == "12.2"
    with pytest.raises(gt.GpuBuildError, match="release X.Y"):
        gt.parse_nvcc_version("clang version 16")


@pytest.mark.parametrize("cuda", ["12.2", "12.4", "12.9"])
def test_cuda_12_from_12_2_on_fits_tensorflow_2_15(cuda):
    assert gt.cuda_mismatch("2.15.1", cuda) is None


@pytest.mark.parametrize("cuda", ["13.0", "11.8", "12.1"])
def test_other_cuda_is_refused_naming_found_and_needed(cuda):
    why = gt.cuda_mismatch("2.15.1", cuda)
    assert f"CUDA {cuda}" in why and "12.2" in why and "TensorFlow 2.15.1" in why


def test_the_machines_cuda_13_is_refused_with_one_sentence():
    found = [gt.CudaCandidate("PATH", "/usr/local/bin/nvcc", gt.parse_nvcc_version(NVCC_13))]
    with pytest.raises(gt.GpuBuildError) as err:
        gt.choose_cuda("2.15.1", found)
    text = str(err.value)
    assert "CUDA 13.0 (/usr/local/bin/nvcc, from PATH)" in text
    assert "needs CUDA 12.2+" in text and "HPCLAB_CUDA_HOME" in text
    assert not re.search(r"\. [A-Z]", text) and text.endswith(".")  # one sentence


def test_the_first_fitting_cuda_is_chosen_in_search_order():
    found = [
        gt.CudaCandidate("PATH", "/usr/local/bin/nvcc", "13.0"),
        gt.CudaCandidate("/usr/local/cuda-12.2", "/usr/local/cuda-12.2/bin/nvcc", "12.2"),
    ]
    assert gt.choose_cuda("2.15.1", found).version == "12.2"
    with pytest.raises(gt.GpuBuildError, match="no nvcc at all"):
        gt.choose_cuda("2.15.1", [])


def test_candidates_come_in_order_without_duplicates():
    env = {"HPCLAB_CUDA_HOME": "/opt/cuda12", "CUDA_HOME": "/opt/cuda12"}
    found = gt.cuda_candidates_from(env, "/usr/bin/nvcc", ["/usr/local/cuda-12.4"])
    assert [s for s, _ in found] == ["HPCLAB_CUDA_HOME", "PATH", "/usr/local/cuda-12.4"]


@pytest.mark.parametrize(
    ("text", "ccs"),
    [("80", (80,)), ("90,70,80", (70, 80, 90)), ("sm_80, 8.6", (80, 86)), ("70 70", (70,))],
)
def test_compute_capabilities_are_parsed_sorted_unique(text, ccs):
    assert gt.parse_cc_list(text) == ccs


@pytest.mark.parametrize("text", ["81", "sm_x", "", "100"])
def test_unknown_compute_capabilities_are_refused_by_name(text):
    with pytest.raises(gt.GpuBuildError, match="HOROVOD_BUILD_CUDA_CC_LIST"):
        gt.parse_cc_list(text)


def test_cuda_home_of_a_wrapper_script(tmp_path):
    wrapper = tmp_path / "nvcc"
    wrapper.write_text('#!/bin/sh\nexec /usr/local/cuda-13.0/bin/nvcc "$@"\n')
    assert gt.cuda_home_of(str(wrapper)) == "/usr/local/cuda-13.0"
    real = tmp_path / "cuda-12.2/bin/nvcc"
    real.parent.mkdir(parents=True)
    real.write_bytes(b"\x7fELF")
    assert gt.cuda_home_of(str(real)) == str(tmp_path / "cuda-12.2")


# -- the wheel-cache key ------------------------------------------------------------------------


def gpu_env(**changes):
    base = {"gpu_operations": "NCCL", "cuda": "12.2", "nccl": "2.16.5", "cuda_cc": "70,80,90"}
    return make_env(**{**base, **changes})


def test_gpu_key_names_nccl_cuda_and_compute_capabilities():
    key = _build.wheel_cache_key(gpu_env())
    assert key.endswith("-nccl2.16.5-cuda12.2-sm70.80.90-cp311")
    assert gt.gpu_key_part("12.2", "2.16.5", (90, 70, 80)) in key


@pytest.mark.parametrize(
    "changes", [{"cuda": "12.4"}, {"nccl": "2.18.1"}, {"cuda_cc": "80"}, {"gpu_operations": ""}]
)
def test_each_gpu_input_changes_the_key_and_blocks_reuse(changes):
    built, now = gpu_env(), gpu_env(**changes)
    assert _build.wheel_cache_key(built) != _build.wheel_cache_key(now)
    ok, why = _build.wheel_matches(_build.make_meta(built, "h.whl", 1.0), now)
    assert not ok and "differs" in why


def test_gpu_toolkit_facts_come_from_the_plan_environment():
    env = {
        "HPCLAB_GPU_OPS": "NCCL",
        "HPCLAB_CUDA_VERSION": "12.2",
        "HPCLAB_NCCL_VERSION": "2.16.5",
        "HOROVOD_BUILD_CUDA_CC_LIST": "80,90",
    }
    assert _build.gpu_toolkit(env) == {"cuda": "12.2", "nccl": "2.16.5", "cuda_cc": "80,90"}
    assert _build.gpu_toolkit({"HPCLAB_CUDA_VERSION": "12.2"}) == {}  # a CPU build has none


def test_old_gpu_metadata_without_toolkit_fields_is_not_reused_for_a_toolkit_build():
    old = _build.make_meta(make_env(gpu_operations="NCCL"), "h.whl", 1.0)
    for field in ("cuda", "nccl", "cuda_cc"):
        old["env"].pop(field)
    ok, why = _build.wheel_matches(old, gpu_env())
    assert not ok and "CUDA version" in why
    assert _build.wheel_matches(old, dataclasses.replace(gpu_env(), cuda="", nccl="", cuda_cc=""))[
        0
    ]


def test_setup_on_aarch64_says_what_to_do_before_installing_anything(tmp_path):
    import subprocess

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uname").write_text('#!/bin/sh\n[ "$1" = -m ] && echo aarch64 || /bin/uname "$@"\n')
    (fake / "uname").chmod(0o755)
    env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HPCLAB_VENV": str(tmp_path / "v"),
    }
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/setup.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "this machine is aarch64" in out.stderr and "x86_64 node" in out.stderr
    assert not (tmp_path / "v").exists()
