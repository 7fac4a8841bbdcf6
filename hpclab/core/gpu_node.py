"""What a GPU node's own tools say about running TensorFlow 2.15 + Horovod there, as sentences.

Pure functions over the text that ``nvidia-smi``, ``nvcc --version`` and NCCL's debug log print
(recorded once by ``scripts/gpu-check.sh``, or read by the doctor); nothing here runs a tool.
Each check gives a :class:`Finding`: ``ok``, ``note`` (works, with a cost worth saying) or
``error`` (will not work as the lab means it), and one sentence saying what it means and what to
do. The unit tests feed recorded outputs (``tests/fixtures/gpu/``) and assert each sentence.

Facts it relies on (sources):

- TensorFlow 2.15's pip wheels carry GPU machine code (SASS) for compute capabilities 5.0, 6.0,
  7.0 and 8.0 and PTX for 9.0 (its ``.bazelrc``: ``TF_CUDA_COMPUTE_CAPABILITIES=sm_50,sm_60,
  sm_70,sm_80,compute_90``). SASS runs on later minors of the same major (8.0 code on 8.6/8.9);
  another major needs the PTX, which the driver JIT-compiles at first start, and TensorFlow
  warns "CUDA kernels will be jit-compiled from PTX, which could take 30 minutes or longer"
  (seen on H100 with 2.15: tensorflow/tensorflow#62320; the CUDA C++ Programming Guide,
  "Binary Compatibility" and "PTX Compatibility").
- Blackwell (compute capability 10.x, 12.x) is known to CUDA from 12.8 on (NVIDIA's Blackwell
  Compatibility Guide); cuDNN 8.9, NCCL 2.16.5 and CUDA 12.2's ``ptxas`` (what XLA compiles with)
  that ``tensorflow[and-cuda]==2.15.1`` installs are older, and a Blackwell GPU under TensorFlow's
  PTX fails in practice (tensorflow/tensorflow#97387: ``CUDA_ERROR_INVALID_HANDLE`` on 12.0).
- MIG (NVIDIA Multi-Instance GPU User Guide, "Application Considerations" and "Device
  Enumeration"): a CUDA process sees one MIG instance, named by a ``MIG-`` UUID; there is no
  GPU-to-GPU peer-to-peer (PCIe or NVLink) or CUDA IPC between instances, so the NCCL
  TensorFlow 2.15 brings (2.16.5) cannot run a collective across MIG instances of one GPU (NCCL's
  newest user guides have a section "Using MIG instances"; a site NCCL that new is unchecked).
- CUDA compatibility (CUDA Toolkit release notes, tables 2 and 3; "CUDA Compatibility" guide):
  ``nvidia-smi``'s "CUDA Version" is the newest CUDA the driver supports. A CUDA 12.x runtime
  runs on any CUDA 12 driver (R525, >= 525.60.13: minor version compatibility) except where it
  must JIT PTX newer than the driver; a CUDA 11 driver cannot run CUDA 12 at all (only the
  ``cuda-compat`` forward-compatibility package on data-centre GPUs bridges that).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

#: Compute capabilities TensorFlow 2.15's pip wheel has machine code for, and the one it has PTX for.
TF215_SASS = (50, 60, 70, 80)
TF215_PTX = 90
#: The CUDA that ``tensorflow[and-cuda]==2.15.1`` brings (nvidia-*-cu12 12.2 wheels).
TF215_CUDA = (12, 2)
#: Architecture names, for sentences.
ARCH = {5: "Maxwell", 6: "Pascal", 7: "Volta/Turing", 8: "Ampere/Ada", 9: "Hopper"}
ARCH.update({10: "Blackwell", 11: "Blackwell", 12: "Blackwell"})


@dataclass(frozen=True)
class Finding:
    """One check's verdict: ``status`` is ok, note or error; ``sentence`` says it to a person."""

    check: str  # "compute_capability", "mig", "cuda_driver", "cuda_toolkit", "nccl"
    status: str
    sentence: str
    figures: Mapping[str, object] | None = None

    def to_dict(self) -> dict:
        """Plain JSON-able dict (the gpu-check JSON's ``findings``)."""
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# Parsing what the tools print
# ----------------------------------------------------------------------------------------------


def parse_smi_list(text: str) -> list[dict]:
    """GPUs of ``nvidia-smi -L``: index, name, uuid and their MIG devices (profile, uuid).

    ``GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5b...)`` then, indented, one
    ``MIG 3g.20gb     Device  0: (UUID: MIG-c6d4...)`` line per MIG device of that GPU."""
    gpus: list[dict] = []
    for line in text.splitlines():
        gpu = re.match(r"\s*GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)", line)
        if gpu:
            gpus.append({"index": gpu[1], "name": gpu[2], "uuid": gpu[3], "mig": []})
            continue
        mig = re.match(r"\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[\w/-]+)\)", line)
        if mig and gpus:
            gpus[-1]["mig"].append({"profile": mig[1], "device": mig[2], "uuid": mig[3]})
    return gpus


#: The query ``parse_smi_query`` reads (``--format=csv,noheader,nounits``).
SMI_QUERY = "index,uuid,name,compute_cap,driver_version,memory.total"


def parse_smi_query(text: str) -> list[dict]:
    """Rows of ``nvidia-smi --query-gpu=`` :data:`SMI_QUERY` ``--format=csv,noheader,nounits``."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 6 and parts[0].isdigit():
            index, uuid, name, cc, driver, mem = parts
            rows.append(
                {
                    "index": index,
                    "uuid": uuid,
                    "name": name,
                    "compute_cap": cc,
                    "driver_version": driver,
                    "memory_mib": int(mem) if mem.isdigit() else None,
                }
            )
    return rows


def parse_smi_banner(text: str) -> tuple[str, str]:
    """(driver version, newest CUDA it supports) from ``nvidia-smi``'s table header
    (``| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2 |``); "" each
    when absent."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*(\d+\.\d+)", text)
    return (driver[1] if driver else "", cuda[1] if cuda else "")


def parse_nvcc(text: str) -> str:
    """``12.2`` from ``nvcc --version`` (``Cuda compilation tools, release 12.2, V12.2.140``), or ""."""
    match = re.search(r"release (\d+\.\d+)", text)
    return match[1] if match else ""


def parse_nccl_log(text: str) -> dict:
    """What an ``NCCL_DEBUG=INFO`` log says: NCCL's version and CUDA, the network it used and
    the network plugin it loaded (each "" when the log does not say)."""
    version = re.search(r"NCCL version (\d+\.\d+\.\d+)(?:\+cuda(\d+\.\d+))?", text)
    network = re.findall(r"Using network (\S[^\n]*?)\s*$", text, re.M)
    plugin = re.search(r"NET/Plugin\s*:?\s*Loaded net plugin (\S[^\n]*?)\s*$", text, re.M)
    return {
        "version": version[1] if version else "",
        "cuda": (version[2] or "") if version else "",
        "network": network[-1] if network else "",
        "plugin": plugin[1] if plugin else "",
    }


def _cc(text: str) -> int | None:
    """``90`` from ``"9.0"`` (nvidia-smi's compute_cap); None when it is not a number."""
    match = re.fullmatch(r"(\d+)\.(\d)", text.strip())
    return int(match[1]) * 10 + int(match[2]) if match else None


# ----------------------------------------------------------------------------------------------
# The sentences
# ----------------------------------------------------------------------------------------------


def _gpu_label(row: Mapping[str, object]) -> str:
    return f"GPU {row.get('index', '?')} ({row.get('name') or 'unnamed'})"


def compute_capability_finding(row: Mapping[str, object]) -> Finding:
    """Whether TensorFlow 2.15.1 runs on the GPU of one :func:`parse_smi_query` row."""
    label, raw = _gpu_label(row), str(row.get("compute_cap", ""))
    cc = _cc(raw)
    figures = {"gpu": row.get("name"), "compute_cap": raw}
    if cc is None:
        return Finding(
            "compute_capability",
            "note",
            f"nvidia-smi gave no compute capability for {label} ({raw!r}; drivers before R510 "
            "have no compute_cap field), so whether TensorFlow 2.15.1 was built for it is unchecked.",
            figures,
        )
    major = cc // 10
    cc_text = f"compute capability {major}.{cc % 10} ({ARCH.get(major, 'unknown architecture')})"
    if cc < TF215_SASS[0]:
        status = "error"
        sentence = (
            f"{label} has {cc_text}, older than any TensorFlow 2.15.1 was built for (5.0 and up); "
            "use a node with a newer GPU."
        )
    elif major * 10 in TF215_SASS:
        status = "ok"
        sentence = f"{label} has {cc_text}, for which TensorFlow 2.15.1 carries machine code."
    elif cc == TF215_PTX or major == TF215_PTX // 10:
        status = "note"
        sentence = (
            f"{label} has {cc_text}, for which TensorFlow 2.15.1 carries PTX but no machine code, "
            "so the driver JIT-compiles its kernels at the first start (TensorFlow warns it 'could "
            "take 30 minutes or longer'); keep CUDA's JIT cache between jobs with CUDA_CACHE_PATH "
            "on a persistent file system and CUDA_CACHE_MAXSIZE=4294967296."
        )
    else:
        status = "error"
        sentence = (
            f"{label} has {cc_text}, which TensorFlow 2.15.1 was not built for: it carries machine "
            "code up to 8.0 and PTX for 9.0, and its CUDA 12.2 libraries (cuDNN 8.9, NCCL 2.16.5, "
            "the ptxas XLA uses) predate Blackwell, which CUDA knows from 12.8 on, so kernels fail "
            "or JIT-compile for a long time; run the TensorFlow backend on an Ampere, Ada or Hopper "
            "node (no TensorFlow 2.15 release targets Blackwell)."
        )
    return Finding("compute_capability", status, sentence, figures)


def mig_finding(
    gpus: Sequence[Mapping], visible: Sequence[str] | None, ranks: int = 2
) -> Finding | None:
    """A sentence when this node's GPUs are split into MIG instances (None when none is).

    `gpus` from :func:`parse_smi_list`; `visible` is ``CUDA_VISIBLE_DEVICES`` as a list
    (hpclab.core.devices.visible_devices); `ranks` the ranks meant to share this node's GPUs."""
    split = [g for g in gpus if g.get("mig")]
    visible_mig = [v for v in (visible or []) if v.startswith("MIG-")]
    if not split and not visible_mig:
        return None
    profiles = [m["profile"] for g in split for m in g["mig"]]
    where = (
        "; ".join(
            f"{_gpu_label(g)} is split into {len(g['mig'])} MIG instance(s) "
            f"({', '.join(m['profile'] for m in g['mig'])})"
            for g in split
        )
        or "CUDA_VISIBLE_DEVICES names MIG instances"
    )
    if visible_mig:
        where += f", and CUDA_VISIBLE_DEVICES names {', '.join(visible_mig)}"
    figures = {"mig_profiles": profiles, "visible_mig": visible_mig, "ranks": ranks}
    if ranks <= 1:
        return Finding(
            "mig",
            "note",
            f"{where}: one rank on one MIG instance trains, with that slice's memory and "
            "multiprocessors only, so its throughput is not the whole GPU's.",
            figures,
        )
    return Finding(
        "mig",
        "error",
        f"{where}: a process sees one MIG instance and NCCL 2.16.5 (TensorFlow 2.15's) cannot run a "
        "collective across MIG instances (no peer-to-peer or CUDA IPC between them, NVIDIA's MIG "
        "user guide), so "
        f"{ranks} ranks cannot allreduce through NCCL here; ask for whole GPUs (a partition "
        "without MIG), or train with one rank (Lab(workers=1)).",
        figures,
    )


def driver_finding(driver: str, driver_cuda: str) -> Finding:
    """Whether the driver (``nvidia-smi``'s banner) runs TensorFlow 2.15.1's CUDA 12.2."""
    figures = {"driver_version": driver, "driver_cuda": driver_cuda}
    if not driver_cuda:
        return Finding(
            "cuda_driver",
            "note",
            "nvidia-smi printed no 'CUDA Version' (no NVIDIA driver, or nvidia-smi missing), so "
            "the driver's CUDA is unchecked.",
            figures,
        )
    major, minor = (int(x) for x in driver_cuda.split("."))
    need = f"{TF215_CUDA[0]}.{TF215_CUDA[1]}"
    if major < TF215_CUDA[0]:
        return Finding(
            "cuda_driver",
            "error",
            f"the driver ({driver}) supports CUDA up to {driver_cuda}, but TensorFlow 2.15.1 runs "
            f"on CUDA {need}, whose libraries do not start on a CUDA {major} driver; ask for nodes "
            "with driver R525 (>= 525.60.13) or newer, or have the site install NVIDIA's cuda-compat "
            "package for CUDA 12 (data-centre GPUs only).",
            figures,
        )
    if (major, minor) < TF215_CUDA:
        return Finding(
            "cuda_driver",
            "note",
            f"the driver ({driver}) supports CUDA up to {driver_cuda}, older than TensorFlow "
            f"2.15.1's CUDA {need}: it runs by CUDA's minor version compatibility except where "
            f"PTX built by CUDA {need} must be JIT-compiled (every kernel on a Hopper GPU), which "
            "fails with CUDA_ERROR_UNSUPPORTED_PTX_VERSION; a driver of R535 (>= 535.54.03) or "
            "newer avoids it.",
            figures,
        )
    return Finding(
        "cuda_driver",
        "ok",
        f"the driver ({driver}) supports CUDA up to {driver_cuda}, enough for TensorFlow "
        f"2.15.1's CUDA {need}.",
        figures,
    )


def toolkit_finding(nvcc_cuda: str, driver_cuda: str = "") -> Finding:
    """Whether the CUDA toolkit (``nvcc --version``) can compile Horovod's GPU ops for
    TensorFlow 2.15.1 (the build's own refusal is scripts/gpu_toolkit.py; this is the node's)."""
    figures = {"nvcc_cuda": nvcc_cuda, "driver_cuda": driver_cuda}
    if not nvcc_cuda:
        return Finding(
            "cuda_toolkit",
            "note",
            "no nvcc here: running needs none, but building Horovod with NCCL needs a CUDA 12.2+ "
            "toolkit from the site (module load cuda/12.x, or HPCLAB_CUDA_HOME).",
            figures,
        )
    major, minor = (int(x) for x in nvcc_cuda.split("."))
    if major != TF215_CUDA[0] or minor < TF215_CUDA[1]:
        return Finding(
            "cuda_toolkit",
            "error",
            f"nvcc is CUDA {nvcc_cuda}, but Horovod's GPU ops must be compiled with CUDA 12.2 or a "
            "later 12.x to live beside TensorFlow 2.15.1's CUDA 12.2 libraries; load a CUDA 12 "
            "toolkit (module load cuda/12.x) or set HPCLAB_CUDA_HOME to one (PyPI's "
            "nvidia-cuda-nvcc-cu12 wheels ship ptxas only, no nvcc).",
            figures,
        )
    if driver_cuda and tuple(map(int, driver_cuda.split("."))) < (major, minor):
        return Finding(
            "cuda_toolkit",
            "note",
            f"nvcc is CUDA {nvcc_cuda}, newer than the driver's CUDA {driver_cuda}: Horovod's "
            "kernels are machine code for the listed architectures, so they run by minor version "
            "compatibility, but code that needs PTX from this toolkit would not.",
            figures,
        )
    return Finding(
        "cuda_toolkit", "ok", f"nvcc is CUDA {nvcc_cuda}, a fit for TensorFlow 2.15.1.", figures
    )


def nccl_log_finding(log: Mapping[str, str], nccl_home: str = "") -> Finding | None:
    """What NCCL said it used (:func:`parse_nccl_log`); None when the log named no version."""
    if not log.get("version"):
        return None
    which = f"NCCL {log['version']}" + (f" (built for CUDA {log['cuda']})" if log["cuda"] else "")
    where = f" from {nccl_home}" if nccl_home else ""
    if log.get("plugin"):
        how = f"loaded the network plugin '{log['plugin']}'"
    else:
        how = "loaded no network plugin (its own IB and socket transports)"
    net = f" and used the network '{log['network']}'" if log.get("network") else ""
    return Finding("nccl", "ok", f"{which}{where} {how}{net}.", dict(log))


def node_findings(
    smi_list: str = "",
    smi_query: str = "",
    smi_banner: str = "",
    nvcc: str = "",
    nccl_log: str = "",
    environ: Mapping[str, str] | None = None,
    ranks: int = 2,
) -> list[Finding]:
    """Every finding the recorded outputs allow, in the order a person reads them: driver,
    toolkit, each GPU model's compute capability, MIG, NCCL. Empty texts give no GPU finding."""
    environ = environ or {}
    driver, driver_cuda = parse_smi_banner(smi_banner)
    rows = parse_smi_query(smi_query)
    findings = [driver_finding(driver or _first(rows, "driver_version"), driver_cuda)]
    findings.append(toolkit_finding(parse_nvcc(nvcc), driver_cuda))
    seen = set()
    for row in rows:
        key = (row["name"], row["compute_cap"])
        if key not in seen:
            seen.add(key)
            findings.append(compute_capability_finding(row))
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    visible = [v.strip() for v in raw.split(",") if v.strip()] if raw else None
    mig = mig_finding(parse_smi_list(smi_list), visible, ranks)
    if mig:
        findings.append(mig)
    nccl = nccl_log_finding(parse_nccl_log(nccl_log))
    if nccl:
        findings.append(nccl)
    return findings


def _first(rows: Sequence[Mapping], key: str) -> str:
    return str(rows[0].get(key, "")) if rows else ""


__all__ = [
    "Finding",
    "SMI_QUERY",
    "compute_capability_finding",
    "driver_finding",
    "mig_finding",
    "nccl_log_finding",
    "node_findings",
    "parse_nccl_log",
    "parse_nvcc",
    "parse_smi_banner",
    "parse_smi_list",
    "parse_smi_query",
    "toolkit_finding",
]
