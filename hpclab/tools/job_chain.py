"""The tail of a batch job script that resumes itself: a checkpointing `hpclab run`/`sweep` that
the time limit stops goes on in a follow-up job, from its checkpoint.

Slurm sends the batch shell SIGUSR1 the time the script asked before the job's time limit
(``#SBATCH --signal=B:USR1@120``). The script runs hpclab in the background and forwards the
signal to it (a shell defers a trap until its foreground child ends; ``wait`` returns at once),
so hpclab writes a checkpoint and stops the run on every rank after the same step (exit 130).
Then, and only after that warning, the script submits itself again as a job that may start when
this one has ended (``sbatch --dependency=afterany:$SLURM_JOB_ID``, Slurm's sbatch manual), with
``HPCLAB_RESUME`` naming the run folder: the follow-up runs ``hpclab run ... --resume FOLDER``,
which goes on from the newest readable checkpoint (:mod:`hpclab.cluster.resume`); a sweep needs
no name, as it resumes its unfinished point by itself (:mod:`hpclab.records.sweep`). A cancel
(``scancel``: SIGTERM) or a failure submits nothing; nor does the :data:`MAX_FOLLOW_UPS`-th
follow-up, so a run that cannot progress does not fill the queue.

A dependent job rather than ``scontrol requeue``: requeueing needs the cluster to allow it
(``JobRequeue``, ``--requeue``) and keeps the job id, hence one output file for every part; a
dependent job works under any configuration and each part keeps its own log.
"""

from __future__ import annotations

import shlex

#: Follow-up jobs one chain may submit (each one resumes the run once).
MAX_FOLLOW_UPS = 20
#: The options that turn checkpoints on (without one there is nothing to resume from).
CHECKPOINT_OPTIONS = ("--checkpoint-every", "--checkpoint-minutes")


def checkpoints_on(argv: list[str]) -> bool:
    """Whether the hpclab command ``argv`` saves checkpoints (an option given, not 0)."""
    for i, word in enumerate(argv):
        for option in CHECKPOINT_OPTIONS:
            value = None
            if word == option and i + 1 < len(argv):
                value = argv[i + 1]
            elif word.startswith(option + "="):
                value = word.split("=", 1)[1]
            if value is not None and value.strip() not in ("0", "0.0", ""):
                return True
    return False


def resumable_lines(command: list[str], python: str) -> list[str]:
    """The script's lines after its environment: ``command`` (``python -m hpclab.tools.cli run
    ...`` or ``... sweep ...``) in the background, the forwarded signals, the follow-up job."""
    is_run = "run" in command[3:4]
    cmd = shlex.join(command)
    lines = [
        "# Resumes itself: SIGUSR1 (the time-limit warning) makes hpclab checkpoint and stop;",
        "# then this script submits itself again, to start when this job ends, and that job",
        "# resumes the run from its checkpoint (hpclab.tools.job_chain).",
        "follow=${HPCLAB_FOLLOW_UPS:-0}",
        "again=()",
    ]
    if is_run:
        lines += [
            'if [ -n "${HPCLAB_RESUME:-}" ]; then again=(--resume "$HPCLAB_RESUME"); fi',
            'summary="hpclab-${SLURM_JOB_ID}.json"',
            f'{cmd} --json "${{again[@]}}" >"$summary" &',
        ]
    else:
        lines += [f'{cmd} "${{again[@]}}" &']
    lines += [
        "child=$! warned=0",
        "trap 'warned=1; kill -USR1 $child 2>/dev/null' USR1",
        "trap 'kill -TERM $child 2>/dev/null' TERM HUP",
        "set +e",
        "wait $child; code=$?",
        "while kill -0 $child 2>/dev/null; do wait $child; code=$?; done  # (a trap ends a wait)",
        "set -e",
    ]
    resume_env, named = "", ""
    if is_run:
        lines += [
            'cat "$summary"',
            "run=$(" + shlex.quote(python) + " -c 'import json,sys; "
            'print(json.load(open(sys.argv[1])).get("path", ""))\' "$summary" || true)',
        ]
        resume_env, named = ",HPCLAB_RESUME=$run", ' && [ -n "$run" ]'
    lines += [
        f'if [ "$warned" = 1 ] && [ "$code" = 130 ] && [ "$follow" -lt {MAX_FOLLOW_UPS} ]{named}; then',
        '  next=$(sbatch --parsable --dependency=afterany:"$SLURM_JOB_ID" '
        f'--export=ALL,HPCLAB_FOLLOW_UPS=$((follow + 1)){resume_env} "$0")',
        '  echo "hpclab job: stopped at the time-limit warning; job $next resumes it"',
        "fi",
        'exit "$code"',
    ]
    return lines


__all__ = ["CHECKPOINT_OPTIONS", "MAX_FOLLOW_UPS", "checkpoints_on", "resumable_lines"]
