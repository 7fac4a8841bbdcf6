#!/usr/bin/env bash
# `make gpu-build`: the GPU stack in its own venv (.venv-gpu), built on any machine with a CUDA
# 12.x toolkit, with or without a GPU. Not part of `make test`.
#
#   1. scripts/setup.sh with HPCLAB_VENV=.venv-gpu HPCLAB_GPU=nccl: tensorflow[and-cuda]==2.15.1
#      (CUDA 12.2 / cuDNN 8.9 / NCCL wheels from PyPI), then Horovod 0.28.1 compiled with
#      HOROVOD_GPU_OPERATIONS=NCCL against the CUDA toolkit and NCCL that scripts/gpu_toolkit.py
#      finds (a CUDA that does not fit TensorFlow 2.15 is refused with one sentence).
#   2. the check: horovod.tensorflow's mpi/gloo/nccl/cuda_built(), which libnccl its ops load,
#      written with the wheel's name and build time to $VENV/hpclab-gpu/gpu-build.json.
#
# Environment: HPCLAB_GPU_VENV (default .venv-gpu), HPCLAB_CUDA_HOME (a CUDA 12.x toolkit),
# HOROVOD_BUILD_CUDA_CC_LIST (default 70,75,80,86,89,90), and everything scripts/setup.sh reads.
# HPCLAB_CUDA_MISMATCH=compile-check builds with a CUDA that does not fit (to exercise the
# recipe only; the wheel is keyed by that CUDA and is not usable with TensorFlow 2.15).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export HPCLAB_VENV="${HPCLAB_GPU_VENV:-.venv-gpu}" HPCLAB_GPU=nccl
VENV="$HPCLAB_VENV"
[[ "$VENV" == /* ]] || VENV="$PWD/$VENV"
start=$SECONDS
scripts/setup.sh
mkdir -p "$VENV/hpclab-gpu"
TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" - "$VENV" "$((SECONDS - start))" <<'PY'
"""What the GPU build gave: Horovod's build flags and the NCCL library its ops load."""
import glob, json, os, subprocess, sys

venv, seconds = sys.argv[1], int(sys.argv[2])
import horovod.tensorflow as hvd

mpi_lib = glob.glob(os.path.join(os.path.dirname(hvd.__file__), "mpi_lib*.so"))[0]
ldd = subprocess.run(["ldd", mpi_lib], capture_output=True, text=True).stdout
marker = json.load(open(os.path.join(venv, "hpclab-horovod.json")))
seen = {
    "wheel": marker.get("wheel"),
    "build_seconds": marker.get("build_seconds"),
    "env": marker.get("env"),
    "gpu_build_script_seconds": seconds,
    "mpi_built": hvd.mpi_built(),
    "gloo_built": hvd.gloo_built(),
    "nccl_built": bool(hvd.nccl_built()),
    "nccl_built_version_code": int(hvd.nccl_built()),
    "cuda_built": hvd.cuda_built(),
    "libnccl": [line.strip() for line in ldd.splitlines() if "nccl" in line],
    "libcudart": [line.strip() for line in ldd.splitlines() if "cudart" in line],
}
with open(os.path.join(venv, "hpclab-gpu", "gpu-build.json"), "w") as f:
    json.dump(seen, f, indent=2)
print(json.dumps(seen, indent=2))
if not (seen["nccl_built"] and seen["cuda_built"]):
    sys.exit("gpu-build: Horovod was built without NCCL or CUDA; see the build log in .cache/logs/.")
PY
