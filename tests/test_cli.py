"""The `hpclab` command line: options generated from RunConfig, one-sentence errors, run/sweep/
report/runs. Fast tests run `main()` in-process (or the module as a subprocess where "no
traceback" must be seen from outside); the `mpi` tests start real engines through the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import write_run

from hpclab.core.config import RunConfig
from hpclab.core.presets import WORKSHOP
from hpclab.records.store import load_run
from hpclab.tools import cli, cli_fields

REPO = Path(__file__).resolve().parents[1]


def hpclab(*args: str, timeout: float = 300, cwd: Path | None = None):
    """`hpclab ARGS` as a subprocess (the installed entry point is `hpclab.tools.cli:main`)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "hpclab.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd or REPO,
    )


# ---------------------------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_help_lists_every_runconfig_field(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for f in dataclasses.fields(RunConfig):
        assert "--" + f.name.replace("_", "-") in text, f.name
    assert "{none,linear,sqrt}" in text and "--workers" in text and "--runs-dir" in text
    if command == "run":
        assert "--no-fp16-allreduce" in text and "--json" in text
    else:
        assert "--report" in text


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_help_text_is_each_fields_metadata(command, capsys):
    """`hpclab run --help` shows each field's dataclass metadata["help"] beside its option."""
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    section = text[text.index("run configuration (hpclab.RunConfig fields") : text.index(" lab: ")]
    fields = dataclasses.fields(RunConfig)
    starts = [section.index(" --" + f.name.replace("_", "-")) for f in fields]
    assert starts == sorted(starts)  # listed in declaration order
    for f, start, end in zip(fields, starts, [*starts[1:], len(section)]):
        words = " ".join(f.metadata["help"].split())
        assert words in section[start:end], f"{f.name}: {words!r} not beside its option"


def test_run_options_become_a_runconfig():
    args = cli.build_parser().parse_args(
        [
            "run",
            "--batch-per-worker",
            "128",
            "--lr-scaling",
            "sqrt",
            "--base-lr",
            "0.1",
            "--image-shape",
            "16,16,1",
            "--fp16-allreduce",
            "--no-noise-scale",
            "--tags",
            "a,b",
            "--workers",
            "4",
        ]
    )
    cfg = RunConfig(**cli_fields.field_values(args))
    assert (cfg.batch_per_worker, cfg.lr_scaling, cfg.base_lr) == (128, "sqrt", 0.1)
    assert cfg.image_shape == (16, 16, 1) and cfg.tags == ("a", "b")
    assert cfg.fp16_allreduce is True and cfg.noise_scale is False
    assert cfg.epochs == RunConfig().epochs  # options not given keep RunConfig's defaults
    assert args.workers == 4


def test_sweep_options_take_comma_lists():
    args = cli.build_parser().parse_args(
        [
            "sweep",
            "--batch-per-worker",
            "32,128,512",
            "--lr-scaling",
            "none,linear",
            "--fp16-allreduce",
            "false,true",
            "--no-noise-scale",
            "--image-shape",
            "8x8x1,16x16x3",
            "--name",
            "a,b",
            "--workers",
            "1,2",
        ]
    )
    values = cli_fields.field_values(args)
    assert values["batch_per_worker"] == [32, 128, 512]
    assert values["lr_scaling"] == ["none", "linear"]
    assert values["fp16_allreduce"] == [False, True] and values["noise_scale"] == [False]
    assert values["image_shape"] == [(8, 8, 1), (16, 16, 3)]
    assert values["name"] == ["a,b"]  # a name is one value, never swept
    assert args.workers == [1, 2]
    one = cli.build_parser().parse_args(["sweep", "--image-shape", "32,32,3", "--fp16-allreduce"])
    assert cli_fields.field_values(one) == {"image_shape": [(32, 32, 3)], "fp16_allreduce": [True]}


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "--lr-scaling", "cubic"], ["--lr-scaling", "'cubic'", "none, linear, sqrt"]),
        (["sweep", "--batch-per-worker", "32,big"], ["--batch-per-worker", "'big'", "integer"]),
        (["run", "--workers", "0"], ["--workers", "'0'"]),
        (["run", "--image-shape", "32,32"], ["--image-shape", "32,32,3"]),
        (["run", "--batch-per-worker", "0"], ["batch_per_worker=0"]),
        (["sweep", "--batch-per-worker", "32,0", "--runs-dir", "{tmp}"], ["batch_per_worker=0"]),
        (
            ["run", "--dataset", "cifar10", "--model", "resnet20", "--data-dir", "{tmp}"],
            ["cifar10.npz", "stage"],
        ),
        (["report", "{tmp}", "-o", "{tmp}/r.html"], ["neither an hpclab run folder"]),
        (["report", "{tmp}/nothing-here"], ["does not exist"]),
        (["runs", "--runs-dir", "{tmp}/nothing-here"], ["does not exist"]),
    ],
)
def test_a_user_mistake_is_one_sentence_and_exit_2(argv, words, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's own errors leave through sys.exit
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    "argv", [["run", "--lr-scaling", "cubic"], ["report", "{tmp}", "-o", "{tmp}/r.html"]]
)
def test_from_outside_a_mistake_shows_no_traceback(argv, tmp_path):
    result = hpclab(*[a.replace("{tmp}", str(tmp_path)) for a in argv], timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "run" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# runs / report / an already finished sweep: no engines needed
# ---------------------------------------------------------------------------------------------


def test_runs_lists_recorded_runs(tmp_path, capsys):
    a = write_run(tmp_path, RunConfig(batch_per_worker=32), val_accs=[0.912])
    b = write_run(
        tmp_path,
        RunConfig(batch_per_worker=256, lr_scaling="none"),
        workers=1,
        status="diverged",
        val_accs=[0.1],
    )
    assert cli.main(["runs", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert a.name in out and b.name in out
    # global 64 = base_batch: nothing to warm up; global 256 > 64: a ramp even without scaling
    assert "b32 linear ×2" in out and "b256 none+wu1 ×1" in out
    assert "0.912" in out and "diverged" in out and "2 run(s)" in out


def test_runs_on_an_empty_folder(tmp_path, capsys):
    assert cli.main(["runs", "--runs-dir", str(tmp_path)]) == 0
    assert "no runs recorded" in capsys.readouterr().out


def test_report_of_run_folders_and_of_a_runs_root(tmp_path, capsys):
    runs = tmp_path / "runs"
    paths = [write_run(runs, RunConfig(batch_per_worker=b)) for b in (32, 256)]
    out = tmp_path / "one.html"
    assert cli.main(["report", str(paths[0]), "-o", str(out), "--title", "One"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert "<title>One</title>" in out.read_text()
    out = tmp_path / "all.html"
    assert cli.main(["report", str(runs), "-o", str(out)]) == 0
    page = out.read_text()
    assert "b32 linear ×2" in page and "b256 linear+wu1 ×2" in page  # 64 = base: no ramp


def test_a_recorded_sweep_is_skipped_without_starting_engines(tmp_path, capsys):
    # the CLI starts from the workshop preset, whose seed follows HPCLAB_SEED
    base = WORKSHOP.replace(num_samples=4000, epochs=1)
    for b in (32, 64):
        write_run(tmp_path, base, batch_per_worker=b)
    report = tmp_path / "sweep.html"
    code = cli.main(
        [
            "sweep",
            "--num-samples",
            "4000",
            "--epochs",
            "1",
            "--batch-per-worker",
            "32,64",
            "--workers",
            "2",
            "--runs-dir",
            str(tmp_path),
            "--report",
            str(report),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "2 already recorded" in out and out.count("skipped (already recorded") == 2
    assert "MPI engine" not in out  # nothing was started
    assert report.is_file()


# ---------------------------------------------------------------------------------------------
# real: MPI engines, Horovod, training — through the command line
# ---------------------------------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.slow
def test_run_json_prints_one_summary_line(tmp_path):
    result = hpclab(
        "run",
        "--json",
        "--workers",
        "2",
        "--num-samples",
        "4000",
        "--epochs",
        "1",
        "--runs-dir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and result.stdout.endswith("\n"), result.stdout
    summary = json.loads(result.stdout)
    assert summary["status"] == "finished" and summary["world_size"] == 2
    assert 0.0 <= summary["val_accuracy"] <= 1.0
    assert "Traceback" not in result.stderr
    run = load_run(summary["path"])  # and the run was recorded where asked
    assert run.path.parent == tmp_path and run.status == "finished"
    assert run.summary["val_accuracy"] == summary["val_accuracy"]


@pytest.mark.mpi
@pytest.mark.slow
def test_a_collapsed_run_says_why_and_exits_4(tmp_path):
    """A learning rate far too low (peak 8e-7 at global batch 512): nothing is learned, the loss
    stays at chance, on every machine and seed. (Too high a rate collapses the same way on some
    and diverges to NaN on others: peak 3.2 here collapsed at seed 0 and diverged at seed 1 with
    oneDNN off; notebook 01 teaches that side.)"""
    result = hpclab(
        "run", "--workers", "2", "--num-samples", "4000", "--epochs", "4",
        "--batch-per-worker", "256", "--base-lr", "1e-7", "--no-progress",
        "--runs-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 4, result.stdout + result.stderr
    assert "hpclab run: collapsed" in result.stdout and "chance level" in result.stdout
    assert "Traceback" not in result.stderr
    (summary,) = tmp_path.glob("*/summary.json")
    run = load_run(summary.parent)
    assert run.status == "collapsed" and "ln 10 = 2.303" in run.summary["error"]
    assert run.epochs["val_accuracy"].iloc[-1] < 0.15


@pytest.mark.mpi
@pytest.mark.slow
def test_sweep_runs_resumes_and_reports(tmp_path):
    args = [
        "sweep",
        "--workers",
        "2",
        "--num-samples",
        "4000",
        "--epochs",
        "1",
        "--batch-per-worker",
        "32,64",
        "--lr-scaling",
        "sqrt",
        "--runs-dir",
        str(tmp_path),
    ]
    first = hpclab(*args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Traceback" not in first.stderr
    lines = [ln for ln in first.stdout.splitlines() if ln.startswith("[")]
    assert len(lines) == 2 and all("finished val_acc" in ln for ln in lines), first.stdout
    # global 64 = base_batch: nothing to warm up; global 128 ramps
    assert lines[0].startswith("[1/2] b32 sqrt ×2") and lines[1].startswith("[2/2] b64 sqrt+wu1")

    report = tmp_path / "report.html"
    again = hpclab(*args, "--report", str(report), timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("skipped (already recorded") == 2, again.stdout
    assert "MPI engine" not in again.stdout  # resumed without starting engines
    assert len(list(tmp_path.glob("*/config.json"))) == 2
    page = report.read_text()
    assert "b32 sqrt ×2" in page and "b64 sqrt+wu1 ×2" in page


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM"])
def test_a_batch_systems_signal_stops_the_run_like_ctrl_c(signame, tmp_path):
    """scancel / walltime (SIGTERM): the run is stopped on every rank, its record says
    `stopped`, the command exits 130 and no engine is left. sbatch --signal=B:USR1@120 is the
    same path end to end in tests/slurm/test_resume_job.py (SIGUSR1 received, stopped for
    `walltime`, nothing left), on the real Slurm, so it is not started a second time here;
    tests/test_stop_signals.py maps every signal to its reason without engines."""
    import signal
    import time

    import psutil

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpclab.tools.cli",
            "run",
            "--json",
            "--no-progress",
            "--workers",
            "2",
            "--num-samples",
            "4000",
            "--epochs",
            "200",
            "--runs-dir",
            str(tmp_path),
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    deadline = time.monotonic() + 180
    while not list(tmp_path.glob("*/metrics.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.5)  # training has published its first rows
    assert proc.poll() is None, proc.communicate()
    children = psutil.Process(proc.pid).children(recursive=True)
    t0 = time.monotonic()
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130, err
    assert f"{signame} received" in err and "Traceback" not in err
    summary = json.loads(out)
    assert summary["status"] == "stopped"
    record = load_run(summary["path"])
    assert record.status == "stopped"
    # what the signal meant, in the record (outside a Slurm job SIGTERM says nothing more)
    reason = {"SIGTERM": "terminated", "SIGUSR1": "walltime"}[signame]
    assert record.summary["stop_reason"] == summary["stop_reason"] == reason, summary
    assert summary["stop_detail"].startswith(signame), summary
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running after {took:.1f} s: {[p.pid for p in alive]}"


CORRUPTIONS = {  # file in a run folder -> what a crash, a full disk or a stray copy leaves
    "summary.json": b'{"status": "fini',  # half-written
    "config.json": b"[1, 2, 3]",  # JSON, but not the object hpclab writes
}


def _runs_root_with_damage(tmp_path):
    root = tmp_path / "runs"
    good = [write_run(root, RunConfig(batch_per_worker=b)) for b in (32, 256)]
    bad = []
    for name, content in CORRUPTIONS.items():
        folder = write_run(root, RunConfig(batch_per_worker=64))
        (folder / name).write_bytes(content)
        bad.append(folder / name)
    binary = write_run(root, RunConfig(batch_per_worker=128))
    (binary / "summary.json").write_bytes(bytes(range(256)))  # not even text
    bad.append(binary / "summary.json")
    return root, good, bad


def test_runs_and_report_skip_damaged_run_files_with_one_line_each(tmp_path, capsys, caplog):
    root, good, bad = _runs_root_with_damage(tmp_path)
    assert cli.main(["runs", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert all(g.name in out for g in good) and "2 run(s)" in out
    said = [r.getMessage() for r in caplog.records if r.name == "hpclab.records.store"]
    assert len(said) == len(bad) and all(any(str(b) in s for s in said) for b in bad), said
    report = tmp_path / "r.html"
    assert cli.main(["report", str(root), "-o", str(report)]) == 0
    err = capsys.readouterr().err
    assert sum(line.startswith("hpclab report: skipping a run:") for line in err.splitlines()) == 3
    assert all(str(b) in err for b in bad) and "Traceback" not in err
    assert "b32 linear ×2" in report.read_text()
    # a damaged run named on the command line: one sentence, exit 2, no report
    assert cli.main(["report", str(bad[0].parent), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert str(bad[0]) in err and "half-written" in err and "Traceback" not in err
    assert not (tmp_path / "x.html").exists()


def test_sweep_resume_and_load_run_on_damaged_records(tmp_path, caplog):
    from hpclab.core.errors import RecordError
    from hpclab.records.index import find_finished
    from hpclab.records.store import load_run

    root, good, bad = _runs_root_with_damage(tmp_path)
    cfg = load_run(good[0]).meta["config"]
    assert find_finished(root, cfg, 2) == good[0]  # the damaged ones are read past
    damaged = RunConfig(batch_per_worker=64).to_dict()
    assert find_finished(root, damaged, 2) is None  # no readable result: the point runs again
    for path in bad:
        with pytest.raises(RecordError, match=str(path).replace("+", r"\+")):
            load_run(path.parent)


@pytest.mark.parametrize("option", ["--runs-dir", "--data-dir"])
def test_a_file_as_runs_or_data_dir_is_refused_before_any_engine_starts(tmp_path, capsys, option):
    import time

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for bad, why in ((a_file, "is a file"), (a_file / "sub", "cannot be made")):
        t0 = time.perf_counter()
        assert cli.main(["run", option, str(bad), "--epochs", "1"]) == 2
        err = capsys.readouterr().err
        assert option in err and str(bad) in err and why in err and "Traceback" not in err
        assert time.perf_counter() - t0 < 5  # no engine was started
    assert cli.main(["runs", "--runs-dir", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_options_are_spelled_out_not_abbreviated(capsys):
    """A prefix such as --epoch is refused (one sentence, exit 2): options added later can never
    change what a batch script's abbreviation meant."""
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["run", "--epoch", "2"])
    assert exc.value.code == 2 and "unrecognized arguments: --epoch" in capsys.readouterr().err
