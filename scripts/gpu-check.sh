#!/usr/bin/env bash
# The first run on a GPU node: what of hpclab's GPU path works, in one JSON. Sized for what a
# workshop's node has: one GPU is enough (two ranks on it where the build allows, else one; two
# GPUs add the local_rank binding), and no network on the compute node (a wheelhouse).
#
#     scripts/gpu-check.sh                          # all steps; writes gpu-check-<host>-<time>.json
#     scripts/gpu-check.sh --skip-setup             # reuse .venv-gpu as it is
#     scripts/gpu-check.sh --cpu                    # the plumbing without a GPU (.venv, gpus=0)
#     scripts/gpu-check.sh --out FILE               # the JSON's path
#
# Offline, in two steps (the compute node needs no network; pip and the Horovod build are served
# from DIR, the same Python version and CUDA module on both nodes):
#   1. on a node with the network, after `make gpu-build` (or `make setup` for --cpu) built the
#      Horovod wheel:   scripts/gpu-check.sh --prepare-wheelhouse DIR [--cpu]
#      (pip downloads hpclab's locked requirements, pip itself and, without --cpu,
#      tensorflow[and-cuda]==2.15.1 into DIR; the cached Horovod wheels go to DIR/horovod)
#   2. on the compute node: scripts/gpu-check.sh --wheelhouse DIR [--cpu]
#      (PIP_NO_INDEX=1, PIP_FIND_LINKS=DIR, HPCLAB_WHEEL_CACHE=DIR/horovod: setup installs from
#      DIR and reuses the wheel; --cpu then sets up a fresh venv in the work folder)
#
# Steps (each one's exit status, seconds, JSON records and last lines go into the report, built
# by scripts/gpu_check.py; a failed step does not stop the next one):
#   facts      nvidia-smi -L / --query-gpu / its header, nvcc --version, the NCCL network plugin
#              on the library path (scripts/site_nccl.py), uname -m
#   setup      `make gpu-build` (.venv-gpu), or with --cpu --wheelhouse a CPU venv from DIR
#   doctor     hpclab doctor (versions, build flags, devices, a 2-rank allreduce)
#   allreduce  1 or 2 ranks under mpiexec (scripts/gpu_check.py cases), a GPU tensor through
#              Horovod with NCCL_DEBUG=INFO (the report reads NCCL's version, network and plugin)
#   runs       each GPU binding mode the cluster guide names (per_task, local_rank with 2 GPUs,
#              two ranks sharing one GPU: refused under NCCL), lab.ranks' GPU identities; then one
#              short run per precision x XLA on/off and one with the host clock beside the synced one
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OPTS="$(python3 scripts/gpu_check.py options -- "$@")" || exit 2
eval "$OPTS"  # CPU SETUP WHEELHOUSE PREPARE OUT
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
VENV="${HPCLAB_GPU_VENV:-.venv-gpu}"
(( CPU )) && VENV="${HPCLAB_VENV:-.venv}"
(( CPU )) && [[ -n "$WHEELHOUSE" ]] && VENV="${HPCLAB_VENV:-$WORK/venv}"  # a fresh one, offline
[[ "$VENV" == /* ]] || VENV="$ROOT/$VENV"

prepare_wheelhouse() {  # on a node with the network: everything setup needs, into $1
  local dir="$1" py
  py="$VENV/bin/python"; [[ -x "$py" ]] || py="${HPCLAB_PYTHON:-python3.11}"
  mkdir -p "$dir/horovod" || return 1
  "$py" -m pip download --quiet -d "$dir" "pip>=24" setuptools wheel \
    -r requirements/base.in -c requirements/lock.txt || return 1
  if (( ! CPU )); then
    "$py" -m pip download --quiet -d "$dir" "tensorflow[and-cuda]==2.15.1" -c requirements/lock.txt || return 1
  fi
  local copied=0 d
  for d in "$ROOT"/.cache/wheels/*/; do
    [[ -f "$d/build.json" ]] || continue
    cp -rp "${d%/}" "$dir/horovod/" && copied=$((copied + 1))
  done
  (( copied )) || echo "gpu-check: no Horovod wheel in .cache/wheels: run \`make gpu-build\` (or \`make setup\` for --cpu) here first, or the compute node compiles Horovod itself." >&2
  echo "gpu-check: wheelhouse $dir: $(find "$dir" -maxdepth 1 -name '*.whl' | wc -l) wheels, $copied Horovod build(s), $(du -sh "$dir" | cut -f1)"
}
if [[ -n "$PREPARE" ]]; then prepare_wheelhouse "$PREPARE"; exit $?; fi
if [[ -n "$WHEELHOUSE" ]]; then  # offline: pip reads only DIR, setup reuses DIR's Horovod wheel
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE" HPCLAB_WHEEL_CACHE="$WHEELHOUSE/horovod"
fi
OUT="${OUT:-${GPU_CHECK_OUT:-$ROOT/gpu-check-$(hostname -s)-$(date -u +%Y%m%dT%H%M%SZ).json}}"
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
skip() { echo "skip $2" > "$WORK/$1.status"; STEPS+=("$1"); echo "==> [gpu-check] $1: skipped ($2)"; }

facts() {
  uname -m
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L | tee "$WORK/smi-L.txt"
    nvidia-smi --query-gpu=index,uuid,name,compute_cap,driver_version,memory.total \
      --format=csv,noheader,nounits | tee "$WORK/smi-query.csv"
    nvidia-smi > "$WORK/smi.txt" 2>&1; head -n 4 "$WORK/smi.txt"
  fi
  if command -v nvcc >/dev/null; then nvcc --version | tee "$WORK/nvcc.txt"; fi
  python3 scripts/site_nccl.py plugins | tee "$WORK/nccl-plugin.txt"
  echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>} SLURM_GPUS_PER_TASK=${SLURM_GPUS_PER_TASK-} SLURM_GPU_BIND=${SLURM_GPU_BIND-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH-} NCCL_NET_PLUGIN=${NCCL_NET_PLUGIN-}"
  return 0
}
step facts 60 facts
GPUS="$(grep -c '^GPU ' "$WORK/smi-L.txt" 2>/dev/null || true)"; GPUS="${GPUS:-0}"

if (( SETUP )) && (( CPU )); then
  step setup 1800 env HPCLAB_VENV="$VENV" HPCLAB_GPU=none scripts/setup.sh
elif (( SETUP )); then
  step setup 1800 env HPCLAB_GPU_VENV="$VENV" scripts/gpu_build.sh
else
  skip setup "--skip-setup or --cpu: ${VENV#"$ROOT"/} used as it is"
fi
NCCL=0
if (( ! CPU )); then
  NCCL="$(TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import horovod.tensorflow as h; print(int(bool(h.nccl_built())))' 2>/dev/null || echo 0)"
fi
CPU_FLAG=(); (( CPU )) && CPU_FLAG=(--cpu)
python3 scripts/gpu_check.py cases --gpus "$GPUS" --nccl "$NCCL" "${CPU_FLAG[@]}" > "$WORK/cases.json"
RANKS="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["workers"])' "$WORK/cases.json")"
step doctor 300 "$VENV/bin/hpclab" doctor

# RANKS ranks, one GPU each where there are enough, a GPU tensor through Horovod (NCCL when built with it).
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
ok = float(total[0]) == hvd.size() * (hvd.size() + 1) / 2
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "gpus_seen": len(gpus), "ok": ok,
                  "device": total.device, "value": float(total[0]),
                  "nccl_built": int(hvd.nccl_built()), "cuda_built": hvd.cuda_built()}))
PY
step allreduce 300 env NCCL_DEBUG=INFO "$VENV/bin/mpiexec" -n "$RANKS" "$VENV/bin/python" "$WORK/allreduce.py"

# The binding modes (each its own Lab), then the runs matrix; one JSON line per case.
cat > "$WORK/runs.py" <<'PY'
import json, os, sys, tempfile, time
from hpclab.cluster.lab import Lab
from hpclab.core.catalog import PRECISIONS
from hpclab.core.presets import QUICK

plan = json.load(open(sys.argv[1]))
runs_dir = tempfile.mkdtemp(prefix="gpu-check-runs-")

def binding(case):  # one Lab per mode, its variables set for the engines it starts
    saved = {k: os.environ.get(k) for k in case["env"]}
    os.environ.update(case["env"])
    t0 = time.perf_counter()
    try:
        lab = Lab(workers=case["workers"], gpus=1, runs_dir=runs_dir, verbose=False)
    except Exception as exc:  # under NCCL, two ranks on one GPU must be refused with a sentence
        got = {"refused": f"{type(exc).__name__}: {exc}"[:2000]}
    else:
        got = {"ranks": [{k: r.get(k) for k in ("rank", "gpu", "gpus", "gpu_binding")} for r in lab.ranks]}
        lab.stop()
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    trained = "ranks" in got
    ok = trained == (case["expect"] == "trains") and (
        not trained or all(r["gpu_binding"] == case["mode"] for r in got["ranks"]))
    return {"case": f"binding:{case['mode']}", "ok": ok, "expect": case["expect"],
            "seconds": round(time.perf_counter() - t0, 1), **got}

for case in plan["cases"]:
    if "skipped" not in case:
        print(json.dumps(binding(case)), flush=True)
lab = Lab(workers=plan["workers"], gpus=plan["gpus"], runs_dir=runs_dir, verbose=False)
print(json.dumps({"case": "lab", "ok": True, "ranks": lab.ranks}), flush=True)
cases = [dict(precision=p, xla=x) for p in PRECISIONS for x in (False, True)]
cases.append(dict(precision="float32", xla=False, time_sync="host"))
bf16 = None
if plan["gpus"] == 0:  # a CPU without bfloat16 (no AVX-512 and no Eigen path) skips it, saying why
    from hpclab.rank.bfloat16 import describe, probe
    bf16 = probe()
try:
    for case in cases:
        if case["precision"] == "mixed_bfloat16" and bf16 is not None and bf16["ok"] is False:
            print(json.dumps({"case": case, "skipped": describe(bf16)}), flush=True)
            continue
        start = time.perf_counter()
        try:
            s = lab.run(QUICK.replace(max_steps=200, **case)).wait(timeout=240)
            split = s.get("time_split") or {}
            row = {"case": case, "ok": s.get("status") == "finished", "status": s.get("status"),
                   "seconds": round(time.perf_counter() - start, 1), "val_accuracy": s.get("val_accuracy"),
                   "samples_per_sec": s.get("samples_per_sec"),
                   "time_split": {k: split.get(k) for k in ("method", "step_ms", "input_ms",
                                  "compute_ms", "allreduce_ms", "apply_ms", "loop_ms")}}
        except Exception as exc:  # a case that fails is the finding; the next one still runs
            row = {"case": case, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(json.dumps(row), flush=True)
finally:
    lab.stop()
PY
step runs 480 "$VENV/bin/python" "$WORK/runs.py" "$WORK/cases.json"

WRITER=python3; [[ -x "$VENV/bin/python" ]] && WRITER="$VENV/bin/python"
MODE=gpu; (( CPU )) && MODE=cpu
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$WRITER" scripts/gpu_check.py write "$WORK" "$OUT" "${STEPS[@]}" \
  --seconds "$((SECONDS - T0))" --mode "$MODE" --wheelhouse "$WHEELHOUSE"
