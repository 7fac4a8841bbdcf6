"""``hpclab plan``: measure a few minutes here (or read a recorded measurement), fit the hardware
and statistical models, and print the plan of an allocation — the table, the paragraph and the
assumptions — with its charts in one HTML file (:mod:`hpclab.studies.planner`).

    hpclab plan                                   # ~3 min of measurement on 2 ranks here
    hpclab plan --measurements plan.json          # no engines: a recorded measurement
    hpclab plan --measurements plan.json --inter-gbit 200 --gpus-per-node 4 \\
        --device-samples-per-s 2500               # the same model on a target cluster
    hpclab plan --replay data/scaling-traces/pollux-osdi21/imagenet --target 0.75
                                                  # the planner against a real cluster
    hpclab plan --measurements my-trace/ --target 0.75 --workers 8,64,512,1024
                                                  # someone else's 1-2 GPU timings

Every plan prints the replay's own error on the shared real-cluster traces
(:func:`hpclab.core.replay.shared_replay_errors`, computed when the plan is made).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hpclab.studies.plan_measure import TARGET
from hpclab.tools.cli_progress import say
from hpclab.tools.cli_run import positive_int, positive_ints

DEFAULT_BATCHES = [32, 64, 128, 256, 512, 1024, 2048]
SHOWN = (
    "workers",
    "global_batch",
    "local_batch",
    "steps",
    "step_s",
    "time_s",
    "gpu_hours",
    "node_hours",
    "hardware_efficiency",
    "statistical_efficiency",
    "named",
)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number > 0")
    return value


def _replay_options(parser: argparse.ArgumentParser) -> None:
    """``--replay`` and its flag: the planner checked against a real cluster's measurements."""
    group = parser.add_argument_group("replay (the planner against real clusters)")
    group.add_argument(
        "--replay",
        type=Path,
        default=None,
        metavar="PATH",
        help="replay the planner on a real cluster's measurements: a workload folder in the "
        "Pollux trace format (placements.csv, validation-<B>.csv) or the MLPerf table",
    )
    group.add_argument(
        "--lower-is-better",
        action="store_true",
        help="with --replay: the metric is a loss (reached at or below --target)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpclab plan``."""
    src = parser.add_argument_group("measurement")
    src.add_argument(
        "--measurements",
        type=Path,
        default=None,
        metavar="FILE|DIR",
        help="a recorded measurement (JSON from --save), or a folder of someone else's in the "
        "trace format (placements.csv timed on 1-2 GPUs, validation-<B>.csv; needs --target): "
        "no engines start",
    )
    src.add_argument(
        "--save",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the measurement as JSON, to plan again without measuring",
    )
    src.add_argument(
        "--target",
        type=float,
        default=None,
        metavar="VALUE",
        help=f"held-out accuracy to reach (default: {TARGET}); with --replay, the trace's metric",
    )
    src.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the measurement's runs are recorded",
    )
    src.add_argument(
        "--data-dir", type=Path, default=None, metavar="DIR", help="generated and staged datasets"
    )
    _replay_options(parser)
    grid = parser.add_argument_group("choices planned")
    grid.add_argument(
        "--workers",
        type=positive_ints,
        default=[1, 2, 4, 8, 16, 32, 64],
        metavar="N[,N...]",
        help="rank counts (default: 1,2,...,64)",
    )
    grid.add_argument(
        "--batches",
        type=positive_ints,
        default=DEFAULT_BATCHES,
        metavar="B[,B...]",
        help="global batches (default: 32,...,2048)",
    )
    target = parser.add_argument_group("a target cluster (entered instead of this machine)")
    target.add_argument(
        "--gpus-per-node",
        type=positive_int,
        default=None,
        metavar="G",
        help="ranks (GPUs) per node",
    )
    target.add_argument(
        "--inter-gbit",
        type=positive_float,
        default=None,
        metavar="X",
        help="one node's network bandwidth (Gbit/s)",
    )
    target.add_argument(
        "--inter-latency-us",
        type=positive_float,
        default=2.0,
        metavar="X",
        help="network latency per message (µs; default: 2)",
    )
    target.add_argument(
        "--intra-gbs",
        type=positive_float,
        default=None,
        metavar="X",
        help="bandwidth between ranks of a node (GB/s; default: as measured)",
    )
    target.add_argument(
        "--intra-latency-us",
        type=positive_float,
        default=5.0,
        metavar="X",
        help="latency between ranks of a node (µs; default: 5)",
    )
    target.add_argument(
        "--device-samples-per-s",
        type=positive_float,
        default=None,
        metavar="R",
        help="one device's training rate (samples/s) with the model, instead of this CPU's",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("plan.html"),
        metavar="FILE",
        help="the HTML file with the charts (default: plan.html)",
    )
    out.add_argument("--json", action="store_true", help="print the plan as one JSON line")


def _network(args, measured):
    """The target cluster's network from the options, or None (this machine's, measured)."""
    from hpclab.core.hardware_model import Link, Network

    if args.inter_gbit is None and args.gpus_per_node is None and args.intra_gbs is None:
        return None
    intra = (
        Link(args.intra_latency_us * 1e-6, args.intra_gbs * 1e9, "entered")
        if args.intra_gbs is not None
        else measured
    )
    inter = (
        Link.from_gbit(args.inter_gbit, args.inter_latency_us, "entered")
        if args.inter_gbit is not None
        else None
    )
    return Network(intra=intra, inter=inter, per_node=args.gpus_per_node or 0)


def run(args: argparse.Namespace) -> int:
    """Measure (or load), fit, plan, print, write the charts."""
    from hpclab.studies import planner

    if args.replay is not None:
        from hpclab.tools.cli_replay import run_replay

        return run_replay(args)
    if args.measurements is not None and args.measurements.is_dir():
        return _plan_from_trace(args)
    if args.target is None:
        args.target = TARGET
    if not 0 < args.target <= 1:
        from hpclab.core.errors import ConfigError

        raise ConfigError(f"--target is a held-out accuracy in (0, 1]; you passed {args.target!r}.")
    if args.measurements is not None:
        measurements = planner.Measurements.load(args.measurements)
    else:
        from hpclab.cluster.lab import Lab

        say("measuring on 2 ranks here (about three minutes) ...")
        with Lab(workers=2, runs_dir=args.runs_dir, data_dir=args.data_dir) as lab:
            measurements = planner.measure(lab, target=args.target)
    if args.save is not None:
        measurements.save(args.save)
        say(f"measurement saved to {args.save}")
    measured_link = planner.fit_hardware(measurements).network.intra
    result = planner.plan(
        measurements=measurements,
        workers=args.workers,
        batches=args.batches,
        network=_network(args, measured_link),
        device_samples_per_s=args.device_samples_per_s,
    )
    _write_html(result, args.output)
    _print_plan(result.allocation, args.json)
    say(f"charts written to {args.output}")
    return 0


def _print_plan(plan, as_json: bool) -> None:
    """The plan: one JSON line, or the Pareto table, paragraph and assumptions; both with the
    replay's own error on the shared traces (:func:`_replay_error`)."""
    error = _replay_error()
    if as_json:
        print(
            json.dumps(
                {
                    "rows": list(plan.rows),
                    "paragraph": plan.paragraph,
                    "assumptions": [a.__dict__ for a in plan.assumptions],
                    "replay_error": error,
                }
            )
        )
        return
    table = plan.table()
    shown = table[table["pareto"]][list(SHOWN)]
    print("The Pareto set (time vs GPU-hours):")
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print()
    print(plan.paragraph)
    print()
    print("Assumptions:")
    for a in plan.assumptions:
        print(f"  [{a.kind}] {a.what}")
    print()
    print(error["sentence"] if error else "(the replay's error: the shared traces are not here)")


def _plan_from_trace(args) -> int:
    """``--measurements DIR``: a folder in the trace format, someone else's cluster."""
    from hpclab.core.errors import ConfigError
    from hpclab.studies import planner

    if args.target is None:
        raise ConfigError(
            "--measurements DIR (a trace folder) needs --target VALUE: the value of its "
            "validation-<B>.csv 'metric' to reach (--lower-is-better for a loss)."
        )
    result = planner.plan_from_trace(
        args.measurements,
        args.target,
        lower_is_better=args.lower_is_better,
        workers=args.workers,
        batches=args.batches if args.batches != DEFAULT_BATCHES else None,
        per_node=args.gpus_per_node,
    )
    _write_html(result, args.output)
    _print_plan(result.allocation, args.json)
    say(f"charts written to {args.output}")
    return 0


def _replay_error() -> dict | None:
    """The replay's step-time error on the shared traces, run now (None where the traces are
    not beside the package: an install without the repository's data/)."""
    from hpclab.core import replay, traces

    if not (traces.traces_dir() / "pollux-osdi21").is_dir():
        return None
    errors = replay.shared_replay_errors()
    return {
        "median": errors["median"],
        "p90": errors["p90"],
        "workloads": sorted(errors["workloads"]),
        "sentence": replay.error_sentence(errors),
    }


def _write_html(result, path: Path) -> None:
    from hpclab.views.charts.allocation_chart import critical_batch_figure, pareto_figure

    parts = [
        pareto_figure(result.allocation).to_html(full_html=False, include_plotlyjs="inline"),
        critical_batch_figure(
            result.statistics, result.measurements.sweep if result.measurements else None
        ).to_html(full_html=False, include_plotlyjs=False),
    ]
    notes = "".join(f"<li>[{a.kind}] {a.what}</li>" for a in result.allocation.assumptions)
    html = (
        "<!doctype html><meta charset='utf-8'><title>hpclab plan</title>"
        f"<h1>Plan</h1><p>{result.allocation.paragraph}</p>{''.join(parts)}"
        f"<h2>Assumptions</h2><ul>{notes}</ul>"
    )
    Path(path).write_text(html, encoding="utf-8")
