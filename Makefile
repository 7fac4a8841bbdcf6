# hpclab: `make setup` once (a few minutes: it compiles Horovod), then `make lab` or `make test`.
# Every target that needs the stack depends on `setup`, which is fast when nothing changed.

SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_FAST := -m "not mpi and not notebook and not browser and not slurm and not hub and not slow"

.PHONY: help setup lint test check demo lab strip kernel gpu-build bench lock clean distclean

help: ## show this help
	@echo "hpclab make targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'
	@echo "Environment: HPCLAB_MPI=system builds against the site MPI on PATH (see scripts/setup.sh)."

setup: ## create .venv, install the locked packages, build/reuse Horovod, run `hpclab doctor --quick`
	@HPCLAB_VENV=$(VENV) scripts/setup.sh

lint: setup ## ruff: lint and format check (fix with `.venv/bin/ruff format . && .venv/bin/ruff check --fix .`)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint ## lint, then all tests: real MPI engines and Horovod, notebooks, the browser, a real Slurm + JupyterHub
	@scripts/install-browser.sh
	@scripts/install-slurm.sh
	@scripts/install-hub.sh
	HPCLAB_REQUIRE_MPI=1 HPCLAB_REQUIRE_SLURM=1 $(PY) -m pytest --durations=30

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

lock: setup ## rewrite requirements/lock.txt from .venv after changing requirements/base.in
	@{ sed -n '/^#/p' requirements/lock.txt; \
	   $(VENV)/bin/pip freeze --all --exclude-editable | grep -viE '^(pip|horovod|hpclab)(==| @)'; \
	 } > requirements/lock.txt.new && mv requirements/lock.txt.new requirements/lock.txt
	@echo "requirements/lock.txt updated; review it with git diff"

clean: ## remove .venv and runs/ (keeps the compiled Horovod in .cache/wheels)
	rm -rf $(VENV) runs/ .pytest_cache
	find . -name __pycache__ -type d -prune -not -path './.cache/*' -exec rm -rf {} +

distclean: clean ## also remove .cache (the next setup compiles Horovod again)
	rm -rf .cache
