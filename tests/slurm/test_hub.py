"""JupyterHub through Slurm, driven by a real browser: the whole chain a cluster user sees.

A root JupyterHub on 127.0.0.1 (SharedPasswordAuthenticator, batchspawner's MultiSlurmSpawner,
configurable-http-proxy from npm) spawns a real Unix user's JupyterLab as a Slurm job on the
session's test cluster (`slurm` fixture, tests/slurm/conftest.py). Debian's Chromium, driven by
Playwright, logs in, watches the spawner's progress and lands in JupyterLab; the test checks the
job in squeue and that every listening socket of hub, proxy and JupyterLab is on loopback, then
stops the server through the REST API with a service token and checks that the job and every
process of the user are gone. Logs (hub, job, Slurm daemons) are printed on failure; screenshots
go to test-artifacts/hub-*.png.

The notebook step (open a notebook, Run All on `Lab(workers=2)` with engines as srun steps inside
the hub's job) goes into `notebook_step` below.

Needs: root, Slurm (scripts/install-slurm.sh), Chromium (scripts/install-browser.sh),
configurable-http-proxy (scripts/install-hub.sh), jupyterhub + batchspawner (`make setup`).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from browser_util import (
    accept_dialogs,
    launch,
    need_chromium,
    record_console,
    run_all_cells_until_panel,
    screenshot,
    wait_for,
)
from test_browser import PLOT_POINTS_JS, PRESET

from . import hub as hubmod

pytestmark = [pytest.mark.hub, pytest.mark.slurm, pytest.mark.browser, pytest.mark.slow]

USER = hubmod.TEST_USER
ARTIFACTS = hubmod.ROOT / "test-artifacts" / "hub"
# batchspawner's own progress messages (SlurmSpawner.progress): the page shows the Slurm state
BATCHSPAWNER_PROGRESS = re.compile(r"Pending in queue|Cluster job running")
PROGRESS_JS = """() => {
  const m = document.querySelector('#progress-message');
  const log = document.querySelector('#progress-log');
  return [m ? m.innerText : '', log ? log.innerText : ''];
}"""


def _need_hub() -> None:
    reason = hubmod.missing()
    if reason is None:
        return
    if os.environ.get("HPCLAB_REQUIRE_SLURM") == "1":
        pytest.fail(f"HPCLAB_REQUIRE_SLURM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _user_settings(user: hubmod.TestUser) -> None:
    """No "official Jupyter news?" toast over the screenshots (same as tests/test_browser.py)."""
    settings = user.home / ".jupyter/lab/user-settings/@jupyterlab/apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )
    for d, _, files in os.walk(user.home / ".jupyter"):
        user.chown(Path(d))
        for f in files:
            user.chown(Path(d) / f)


@pytest.fixture
def hub_env() -> dict[str, str | None]:
    """Extra environment for the user's JupyterLab job (Spawner.environment): the profile, as a
    centre's hub sets it (`hpclab profiles ci --hub-snippet`), and no HPCLAB_RUNS/HPCLAB_DATA:
    the checkout is a read-only install for this second user, so the lab must pick the user's
    own folders by itself (hpclab.records.paths, issue 26 item 1)."""
    return {
        "HPCLAB_PROFILE": "ci",
        "HPCLAB_PROFILE_PATH": str(hubmod.ROOT / "tests/slurm/profiles"),
        "HPCLAB_RUNS": None,
        "HPCLAB_DATA": None,
    }


@pytest.fixture
def hub(request, slurm, hub_env):
    _need_hub()
    need_chromium()
    pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")
    t0 = time.monotonic()
    user = hubmod.TestUser(USER)
    grants = None
    server = None
    # Not pytest's tmp_path (/tmp/pytest-of-root is 0700): the user's job writes runs in here.
    workdir = Path(tempfile.mkdtemp(prefix="hpclab-hub-"))
    workdir.chmod(0o755)
    try:
        python = hubmod.VENV / "bin" / "python"
        # The user's job runs the venv's python (a symlink into /root/.pyenv, /root is 0700),
        # reads slurm.conf, talks to munged, writes runs: give the user --x on whatever ancestor
        # directory is in the way (ACL, only for this user), restored at teardown.
        paths = [python, os.path.realpath(python), hubmod.ROOT, slurm.conf, workdir]
        paths += [v for v in hub_env.values() if v and v.startswith("/") and os.path.exists(v)]
        grants = hubmod.grant_traverse(USER, paths)
        print(f"\ntest_hub: ACL user:{USER}:--x added on: {grants}")
        _user_settings(user)
        write_notebook(user)
        check = user.run(
            [python, "-c", "import hpclab, horovod, jupyterhub, batchspawner, jupyterlab"],
            env={**slurm.env, "HOME": str(user.home)},
        )
        assert check.returncode == 0, (
            f"the venv is not usable by the test user {USER} (permissions?):\n{check.stderr}"
        )
        writable = user.run(["sh", "-c", f'test -w "{hubmod.ROOT}"'])
        assert writable.returncode != 0, (
            f"the checkout is writable by {USER}: not a read-only install"
        )
        sinfo = user.run(["sinfo", "-h", "-o", "%P %a"], env=slurm.env, timeout=20)
        assert sinfo.returncode == 0 and slurm.partition in sinfo.stdout, (
            f"the test user cannot talk to Slurm: {sinfo.stdout}{sinfo.stderr}"
        )
        t_hub = time.monotonic()
        # batchspawner's default `srun {cmd}`: the JupyterLab step holds the job's CPUs, so the
        # engines' srun starts only because the Lab adds --overlap by itself (what sites see)
        server = hubmod.Hub(slurm, workdir, user, environment=hub_env, srun="srun")
        server.start()
        print(
            f"test_hub: user and checks {t_hub - t0:.1f} s, hub answering after "
            f"{time.monotonic() - t_hub:.1f} s"
        )
        yield server
    finally:
        t1 = time.monotonic()
        problems: list[str] = []
        if server is not None:
            problems += server.stop()
            failed = getattr(request.node, "hub_failed", True)
            if failed or problems:
                dest = ARTIFACTS / time.strftime("%Y%m%d-%H%M%S")
                dest.mkdir(parents=True, exist_ok=True)
                for f in [server.log_path, *server.job_logs()]:
                    shutil.copy2(f, dest / f.name)
                print(f"test_hub: hub and job logs copied to {dest}")
        left = user.remove()
        if grants is not None:
            problems += grants.restore()
        if server is not None and (left or problems):
            print(server.log_tails())
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"test_hub: teardown took {time.monotonic() - t1:.1f} s")
        assert not left, f"processes of {USER} survived the hub's shutdown (killed now): {left}"
        assert not problems, "; ".join(problems)


def _loopback_only(server: hubmod.Hub) -> list[str]:
    """Listening TCP sockets of hub, proxy and the user's processes that are not on loopback."""
    import psutil

    pids = {server.proc.pid, *(p.pid for p in psutil.Process(server.proc.pid).children(True))}
    pids |= set(server.user.pids())
    bad = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            if conn.laddr.ip in ("127.0.0.1", "::1"):
                continue
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.NoSuchProcess:
                continue
            if name == "srun":
                continue  # Slurm's own I/O ports: srun binds all interfaces (no option for that)
            bad.append(f"{name} (pid {conn.pid}) listens on {conn.laddr.ip}:{conn.laddr.port}")
    return bad


NOTEBOOK = "hub.ipynb"
# The profile comes from HPCLAB_PROFILE (the hub's Spawner.environment), as a centre would set it.
CELLS = [
    "import hpclab\nfrom hpclab.views.panel.panel import Panel",
    "lab = hpclab.Lab(workers=2)\nprint('LAUNCH', lab.plan.record())\nprint('RUNS', lab.runs_dir)",
    f"panel = Panel(lab, base={PRESET})\npanel",
]


def write_notebook(user: hubmod.TestUser) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}  # fmt: skip
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    path = user.home / NOTEBOOK
    nbformat.write(nb, path)
    user.chown(path)


def notebook_step(page, server: hubmod.Hub, slurm) -> None:
    """Design 3.5 step 6: the notebook in the hub's job starts 2 engines as an `srun --overlap`
    step of that job, the panel trains, the live chart gains points, Stop stops."""
    run_button = run_all_cells_until_panel(page, f"{server.url}/user/{USER}/lab/tree/{NOTEBOOK}", 2)
    launch = page.locator(".jp-OutputArea-output", has_text="LAUNCH").first.inner_text()
    assert "'mode': 'srun'" in launch and "--overlap" in launch and "'profile': 'ci'" in launch
    steps = slurm.run(["squeue", "--steps", "-h", "-u", USER, "-o", "%i %j"]).stdout
    assert any(line.split()[1].startswith("hpclab-") for line in steps.splitlines()), steps
    status = page.locator(".hpclab-status")
    wait_for(lambda: run_button.is_enabled() and status.inner_text().strip() == "ready", 30,
             "the Run button and status 'ready'", page)  # fmt: skip
    run_button.click(timeout=90_000)
    wait_for(lambda: status.inner_text().startswith("running"), 90, "status 'running'", page)
    points = page.evaluate
    first = wait_for(lambda: max(0, points(PLOT_POINTS_JS)) >= 2 and points(PLOT_POINTS_JS), 240,
                     "the first points", page)  # fmt: skip
    # the next point is an event to wait for: how soon it comes depends on the machine
    second = wait_for(
        lambda: (n := points(PLOT_POINTS_JS)) > first and n,
        60,
        f"the chart to grow past {first} points",
        page,
    )
    page.evaluate("document.querySelector('.hpclab-panel').scrollIntoView({block: 'start'})")
    screenshot(page, "hub-panel.png")
    page.locator("button.hpclab-stop").click(timeout=90_000)
    wait_for(lambda: status.inner_text().startswith("stopped at step"), 60, "'stopped'", page)
    # the second user's run went to a folder of the user's own, not into the read-only install
    runs = Path(
        page.locator(".jp-OutputArea-output", has_text="RUNS").first.inner_text().split()[-1]
    )
    owner = server.user
    assert runs.is_relative_to(owner.home), f"runs folder {runs} is not under {owner.home}"
    records = list(runs.glob("*/config.json"))
    assert records and all(r.stat().st_uid == owner.uid for r in records), records
    print(f"test_hub: panel trained in the hub's job, chart {first} → {second} points; {steps!r}")
    print(f"test_hub: {len(records)} run record(s) of {owner.name} in {runs}")


def test_hub_spawns_jupyterlab_as_slurm_job_in_browser(request, hub, slurm):
    from playwright.sync_api import sync_playwright

    t0 = time.monotonic()
    user = hub.user
    lab_url = re.compile(rf"/user/{USER}/lab/?(\?.*)?$")
    messages: list[str] = []
    (hubmod.ROOT / "test-artifacts" / "hub-failure.png").unlink(missing_ok=True)
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            console = record_console(page)
            page.goto(f"{hub.url}/hub/login")
            page.locator("#username_input").fill(USER)
            page.locator("#password_input").fill(hub.password)
            page.locator("#login_submit").click()

            # spawn-pending page: read the spawner's progress until the hub redirects to the lab
            deadline = time.monotonic() + 120
            while not lab_url.search(page.url):
                assert time.monotonic() < deadline, (
                    f"no JupyterLab after 120 s; at {page.url}; progress {messages}"
                )
                if "/hub/spawn-pending/" in page.url:
                    try:
                        for text in page.evaluate(PROGRESS_JS):
                            for line in text.splitlines():
                                if line.strip() and line.strip() not in messages:
                                    messages.append(line.strip())
                    except Exception:  # noqa: BLE001 — the page navigated away mid-read
                        pass
                time.sleep(0.1)
            t_lab = time.monotonic() - t0
            print(f"test_hub: progress messages seen: {messages}")
            assert any(BATCHSPAWNER_PROGRESS.search(m) for m in messages), messages

            # the user's JupyterLab is a Slurm job on the requested node, listening on loopback
            jobs = hub.squeue()
            assert jobs == [f"RUNNING {hub.node} spawner-jupyterhub"], jobs
            model = hub.api("GET", f"/users/{USER}").json()
            job_id = model["servers"][""]["state"]["job_id"]
            page.locator("#jp-main-dock-panel").wait_for(state="visible", timeout=90_000)
            accept_dialogs(page, 1)
            print(
                f"test_hub: JupyterLab (job {job_id}) shown {time.monotonic() - t0:.1f} s after "
                f"login (redirect at {t_lab:.1f} s)"
            )
            bad = _loopback_only(hub)
            assert not bad, f"not loopback-only: {bad}"
            assert user.pids(), "no process of the user while the server runs?"
            screenshot(page, "hub-lab.png")

            notebook_step(page, hub, slurm)

            # stop through the REST API with the service token: job and processes must go
            t_stop = time.monotonic()
            r = hub.api("DELETE", f"/users/{USER}/server", timeout=60)
            assert r.status_code in (202, 204), (r.status_code, r.text)
            while (hub.squeue() or user.pids()) and time.monotonic() - t_stop < 15:
                time.sleep(0.25)
            assert not hub.squeue(), f"job still in squeue 15 s after the stop: {hub.squeue()}"
            assert not user.pids(), f"processes of {USER} 15 s after the stop: {user.processes()}"
            print(
                f"test_hub: REST stop → job and processes gone in "
                f"{time.monotonic() - t_stop:.1f} s (HTTP {r.status_code})"
            )
            model = hub.api("GET", f"/users/{USER}").json()
            assert model["servers"] == {}, model["servers"]
        except BaseException:
            if "page" in locals():
                try:
                    screenshot(page, "hub-failure.png")
                except Exception:  # noqa: BLE001 — the browser may be gone: no screenshot then
                    pass
            print(f"\nprogress messages: {messages}")
            if "console" in locals():
                print("browser console:\n" + "\n".join(console[-40:]))
            print(hub.log_tails())
            raise
        finally:
            browser.close()
    print(f"test_hub: browser part took {time.monotonic() - t0:.1f} s")
    request.node.hub_failed = False  # the fixture keeps the logs of a failed run only


def test_hub_config_keeps_servers_on_loopback(tmp_path):
    """The rendered config without Slurm or a hub: loopback everywhere, no 0.0.0.0."""

    class FakeSlurm:
        root, conf, partition, nodes = tmp_path, tmp_path / "slurm.conf", "debug", ["n1", "n2"]
        env: dict = {}

    class FakeUser:
        name, home = "nobody", Path("/nonexistent")

        def chown(self, path):
            pass

    if shutil.which("sudo") is None and shutil.which("runuser") is None:
        pytest.skip("no sudo/runuser")
    server = hubmod.Hub(FakeSlurm(), tmp_path / "hub", FakeUser(), environment={"X": "1"})
    text = server.config.read_text()
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "0.0.0.0" in line]
    assert 'ip = Unicode("127.0.0.1")' in text
    assert "{'n1': '127.0.0.1', 'n2': '127.0.0.1'}" in text
    assert oct(server.config.stat().st_mode & 0o777) == "0o600"
    compile(text, str(server.config), "exec")
