"""The ``hpclab`` command line: ``hpclab <command> [options]``.

Each command is one entry in :data:`COMMANDS`: a help line, a function that adds the command's
options to its sub-parser, and a function that runs it and returns the exit code. Command
modules are imported only when their command runs, so ``hpclab --help`` never imports
TensorFlow (nothing on the client does: only the engines import it).

Commands::

    hpclab doctor                      check the stack (versions, Horovod build, a 2-rank allreduce)
    hpclab run   [field options]       one run; --json prints its summary as one JSON line
    hpclab sweep [field options]       one run per combination of comma-separated values
    hpclab report RUN_DIR... -o FILE   one self-contained HTML report of recorded runs
    hpclab runs                        a table of the recorded runs

The field options are generated from :class:`hpclab.config.RunConfig` (``--batch-per-worker``,
``--lr-scaling {none,linear,sqrt}``, ``--image-shape 32,32,3``, ``--fp16-allreduce`` /
``--no-fp16-allreduce``, ...), with the comment next to each field as its help.

Exit codes of ``run`` and ``sweep`` (see :data:`EXIT_CODES`): 0 finished; 1 a run failed or was
stopped from outside; 2 a usage mistake (bad option or value, missing staged dataset, unknown run
folder, engines that cannot start) — one sentence on stderr, never a traceback; 3 the run
diverged (a result, not a crash: the learning rate was too high for that batch); 130 Ctrl-C (the
run is stopped collectively and its record kept). A sweep exits 0 when every point ran to its end,
diverged ones included, and 1 if any point failed or was stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import re
import sys
import threading
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclab import jsonio


@dataclass(frozen=True)
class Command:
    """One ``hpclab`` sub-command."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


EXIT_CODES = {
    "finished": 0,
    "failed": 1,
    "stopped": 1,
    "usage": 2,
    "diverged": 3,
    "interrupted": 130,
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one sentence (not the whole usage block) and exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`).\n")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# doctor (written with hpclab/doctor.py)
# ---------------------------------------------------------------------------------------------


def _doctor_configure(parser: argparse.ArgumentParser) -> None:
    from hpclab.tools import doctor

    doctor.add_arguments(parser)


def _doctor_run(args: argparse.Namespace) -> int:
    from hpclab.tools import doctor

    return doctor.run(args)


# ---------------------------------------------------------------------------------------------
# RunConfig fields as options
# ---------------------------------------------------------------------------------------------


def _field_comments() -> dict[str, str]:
    """The comment beside each RunConfig field in config.py: the one place fields are explained."""
    from hpclab.config import RunConfig

    try:
        source = inspect.getsource(RunConfig)
    except (OSError, TypeError):
        return {}
    found = re.findall(r"^\s+(\w+): [^=#]+= .*?#\s*(.+?)\s*$", source, flags=re.M)
    return dict(found)


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # choice | int | float | bool | shape | strings | str
    default: Any
    choices: tuple = ()
    help: str = ""

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "field_" + self.name

    def metavar(self, many: bool) -> str:
        if self.kind == "choice":
            return "{" + ",".join(self.choices) + "}" + ("[,...]" if many else "")
        if self.kind == "shape":
            return "H,W,C" if not many else "HxWxC[,...]"
        if self.kind == "strings":
            return "TAG[,TAG...]"
        if self.kind == "str":
            return "TEXT"  # one value, also in a sweep
        base = {"int": "N", "float": "X", "bool": "BOOL"}[self.kind]
        return base + ("[,...]" if many else "")

    def default_text(self) -> str:
        d = self.default
        if self.kind == "shape":
            return ",".join(map(str, d))
        if self.kind == "strings":
            return ",".join(d) or "none"
        if self.kind == "str":
            return repr(d)
        return f"{d:g}" if isinstance(d, float) else str(d)


def _fields() -> list[_Field]:
    import dataclasses

    from hpclab import config
    from hpclab.config import RunConfig

    choices = {
        "dataset": config.DATASETS,
        "model": config.MODELS,
        "optimizer": config.OPTIMIZERS,
        "lr_scaling": config.LR_SCALINGS,
        "lr_schedule": config.LR_SCHEDULES,
        "precision": config.PRECISIONS,
    }
    hints = typing.get_type_hints(RunConfig)
    comments = _field_comments()
    out = []
    for f in dataclasses.fields(RunConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        hint = hints[f.name]
        if f.name in choices:
            kind = "choice"
        elif hint is bool:
            kind = "bool"
        elif hint is int:
            kind = "int"
        elif hint is float:
            kind = "float"
        elif f.name == "image_shape":
            kind = "shape"
        elif hint is tuple:
            kind = "strings"
        else:
            kind = "str"
        out.append(
            _Field(f.name, kind, default, tuple(choices.get(f.name, ())), comments.get(f.name, ""))
        )
    return out


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _convert(field: _Field, text: str) -> Any:
    """One value of `field` from text; argparse turns ArgumentTypeError into one sentence."""
    text = text.strip()
    try:
        if field.kind == "int":
            return int(text)
        if field.kind == "float":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
    except ValueError:
        kind = "an integer" if field.kind == "int" else "a finite number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if field.kind == "choice":
        if text not in field.choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(field.choices)}")
        return text
    if field.kind == "bool":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    if field.kind == "shape":
        parts = re.split(r"[,x]", text)
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            shape = ()
        if len(shape) != 3:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not an image shape: give height, width and channels, e.g. 32,32,3"
            )
        return shape
    if field.kind == "strings":
        return tuple(t.strip() for t in text.split(",") if t.strip())
    return text


def _one(field: _Field) -> Callable[[str], Any]:
    return lambda text: _convert(field, text)


def _many(field: _Field) -> Callable[[str], list]:
    """Comma-separated values for a sweep (a shape is HxWxC there; 32,32,3 alone is one shape)."""

    def parse(text: str) -> list:
        if field.kind in ("strings", "str"):
            return [_convert(field, text)]  # a name / a tag list is one value, not swept
        if field.kind == "shape" and "x" not in text:
            return [_convert(field, text)]
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("no value given")
        return [_convert(field, t) for t in items]

    return parse


def _add_field_options(parser: argparse.ArgumentParser, *, many: bool) -> None:
    group = parser.add_argument_group(
        "run configuration (hpclab.RunConfig fields)"
        if not many
        else "run configuration (hpclab.RunConfig fields; comma-separated values are swept)"
    )
    for f in _fields():
        help_text = f"{f.help} (default: {f.default_text()})".replace("%", "%%")
        if f.kind == "bool":
            if many:
                group.add_argument(
                    f.option,
                    dest=f.dest,
                    nargs="?",
                    const=[True],
                    type=_many(f),
                    default=argparse.SUPPRESS,
                    metavar="true,false",
                    help=help_text[:-1] + f"; --no-{f.option[2:]} for false, "
                    "true,false to sweep both)",
                )
            else:
                group.add_argument(
                    f.option,
                    dest=f.dest,
                    action=argparse.BooleanOptionalAction,
                    default=argparse.SUPPRESS,
                    help=help_text,
                )
                continue
            group.add_argument(
                "--no-" + f.option[2:],
                dest=f.dest,
                action="store_const",
                const=[False],
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
            continue
        group.add_argument(
            f.option,
            dest=f.dest,
            type=_many(f) if many else _one(f),
            default=argparse.SUPPRESS,
            metavar=f.metavar(many),
            help=help_text,
        )


def _field_values(args: argparse.Namespace) -> dict[str, Any]:
    return {k[len("field_") :]: v for k, v in vars(args).items() if k.startswith("field_")}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def _positive_ints(text: str) -> list[int]:
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("no value given")
    return [_positive_int(t.strip()) for t in items]


def _add_lab_options(parser: argparse.ArgumentParser, *, many: bool) -> None:
    group = parser.add_argument_group("lab")
    if many:
        group.add_argument(
            "--workers",
            type=_positive_ints,
            default=[2],
            metavar="N[,N...]",
            help="MPI workers (Horovod ranks); several sizes restart the engines "
            "between them (default: 2)",
        )
    else:
        group.add_argument(
            "--workers",
            type=_positive_int,
            default=2,
            metavar="N",
            help="MPI workers (Horovod ranks) (default: 2)",
        )
    group.add_argument(
        "--threads-per-worker",
        type=_positive_int,
        default=1,
        metavar="N",
        help="CPU threads per worker (default: 1)",
    )
    group.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where runs are recorded (default: $HPCLAB_RUNS or <checkout>/runs)",
    )
    group.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="generated and staged datasets (default: $HPCLAB_DATA or <checkout>/data)",
    )


def _lab_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    from hpclab import paths

    return (args.runs_dir or paths.runs_dir(), args.data_dir or paths.data_dir())


def _start_lab(args: argparse.Namespace, workers: int):
    from hpclab.lab import Lab

    runs_dir, data_dir = _lab_dirs(args)
    return Lab(
        workers=workers,
        threads_per_worker=args.threads_per_worker,
        runs_dir=runs_dir,
        data_dir=data_dir,
    )


# ---------------------------------------------------------------------------------------------
# hpclab run
# ---------------------------------------------------------------------------------------------


def _run_configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit status: 0 finished, 1 failed or stopped, 2 usage mistake, "
        "3 diverged (the loss became NaN/inf), 130 interrupted by Ctrl-C "
        "(the run is stopped and its record kept)"
    )
    _add_field_options(parser, many=False)
    _add_lab_options(parser, many=False)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--json",
        action="store_true",
        help="print the summary as ONE JSON line on stdout (everything else goes to stderr)",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


class _Progress:
    """Progress of one run on stderr: a tqdm bar on a terminal, a line per epoch otherwise."""

    def __init__(self, total_steps: int, enabled: bool):
        self.enabled, self.total_steps = enabled, total_steps
        self.bar = None
        self.epochs_seen = 0
        self._lock = threading.Lock()  # called from the run's monitor thread and at the end

    def start(self) -> None:
        """Once the run has started (so the bar's clock does not count the engines' start-up)."""
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total_steps, unit="step", file=sys.stderr, dynamic_ncols=True, leave=True
            )

    def __call__(self, run) -> None:  # Run.on_update: from the run's monitor thread
        with self._lock:
            self._update(run)

    def _update(self, run) -> None:
        if not self.enabled:
            return
        if sys.stderr.isatty():
            bar = self.bar  # close() may run meanwhile on the main thread
            history = run.history
            if bar is None or history.empty:
                return
            last = history.iloc[-1]
            bar.n = int(_num(last.get("step"), 0))
            bar.set_postfix(
                {
                    "loss": f"{_num(last.get('loss')):.3g}",
                    "samples/s": f"{_num(last.get('samples_per_sec')):,.0f}",
                    "lr": f"{_num(last.get('lr')):.3g}",
                },
                refresh=False,
            )
            bar.refresh()
        else:
            epochs = run.epochs
            for _, row in epochs.iloc[self.epochs_seen :].iterrows():
                _say(
                    f"  epoch {int(_num(row.get('epoch'), 0))}: "
                    f"step {int(_num(row.get('step'), 0))}, "
                    f"loss {_num(row.get('loss')):.4g}, "
                    f"val_acc {_num(row.get('val_accuracy')):.3f}, "
                    f"{_num(row.get('samples_per_sec')):,.0f} samples/s"
                )
            self.epochs_seen = len(epochs)

    def close(self, run=None) -> None:
        """Draw the last state of `run` (if given), then stop drawing."""
        with self._lock:
            if run is not None:
                self._update(run)
            self.enabled = False
            bar, self.bar = self.bar, None
            if bar is not None:
                bar.close()


def _num(value: Any, default: float = float("nan")) -> float:
    """A telemetry value as a float (None, missing or NaN-able junk become `default`)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return default
    return value if math.isfinite(value) else default


def _run_run(args: argparse.Namespace) -> int:
    from hpclab.config import RunConfig
    from hpclab.sweep import check_staged

    cfg = RunConfig(**_field_values(args))
    workers = args.workers
    d = cfg.derived(workers)  # validates workers against the config (ConfigError)
    runs_dir, data_dir = _lab_dirs(args)
    check_staged(cfg, data_dir)
    _say(
        f"hpclab run: {cfg.label()} ×{workers}: global batch {d['global_batch']}, peak lr "
        f"{d['peak_lr']:.4g}, {d['steps_per_epoch']} steps/epoch, {d['total_steps']} steps, "
        f"{d['warmup_steps']} warm-up steps"
    )
    progress = _Progress(d["total_steps"], enabled=not args.no_progress)
    interrupted = False
    # Everything the lab prints goes to stderr, so stdout carries only the result.
    with contextlib.redirect_stdout(sys.stderr):
        with _start_lab(args, workers) as lab:
            run = lab.run(cfg)
            _say(f"hpclab run: recording to {run.path}")
            progress.start()
            run.on_update(progress)
            try:
                _wait_quietly(run)
            except KeyboardInterrupt:
                interrupted = True
                progress.close()
                _say("\nhpclab run: Ctrl-C — stopping every rank after the same step ...")
                try:
                    run.stop(timeout=15)
                    _wait_quietly(run, timeout=15)
                except KeyboardInterrupt:
                    _say(
                        "hpclab run: interrupted again; the engines are shut down without "
                        "waiting for the run."
                    )
            finally:
                progress.close(None if interrupted else run)
    summary = dict(run.summary) or {"run_id": run.run_id, "status": run.status}
    summary.setdefault("path", str(run.path))
    status = run.status
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
        + f" — {run.path}"
    )
    if status in ("failed", "diverged") and run.error:
        line += f"\nhpclab run: {run.error}"
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)
    if interrupted:
        return EXIT_CODES["interrupted"]
    return EXIT_CODES.get(status, 1)


def _wait_quietly(run, timeout: float | None = None) -> None:
    """Wait for the run to end, whatever its outcome (the status says what happened)."""
    from hpclab.errors import RunFailed

    try:
        run.wait(timeout)
    except (RunFailed, TimeoutError):
        pass


# ---------------------------------------------------------------------------------------------
# hpclab sweep
# ---------------------------------------------------------------------------------------------


def _sweep_configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Every combination of the comma-separated values is one run; all are "
        "validated before the first starts. Combinations already finished in "
        "--runs-dir are skipped, so re-running a sweep resumes it. exit status: 0 "
        "every point ran to its end (diverged ones included), 1 a point failed, "
        "2 usage mistake, 130 Ctrl-C."
    )
    _add_field_options(parser, many=True)
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


def _run_sweep(args: argparse.Namespace) -> int:
    from hpclab import sweep
    from hpclab.config import RunConfig

    values = _field_values(args)
    fixed = {k: v[0] for k, v in values.items() if len(v) == 1}
    grid = {k: v for k, v in values.items() if len(v) > 1}
    cfg = RunConfig(**fixed)
    runs_dir, data_dir = _lab_dirs(args)
    grid["workers"] = args.workers
    points = sweep.plan(cfg, runs_dir, current_workers=args.workers[0], data_dir=data_dir, **grid)
    pending = [p for p in points if p.finished is None]
    print(
        f"hpclab sweep: {len(points)} run(s), {len(points) - len(pending)} already recorded, "
        f"recording to {runs_dir}",
        flush=True,
    )
    t0 = time.perf_counter()
    if pending:
        try:
            with _start_lab(args, pending[0].workers) as lab:
                records = sweep.run_sweep(lab, cfg, **grid)
        except KeyboardInterrupt:
            _say(
                "\nhpclab sweep: interrupted; the current run was stopped and recorded. Run the "
                "same command again to resume."
            )
            return EXIT_CODES["interrupted"]
    else:
        from hpclab.runs import load_run

        printer = sweep.PrintProgress(keys=[k for k in grid if k != "workers"])
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
        from hpclab.views.report import write_report

        path = write_report(records, args.report, title=args.title)
        print(f"hpclab sweep: report written to {path}", flush=True)
    return EXIT_CODES["failed"] if "failed" in statuses or "stopped" in statuses else 0


# ---------------------------------------------------------------------------------------------
# hpclab report / hpclab runs
# ---------------------------------------------------------------------------------------------


def _report_configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="run folders, or a runs root (every run recorded under it)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("report.html"),
        metavar="FILE",
        help="the HTML file to write (default: report.html)",
    )
    parser.add_argument("--title", default="hpclab report", help="title of the report")


def run_folders(paths: Sequence[Path]) -> list[Path]:
    """Run folders named directly, or every run under a runs root; FileNotFoundError otherwise."""
    found: list[Path] = []
    for path in paths:
        if (path / "config.json").is_file():
            found.append(path)
            continue
        if not path.is_dir():
            raise FileNotFoundError(
                f"{path} does not exist; give run folders (runs/<run_id>) or "
                "a runs root such as runs/."
            )
        inside = sorted(p.parent for p in path.glob("*/config.json"))
        if not inside:
            raise FileNotFoundError(
                f"{path} is neither an hpclab run folder (no config.json) nor "
                "a runs root with run folders in it."
            )
        found.extend(inside)
    return list(dict.fromkeys(found))


def _report_run(args: argparse.Namespace) -> int:
    from hpclab.runs import load_run
    from hpclab.views.report import write_report

    records = [load_run(p) for p in run_folders(args.paths)]
    path = write_report(records, args.output, title=args.title)
    print(path, flush=True)
    return 0


def _runs_configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where runs are recorded (default: $HPCLAB_RUNS or <checkout>/runs)",
    )


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if fmt == "d" and isinstance(value, float) and value.is_integer():
        value = int(value)  # pandas stores an int column with a gap as float
    try:
        return format(value, fmt)
    except (TypeError, ValueError):
        return str(value)


def _runs_run(args: argparse.Namespace) -> int:
    from hpclab import paths
    from hpclab.runs import list_runs

    root = args.runs_dir or paths.runs_dir()
    if args.runs_dir is not None and not root.is_dir():
        raise FileNotFoundError(
            f"{root} does not exist; give the folder your runs are recorded in (--runs-dir)."
        )
    df = list_runs(root)
    if df.empty:
        print(f"no runs recorded in {root}")
        return 0
    columns = [
        ("run_id", "run_id", "s"),
        ("status", "status", "s"),
        ("label", "label", "s"),
        ("workers", "workers", "d"),
        ("global_batch", "batch", "d"),
        ("val_accuracy", "val_acc", ".3f"),
        ("samples_per_sec", "samples/s", ",.0f"),
        ("wall_time_s", "wall_s", ".1f"),
    ]
    rows = []
    for _, r in df.iterrows():
        row = r.to_dict()
        row["label"] = _label_of(row)
        rows.append([_fmt(row.get(key), fmt) for key, _, fmt in columns])
    header = [title for _, title, _ in columns]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    right = {i for i, (_, _, fmt) in enumerate(columns) if fmt != "s"}

    def line(cells):
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    print(line(header))
    for row in rows:
        print(line(row))
    print(f"{len(rows)} run(s) in {root}")
    return 0


def _label_of(row: dict) -> str:
    """The run's legend label (`b256 linear+wu1 ×2`), read from its config.json only."""
    from hpclab.config import RunConfig

    try:
        meta = json.loads((Path(row["path"]) / "config.json").read_text())
        return f"{RunConfig.from_dict(meta['config']).label()} ×{meta['workers']}"
    except (OSError, ValueError, KeyError, TypeError):  # ConfigError is a ValueError
        return row.get("name") or "?"


#: name -> Command.
COMMANDS: dict[str, Command] = {
    "doctor": Command(
        help="check the stack: versions, Horovod build, devices, and a 2-rank MPI allreduce",
        configure=_doctor_configure,
        run=_doctor_run,
    ),
    "run": Command(
        help="train once on N MPI workers and record the run",
        configure=_run_configure,
        run=_run_run,
    ),
    "sweep": Command(
        help="one run per combination of comma-separated values (resumable), then a report",
        configure=_sweep_configure,
        run=_run_sweep,
    ),
    "report": Command(
        help="write one self-contained HTML report of recorded runs",
        configure=_report_configure,
        run=_report_run,
    ),
    "runs": Command(
        help="list the recorded runs",
        configure=_runs_configure,
        run=_runs_run,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per entry of :data:`COMMANDS`."""
    parser = _Parser(
        prog="hpclab",
        description="Data-parallel deep learning lab: MPI engines, TensorFlow/Keras under Horovod.",
    )
    sub = parser.add_subparsers(dest="command", metavar="command")
    for name, command in COMMANDS.items():
        command.configure(sub.add_parser(name, help=command.help, description=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: ``sys.argv[1:]``), run the command and return its exit code.

    The user's mistakes — a bad value (ConfigError), a missing file or run folder
    (FileNotFoundError), engines that cannot start (LabError) — end as one sentence on stderr and
    exit status 2; a run that failed (RunFailed) as one sentence and status 1. Anything else is a
    bug in hpclab and keeps its traceback.
    """
    from hpclab.errors import ConfigError, LabError, RunFailed

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command].run(args)
    except (ConfigError, FileNotFoundError, LabError) as exc:
        _say(f"hpclab {args.command}: {_sentence(exc)}")
        return EXIT_CODES["usage"]
    except RunFailed as exc:
        _say(f"hpclab {args.command}: {_sentence(exc)}")
        return EXIT_CODES["failed"]
    except KeyboardInterrupt:  # e.g. during engine start-up; runs handle Ctrl-C themselves
        _say(f"\nhpclab {args.command}: interrupted.")
        return EXIT_CODES["interrupted"]


def _sentence(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename and not str(exc.args[0]).endswith("."):
        text = f"{exc.filename} does not exist."
    return text


if __name__ == "__main__":
    sys.exit(main())
