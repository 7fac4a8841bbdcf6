"""bfloat16 below AVX-512 (hpclab.rank.bfloat16): the sentence a rank raises, and that it reaches
the client as a failed run, not a crashed engine.

The unit tests feed the parsers and the sentence made-up /proc/cpuinfo text and TensorFlow errors
(the error text is the one TensorFlow 2.15 raises under ONEDNN_MAX_CPU_ISA=AVX2). The engine
test starts one MPI engine with ``ONEDNN_MAX_CPU_ISA=AVX2`` and ``TF_ENABLE_ONEDNN_OPTS=1`` in
its environment, runs ``precision="mixed_bfloat16"`` there, and asserts the outcome the lab's
own probe predicts under that environment (the sentence, or a run that trains).
"""

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
def test_below_avx512_the_client_gets_the_sentence_or_the_run_trains(tmp_path, monkeypatch):
    """One engine whose oneDNN is capped at AVX2, with TensorFlow's oneDNN ops switched on.

    Whether bfloat16 reaches oneDNN at all is TensorFlow's choice, made from the CPU's own
    flags, not from the cap: on a CPU without AVX-512 its graph pass says "oneDNN BFloat16
    support are only on platforms with AVX512. Falling back to default implementation" and
    Eigen runs bfloat16 (measured on an AVX2-only AMD EPYC: the run trains); on an AVX-512 CPU
    bfloat16 goes to oneDNN, which the AVX2 cap leaves without a bfloat16 kernel (the run
    fails at set-up). ``TF_ENABLE_ONEDNN_OPTS=1`` keeps CPUs whose default is oneDNN off (no
    AVX-512 VNNI) on the failing side. The lab must agree with its own probe
    (:func:`bfloat16.probe`, the child ``hpclab doctor`` runs, under the same environment):
    where it fails, the run fails with the sentence; where it runs, the run trains its steps
    (four steps leave the loss at chance, so the verdict may read ``collapsed``; that is a
    result, not a failure). Not `own_lab`: nothing here is timed, and stopping the shared Lab
    would cost the next test its restart (~9 s)."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # the engine inherits the client's env
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    predicted = bfloat16.probe()
    assert predicted["ok"] is not None, f"the bfloat16 probe gave no answer: {predicted['error']}"
    with Lab(workers=1, runs_dir=tmp_path, verbose=False) as lab:
        run = lab.run(RunConfig(precision="mixed_bfloat16", num_samples=2000, max_steps=4))
        if predicted["ok"]:
            run.wait(timeout=120)
        else:
            with pytest.raises(RunFailed) as info:
                run.wait(timeout=120)
        assert lab.healthy  # a sentence, not a crashed engine
    if predicted["ok"]:
        assert run.status in ("finished", "collapsed"), run.status
        return
    message = str(info.value)
    assert run.status == "failed"
    for part in ("rank 0", "ONEDNN_MAX_CPU_ISA=AVX2", "precision='float32'", "TF_ENABLE_ONEDNN"):
        assert part in message, message
    if bfloat16.cpu_model():
        assert bfloat16.cpu_model() in message


def test_the_doctor_row_says_runs_no_or_unknown():
    found = {"cpu": "Intel(R) Core(TM) i5-8250U", "cpu_isa": "AVX2", "error": "could not create"}
    assert bfloat16.describe({"ok": True, "onednn": True, "isa": "Intel AVX-512"}).startswith(
        "runs through oneDNN on Intel AVX-512"
    )
    assert "Eigen" in bfloat16.describe({"ok": True, "onednn": False, "isa": ""})
    assert bfloat16.describe({**found, "ok": False}).startswith("no: precision='mixed_bfloat16'")
    timed_out = {**found, "ok": None, "error": "the probe took over 300 s"}
    assert bfloat16.describe(timed_out) == "unknown: the probe took over 300 s"
