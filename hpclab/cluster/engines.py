"""`EngineSet`: execute a `LaunchPlan` — controller, engines, the queue phase, stop and abort.

The plan decides (`hpclab.cluster.launch`); this module only does what it says, with every wait bounded:
the queue phase (mode sbatch: `squeue` polled until the job runs, `queue_timeout_s`), then
registration (`registration_timeout_s`), and on stop a bounded clean shutdown followed by the
cluster's stop and, under Slurm, `scancel` of the step or job so no engine outlives the lab.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

from hpclab.cluster import ports, slurm, world
from hpclab.cluster.launch import LaunchPlan
from hpclab.cluster.site_mpi import init_failure
from hpclab.core.errors import LabError

log = logging.getLogger(__name__)
QUEUE_POLL_S = 2.0
SHUTDOWN_S = 10.0  # a clean engine shutdown (Horovod and MPI finalise together) gets this long
#: A nanny sends its engine's exit to the controller with LINGER 3 s (ipyparallel nanny.py,
#: notify_exit), then ends: what is left after the stop gets this long before it is killed.
NANNY_END_S = 3.0
#: Lab.stop() returns within this: the run's stop (5 s), three bounded steps of SHUTDOWN_S
#: (clean shutdown, engines, controller), then whatever is left on this host is killed.
STOP_BOUND_S = 5 + 3 * SHUTDOWN_S + NANNY_END_S + 5
#: Engines that reached the controller but heard this many heartbeats in a row missing (at
#: HEARTBEAT_MS each) before registering meet a controller whose heart monitor is gone.
SILENT_HEART_MISSES = 5
_MISSED = re.compile(r"No heartbeat in the last \d+ ms \((\d+) time")


class _ControllerSilent(Exception):
    """Engines reached the controller, whose heart monitor (a process of its own) never
    answered (its port can be taken between ipyparallel choosing and binding it).
    `EngineSet.start` then starts a new controller once."""


class EngineSet:
    """One controller and one set of MPI engines, started as `plan` says.

    `on_status(text)` hears queue states ("PENDING (Priority)") while a job waits."""

    def __init__(self, plan: LaunchPlan, on_status=None):
        self.plan = plan
        self.on_status = on_status or (lambda text: None)
        self.cluster = None
        self.client = None
        self.job_id: str = ""  # mode sbatch: the engines' job; mode srun: the enclosing job
        self.phases: dict[str, float] = {}
        self.failed = False  # a failed start keeps its state folder (logs, batch script)
        self._engine_set = None  # ipyparallel's launcher; kept: the cluster forgets a stopped one
        self._local: list = []  # psutil.Process of controller, launcher and its tree, this host
        self._reaper = (
            None  # hpclab.cluster.reaper: ends them all if this client dies without stop()
        )

    def start(self):
        """Start everything and return a connected client with all engines registered; on any
        failure stop what was started and raise LabError with the launcher's output. A
        controller whose heart is silent is replaced once, with a new cluster id and folder."""
        try:
            return self._start(retry=True)
        except _ControllerSilent as exc:
            log.warning("%s; starting a new controller (once).", exc)
            self.failed = False
            self._engine_set, self._local, self.phases = None, [], {}
            suffix = f"-{int(time.time()) % 100000}"
            self.plan = replace(
                self.plan,
                cluster_id=self.plan.cluster_id + suffix,
                state_dir=self.plan.state_dir + suffix,
            )
            return self._start(retry=False)

    def _start(self, retry: bool):
        import ipyparallel as ipp

        plan = self.plan
        try:
            Path(plan.state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(plan.state_dir, 0o700)  # connection info carries the cluster's HMAC key
        except OSError as exc:
            raise LabError(
                f"the lab's state folder {plan.state_dir} could not be made private "
                f"({exc.strerror or exc}); set paths.state in the profile to a folder you own."
            ) from None
        # before the first process: a client killed at any moment of the start (a kernel
        # restarted, a queued job) leaves nothing behind (hpclab.cluster.reaper)
        self._reaper = _start_reaper(plan)
        step = "starting the ipyparallel controller"  # what a raw OSError/RuntimeError meant
        t0 = time.perf_counter()
        try:
            with ports.reserved(plan.ports, plan.controller_ip) as engine_ports:
                self.cluster = ipp.Cluster(
                    config=plan.ipp_config(),
                    log_level=logging.ERROR,  # our own errors say what to do
                    **plan.cluster_kwargs(engine_ports),
                )
                self.cluster.start_controller_sync()
            self.phases["controller_s"] = time.perf_counter() - t0
            step = f"starting the engines ({plan.mode})"
            self.cluster.start_engines_sync(plan.workers)
            step = "waiting for the engines"
            self._engine_set = self.cluster.engine_set
            if plan.mode == "sbatch":
                self.job_id = self._engine_set.job_id
                self._wait_for_queue()
            elif plan.mode == "srun":
                self.job_id = os.environ.get("SLURM_JOB_ID", "")
            t1 = time.perf_counter()
            self.client = self.cluster.connect_client_sync()
            self._wait_for_registration()
            self.phases["engines_s"] = time.perf_counter() - t1
            self._local = _process_tree(self.cluster.controller, self._engine_set)
        except _ControllerSilent as exc:
            self.failed = True
            output = self.output()
            self.stop()
            if retry:
                raise
            raise LabError(
                f"{plan.workers} MPI engines ({plan.mode}, profile {plan.profile!r}) could not "
                f"register: {exc}, twice; check that `hpclab doctor` passes."
                + (f"\nthe launcher said:\n{output[-2000:]}" if output else "")
            ) from None
        except (TimeoutError, ipp.error.TimeoutError, ipp.error.EngineError) as exc:
            self.failed = True
            output = self.output()
            self.stop()
            what = (
                "stopped before they registered"
                if isinstance(exc, ipp.error.EngineError)
                else f"did not register within {plan.registration_timeout_s:g} s"
            )
            raise LabError(
                f"{plan.workers} MPI engines ({plan.mode}, profile {plan.profile!r}) {what} "
                f"({exc}); check that `hpclab doctor` passes."
                + (f"\nthe launcher said:\n{output[-2000:]}" if output else "")
            ) from None
        except subprocess.CalledProcessError as exc:  # sbatch refused the job script
            self.failed = True
            self.stop()
            said = (
                (exc.output or b"").decode(errors="replace")
                if isinstance(exc.output, bytes)
                else exc.output
            )
            raise LabError(
                f"{shlex.join(exc.cmd)} failed (exit {exc.returncode}): {(said or '').strip()[-1000:]}; "
                f"check the profile's slurm settings with `hpclab doctor --profile {plan.profile}`."
            ) from None
        except (OSError, RuntimeError) as exc:  # a launcher missing, a controller that died
            self.failed = True
            output = self.output()
            self.stop()
            raise LabError(
                f"{step} failed ({type(exc).__name__}: {exc}); check that `hpclab doctor` "
                f"passes for profile {plan.profile!r}."
                + (f"\nthe launcher said:\n{output[-2000:]}" if output else "")
            ) from None
        except BaseException:  # LabError from the queue phase, Ctrl-C: leave nothing running
            self.failed = True
            self.stop()
            raise
        return self.client

    def _wait_for_registration(self) -> None:
        """Until every engine registered; fails early when the launcher (mpiexec, srun) or the
        engines' job ended first. ipyparallel notices a dead launcher only inside a running
        event loop (a notebook), not in a script or the CLI, so the check is ours."""
        import ipyparallel as ipp

        deadline = time.perf_counter() + self.plan.registration_timeout_s
        while True:
            try:
                self.client.wait_for_engines(self.plan.workers, timeout=1, interactive=False)
                return
            except (TimeoutError, ipp.error.TimeoutError):
                pass
            unshared = world.missing_state_folder(self.output())  # such an engine quits at once
            if unshared:
                raise LabError(unshared)
            ended = self._launcher_ended()
            if ended:  # an MPI that aborted at MPI_Init for want of its PMI: name the plugin
                wrong = init_failure(self.output(), self.plan.srun_mpi)
                raise LabError(wrong) if wrong else ipp.error.EngineError(ended)
            missed = max((int(n) for n in _MISSED.findall(self.output())), default=0)
            if missed >= SILENT_HEART_MISSES:
                raise _ControllerSilent(
                    f"the engines reached the controller but heard no heartbeat from it "
                    f"{missed} times in a row (pid {self.cluster.controller.process.pid})"
                )
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{len(self.client.ids)} of {self.plan.workers} registered")

    def _launcher_ended(self) -> str:
        """Why the engines can no longer register (a sentence), or '' while they still may."""
        if self.plan.mode == "sbatch":
            state = slurm.job_state(self.job_id)
            return "" if state else f"the engines' job {self.job_id} left the queue"
        code = self._engine_set.poll()
        launcher = os.path.basename(self.plan.launch_cmd[0])
        return "" if code is None else f"{launcher} exited with status {code}"

    def _wait_for_queue(self) -> None:
        """Mode sbatch: poll squeue until the engines' job runs (its own timeout, so a long
        queue never eats the registration time)."""
        t0 = time.perf_counter()
        last = None
        while True:
            state = slurm.job_state(self.job_id)
            waited = time.perf_counter() - t0
            if state is None:
                raise LabError(
                    f"the engines' job {self.job_id} left the queue before it ran; its output "
                    f"({self.plan.output_file}) ends:\n{self.output()[-2000:] or '(nothing)'}"
                )
            shown = state[0] + (f" ({state[1]})" if state[1] and state[1] != "None" else "")
            if shown != last:
                self.on_status(f"engines' job {self.job_id}: {shown}")
                last = shown
            if state[0] == "RUNNING":
                self.phases["queue_s"] = waited
                return
            if waited > self.plan.queue_timeout_s:
                raise LabError(
                    f"the engines' job {self.job_id} was still {shown} after "
                    f"{self.plan.queue_timeout_s:g} s (profile slurm.queue_timeout_s); it was "
                    "cancelled. Try a smaller request or another partition."
                )
            time.sleep(QUEUE_POLL_S)

    def stop(self, clean: bool = True) -> None:
        """Shut the engines down cleanly (bounded; skipped when `clean` is False: lost engines
        cannot answer), stop controller and launcher, and under Slurm cancel what might be
        left. Safe to call twice."""
        cluster, self.cluster = self.cluster, None
        client, self.client = self.client, None
        if client is not None:
            ids = list(client.ids)
            if ids and clean:
                _bounded(lambda: _shut_down(client, ids, SHUTDOWN_S), SHUTDOWN_S)
            try:
                client.close()
            except Exception:  # noqa: BLE001 — closing a client whose engines died can fail
                pass
        if cluster is not None:  # one at a time: ipyparallel's stop_cluster gathers both, and
            # an engine set that fails to stop (sbatch never gave a job id) abandons the controller
            _bounded(cluster.stop_engines_sync, SHUTDOWN_S)
            _bounded(cluster.stop_controller_sync, SHUTDOWN_S)
        self._cancel_leftovers()
        _kill_survivors(self._local)  # a hung or stopped process ignored every polite request
        reaper, self._reaper = self._reaper, None
        if reaper is not None:  # nothing left for it to watch
            reaper.kill()
            reaper.wait()
        if clean and not self.failed:  # keep a failed start's logs and script for a post-mortem
            shutil.rmtree(self.plan.state_dir, ignore_errors=True)

    def abort(self, pids: list[int] = ()) -> None:
        """Last resort: end the MPI job at once (a rank died or hangs); `pids`: engine processes
        on this host, killed directly (a SIGSTOPped rank never acts on a forwarded signal)."""
        import psutil  # ipyparallel's own dependency: its launchers raise psutil.NoSuchProcess

        if self.plan.mode in ("srun", "sbatch"):
            self._cancel_leftovers(signal="KILL")  # SIGKILL to srun is not forwarded (srun(1))
        for pid in pids:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        if self.cluster is None:
            return
        try:
            self.cluster.signal_engines_sync(signal.SIGKILL)
        except (ProcessLookupError, psutil.NoSuchProcess) as exc:  # already gone: the usual case
            log.debug("aborting the engines: %r (already gone)", exc)
        except Exception as exc:  # noqa: BLE001 — from a run's monitor thread: log, never raise
            log.warning("aborting the engines reported %r; call lab.restart().", exc)

    def link_state(self) -> str:
        """'' while the controller and the launcher (mpiexec, srun, the job) run; else what
        ended, e.g. 'mpiexec exited with status -9' (cluster/run.py names it when ranks fall silent)."""
        parts = [self.controller_state()]
        if self._engine_set is not None:
            try:
                parts.append(self._launcher_ended())
            except Exception:  # noqa: BLE001 — asked while things fall apart: say what we can
                pass
        return "; ".join(p for p in parts if p)

    def controller_state(self) -> str:
        """'' while the ipyparallel controller runs; else a sentence saying it is gone."""
        controller = getattr(self.cluster, "controller", None)
        try:
            code = controller.poll() if controller is not None else None
            if code is None and controller.process.status() == "zombie":  # not reaped: no loop
                code = "killed"
        except Exception:  # noqa: BLE001 — poll() of a process psutil lost track of
            code = "unknown"
        if code is None:
            return ""
        pid = getattr(getattr(controller, "process", None), "pid", "?")
        return f"the ipyparallel controller (pid {pid}) exited (status {code})"

    def _cancel_leftovers(self, signal: str | None = None) -> None:
        if self.plan.mode == "sbatch" and self.job_id:
            slurm.cancel(self.job_id, signal=signal)
        elif self.plan.mode == "srun" and self.job_id:
            for step in slurm.steps_named(self.job_id, self.plan.job_name):
                slurm.cancel(step, signal=signal or "KILL")

    def output(self) -> str:
        """What the launcher (mpiexec, srun, the batch job) and the engines printed."""
        path = getattr(self._engine_set, "output_file", "") or self.plan.output_file
        if os.path.isfile(path):  # read the file: ipyparallel caches get_output() on first call
            with open(path, errors="replace") as f:
                return f.read()
        # In a notebook ipyparallel notices the launcher's exit itself, reads the file into its
        # cache and removes it (BaseLauncher._log_output): take the cached text then.
        return getattr(self._engine_set, "_output", None) or ""


def _process_tree(*launchers) -> list:
    """psutil.Process of each launcher's process (controller, mpiexec/srun) and its descendants
    on this host, remembered at start: after a kill -9 of a parent they can no longer be found."""
    import psutil

    found = []
    for launcher in launchers:
        pid = getattr(getattr(launcher, "process", None), "pid", None)
        try:
            root = psutil.Process(pid) if pid else None
            found += [root, *root.children(recursive=True)] if root else []
        except psutil.Error:
            continue
    return found


def _start_reaper(plan: LaunchPlan):
    """hpclab.cluster.reaper for the lab `plan` starts, on behalf of this process: every process
    ipyparallel launches for it and, mode sbatch, its job by name (None if it cannot start)."""
    from hpclab.cluster import reaper

    try:
        return reaper.start(
            os.getpid(),
            lab_id=plan.cluster_id,
            slurm_name=plan.job_name if plan.mode == "sbatch" else "",
        )
    except OSError as exc:
        log.warning(
            "no reaper for the engines (%r): if this process is killed, stop them by hand", exc
        )
        return None


def _shut_down(client, ids: list[int], seconds: float) -> None:
    """Shut the engines `ids` down, then wait (at most `seconds`) until the controller has
    unregistered each one.

    Each engine's ipyparallel nanny (ipyparallel/engine/nanny.py, KernelNanny) notices its
    engine's exit, sends the controller an ``unregistration_request`` and only then ends; with
    the controller already stopped that message lingers (its socket's LINGER, 3 s) and the nanny
    outlives the stop. Waiting here for the unregistrations (the controller's notifications
    update ``client.ids``) lets every nanny end by itself, on this host or any other."""
    client.shutdown(targets=ids, block=True)
    deadline = time.monotonic() + seconds
    while set(ids) & set(client.ids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _kill_survivors(processes: list) -> None:
    """SIGKILL what is still alive of `processes` (psutil checks each is the same process)
    after NANNY_END_S for those ending by themselves (a nanny whose notice is being sent)."""
    import psutil

    deadline = time.monotonic() + NANNY_END_S  # (an ended nanny, orphaned, may stay a zombie)
    while (alive := [p for p in processes if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    names = [_named(p) for p in alive]
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    if alive:
        log.warning("killed %d lab process(es) that outlived the shutdown: %s", len(alive), names)
        try:
            psutil.wait_procs(alive, timeout=5)
        except psutil.Error:  # one turned zombie or vanished between the check and the wait
            pass


def _named(process) -> str:
    """'pid command' of a process, its command line cut to 80 characters."""
    try:
        return f"{process.pid} {' '.join(process.cmdline())[:80]}"
    except Exception:  # noqa: BLE001 — gone meanwhile
        return str(process.pid)


def _alive(process) -> bool:
    """Running and not a zombie (an exited child its parent has not reaped yet)."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _bounded(call, seconds: float) -> bool:
    """Run `call` on a daemon thread for at most `seconds`; True if it returned in time."""
    errors = []

    def target():
        try:
            call()
        except Exception as exc:  # noqa: BLE001 — engines already gone: the next step cleans up
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True, name="hpclab-stop")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        log.warning(
            "%s did not finish within %g s; going on", getattr(call, "__name__", call), seconds
        )
        return False
    if errors:
        log.info("stopping reported %r; the next step cleans up", errors[0])
    return True


__all__ = ["EngineSet"]
