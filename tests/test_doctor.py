"""`hpclab doctor` end to end: real ipyparallel MPI engines, real Horovod, nothing mocked."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from hpclab.cluster import host
from hpclab.tools import cli, doctor


def run_doctor(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpclab.tools.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.mpi
def test_doctor_runs_a_two_rank_allreduce():
    result = run_doctor()
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert re.search(r"controllers\s+MPI: yes\s+Gloo: yes", out), out
    assert re.search(r"frameworks\s+TensorFlow: yes", out), out
    assert re.search(r"MPI library\s+\S+", out) and re.search(r"mpiexec\s+/\S+", out), out
    assert "TensorFlow    2.15.1" in out and "Horovod       0.28.1" in out, out
    assert re.search(r"bfloat16\s+(runs through|no: precision='mixed_bfloat16')", out), out
    rank_lines = re.findall(r"rank (\d)/2 .*allreduce\(sum of rank\+1\) = (\S+)", out)
    assert sorted(rank_lines) == [("0", "3"), ("1", "3")], out
    assert "all 2 ranks agree: 3" in out, out
    assert "hpclab doctor: OK" in out, out


@pytest.mark.mpi
def test_engines_that_cannot_register_in_time_give_one_sentence():
    """A 1-second budget is too short for MPI engines: exit 1, one sentence, no traceback."""
    result = run_doctor("--timeout", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("hpclab doctor: The 2 MPI engines did not start"), result.stderr
    assert "--timeout" in message


def test_bad_timeout_is_one_sentence_without_importing_tensorflow():
    result = run_doctor("--timeout", "0", timeout=60)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == "hpclab doctor: --timeout must be between 1 and 3600 seconds; you passed 0."
    )


def test_cli_without_a_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "doctor" in capsys.readouterr().out


def test_every_command_has_help_and_a_runner(capsys):
    parser = cli.build_parser()
    for name, command in cli.COMMANDS.items():
        assert command.help and callable(command.run)
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([name, "--help"])
        assert exit_info.value.code == 0
        assert f"hpclab {name}" in capsys.readouterr().out


@pytest.mark.parametrize("beside_mode", [0o755, 0o644, None])
def test_doctor_reports_the_mpiexec_a_lab_uses(beside_mode, tmp_path, monkeypatch):
    """One rule: the doctor's mpiexec is host.find_mpiexec's, also when the one beside
    sys.executable exists but is not executable (the doctor once reported that one)."""
    bin_dir, site = tmp_path / "venv" / "bin", tmp_path / "site"
    for folder in (bin_dir, site):
        folder.mkdir(parents=True)
    (site / "mpiexec").write_text("#!/bin/sh\n")
    (site / "mpiexec").chmod(0o755)
    if beside_mode is not None:
        (bin_dir / "mpiexec").write_text("#!/bin/sh\n")
        (bin_dir / "mpiexec").chmod(beside_mode)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(site))
    assert doctor._mpiexec() == host.find_mpiexec()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    if beside_mode != 0o755:
        with pytest.raises(doctor.DoctorError, match="No mpiexec found"):
            doctor._mpiexec()
