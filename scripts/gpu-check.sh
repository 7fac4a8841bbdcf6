#!/usr/bin/env bash
# The first run on a GPU node: what of hpclab's GPU path works, in one JSON (about 10 minutes
# once the GPU wheel is built; the first `make gpu-build` compiles Horovod for a few minutes more).
#
# Run it on a node with 2 GPUs or more (inside an allocation, e.g. `salloc -N1 --gpus=2`):
#     scripts/gpu-check.sh                 # all steps; writes gpu-check-<host>-<time>.json
#     scripts/gpu-check.sh --skip-setup    # reuse .venv-gpu as it is
#     scripts/gpu-check.sh --cpu           # the plumbing on a machine without GPU (.venv, gpus=0)
#
# Steps (each one's exit status, seconds and last lines go into the JSON; a failed step does
# not stop the next one):
#   facts      nvidia-smi -L, the driver, nvcc --version, uname -m
#   setup      `make gpu-build` (.venv-gpu: tensorflow[and-cuda], NCCL, Horovod with NCCL)
#   doctor     hpclab doctor (versions, build flags, devices, a 2-rank allreduce)
#   allreduce  2 ranks under mpiexec, one GPU each: a GPU tensor allreduced through NCCL
#   runs       a Lab of 2 ranks that must see GPUs (Lab(gpus=...)): lab.ranks' GPU identities,
#              then one short run per precision x XLA on/off, and one run with the host clock
#              beside the device-synced one (what the time split's sync changes on a GPU)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
SETUP=1 CPU=0
for arg in "$@"; do
  case "$arg" in
    --skip-setup) SETUP=0 ;;
    --cpu) CPU=1 SETUP=0 ;;
    *) echo "gpu-check: unknown option $arg (known: --skip-setup, --cpu)" >&2; exit 2 ;;
  esac
done
VENV="${HPCLAB_GPU_VENV:-.venv-gpu}"
(( CPU )) && VENV="${HPCLAB_VENV:-.venv}"
[[ "$VENV" == /* ]] || VENV="$ROOT/$VENV"
OUT="${GPU_CHECK_OUT:-$ROOT/gpu-check-$(hostname -s)-$(date -u +%Y%m%dT%H%M%SZ).json}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
STEPS=()
T0=$SECONDS

step() {  # step NAME TIMEOUT_S CMD...: run it, keep status, seconds and output
  local name="$1" limit="$2" start=$SECONDS rc
  shift 2
  echo "==> [gpu-check] $name"
  if declare -F "$1" >/dev/null; then "$@" > "$WORK/$name.log" 2>&1  # a function of this script
  else timeout "$limit" "$@" > "$WORK/$name.log" 2>&1; fi
  rc=$?
  tail -n 5 "$WORK/$name.log" | sed 's/^/    /'
  echo "    [gpu-check] $name: exit $rc in $((SECONDS - start)) s"
  echo "$rc $((SECONDS - start))" > "$WORK/$name.status"
  STEPS+=("$name")
}

facts() {
  uname -m
  command -v nvidia-smi >/dev/null && nvidia-smi -L && nvidia-smi --query-gpu=driver_version,name,memory.total,compute_cap --format=csv
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>} SLURM_GPUS_PER_TASK=${SLURM_GPUS_PER_TASK-} SLURM_GPU_BIND=${SLURM_GPU_BIND-}"
  return 0
}
step facts 60 facts
(( SETUP )) && step setup 1800 env HPCLAB_GPU_VENV="$VENV" scripts/gpu_build.sh
step doctor 300 "$VENV/bin/hpclab" doctor

# 2 ranks, one GPU each, a GPU tensor through Horovod (NCCL when built with it).
cat > "$WORK/allreduce.py" <<'PY'
import json, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
gpus = tf.config.list_physical_devices("GPU")
if gpus:
    tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
with tf.device("/GPU:0" if gpus else "/CPU:0"):
    x = tf.fill([1 << 20], float(hvd.rank() + 1))
total = hvd.allreduce(x, op=hvd.Sum)
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "gpus_seen": len(gpus),
                  "device": total.device, "value": float(total[0]), "expected": hvd.size() * (hvd.size() + 1) / 2,
                  "nccl_built": int(hvd.nccl_built()), "cuda_built": hvd.cuda_built()}))
PY
step allreduce 300 "$VENV/bin/mpiexec" -n 2 "$VENV/bin/python" "$WORK/allreduce.py"

# A Lab that must see GPUs, then the runs matrix; one JSON line per run.
cat > "$WORK/runs.py" <<'PY'
import json, sys, tempfile, time
from hpclab.cluster.lab import Lab
from hpclab.core.catalog import PRECISIONS
from hpclab.core.presets import QUICK

cpu = sys.argv[1] == "1"
runs_dir = tempfile.mkdtemp(prefix="gpu-check-runs-")
t0 = time.perf_counter()
lab = Lab(workers=2, gpus=0 if cpu else 1, runs_dir=runs_dir, verbose=False)
print(json.dumps({"lab_start_s": round(time.perf_counter() - t0, 1), "ranks": lab.ranks}), flush=True)
cases = [dict(precision=p, xla=x) for p in PRECISIONS for x in (False, True)]
cases.append(dict(precision="float32", xla=False, time_sync="host"))
try:
    for case in cases:
        cfg = QUICK.replace(max_steps=200, **case)
        start = time.perf_counter()
        try:
            s = lab.run(cfg).wait(timeout=240)
            split = s.get("time_split") or {}
            row = {"case": case, "ok": True, "seconds": round(time.perf_counter() - start, 1),
                   "val_loss": s.get("val_loss"), "val_accuracy": s.get("val_accuracy"), "status": s.get("status"),
                   "samples_per_sec": s.get("samples_per_sec"),
                   "time_split": {k: split.get(k) for k in ("method", "step_ms", "input_ms",
                                  "compute_ms", "allreduce_ms", "apply_ms", "loop_ms")}}
        except Exception as exc:  # a case that fails is the finding; the next one still runs
            row = {"case": case, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(json.dumps(row), flush=True)
finally:
    lab.stop()
PY
step runs 420 "$VENV/bin/python" "$WORK/runs.py" "$CPU"

python3 - "$WORK" "$OUT" "$((SECONDS - T0))" "$CPU" "${STEPS[@]}" <<'PY'
import json, pathlib, platform, sys
work, out, total, cpu, steps = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5:]
report = {"host": platform.node(), "machine": platform.machine(), "cpu_mode": cpu, "seconds": total, "steps": {}}
for name in steps:
    rc, secs = (work / f"{name}.status").read_text().split()
    log = (work / f"{name}.log").read_text(errors="replace")
    entry = {"exit": int(rc), "seconds": int(secs), "tail": log.splitlines()[-30:]}
    jsons = []
    for line in log.splitlines():
        if line.startswith("{"):
            try:
                jsons.append(json.loads(line))
            except ValueError:
                pass
    if jsons:
        entry["records"] = jsons
    report["steps"][name] = entry
pathlib.Path(out).write_text(json.dumps(report, indent=1))
print(f"gpu-check: wrote {out} ({total} s); failed steps: {[n for n in steps if report['steps'][n]['exit']] or 'none'}")
PY
