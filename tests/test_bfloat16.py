"""bfloat16 below AVX-512 (hpclab.rank.bfloat16): the sentence a rank raises, and that it reaches
the client as a failed run, not a crashed engine.

The unit tests feed the parsers and the sentence made-up /proc/cpuinfo text and TensorFlow errors
(the error text is the one TensorFlow 2.15 raises under ONEDNN_MAX_CPU_ISA=AVX2). The last test
starts one MPI engine with ``ONEDNN_MAX_CPU_ISA=AVX2`` in its environment, so oneDNN on this
machine behaves as on an AVX2 laptop, and runs ``precision="mixed_bfloat16"`` there.
"""

import os

import pytest

from hpclab import Lab, RunConfig, RunFailed
from hpclab.rank import bfloat16

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz
flags\t\t: fpu sse4_2 avx avx2 fma
"""
TF_ERROR = (
    "{{function_node __wrapped____MklNativeConv2D_device_/job:localhost/replica:0/task:0/device:"
    "CPU:0}} Operation received an exception:Status: 3, message: could not create a primitive "
    "descriptor for a convolution forward propagation primitive, in file tensorflow/core/kernels/"
    "mkl/mkl_conv_ops.cc:1093 [Op:Conv2D] name:"
)


def test_cpu_model_and_isa_come_from_cpuinfo():
    assert bfloat16.cpu_model(CPUINFO) == "Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz"
    assert bfloat16.cpu_isa(CPUINFO) == "AVX2"
    avx512 = CPUINFO.replace("avx2 fma", "avx2 avx512f avx512bw avx512vl avx512dq")
    assert bfloat16.cpu_isa(avx512) == "AVX-512"
    assert bfloat16.cpu_isa(avx512.replace("fpu", "fpu avx512_bf16")) == "AVX-512 with bfloat16"
    assert bfloat16.cpu_model("") == "" and bfloat16.cpu_isa("") == ""


def test_onednn_reason_keeps_onednns_words():
    reason = bfloat16.onednn_reason(TF_ERROR)
    assert reason.startswith("could not create a primitive descriptor for a convolution")
    assert "mkl_conv_ops" not in reason and "function_node" not in reason
    verbose = "onednn_verbose,info,cpu,runtime:threadpool\nonednn_verbose,info,cpu,isa:Intel AVX2\n"
    assert bfloat16.onednn_isa(verbose) == "Intel AVX2"


@pytest.mark.parametrize("cap", [None, "AVX2"])
def test_the_sentence_names_rank_cpu_cap_and_both_ways_out(cap):
    found = {"cpu": "Intel(R) Core(TM) i5-8250U", "cpu_isa": "AVX2", "error": "could not create"}
    env = {"ONEDNN_MAX_CPU_ISA": cap} if cap else {}
    text = bfloat16.sentence(3, "node7", found, env)
    for part in ("rank 3 on node7", found["cpu"], "AVX-512", "could not create"):
        assert part in text
    assert "precision='float32'" in text and "TF_ENABLE_ONEDNN_OPTS=0" in text
    assert ("ONEDNN_MAX_CPU_ISA" in text) == bool(cap) and (cap or "") in text
    assert text.count(". ") == 0 and text.endswith(".")  # one sentence


@pytest.mark.mpi
@pytest.mark.slow
def test_below_avx512_the_client_gets_the_sentence(tmp_path, monkeypatch):
    """One engine whose oneDNN is capped at AVX2: the run fails at set-up with the sentence.
    Not `own_lab`: nothing here is timed, and stopping the shared Lab would cost the next test
    its restart (~9 s)."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # the engine inherits the client's env
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    with Lab(workers=1, runs_dir=tmp_path, verbose=False) as lab:
        run = lab.run(RunConfig(precision="mixed_bfloat16", num_samples=2000, max_steps=4))
        with pytest.raises(RunFailed) as info:
            run.wait(timeout=120)
        assert lab.healthy  # a sentence, not a crashed engine
    message = str(info.value)
    assert run.status == "failed"
    for part in ("rank 0", "ONEDNN_MAX_CPU_ISA=AVX2", "precision='float32'", "TF_ENABLE_ONEDNN"):
        assert part in message, message
    if bfloat16.cpu_model():
        assert bfloat16.cpu_model() in message
    assert os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"


def test_the_doctor_row_says_runs_no_or_unknown():
    found = {"cpu": "Intel(R) Core(TM) i5-8250U", "cpu_isa": "AVX2", "error": "could not create"}
    assert bfloat16.describe({"ok": True, "onednn": True, "isa": "Intel AVX-512"}).startswith(
        "runs through oneDNN on Intel AVX-512"
    )
    assert "Eigen" in bfloat16.describe({"ok": True, "onednn": False, "isa": ""})
    assert bfloat16.describe({**found, "ok": False}).startswith("no: precision='mixed_bfloat16'")
    timed_out = {**found, "ok": None, "error": "the probe took over 300 s"}
    assert bfloat16.describe(timed_out) == "unknown: the probe took over 300 s"
