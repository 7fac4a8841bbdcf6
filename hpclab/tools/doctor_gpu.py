"""The doctor's look at a GPU node: what ``nvidia-smi`` and ``nvcc`` say, as sentences.

``hpclab doctor`` calls :func:`gpu_node_rows` in its devices stage. On a node without
``nvidia-smi`` it returns nothing. Otherwise it runs ``nvidia-smi`` (its header, ``-L``, and
``--query-gpu=`` :data:`hpclab.core.gpu_node.SMI_QUERY`) and ``nvcc --version`` when on PATH,
and hands their text to :func:`hpclab.core.gpu_node.node_findings`: each finding is one row;
an ``error`` is an error only where TensorFlow was built with CUDA (a CPU stack on a GPU node is
not stopped by the GPU's driver), so the doctor ends with that sentence instead of a stack
trace later in a run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

from hpclab.core.gpu_node import SMI_QUERY, Finding, node_findings

#: The commands whose output the findings read, by node_findings' argument name.
COMMANDS = {
    "smi_banner": ["nvidia-smi"],
    "smi_list": ["nvidia-smi", "-L"],
    "smi_query": ["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
    "nvcc": ["nvcc", "--version"],
}


def run_tool(argv: Sequence[str]) -> str:
    """A tool's stdout ("" when it is missing, fails or hangs for 20 s)."""
    if not shutil.which(argv[0]):
        return ""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout if out.returncode == 0 else ""


def gpu_node_findings(
    run: Callable[[Sequence[str]], str] = run_tool,
    environ: Mapping[str, str] = os.environ,
    ranks: int = 2,
) -> list[Finding]:
    """The node's findings ([] where ``nvidia-smi`` prints nothing: no NVIDIA driver here)."""
    texts = {key: run(argv) for key, argv in COMMANDS.items()}
    if not texts["smi_list"].strip():
        return []
    return node_findings(environ=environ, ranks=ranks, **texts)


#: The doctor's row label of each check (its column is 13 characters wide).
LABELS = {
    "cuda_driver": "CUDA driver",
    "cuda_toolkit": "CUDA nvcc",
    "compute_capability": "GPU arch",
    "mig": "MIG",
    "nccl": "NCCL",
}


def gpu_node_rows(
    tf_cuda: bool, run: Callable[[Sequence[str]], str] = run_tool, ranks: int = 2
) -> tuple[list[tuple[str, str]], list[str]]:
    """(rows to print, error sentences) for the doctor; errors only where `tf_cuda`."""
    rows, errors = [], []
    for f in gpu_node_findings(run, ranks=ranks):
        text = f.sentence if f.status == "ok" else f"{f.status}: {f.sentence}"
        rows.append((LABELS.get(f.check, f.check), text))
        if f.status == "error" and tf_cuda:
            errors.append(f.sentence[0].upper() + f.sentence[1:])
    return rows, errors


__all__ = ["COMMANDS", "LABELS", "gpu_node_findings", "gpu_node_rows", "run_tool"]
