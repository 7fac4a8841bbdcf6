"""A lab client in a process of its own, for fault tests that stop, kill or interrupt it.

`start(code, tmp_path)` runs `code` with the checkout's Python (runs under `tmp_path/runs`,
unbuffered output, pipes for stdin/stdout/stderr); `read_line(proc, prefixes, timeout)` waits
for the first line the client prints that starts with one of `prefixes` (the client says where
it is; the test waits for that event, never for a fixed time).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start(code: str, tmp_path: Path, env: dict | None = None) -> subprocess.Popen:
    environ = {
        **os.environ,
        **(env or {}),
        "HPCLAB_RUNS": str(tmp_path / "runs"),
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=environ,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen, prefixes: str | tuple[str, ...], timeout: float) -> str:
    """The first line of the client's output that starts with one of `prefixes`, stripped; the
    client is killed and its stderr shown when it ends or `timeout` s pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefixes):
            return line.strip()
    proc.kill()
    raise AssertionError(f"the client never printed {prefixes}; stderr:\n{proc.stderr.read()}")
