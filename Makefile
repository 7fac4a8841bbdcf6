# hpclab: `make setup` once (a few minutes: it compiles Horovod), then `make lab` or `make test`.
# Every target that needs the stack depends on `setup`, which is fast when nothing changed.

SHELL := /bin/bash
.DEFAULT_GOAL := help
# STACK=py312: the second supported stack (Python 3.12, TensorFlow 2.21 + tf-keras, patched
# Horovod) in .venv-py312; empty: the default stack (Python 3.11, TensorFlow 2.15) in .venv.
STACK ?=
VENV ?= $(if $(filter py312,$(STACK)),.venv-py312,.venv)
LOCK_FILE := requirements/lock$(if $(filter py312,$(STACK)),-py312).txt
PY := $(VENV)/bin/python
PYTEST_FAST := -m "not mpi and not notebook and not browser and not slurm and not hub and not slow"

.PHONY: help setup lint test test-py312 check demo lab strip kernel gpu-build bench lock clean distclean

help: ## show this help
	@echo "hpclab make targets:"
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'
	@echo "Environment: HPCLAB_MPI=system builds against the site MPI on PATH (see scripts/setup.sh)."

setup: ## create .venv, install the locked packages, build/reuse Horovod, run `hpclab doctor --quick`
	@HPCLAB_VENV=$(VENV) $(if $(STACK),HPCLAB_STACK=$(STACK)) scripts/setup.sh

lint: setup ## ruff: lint and format check (fix with `.venv/bin/ruff format . && .venv/bin/ruff check --fix .`)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint ## lint, then all tests: real MPI engines and Horovod, notebooks, the browser, a real Slurm + JupyterHub
	@scripts/install-browser.sh
	@scripts/install-slurm.sh
	@scripts/install-hub.sh
	HPCLAB_REQUIRE_MPI=1 HPCLAB_REQUIRE_SLURM=1 $(PY) -m pytest --durations=30

# The py312 stack's subset: what the stack changes (TensorFlow, Keras, Horovod, NumPy 2) on real
# engines: training, precisions, loss scaling, LARS/LAMB, XLA, time split, averaging, SDC, the CLI
# and two notebooks. The engine-fault tests (killed/hung ranks, controller, mpiexec, full disk)
# exercise process handling, not the stack, and cost ~3.5 min: the default stack runs them.
PY312_TESTS := tests/test_stacks.py tests/test_engine.py tests/test_time_split.py \
  tests/test_averaging.py tests/test_sdc.py tests/test_cli.py \
  "tests/test_notebooks.py::test_notebook_runs_top_to_bottom[00_welcome]" \
  "tests/test_notebooks.py::test_notebook_runs_top_to_bottom[03_precision]"
PY312_SKIP := not killed and not hung and not full_disk
test-py312: ## set up the py312 stack in .venv-py312 (STACK=py312 setup) and run its CI subset of the tests
	@$(MAKE) --no-print-directory STACK=py312 VENV=.venv-py312 setup
	HPCLAB_REQUIRE_MPI=1 .venv-py312/bin/python -m pytest -p no:cacheprovider --durations=15 \
	  -k "$(PY312_SKIP)" $(PY312_TESTS)

check: lint ## the fast tier (under a minute): lint plus every test that starts no engines and takes seconds at most
	$(PY) -m pytest -q $(PYTEST_FAST)

demo: setup ## 2-worker MNIST-1D: batch x {no scaling, linear+warm-up, LARS}, LR window SGD vs LARS -> runs/demo/report.html
	@scripts/demo.sh

lab: setup ## JupyterLab on the workshop notebooks (prints the URL with its token)
	$(VENV)/bin/jupyter lab notebooks/ --ip=127.0.0.1 --no-browser

strip: setup ## clear outputs and execution counts of notebooks/*.ipynb (before a commit)
	$(VENV)/bin/jupyter nbconvert --clear-output --inplace notebooks/*.ipynb

# `make kernel` options (scripts/install_kernel.py): KERNEL_PREFIX empty installs for you only;
# a folder (e.g. /usr/local, or the hub's env) for every user of a Jupyter reading
# <folder>/share/jupyter; "sys" into this venv. KERNEL_ENV="K=V K2=V2" is the kernel's
# environment; KERNEL_SETUP="module load ..." runs in bash before the kernel starts.
KERNEL_PREFIX ?=
KERNEL_ENV ?=
KERNEL_SETUP ?=
kernel: setup ## install the Jupyter kernel "Python (hpclab)" (KERNEL_PREFIX, KERNEL_ENV, KERNEL_SETUP: see above)
	$(PY) scripts/install_kernel.py \
	  $(if $(filter sys,$(KERNEL_PREFIX)),--sys-prefix,$(if $(KERNEL_PREFIX),--prefix "$(KERNEL_PREFIX)")) \
	  $(foreach e,$(KERNEL_ENV),--env "$(e)") $(if $(KERNEL_SETUP),--setup "$(KERNEL_SETUP)")

gpu-build: ## GPU stack in .venv-gpu: tensorflow[and-cuda], NCCL, Horovod with NCCL (needs CUDA 12.x; not in `make test`)
	@scripts/gpu_build.sh

bench: setup ## throughput benchmarks
	$(PY) benchmarks/run.py

lock: setup ## rewrite requirements/lock.txt (STACK=py312: lock-py312.txt) from the venv after changing base.in
	@{ sed -n '/^#/p' $(LOCK_FILE); \
	   $(VENV)/bin/pip freeze --all --exclude-editable | grep -viE '^(pip|horovod|hpclab)(==| @)'; \
	 } > $(LOCK_FILE).new && mv $(LOCK_FILE).new $(LOCK_FILE)
	@echo "$(LOCK_FILE) updated; review it with git diff"

clean: ## remove .venv and runs/ (keeps the compiled Horovod in .cache/wheels)
	rm -rf $(VENV) runs/ .pytest_cache
	find . -name __pycache__ -type d -prune -not -path './.cache/*' -exec rm -rf {} +

distclean: clean ## also remove .cache (the next setup compiles Horovod again)
	rm -rf .cache
