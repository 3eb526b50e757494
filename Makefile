# labkit — one entry point.  `make lab` to learn, `make test` to check.
#
# Everything lives in a virtual environment in .venv (created on first use).
# TORCH picks the PyTorch build: the default pin is a CPU-friendly release; on a
# machine with an NVIDIA GPU use `make lab TORCH=torch` (PyPI's CUDA build), or
# install the wheel pytorch.org recommends for your CUDA into .venv first.

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
# the extras installed; add deepspeed for DeepSpeed's ZeRO runs: make test EXTRAS=all,test,deepspeed
EXTRAS ?= all,test
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.labkit-installed
# Jupyter refuses to run as root unless told; containers and CI often are root.
ROOT_OK := $(if $(filter 0,$(shell id -u)),--ServerApp.allow_root=True)

.PHONY: lab test install unit nbval portable notebooks bench doctor clean

lab: install  ## install everything, open JupyterLab on notebooks/ (localhost, token on)
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=notebooks $(ROOT_OK)

# The portable-truth check runs on one core, beside the unit tests and nbval (which use every
# core); its log is printed when they are done, and any of the three failing fails the target.
PORTABLE_LOG := .portable-check.log

test: install  ## install everything: unit tests, nbval over every notebook, and the portable-truth check beside them
	@$(BIN)/python scripts/portable_check.py > $(PORTABLE_LOG) 2>&1 & portable=$$!; \
	$(BIN)/python -m pytest tests; unit=$$?; \
	$(BIN)/python -m pytest --nbval notebooks --nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider; \
	nbval=$$?; wait $$portable; check=$$?; \
	echo "== the portable-truth check, run beside them (scripts/portable_check.py):"; cat $(PORTABLE_LOG); \
	echo "== unit tests: exit $$unit; nbval: exit $$nbval; portable-truth check: exit $$check"; \
	test $$unit = 0 && test $$nbval = 0 && test $$check = 0

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q "$(TORCH)"
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[$(EXTRAS)]"
	touch $@

unit: install  ## unit tests only
	$(BIN)/python -m pytest tests

nbval: install  ## notebooks only
	$(BIN)/python -m pytest --nbval notebooks --nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider

portable: install  ## nbval again, as a CPU without AVX-512/bf16 and with one thread would run it
	$(BIN)/python scripts/portable_check.py

notebooks: install  ## re-execute every notebook top to bottom and store its outputs
	$(BIN)/python scripts/execute_notebooks.py notebooks/*.ipynb

doctor: install  ## what hardware is here, which precision to use
	$(BIN)/labkit doctor

bench: install  ## measured speed and memory on this machine (prints figures; asserts nothing)
	$(BIN)/labkit bench --framework torch,jax,tf --precision fp32,bf16,fp16 --model mlp,transformer
	$(BIN)/python benchmarks/bench_simulate.py
	$(BIN)/python benchmarks/bench_explorer.py

clean:
	rm -rf $(VENV) .pytest_cache
