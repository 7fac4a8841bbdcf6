"""The CUDA toolkit, NCCL and compute capabilities a GPU Horovod build uses (``make gpu-build``).

`scripts/gpu_build.sh` asks this module, before it compiles anything, which CUDA compiler to
use, where NCCL's header and library are, and which GPU architectures to compile for; it prints
the answer as ``export`` lines, or one sentence and exit status 2 when the build cannot be right.

Facts it relies on (sources):

- TensorFlow 2.15 was built and tested with CUDA 12.2 and cuDNN 8.9
  (https://www.tensorflow.org/install/source#gpu); ``tensorflow[and-cuda]==2.15.1`` installs the
  ``nvidia-*-cu12`` 12.2 wheels. Code compiled by another CUDA major version (13.x) must not be
  linked into the same process, so a CUDA that is not 12.x with x >= 2 is refused.
- The PyPI ``nvidia-cuda-nvcc-cu12`` wheels (12.2.140 to 12.9.86, checked) ship only ``ptxas``,
  not the ``nvcc`` driver, so the CUDA compiler must come from a toolkit (``module load cuda``,
  ``/usr/local/cuda-12.x``, or ``$HPCLAB_CUDA_HOME``).
- NCCL: a site's (``$HPCLAB_NCCL_HOME``, ``$NCCL_HOME``, ...) or the PyPI ``nvidia-nccl-cu12``
  wheel's, found by ``scripts/site_nccl.py`` (which also names a NCCL network plugin on the
  library path).
- CUDA 12.8's nvcc is the first to know Blackwell (``sm_100``, ``sm_101``, ``sm_120``), 12.9's
  adds ``sm_103`` and ``sm_121`` (CUDA 12.8/12.9 release notes); TensorFlow 2.15.1 itself has no
  Blackwell code (``hpclab/core/gpu_node.py``).
- Horovod compiles its CUDA kernels for ``HOROVOD_BUILD_CUDA_CC_LIST`` (comma-separated, e.g.
  ``70,80,90``; ``cmake/build_utils.py:get_nvcc_flags``), else for every architecture nvcc knows.

Pure functions are unit-tested in ``tests/test_gpu_build.py``. Command line::

    python scripts/gpu_toolkit.py plan --site-packages SP --dest DIR [--tensorflow 2.15.1]
    python scripts/gpu_toolkit.py key-part --cuda 12.2 --nccl 2.16.5 --cc 70,80,90
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from site_nccl import NcclError, find_nccl, parse_nccl_header, plugin_sentence  # noqa: F401

#: TensorFlow minor version -> (CUDA major, lowest CUDA minor, what TF was built with).
TF_CUDA = {"2.15": (12, 2, "CUDA 12.2 with cuDNN 8.9")}
#: Compute capabilities compiled by default: Volta (V100) to Hopper (H100/GH200).
DEFAULT_CC = (70, 75, 80, 86, 89, 90)
#: Architectures CUDA 12.2's nvcc accepts (``nvcc --list-gpu-arch``, without the ``a`` variants).
KNOWN_CC = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90)
#: Architectures later CUDA 12 compilers add: (CUDA minor, its new compute capabilities).
LATER_CC = ((8, (100, 101, 120)), (9, (103, 121)))


class GpuBuildError(RuntimeError):
    """The GPU build cannot be right; the message is one sentence saying what to do."""


@dataclass(frozen=True)
class CudaCandidate:
    """One CUDA compiler found, with where it was found (for the refusal sentence)."""

    source: str  # "HPCLAB_CUDA_HOME", "CUDA_HOME", "PATH", "/usr/local/cuda-12.2", ...
    nvcc: str
    version: str  # "12.2", or "" when `nvcc --version` printed no release


def parse_nvcc_version(text: str) -> str:
    """``12.2`` from ``nvcc --version`` output (``Cuda compilation tools, release 12.2, V12.2.140``)."""
    match = re.search(r"release (\d+)\.(\d+)", text)
    if not match:
        raise GpuBuildError("`nvcc --version` printed no 'release X.Y' line; is it NVIDIA's nvcc?")
    return f"{match.group(1)}.{match.group(2)}"


def tf_minor(tensorflow: str) -> str:
    """``2.15`` from ``2.15.1``."""
    return ".".join(tensorflow.split(".")[:2])


def cuda_mismatch(tensorflow: str, cuda: str) -> str | None:
    """Why CUDA `cuda` cannot build Horovod for TensorFlow `tensorflow` (None when it can)."""
    need = TF_CUDA.get(tf_minor(tensorflow))
    if need is None:
        return f"no CUDA requirement is known for TensorFlow {tensorflow}; add it to TF_CUDA."
    major, minor = (int(x) for x in cuda.split(".")[:2])
    if major != need[0] or minor < need[1]:
        return (
            f"CUDA {cuda} does not match TensorFlow {tensorflow}, which needs CUDA "
            f"{need[0]}.{need[1]} or a later {need[0]}.x (it was built with {need[2]})."
        )
    return None


def choose_cuda(tensorflow: str, candidates: Sequence[CudaCandidate]) -> CudaCandidate:
    """The first candidate whose CUDA fits `tensorflow`, or one sentence naming all that were found."""
    for cand in candidates:
        if cand.version and cuda_mismatch(tensorflow, cand.version) is None:
            return cand
    need = TF_CUDA.get(tf_minor(tensorflow), (12, 2, "CUDA 12.2"))
    found = (
        "; ".join(f"CUDA {c.version or '?'} ({c.nvcc}, from {c.source})" for c in candidates)
        or "no nvcc at all"
    )
    raise GpuBuildError(
        f"found {found}, but TensorFlow {tensorflow} needs CUDA {need[0]}.{need[1]}+ "
        f"({need[2]}): load a CUDA {need[0]}.x toolkit (e.g. `module load cuda/{need[0]}.{need[1]}`) "
        f"or set HPCLAB_CUDA_HOME to one (PyPI's nvidia-cuda-nvcc-cu12 wheels ship ptxas only, no nvcc)."
    )


def known_cc(cuda: str = "12.2") -> tuple[int, ...]:
    """The compute capabilities CUDA `cuda`'s nvcc compiles for (12.2's, plus 12.8's Blackwell)."""
    minor = int(cuda.split(".")[1]) if cuda.startswith("12.") else 2
    return KNOWN_CC + tuple(cc for since, ccs in LATER_CC if minor >= since for cc in ccs)


def parse_cc_list(text: str, cuda: str = "12.2") -> tuple[int, ...]:
    """``(70, 80, 90)`` from ``"70,80,90"`` (also ``8.0`` or ``sm_80`` forms); sorted, unique;
    each must be one CUDA `cuda`'s nvcc knows."""
    ccs, allowed = set(), known_cc(cuda)
    for raw in re.split(r"[,\s;]+", text.strip()):
        if not raw:
            continue
        token = raw.lower().removeprefix("sm_").removeprefix("compute_").replace(".", "")
        if token.isdigit() and int(token) >= 100 and int(token) not in allowed:
            raise GpuBuildError(
                f"HOROVOD_BUILD_CUDA_CC_LIST has {raw!r}, a Blackwell GPU, which CUDA {cuda}'s nvcc "
                "does not know (CUDA 12.8 is the first that does) and TensorFlow 2.15.1 was not "
                "built for; leave it out (docs/cluster.md, GPU nodes)."
            )
        if not token.isdigit() or int(token) not in allowed:
            raise GpuBuildError(
                f"HOROVOD_BUILD_CUDA_CC_LIST has {raw!r}; allowed are compute capabilities such as "
                f"{','.join(map(str, allowed))} (comma-separated)."
            )
        ccs.add(int(token))
    if not ccs:
        raise GpuBuildError("HOROVOD_BUILD_CUDA_CC_LIST is empty; give e.g. 80 or 70,80,90.")
    return tuple(sorted(ccs))


def gpu_key_part(cuda: str, nccl: str, ccs: Sequence[int]) -> str:
    """The GPU part of the wheel-cache key: ``nccl2.16.5-cuda12.2-sm70.80.90``."""
    return f"nccl{nccl}-cuda{cuda}-sm{'.'.join(str(c) for c in sorted(ccs))}"


def cuda_candidates_from(
    environ: Mapping[str, str], which: str | None, globbed: Sequence[str]
) -> list[tuple[str, str]]:
    """(source, nvcc path) in the order they are tried; duplicates (same real file) dropped."""
    found: list[tuple[str, str]] = []
    for var in ("HPCLAB_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"):
        if environ.get(var):
            found.append((var, os.path.join(environ[var], "bin", "nvcc")))
    if which:
        found.append(("PATH", which))
    for home in globbed:
        found.append((home, os.path.join(home, "bin", "nvcc")))
    seen, unique = set(), []
    for source, nvcc in found:
        real = os.path.realpath(nvcc)
        if real not in seen:
            seen.add(real)
            unique.append((source, nvcc))
    return unique


# ----------------------------------------------------------------------------------------------
# The real machine (subprocesses and the filesystem)
# ----------------------------------------------------------------------------------------------


def _nvcc_version(nvcc: str) -> str:
    if not os.access(nvcc, os.X_OK):
        return ""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
        return parse_nvcc_version(out.stdout)
    except (OSError, subprocess.SubprocessError, GpuBuildError):
        return ""


def find_cuda(tensorflow: str, environ: Mapping[str, str] = os.environ) -> CudaCandidate:
    """The CUDA toolkit to build with, looked for in $HPCLAB_CUDA_HOME, $CUDA_HOME, PATH, /usr/local."""
    import glob

    homes = sorted(glob.glob("/usr/local/cuda-12*"), reverse=True) + ["/usr/local/cuda"]
    pairs = cuda_candidates_from(environ, shutil.which("nvcc"), homes)
    cands, homes_seen = [], set()
    for source, nvcc in pairs:  # one entry per toolkit (a wrapper script and its target are one)
        if os.path.exists(nvcc) and cuda_home_of(nvcc) not in homes_seen:
            homes_seen.add(cuda_home_of(nvcc))
            cands.append(CudaCandidate(source, nvcc, _nvcc_version(nvcc)))
    if environ.get("HPCLAB_CUDA_MISMATCH") == "compile-check" and cands and cands[0].version:
        # Exercises the build recipe (NCCL found, CUDA kernels compiled, linked) where no fitting
        # CUDA exists; the wheel's cache key names its CUDA, so no matching build ever reuses it.
        print(
            f"warning: HPCLAB_CUDA_MISMATCH=compile-check: building with CUDA {cands[0].version}; "
            f"the wheel is NOT usable with TensorFlow {tensorflow}.",
            file=sys.stderr,
        )
        return cands[0]
    return choose_cuda(tensorflow, cands)


def cuda_home_of(nvcc: str) -> str:
    """The toolkit folder of an nvcc (``.../bin/nvcc`` -> ``...``), through wrapper scripts."""
    real = os.path.realpath(nvcc)
    with open(real, "rb") as f:
        head = f.read(256)
    match = re.match(rb"#!/bin/sh\s+exec (\S+)/bin/nvcc", head)  # a one-line wrapper script
    if match:
        return match.group(1).decode()
    return os.path.dirname(os.path.dirname(real))


def plan(
    site_packages: str, dest: str, tensorflow: str, environ: Mapping[str, str]
) -> dict[str, str]:
    """The environment of a GPU Horovod build (see the module docstring)."""
    cuda = find_cuda(tensorflow, environ)
    cc_text = environ.get("HOROVOD_BUILD_CUDA_CC_LIST") or ",".join(map(str, DEFAULT_CC))
    ccs = parse_cc_list(cc_text, cuda.version or "12.2")
    nccl = find_nccl(environ, site_packages, dest)
    home = cuda_home_of(cuda.nvcc)
    return {
        "HOROVOD_CUDA_HOME": home,
        "CUDACXX": os.path.join(home, "bin", "nvcc"),
        "HOROVOD_NCCL_INCLUDE": nccl.include,
        "HOROVOD_NCCL_LIB": nccl.lib_dir,
        "HOROVOD_NCCL_LINK": "SHARED",
        "HOROVOD_BUILD_CUDA_CC_LIST": ",".join(map(str, ccs)),
        "HPCLAB_CUDA_VERSION": cuda.version,
        "HPCLAB_NCCL_VERSION": nccl.version,
        "HPCLAB_CUDA_SOURCE": f"{cuda.source}: {cuda.nvcc}",
        "HPCLAB_NCCL_SOURCE": f"{nccl.source}: {nccl.home}",
        # a site's NCCL: its library in the cache key, and its folder in the ops' RUNPATH
        "HPCLAB_NCCL_SITE_LIB": nccl.lib if nccl.site else "",
        "HPCLAB_NCCL_RPATH": os.path.dirname(nccl.lib) if nccl.site else "",
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python scripts/gpu_toolkit.py``; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python scripts/gpu_toolkit.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="print the build's environment as export lines")
    p.add_argument("--site-packages", required=True)
    p.add_argument("--dest", required=True)
    p.add_argument("--tensorflow", default="2.15.1")
    p = sub.add_parser("key-part", help="print the GPU part of the wheel-cache key")
    p.add_argument("--cuda", required=True)
    p.add_argument("--nccl", required=True)
    p.add_argument("--cc", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "key-part":
            print(gpu_key_part(args.cuda, args.nccl, parse_cc_list(args.cc, args.cuda)))
            return 0
        for name, value in plan(args.site_packages, args.dest, args.tensorflow, os.environ).items():
            print(f"export {name}={shlex.quote(value)}")
        plugin = plugin_sentence(os.environ)
        if plugin:  # said during the build; scripts/gpu-check.sh records it in its JSON
            print(f"gpu-build: {plugin}", file=sys.stderr)
    except (GpuBuildError, NcclError) as err:
        print(f"gpu-build refused: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
