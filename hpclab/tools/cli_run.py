"""``hpclab run`` and ``hpclab sweep``: train on MPI engines from the command line.

Both take the RunConfig field options (:mod:`hpclab.tools.cli_fields`) and the lab options
(workers, threads, where runs and data live, and the settings Horovod reads at ``hvd.init()``:
:class:`hpclab.core.engine_settings.EngineSettings`), start a :class:`hpclab.cluster.lab.Lab` and
record every run. Their exit status says how the run(s) ended (:data:`EXIT_CODES`). Heavy modules (the lab,
ipyparallel, the report) are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from hpclab.core.engine_settings import EngineSettings
from hpclab.records import jsonio
from hpclab.tools.cli_fields import add_field_options, base_config, field_values
from hpclab.tools.cli_progress import Progress, say
from hpclab.tools.stop_signals import last_reason

#: Exit status of ``hpclab`` commands: a run's end status, or how the command itself ended.
EXIT_CODES = {
    "finished": 0,
    "failed": 1,
    "stopped": 1,
    "usage": 2,
    "diverged": 3,
    "collapsed": 4,
    "interrupted": 130,
}


# ---------------------------------------------------------------------------------------------
# lab options, shared by run and sweep
# ---------------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def positive_ints(text: str) -> list[int]:
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("no value given")
    return [positive_int(t.strip()) for t in items]


def _add_lab_options(parser: argparse.ArgumentParser, *, many: bool) -> None:
    group = parser.add_argument_group("lab")
    if many:
        group.add_argument(
            "--workers",
            type=positive_ints,
            default=[2],
            metavar="N[,N...]",
            help="MPI workers (Horovod ranks); several sizes restart the engines "
            "between them (default: 2)",
        )
    else:
        group.add_argument(
            "--workers",
            type=positive_int,
            default=None,
            metavar="N",
            help="MPI workers (Horovod ranks) (default: 2; with --resume, the recorded number)",
        )
    group.add_argument(
        "--threads-per-worker",
        type=positive_int,
        default=None,
        metavar="N",
        help="CPU threads per worker (default: 1, or 2 on GPU ranks as the CPUs allow)",
    )
    group.add_argument(
        "--profile",
        default=None,
        metavar="NAME|FILE",
        help="cluster profile: how engines start (default: $HPCLAB_PROFILE, else srun inside a "
        "Slurm allocation, else mpiexec here; `hpclab profiles` lists them)",
    )
    group.add_argument(
        "--nodes",
        type=positive_int,
        default=0,
        metavar="N",
        help="spread the workers over N nodes (Slurm; default: as the allocation places them)",
    )
    defaults = EngineSettings()
    group.add_argument(
        "--hvd-cycle-time-ms",
        type=float,
        default=defaults.cycle_time_ms,
        metavar="X",
        help="Horovod: background cycle between collectives, read at hvd.init() "
        f"(ms; default: {defaults.cycle_time_ms:g})",
    )
    group.add_argument(
        "--hvd-fusion-mb",
        type=float,
        default=defaults.fusion_mb,
        metavar="X",
        help="Horovod: tensor-fusion buffer, read at hvd.init() "
        f"(MB; 0 = no fusion; default: {defaults.fusion_mb:g})",
    )
    group.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where runs are recorded (default: $HPCLAB_RUNS, the profile's, <checkout>/runs if writable, else your own folder)",
    )
    group.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="generated and staged datasets (default: $HPCLAB_DATA, the profile's, <checkout>/data if writable, else your own folder)",
    )


def _lab_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    from hpclab.cluster import profiles

    runs, data = profiles.folders(profiles.resolve(args.profile)[0])
    return (args.runs_dir or runs, args.data_dir or data)


def _engine_settings(args: argparse.Namespace, groups: int = 1) -> EngineSettings:
    """The Lab's settings from the options (a ConfigError naming a bad one, before any start);
    ``groups``: a hybrid run's, registered at start (no restart)."""
    return EngineSettings(
        cycle_time_ms=args.hvd_cycle_time_ms, fusion_mb=args.hvd_fusion_mb, groups=groups
    )


def _start_lab(args: argparse.Namespace, workers: int, settings: EngineSettings):
    """The Lab of a command, with these engine settings."""
    from hpclab.cluster.lab import Lab

    runs_dir, data_dir = _lab_dirs(args)
    return Lab(
        workers=workers,
        engine_settings=settings,
        profile=args.profile,
        nodes=args.nodes,
        threads_per_worker=args.threads_per_worker,
        runs_dir=runs_dir,
        data_dir=data_dir,
    )


# ---------------------------------------------------------------------------------------------
# hpclab run
# ---------------------------------------------------------------------------------------------


def configure_run(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpclab run``."""
    parser.epilog = (
        "exit status: 0 finished, 1 failed or stopped, 2 usage mistake, "
        "3 diverged (the loss became NaN/inf), 4 collapsed (the loss stayed at chance level past "
        "warm-up), 130 interrupted by Ctrl-C, SIGTERM, SIGHUP or "
        "SIGUSR1 (the run is stopped and its record kept)"
    )
    add_field_options(parser, many=False)
    _add_lab_options(parser, many=False)
    parser.add_argument(
        "--resume",
        default=None,
        metavar="RUN_ID|DIR",
        help="continue a stopped, failed or abandoned run in its own folder from its latest "
        "checkpoint (it ran with --checkpoint-every); knob options may change only its name, "
        "tags, publish and checkpoint cadence",
    )
    parser.add_argument(
        "--rescale",
        default=None,
        choices=("keep_global_batch", "keep_per_rank_batch"),
        help="with --resume on another --workers than recorded: keep the global batch (each "
        "rank's batch changes) or each rank's batch (the LR follows the run's lr_scaling); not "
        "bit for bit an uninterrupted run",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--json",
        action="store_true",
        help="print the summary as ONE JSON line on stdout (everything else goes to stderr)",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    """``hpclab run``: one run on ``--workers`` engines; the exit status is how it ended."""
    from hpclab.records.paths import check_folder
    from hpclab.records.sweep import check_staged

    runs_dir, data_dir = _lab_dirs(args)
    resuming = None
    if args.resume:
        cfg, workers, resuming = _resume(args, runs_dir)
    else:
        cfg, workers = base_config(args, **field_values(args)), args.workers or 2
    plan = cfg.for_workers(workers)  # validates workers against the config (ConfigError)
    d = plan.derived()
    settings = _engine_settings(args, cfg.groups if cfg.update == "hybrid" else 1)
    check_folder(data_dir, "data_dir")  # (a file or an unmakeable folder, named as such first)
    check_staged(cfg, data_dir)
    say(
        f"hpclab run: {cfg.label()} ×{workers}: global batch {d['global_batch']}, peak lr "
        f"{d['peak_lr']:.4g}, {d['steps_per_epoch']} steps/epoch, {d['total_steps']} steps, "
        f"{plan.warmup_text()}"
    )
    progress = Progress(d["total_steps"], enabled=not args.no_progress)
    interrupted = False
    # Everything the lab prints goes to stderr, so stdout carries only the result.
    with contextlib.redirect_stdout(sys.stderr):
        with _start_lab(args, workers, settings) as lab:
            if resuming is not None:
                say(f"hpclab run: resuming from step {resuming.from_step} ({resuming.checkpoint})")
                handle = lab.run(cfg, resume=resuming.record.path, rescale=args.rescale)
            else:
                handle = lab.run(cfg)
            say(f"hpclab run: recording to {handle.path}")
            progress.start()
            handle.on_update(progress)
            try:
                _wait_quietly(handle)
            except KeyboardInterrupt:
                interrupted = True
                progress.close()
                say("\nhpclab run: interrupted — stopping every rank after the same step ...")
                try:
                    handle.stop(timeout=15, reason=last_reason())
                    _wait_quietly(handle, timeout=15)
                except KeyboardInterrupt:
                    say(
                        "hpclab run: interrupted again; the engines are shut down without "
                        "waiting for the run."
                    )
            finally:
                progress.close(None if interrupted else handle)
    summary = dict(handle.summary) or {"run_id": handle.run_id, "status": handle.status}
    summary.setdefault("path", str(handle.path))
    status = handle.status
    if args.json:
        print(jsonio.dumps(summary, sort_keys=True), flush=True)
    acc = summary.get("val_accuracy")
    line = (
        f"hpclab run: {status}"
        + (f", val_accuracy {acc:.4f}" if acc is not None else "")
        + (
            f", {summary['samples_per_sec']:,.0f} samples/s"
            if summary.get("samples_per_sec")
            else ""
        )
        + f" — {handle.path}"
    )
    if status in ("failed", "diverged", "collapsed") and handle.error:
        line += f"\nhpclab run: {handle.error}"
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)
    if interrupted:
        return EXIT_CODES["interrupted"]
    return EXIT_CODES.get(status, 1)


def _resume(args: argparse.Namespace, runs_dir: Path):
    """(config, workers, the checked resume) of ``--resume``: the recorded config with the knob
    options given applied, and the recorded workers unless ``--workers`` is given; refused (a
    ConfigError, exit 2) before any engine starts (hpclab.cluster.resume)."""
    from hpclab.cluster import resume
    from hpclab.core.config import RunConfig
    from hpclab.records.store import load_run

    record = load_run(resume.run_folder(args.resume, runs_dir))
    cfg = RunConfig.from_dict(record.config).replace(**field_values(args))
    workers = args.workers or record.workers
    checked = resume.prepare(record.path, cfg, workers, runs_dir, args.rescale)
    return checked.cfg, workers, checked


def _wait_quietly(handle, timeout: float | None = None) -> None:
    """Wait for the run to end, whatever its outcome (the status says what happened)."""
    from hpclab.core.errors import RunFailed

    try:
        handle.wait(timeout)
    except (RunFailed, TimeoutError):
        pass


# ---------------------------------------------------------------------------------------------
# hpclab sweep
# ---------------------------------------------------------------------------------------------


def configure_sweep(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpclab sweep``."""
    parser.epilog = (
        "Every combination of the comma-separated values is one run; all are "
        "validated before the first starts. Combinations already recorded in --runs-dir "
        "with a result (finished, diverged, collapsed) are skipped, so re-running a sweep "
        "resumes it; a stopped or failed one goes on from its checkpoint if it has one (see "
        "--checkpoint-every, --checkpoint-minutes), else runs again. exit status: 0 "
        "every point ran to its end (diverged and collapsed ones included), 1 a point failed, "
        "2 usage mistake, 130 Ctrl-C."
    )
    add_field_options(parser, many=True)
    _add_lab_options(parser, many=True)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="PATH",
        help="write a self-contained HTML report of the sweep's runs here at the end",
    )
    out.add_argument("--title", default="hpclab sweep", help="title of the report")


def sweep(args: argparse.Namespace) -> int:
    """``hpclab sweep``: every combination once (finished ones skipped), then a report."""
    from hpclab.records import sweep as sweeps

    values = field_values(args)
    fixed = {k: v[0] for k, v in values.items() if len(v) == 1}
    grid = {k: v for k, v in values.items() if len(v) > 1}
    cfg = base_config(args, **fixed)
    runs_dir, data_dir = _lab_dirs(args)
    settings = _engine_settings(args)
    grid["workers"] = args.workers
    points = sweeps.plan(
        cfg,
        runs_dir,
        current_workers=args.workers[0],
        data_dir=data_dir,
        engine=settings,
        **grid,
    )
    pending = [p for p in points if p.finished is None]
    print(
        f"hpclab sweep: {len(points)} run(s), {len(points) - len(pending)} already recorded, "
        f"recording to {runs_dir}",
        flush=True,
    )
    t0 = time.perf_counter()
    if pending:
        try:
            with _start_lab(args, pending[0].workers, settings) as lab:
                records = sweeps.run_sweep(lab, cfg, **grid)
        except KeyboardInterrupt:
            say(
                "\nhpclab sweep: interrupted; the current run was stopped and recorded. Run the "
                "same command again to resume."
            )
            return EXIT_CODES["interrupted"]
    else:
        from hpclab.records.store import load_run

        printer = sweeps.PrintProgress(keys=[k for k in grid if k != "workers"])
        records = []
        for i, p in enumerate(points, start=1):
            record = load_run(p.finished)
            printer.end(i, len(points), p, record, "skipped")
            records.append(record)
    statuses = [r.status for r in records]
    print(
        f"hpclab sweep: done in {time.perf_counter() - t0:.0f} s: "
        + ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses)),
        flush=True,
    )
    if args.report is not None:
        from hpclab.views.charts.report import write_report

        path = write_report(records, args.report, title=args.title)
        print(f"hpclab sweep: report written to {path}", flush=True)
    return EXIT_CODES["failed"] if "failed" in statuses or "stopped" in statuses else 0


__all__ = ["EXIT_CODES", "configure_run", "run", "configure_sweep", "sweep"]
