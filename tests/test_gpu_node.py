"""Sentences from a GPU node's recorded tool outputs (hpclab/core/gpu_node.py).

The outputs under tests/fixtures/gpu/ are in the format ``nvidia-smi`` (R470, R525, R535,
R580 headers), ``nvidia-smi -L`` (with MIG devices), ``nvidia-smi --query-gpu=...
--format=csv,noheader,nounits``, ``nvcc --version`` and ``NCCL_DEBUG=INFO`` print; each test
asserts the sentence a person gets. Pure: milliseconds, no GPU.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpclab.core import gpu_node as gn

FIX = Path(__file__).resolve().parent / "fixtures" / "gpu"


def fixture(name: str) -> str:
    return (FIX / name).read_text(encoding="utf-8")


def one_sentence(text: str) -> bool:
    """One sentence: ends with a full stop, no '. X' sentence break inside."""
    return text.endswith(".") and not re.search(r"\.\s+[A-Z]", text)


# -- parsing -----------------------------------------------------------------------------------


def test_smi_list_reads_gpus_and_their_mig_devices():
    gpus = gn.parse_smi_list(fixture("smi-L-a100-mig.txt"))
    assert [g["index"] for g in gpus] == ["0", "1"]
    assert gpus[0]["name"] == "NVIDIA A100-SXM4-40GB"
    assert [m["uuid"][:12] for m in gpus[0]["mig"]] == ["MIG-c6d4f1ef", "MIG-cba663e8"]
    assert gpus[0]["mig"][0]["profile"] == "3g.20gb" and gpus[1]["mig"] == []


def test_smi_query_and_banner_and_nvcc():
    (row,) = gn.parse_smi_query(fixture("smi-query-b200.csv"))
    assert row["compute_cap"] == "10.0" and row["memory_mib"] == 183359
    assert gn.parse_smi_banner(fixture("smi-banner-535.txt")) == ("535.104.05", "12.2")
    assert gn.parse_smi_banner(fixture("smi-banner-470.txt")) == ("470.199.02", "11.4")
    assert gn.parse_smi_banner("no driver") == ("", "")
    assert gn.parse_nvcc(fixture("nvcc-13.0.txt")) == "13.0"
    assert gn.parse_nvcc("clang version 16") == ""


def test_nccl_log_names_version_network_and_plugin():
    ofi = gn.parse_nccl_log(fixture("nccl-debug-ofi.txt"))
    assert ofi == {
        "version": "2.16.5",
        "cuda": "12.2",
        "network": "AWS Libfabric",
        "plugin": "AWS Libfabric (v7)",
    }
    sock = gn.parse_nccl_log(fixture("nccl-debug-socket.txt"))
    assert sock["network"] == "Socket" and sock["plugin"] == ""


# -- compute capability ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "gpu", "cc"),
    [
        ("smi-query-b200.csv", "NVIDIA B200", "10.0"),
        ("smi-query-rtx5090.csv", "NVIDIA GeForce RTX 5090", "12.0"),
    ],
)
def test_blackwell_gets_what_it_means_and_what_to_do(name, gpu, cc):
    (row,) = gn.parse_smi_query(fixture(name))
    f = gn.compute_capability_finding(row)
    assert f.status == "error" and one_sentence(f.sentence)
    assert f.sentence.startswith(f"GPU 0 ({gpu}) has compute capability {cc} (Blackwell)")
    assert "TensorFlow 2.15.1 was not built for" in f.sentence
    assert "machine code up to 8.0 and PTX for 9.0" in f.sentence  # what it means
    assert "CUDA knows from 12.8 on" in f.sentence
    assert "run the TensorFlow backend on an Ampere, Ada or Hopper node" in f.sentence  # what to do


def test_hopper_runs_from_ptx_with_a_cache_to_keep():
    (row,) = gn.parse_smi_query(fixture("smi-query-h100.csv"))
    f = gn.compute_capability_finding(row)
    assert f.status == "note" and one_sentence(f.sentence)
    assert "compute capability 9.0 (Hopper)" in f.sentence
    assert "PTX but no machine code" in f.sentence and "CUDA_CACHE_PATH" in f.sentence


@pytest.mark.parametrize("name", ["smi-query-a100x2.csv", "smi-query-l40s.csv"])
def test_ampere_and_ada_run_tensorflow_215s_machine_code(name):
    row = gn.parse_smi_query(fixture(name))[0]
    f = gn.compute_capability_finding(row)
    assert f.status == "ok" and "carries machine code" in f.sentence


def test_too_old_and_unknown_compute_capabilities():
    old = gn.compute_capability_finding({"index": "0", "name": "Tesla K80", "compute_cap": "3.7"})
    assert (
        old.status == "error" and "older than any TensorFlow 2.15.1 was built for" in old.sentence
    )
    none = gn.compute_capability_finding({"index": "0", "name": "X", "compute_cap": "[N/A]"})
    assert none.status == "note" and "unchecked" in none.sentence


# -- MIG ---------------------------------------------------------------------------------------


def test_a_mig_slice_is_named_with_why_nccl_cannot_use_it():
    gpus = gn.parse_smi_list(fixture("smi-L-a100-mig.txt"))
    visible = ["MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"]
    f = gn.mig_finding(gpus, visible, ranks=2)
    assert f.status == "error" and one_sentence(f.sentence)
    assert f.sentence.startswith(
        "GPU 0 (NVIDIA A100-SXM4-40GB) is split into 2 MIG instance(s) (3g.20gb, 3g.20gb), "
        "and CUDA_VISIBLE_DEVICES names MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
    )
    assert "NCCL 2.16.5 (TensorFlow 2.15's) cannot run a collective across MIG" in f.sentence
    assert "ask for whole GPUs" in f.sentence and "Lab(workers=1)" in f.sentence


def test_mig_from_the_visible_devices_alone_and_one_rank_is_a_note():
    f = gn.mig_finding([], ["MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"], ranks=1)
    assert f.status == "note" and "one rank on one MIG instance trains" in f.sentence
    assert gn.mig_finding(gn.parse_smi_list(fixture("smi-L-h100.txt")), ["0"]) is None


# -- CUDA driver and toolkit -------------------------------------------------------------------


def test_a_cuda_11_driver_cannot_run_tensorflow_215():
    f = gn.driver_finding(*gn.parse_smi_banner(fixture("smi-banner-470.txt")))
    assert f.status == "error" and one_sentence(f.sentence)
    assert f.sentence.startswith("the driver (470.199.02) supports CUDA up to 11.4")
    assert "R525 (>= 525.60.13)" in f.sentence and "cuda-compat" in f.sentence


def test_a_cuda_12_0_driver_runs_by_minor_version_compatibility_but_not_ptx():
    f = gn.driver_finding(*gn.parse_smi_banner(fixture("smi-banner-525.txt")))
    assert f.status == "note" and "minor version compatibility" in f.sentence
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in f.sentence and "535.54.03" in f.sentence


@pytest.mark.parametrize("name", ["smi-banner-535.txt", "smi-banner-580.txt"])
def test_a_12_2_or_newer_driver_is_enough(name):
    f = gn.driver_finding(*gn.parse_smi_banner(fixture(name)))
    assert f.status == "ok" and "enough for TensorFlow 2.15.1's CUDA 12.2" in f.sentence


def test_a_cuda_13_toolkit_is_refused_with_what_to_load():
    f = gn.toolkit_finding(gn.parse_nvcc(fixture("nvcc-13.0.txt")), "13.0")
    assert f.status == "error" and one_sentence(f.sentence)
    assert f.sentence.startswith("nvcc is CUDA 13.0, but Horovod's GPU ops must be compiled")
    assert "module load cuda/12.x" in f.sentence and "ptxas only" in f.sentence


def test_a_toolkit_newer_than_the_driver_and_a_fitting_one():
    newer = gn.toolkit_finding(gn.parse_nvcc(fixture("nvcc-12.4.txt")), "12.2")
    assert newer.status == "note" and "newer than the driver's CUDA 12.2" in newer.sentence
    fits = gn.toolkit_finding(gn.parse_nvcc(fixture("nvcc-12.2.txt")), "12.2")
    assert fits.status == "ok"
    assert gn.toolkit_finding("", "12.2").status == "note"


# -- NCCL and the whole node -------------------------------------------------------------------


def test_nccl_log_sentence_names_the_plugin_it_loaded():
    f = gn.nccl_log_finding(gn.parse_nccl_log(fixture("nccl-debug-ofi.txt")))
    assert f.sentence == (
        "NCCL 2.16.5 (built for CUDA 12.2) loaded the network plugin 'AWS Libfabric (v7)' "
        "and used the network 'AWS Libfabric'."
    )
    sock = gn.nccl_log_finding(gn.parse_nccl_log(fixture("nccl-debug-socket.txt")))
    assert "loaded no network plugin" in sock.sentence
    assert gn.nccl_log_finding(gn.parse_nccl_log("")) is None


def test_node_findings_of_a_mig_node_with_an_old_driver():
    found = gn.node_findings(
        smi_list=fixture("smi-L-a100-mig.txt"),
        smi_query=fixture("smi-query-a100x2.csv"),
        smi_banner=fixture("smi-banner-525.txt"),
        nvcc=fixture("nvcc-12.2.txt"),
        environ={"CUDA_VISIBLE_DEVICES": "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"},
    )
    checks = [(f.check, f.status) for f in found]
    assert checks == [
        ("cuda_driver", "note"),
        ("cuda_toolkit", "note"),  # CUDA 12.2's nvcc beside a 12.0 driver
        ("compute_capability", "ok"),  # two A100s of one model: one finding
        ("mig", "error"),
    ]
    assert all(one_sentence(f.sentence) for f in found)
    assert found[0].to_dict()["figures"] == {"driver_version": "525.85.12", "driver_cuda": "12.0"}


# -- the doctor's rows (hpclab/tools/doctor_gpu.py) --------------------------------------------


def fake_tools(**files):
    """A runner answering the doctor's commands from fixture files (missing: no output)."""
    from hpclab.tools import doctor_gpu

    by_argv = {tuple(argv): files.get(key, "") for key, argv in doctor_gpu.COMMANDS.items()}
    return lambda argv: fixture(by_argv[tuple(argv)]) if by_argv[tuple(argv)] else ""


def test_doctor_stops_a_cuda_stack_on_blackwell_with_the_sentence():
    from hpclab.tools import doctor_gpu

    run = fake_tools(
        smi_banner="smi-banner-580.txt",
        smi_list="smi-L-h100.txt",
        smi_query="smi-query-b200.csv",
    )
    rows, errors = doctor_gpu.gpu_node_rows(tf_cuda=True, run=run)
    assert [label for label, _ in rows] == ["CUDA driver", "CUDA nvcc", "GPU arch"]
    assert dict(rows)["CUDA nvcc"].startswith("note: no nvcc here")
    cc = dict(rows)["GPU arch"].removeprefix("error: ")
    assert errors == [cc[0].upper() + cc[1:]]  # the doctor's sentence starts with a capital
    assert errors[0].startswith("GPU 0 (NVIDIA B200) has compute capability 10.0 (Blackwell)")
    # a CPU stack on the same node: told, not stopped
    assert doctor_gpu.gpu_node_rows(tf_cuda=False, run=run)[1] == []


def test_doctor_says_nothing_without_a_driver():
    from hpclab.tools import doctor_gpu

    assert doctor_gpu.gpu_node_rows(tf_cuda=True, run=lambda argv: "") == ([], [])
    assert doctor_gpu.run_tool(["/nonexistent/nvidia-smi"]) == ""
