"""scripts/gpu-check.sh without a GPU: its options, what it runs on one or two GPUs, its JSON.

The steps themselves need a GPU node (and engines); these tests check the decisions and the
report (scripts/gpu_check.py) on recorded tool outputs (tests/fixtures/gpu/), and the script's
refusal of a bad command line. Milliseconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check as gc  # noqa: E402

from hpclab.core.gpu_node import SMI_QUERY  # noqa: E402

FIX = Path(__file__).resolve().parent / "fixtures" / "gpu"


# -- options -----------------------------------------------------------------------------------


def test_default_options_set_up_the_gpu_stack():
    assert gc.parse_options([]) == {
        "CPU": "0",
        "SETUP": "1",
        "WHEELHOUSE": "",
        "PREPARE": "",
        "OUT": "",
    }


def test_cpu_uses_the_venv_as_it_is_unless_a_wheelhouse_is_given(tmp_path):
    assert gc.parse_options(["--cpu"])["SETUP"] == "0"
    offline = gc.parse_options(["--cpu", "--wheelhouse", str(tmp_path)])
    assert offline["SETUP"] == "1" and offline["WHEELHOUSE"] == str(tmp_path)
    assert gc.parse_options(["--skip-setup", "--wheelhouse", str(tmp_path)])["SETUP"] == "0"
    assert gc.parse_options(["--prepare-wheelhouse", "wh"])["PREPARE"].endswith("/wh")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--bogus"], "unknown option '--bogus'"),
        (["--wheel", "x"], "unknown option '--wheel'"),  # no abbreviations
        (["--wheelhouse", "/nonexistent/wh"], "is not a folder; make it first"),
        (["--wheelhouse", ".", "--prepare-wheelhouse", "x"], "are two separate runs"),
    ],
)
def test_a_bad_command_line_is_one_sentence(argv, said):
    with pytest.raises(gc.OptionError, match=said):
        gc.parse_options(argv)


def test_the_script_refuses_a_bad_option_before_doing_anything():
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu-check.sh"), "--bogus"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "unknown option '--bogus'" in out.stderr
    assert not out.stdout  # no step ran


def test_the_script_queries_what_the_findings_read():
    text = (ROOT / "scripts/gpu-check.sh").read_text()
    assert f"--query-gpu={SMI_QUERY}" in text.replace(" \\\n      ", " ")
    assert "NCCL_DEBUG=INFO" in text and "site_nccl.py plugins" in text
    for step in gc.STEPS:
        assert f"step {step} " in text or f"skip {step} " in text


# -- what runs on the GPUs at hand -------------------------------------------------------------


def modes(plan):
    return {c["mode"]: c.get("expect", "skipped") for c in plan["cases"]}


def test_one_gpu_under_nccl_runs_one_rank_and_expects_the_shared_gpu_refused():
    plan = gc.binding_cases(gpus=1, nccl=True)
    assert plan["workers"] == 1 and plan["gpus"] == 1
    assert modes(plan) == {"per_task": "trains", "local_rank": "skipped", "shared": "refused"}
    per_task = plan["cases"][0]
    assert per_task["env"] == {"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_PER_TASK": "1"}
    assert "this node has 1" in plan["cases"][1]["skipped"]


def test_one_gpu_without_nccl_runs_two_ranks_on_it():
    plan = gc.binding_cases(gpus=1, nccl=False)
    assert plan["workers"] == 2
    assert modes(plan)["shared"] == "trains"


def test_two_gpus_add_local_rank_and_two_ranks():
    plan = gc.binding_cases(gpus=2, nccl=True)
    assert plan["workers"] == 2
    assert modes(plan) == {"per_task": "trains", "local_rank": "trains", "shared": "refused"}


@pytest.mark.parametrize(("gpus", "cpu", "why"), [(0, False, "no GPU"), (4, True, "--cpu")])
def test_no_gpu_skips_every_binding_mode_with_the_reason(gpus, cpu, why):
    plan = gc.binding_cases(gpus=gpus, nccl=False, cpu=cpu)
    assert plan["gpus"] == 0 and plan["workers"] == 2
    assert all(why in c["skipped"] for c in plan["cases"])


# -- the report --------------------------------------------------------------------------------


def fake_work(tmp_path: Path) -> Path:
    """A work folder as the script leaves it on a one-GPU H100 node under an old driver."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIX / "smi-L-h100.txt", work / "smi-L.txt")
    shutil.copy(FIX / "smi-query-h100.csv", work / "smi-query.csv")
    shutil.copy(FIX / "smi-banner-525.txt", work / "smi.txt")
    shutil.copy(FIX / "nvcc-12.2.txt", work / "nvcc.txt")
    (work / "nccl-plugin.txt").write_text("NCCL network plugin found: /sw/libnccl-net.so.\n")
    (work / "cases.json").write_text(json.dumps(gc.binding_cases(1, True)))
    (work / "facts.status").write_text("0 1\n")
    (work / "facts.log").write_text("x86_64\n")
    (work / "setup.status").write_text("skip --skip-setup\n")
    (work / "allreduce.status").write_text("0 12\n")
    log = (FIX / "nccl-debug-socket.txt").read_text()
    (work / "allreduce.log").write_text(log + '{"rank": 0, "size": 1, "ok": true}\n')
    (work / "runs.status").write_text("0 300\n")
    (work / "runs.log").write_text(
        '{"case": "binding:per_task", "ok": true}\n'
        '{"case": "binding:shared", "ok": false, "expect": "refused"}\nnot json\n'
    )
    return work


def test_the_report_is_one_object_with_checks_statuses_and_findings(tmp_path):
    work = fake_work(tmp_path)
    steps = ["facts", "setup", "doctor", "allreduce", "runs"]
    data = gc.report(work, steps, 321, "gpu", environ={})
    assert data["schema"] == gc.SCHEMA and data["mode"] == "gpu" and data["offline"] is False
    assert data["stack"]["backend"] == "tensorflow" and "python" in data["stack"]
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert status == {
        "facts": "passed",
        "setup": "skipped",
        "doctor": "skipped",  # no status file: not run
        "allreduce": "passed",
        "runs": "failed",  # exit 0, but a record says ok: false
    }
    runs = data["checks"][-1]
    assert runs["figures"] == {"records": 2, "failed_records": 1} and data["failed"] == ["runs"]
    found = {f["check"]: f for f in data["findings"]}
    assert found["compute_capability"]["status"] == "note"  # an H100: PTX for 9.0
    assert found["cuda_driver"]["sentence"].startswith(
        "the driver (525.85.12) supports CUDA up to 12.0"
    )
    assert "loaded no network plugin" in found["nccl"]["sentence"]  # from the allreduce log
    assert found["nccl_plugin"]["sentence"].startswith("NCCL network plugin found")
    json.dumps(data)  # JSON as it is


def test_write_leaves_the_file_whole_and_the_command_line_works(tmp_path):
    work = fake_work(tmp_path)
    out = tmp_path / "check.json"
    rc = gc.main(["write", str(work), str(out), "facts", "--seconds", "5", "--mode", "cpu"])
    data = json.loads(out.read_text())
    assert rc == 0 and data["mode"] == "cpu" and [c["name"] for c in data["checks"]] == ["facts"]
    assert not (tmp_path / "check.json.tmp").exists()
    wh = gc.report(work, ["facts"], 1, "cpu", wheelhouse=str(tmp_path), environ={})
    assert wh["offline"] is True and wh["wheelhouse"] == str(tmp_path)


def stub_venv(root: Path) -> Path:
    """A venv whose hpclab, mpiexec and python are stand-ins: each step answers at once (the
    real ones start engines); the report writer runs with this test's Python."""
    bin_ = root / "bin"
    bin_.mkdir(parents=True)
    scripts = {
        "hpclab": 'echo "doctor: all checks passed (stand-in)"\n',
        "mpiexec": 'shift 2; echo "NCCL_DEBUG=$NCCL_DEBUG"; exec "$@"\n',
        "python": (
            'case "$1" in\n'
            f'  *gpu_check.py) exec "{sys.executable}" "$@" ;;\n'
            '  *allreduce.py) echo \'{"rank": 0, "size": 2, "ok": true}\' ;;\n'
            '  *runs.py) echo \'{"case": "lab", "ok": true}\' ;;\n'
            "esac\n"
        ),
    }
    for name, body in scripts.items():
        (bin_ / name).write_text("#!/bin/bash\n" + body)
        (bin_ / name).chmod(0o755)
    return root


def test_cpu_mode_runs_every_step_and_writes_one_json(tmp_path):
    """The shell's plumbing end to end with stand-in tools (what --cpu runs for real: 401 s
    and engines; see docs/cluster.md)."""
    venv = stub_venv(tmp_path / "venv")
    out = tmp_path / "check.json"
    env = {
        "PATH": "/usr/bin:/bin",  # no nvidia-smi, no nvcc: a CPU node
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "HPCLAB_VENV": str(venv),
        "PYTHONPATH": str(ROOT),
    }
    run = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu-check.sh"), "--cpu", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert data["mode"] == "cpu" and data["offline"] is False
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert status == {
        "facts": "passed",
        "setup": "skipped",
        "doctor": "passed",
        "allreduce": "passed",
        "runs": "passed",
    }
    allreduce = next(c for c in data["checks"] if c["name"] == "allreduce")
    assert "NCCL_DEBUG=INFO" in allreduce["tail"][0]
    assert allreduce["records"] == [{"rank": 0, "size": 2, "ok": True}]
    assert {f["check"] for f in data["findings"]} >= {"cuda_driver", "cuda_toolkit"}


def test_the_scripts_embedded_python_compiles():
    """allreduce.py and runs.py live in gpu-check.sh as here-documents: a syntax error there
    would show only on a GPU node."""
    import re

    text = (ROOT / "scripts/gpu-check.sh").read_text()
    bodies = re.findall(r"<<'PY'\n(.*?)\nPY\n", text, re.S)
    assert len(bodies) == 2
    for body in bodies:
        compile(body, "gpu-check.sh here-document", "exec")
