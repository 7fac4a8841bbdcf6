"""The decisions and the report of ``scripts/gpu-check.sh``: its options, what it runs on this
node's GPUs, and the one JSON it writes.

The shell script runs the steps (tools, setup, doctor, allreduce, runs); this module decides
and writes, so that both are unit-tested without a GPU (``tests/test_gpu_check.py``):

- :func:`parse_options`: ``--cpu``, ``--skip-setup``, ``--wheelhouse DIR`` (offline: pip and the
  Horovod wheel from DIR, no index), ``--prepare-wheelhouse DIR`` (on a node with the network),
  ``--out FILE``; printed as shell assignments the script ``eval``\\ s.
- :func:`binding_cases`: the GPU binding modes the cluster guide names (``per_task``,
  ``local_rank``, two ranks sharing a GPU), each run, or skipped with the reason, on the GPUs at
  hand; and how many ranks the precision runs use: two where the build allows it on this node
  (two GPUs, or one GPU shared by a build without NCCL), else one. Under an NCCL build two ranks
  on one GPU are *expected to be refused* at start ("Duplicate GPU detected" otherwise, Horovod
  issues #3929, #3949): the case checks that sentence on a real GPU.
- :func:`report`: one JSON object, the format the JAX backend's check shares (issue 47): the
  stack, the mode, whether it ran offline, every check with its status (passed, failed,
  skipped), seconds, figures and the JSON records its step printed, and the node's findings
  (``hpclab.core.gpu_node``: driver, toolkit, compute capability, MIG, NCCL) as sentences.

Command line (used by gpu-check.sh)::

    python3 scripts/gpu_check.py options -- ARGS...          # shell assignments
    python3 scripts/gpu_check.py cases --gpus N --nccl 0|1 [--cpu]   # JSON list
    python3 scripts/gpu_check.py write WORK OUT STEP... --seconds S --mode gpu|cpu [--wheelhouse DIR]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import os
import pathlib
import platform
import shlex
import sys
from collections.abc import Mapping, Sequence

SCHEMA = "hpclab-gpu-check/1"
STEPS = ("facts", "setup", "doctor", "allreduce", "runs")
#: Raw tool outputs the facts step leaves in the work folder, by what hpclab.core.gpu_node reads.
FACT_FILES = {
    "smi_list": "smi-L.txt",
    "smi_query": "smi-query.csv",
    "smi_banner": "smi.txt",
    "nvcc": "nvcc.txt",
}


class OptionError(ValueError):
    """A bad command line; the message is one sentence."""


def parse_options(argv: Sequence[str]) -> dict[str, str]:
    """gpu-check.sh's options as the shell variables it uses (CPU, SETUP, WHEELHOUSE, PREPARE, OUT)."""
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-check.sh", add_help=False, allow_abbrev=False
    )
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--skip-setup", action="store_true")
    parser.add_argument("--wheelhouse", default="")
    parser.add_argument("--prepare-wheelhouse", default="")
    parser.add_argument("--out", default="")
    known, unknown = parser.parse_known_args(list(argv))
    if unknown:
        raise OptionError(
            f"gpu-check: unknown option {unknown[0]!r} (known: --cpu, --skip-setup, "
            "--wheelhouse DIR, --prepare-wheelhouse DIR, --out FILE)."
        )
    if known.wheelhouse and known.prepare_wheelhouse:
        raise OptionError(
            "gpu-check: --prepare-wheelhouse DIR (on a node with the network) and --wheelhouse DIR "
            "(on the compute node, offline) are two separate runs; give one of them."
        )
    if known.wheelhouse and not os.path.isdir(known.wheelhouse):
        raise OptionError(
            f"gpu-check: --wheelhouse {known.wheelhouse!r} is not a folder; make it first with "
            "--prepare-wheelhouse on a node with the network."
        )
    # --cpu uses the venv as it is, unless it is to be set up offline from a wheelhouse
    setup = not known.skip_setup and (not known.cpu or bool(known.wheelhouse))
    return {
        "CPU": "1" if known.cpu else "0",
        "SETUP": "1" if setup else "0",
        "WHEELHOUSE": os.path.abspath(known.wheelhouse) if known.wheelhouse else "",
        "PREPARE": os.path.abspath(known.prepare_wheelhouse) if known.prepare_wheelhouse else "",
        "OUT": known.out,
    }


def binding_cases(gpus: int, nccl: bool, cpu: bool = False) -> dict:
    """What the runs step does on `gpus` GPUs under a Horovod built with NCCL or not.

    Returns ``{"workers": ranks for the precision runs, "gpus": Lab(gpus=), "cases": [...]}``;
    each case is ``{"mode", "workers", "env", "expect": "trains" | "refused"}`` or
    ``{"mode", "skipped": reason}``."""
    if cpu or gpus <= 0:
        why = "--cpu: no GPU is used" if cpu else "no GPU on this node (nvidia-smi -L lists none)"
        cases = [{"mode": m, "skipped": why} for m in ("per_task", "local_rank", "shared")]
        return {"workers": 2, "gpus": 0, "cases": cases}
    first = {"CUDA_VISIBLE_DEVICES": "0"}
    cases: list[dict] = [
        # what Slurm's --gpus-per-task=1 gives a task: one GPU, bound (hpclab.core.devices)
        {
            "mode": "per_task",
            "workers": 1,
            "env": {**first, "SLURM_GPUS_PER_TASK": "1"},
            "expect": "trains",
        }
    ]
    if gpus >= 2:
        cases.append({"mode": "local_rank", "workers": 2, "env": {}, "expect": "trains"})
    else:
        cases.append(
            {"mode": "local_rank", "skipped": f"needs 2 GPUs on one node; this node has {gpus}"}
        )
    cases.append(
        {
            "mode": "shared",
            "workers": 2,
            "env": first,
            "expect": "refused" if nccl else "trains",
        }
    )
    workers = 2 if gpus >= 2 or not nccl else 1
    return {"workers": workers, "gpus": 1, "cases": cases}


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------


def json_records(log: str) -> list:
    """The JSON objects a step printed, one per line (other lines are its log)."""
    records = []
    for line in log.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def check_entry(name: str, work: pathlib.Path) -> dict:
    """One check of the report from its step's files in `work` (``NAME.status``: "exit seconds"
    or "skip reason..."; ``NAME.log``)."""
    status_file = work / f"{name}.status"
    if not status_file.exists():
        return {"name": name, "status": "skipped", "reason": "not run"}
    head, _, rest = status_file.read_text().strip().partition(" ")
    if head == "skip":
        return {"name": name, "status": "skipped", "reason": rest}
    rc, seconds = int(head), int(rest.split()[0])
    log_file = work / f"{name}.log"
    log = log_file.read_text(errors="replace") if log_file.exists() else ""
    records = json_records(log)
    failed_records = [r for r in records if isinstance(r, dict) and r.get("ok") is False]
    entry = {
        "name": name,
        "status": "passed" if rc == 0 and not failed_records else "failed",
        "exit": rc,
        "seconds": seconds,
        "figures": {"records": len(records), "failed_records": len(failed_records)},
        "records": records,
        "tail": log.splitlines()[-30:],
    }
    return entry


def stack_versions() -> dict:
    """The stack this Python holds (package metadata only; nothing is imported)."""
    found = {"backend": "tensorflow", "python": platform.python_version()}
    for key, names in (
        ("tensorflow", ("tensorflow", "tensorflow-cpu")),
        ("horovod", ("horovod",)),
        ("hpclab", ("hpclab",)),
        ("nvidia_nccl", ("nvidia-nccl-cu12",)),
    ):
        for name in names:
            try:
                found[key] = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return found


def findings(work: pathlib.Path, environ: Mapping[str, str], ranks: int) -> list[dict]:
    """The node's findings from the recorded tool outputs (hpclab.core.gpu_node), and the NCCL
    network plugin sentence the facts step recorded; [] where hpclab is not importable."""
    texts = {}
    for key, name in FACT_FILES.items():
        path = work / name
        texts[key] = path.read_text(errors="replace") if path.exists() else ""
    allreduce = work / "allreduce.log"
    texts["nccl_log"] = allreduce.read_text(errors="replace") if allreduce.exists() else ""
    out: list[dict] = []
    try:
        from hpclab.core.gpu_node import node_findings
    except ImportError as err:  # the venv is not set up: say so, keep the raw outputs
        out.append({"check": "findings", "status": "note", "sentence": f"not read: {err}."})
    else:
        out += [f.to_dict() for f in node_findings(environ=environ, ranks=ranks, **texts)]
    plugin = work / "nccl-plugin.txt"
    if plugin.exists() and plugin.read_text().strip():
        out.append({"check": "nccl_plugin", "status": "ok", "sentence": plugin.read_text().strip()})
    return out


def report(
    work: pathlib.Path,
    steps: Sequence[str],
    seconds: int,
    mode: str,
    wheelhouse: str = "",
    environ: Mapping[str, str] = os.environ,
) -> dict:
    """The whole JSON object (see the module docstring)."""
    checks = [check_entry(name, work) for name in steps]
    ranks_file = work / "cases.json"
    ranks = json.loads(ranks_file.read_text())["workers"] if ranks_file.exists() else 2
    return {
        "schema": SCHEMA,
        "stack": stack_versions(),
        "host": platform.node(),
        "machine": platform.machine(),
        "mode": mode,
        "offline": bool(wheelhouse),
        "wheelhouse": wheelhouse or None,
        "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "seconds": seconds,
        "checks": checks,
        "failed": [c["name"] for c in checks if c["status"] == "failed"],
        "findings": findings(work, environ, ranks),
    }


def write_report(path: str, data: Mapping) -> None:
    """Write `data` as JSON to `path` atomically (a half-written report is never left)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python3 scripts/gpu_check.py``; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["options"]:
        rest = argv[2:] if argv[1:2] == ["--"] else argv[1:]
        try:
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in parse_options(rest).items()))
        except OptionError as err:
            print(err, file=sys.stderr)
            return 2
        return 0
    parser = argparse.ArgumentParser(prog="python3 scripts/gpu_check.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cases")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--nccl", type=int, choices=(0, 1), required=True)
    p.add_argument("--cpu", action="store_true")
    p = sub.add_parser("write")
    p.add_argument("work")
    p.add_argument("out")
    p.add_argument("steps", nargs="*")  # before the options: argparse takes positionals first
    p.add_argument("--seconds", type=int, required=True)
    p.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    p.add_argument("--wheelhouse", default="")
    args = parser.parse_args(argv)
    if args.command == "cases":
        print(json.dumps(binding_cases(args.gpus, bool(args.nccl), args.cpu)))
        return 0
    data = report(pathlib.Path(args.work), args.steps, args.seconds, args.mode, args.wheelhouse)
    write_report(args.out, data)
    print(
        f"gpu-check: wrote {args.out} ({args.seconds} s); failed checks: {data['failed'] or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
