"""Shared bits of the real-browser tests (tests/test_browser.py, tests/slurm/test_hub.py).

Debian's Chromium (`scripts/install-browser.sh`) driven by Python Playwright: no browser
download. Tests import it as ``from browser_util import ...`` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def need_chromium() -> None:
    """Skip (non-root: cannot install) or fail (root, i.e. CI) when Chromium is missing."""
    if os.path.exists(CHROMIUM):
        return
    if os.geteuid() != 0:
        pytest.skip(
            f"{CHROMIUM} is missing and installing it needs root; ask an admin for "
            "`apt-get install chromium fonts-dejavu-core` (scripts/install-browser.sh)."
        )
    pytest.fail(
        f"{CHROMIUM} is missing; run scripts/install-browser.sh (as root) first — "
        ".ci/run does this before the tests."
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accept_dialogs(page, seconds: float) -> None:
    """JupyterLab may ask for a kernel on first open; that dialog intercepts every click."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        accept = page.locator(".jp-Dialog .jp-mod-accept")
        if accept.count():
            accept.first.click()
        time.sleep(0.25)


def run_all_cells_until_panel(page, url: str, dialogs: float = 3):
    """Open the notebook at `url`, Run → Run All Cells as a student would, and return the panel's
    Run button once it shows (the engines and Horovod have started)."""
    page.goto(url)
    page.locator(".jp-Notebook").first.wait_for(state="visible", timeout=90_000)
    accept_dialogs(page, dialogs)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    accept_dialogs(page, 1)
    run_button = page.locator("button.hpclab-run")
    run_button.wait_for(state="visible", timeout=180_000)
    return run_button


def panel_status(page) -> str:
    return page.locator(".hpclab-status").inner_text()


def wait_for(predicate, timeout: float, what: str, page=None):
    """`predicate()`'s first truthy value within `timeout` s; else an AssertionError naming
    `what` (and the panel's status line when `page` is given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    status = f" (panel status: {panel_status(page)!r})" if page is not None else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{status}")


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path


def launch(pw):
    """Headless Debian Chromium through a `sync_playwright()` handle."""
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def record_console(page) -> list[str]:
    """Browser-side errors and warnings of `page`, collected into the returned list."""
    console: list[str] = []
    page.on(
        "console",
        lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None,
    )
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    return console
