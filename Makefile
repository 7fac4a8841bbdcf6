# hpclab: `make setup` once (a few minutes: it compiles Horovod), then `make lab` or `make test`.
# Every target that needs the stack depends on `setup`, which is fast when nothing changed.

SHELL := /bin/bash
.DEFAULT_GOAL := help
# STACK=py312: the second supported stack (Python 3.12, TensorFlow 2.21 + tf-keras, patched
# Horovod) in .venv-py312; empty: the default stack (Python 3.11, TensorFlow 2.15) in .venv.
# STACK=site: the site's own TensorFlow 2.15 + Horovod (HPCLAB_SITE_PYTHON) in .venv-site.
STACK ?=
VENV ?= $(if $(filter py312,$(STACK)),.venv-py312,$(if $(filter site,$(STACK)),.venv-site,.venv))
LOCK_FILE := requirements/lock$(if $(filter py312,$(STACK)),-py312).txt
PY := $(VENV)/bin/python
PYTEST_FAST := -m "not mpi and not notebook and not browser and not slurm and not hub and not slow"
# Python keeps compiled modules (and pytest its rewritten test modules) in __pycache__: an
# environment that sets PYTHONDONTWRITEBYTECODE makes every run and every engine compile them
# again (`make check`: 65 s with it, 51 s once cached, on 2 cores).
unexport PYTHONDONTWRITEBYTECODE

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

test: lint ## lint, then all tests: real MPI engines and Horovod, notebooks, the browser, a real Slurm + JupyterHub, Open MPI
	@scripts/install-browser.sh
	@scripts/install-slurm.sh
	@scripts/install-openmpi.sh
	@scripts/install-hub.sh
	HPCLAB_REQUIRE_MPI=1 HPCLAB_REQUIRE_SLURM=1 $(PY) -m pytest --durations=30

# The py312 stack's subset, chosen by measured durations (seconds on py312, shared 2-core
# machine): what the stack changes (TensorFlow, Keras, Horovod, NumPy 2) on real engines.
# Training + ranks agree (69), precisions and loss scaling (16), XLA and per-tensor allreduce
# (46), LARS/LAMB (15), the time split (26), averaging (28), SDC (25), the CLI's real run plus
# its quick tests (~65), notebook 00 (the notebook path; notebook 03's precisions are the engine
# tests above): 186 s with notebook 03 on a quiet machine (2026-11-27), about 1 min less now.
# The rest (engine faults, the CLI's sweeps and signals, the timing-bound time-split lessons)
# exercise process handling or timing, not the stack: `make test` runs them on the default one.
E := tests/test_engine.py::test_
PY312_TESTS := tests/test_stacks.py $(E)default_run_learns_and_ranks_agree \
  $(E)mixed_bfloat16_trains_on_cpu $(E)mixed_float16_with_loss_scaling_and_fp16_allreduce \
  $(E)per_tensor_allreduce_and_xla_train_the_same_model $(E)lars_and_lamb_train \
  tests/test_time_split.py::test_the_time_split_adds_up_to_the_measured_step_time_in_every_window \
  tests/test_time_split.py::test_input_and_compute_are_split_where_the_batch_is_large \
  tests/test_averaging.py::test_averaging_the_models_every_step_is_synchronous_sgd \
  tests/test_averaging.py::test_a_stale_update_applies_the_gradient_of_tau_steps_ago \
  tests/test_sdc.py::test_an_exponent_flip_in_one_ranks_weights_splits_the_replicas_and_rollback_heals_them \
  tests/test_sdc.py::test_a_gradient_flip_reaches_every_rank_through_the_allreduce \
  tests/test_cli.py \
  "tests/test_notebooks.py::test_notebook_runs_top_to_bottom[00_welcome]"
PY312_SKIP := not sweep_runs_resumes and not batch_systems_signal and not collapsed_run
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
