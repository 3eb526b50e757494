# labkit — one entry point.  `make lab` to learn, `make test` to check.
#
# Everything lives in a virtual environment in .venv (created on first use).
# TORCH picks the PyTorch release (default torch==2.13.0). On Linux, PyPI's build of it is the
# CUDA build: right for an NVIDIA GPU as it is. Without a GPU, install the CPU build into .venv
# first (README, "Which PyTorch"); for another CUDA version, the wheel pytorch.org's selector gives.

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

# `make test` runs in two lanes, so that both cores stay busy:
#   lane 1: the unit tests, then nbval on the light notebooks (NBVAL_LANE1);
#   lane 2: the portable-truth check on one core, then nbval on the heavy notebooks (NBVAL_LANE2).
# The native nbval runs only where the portable check's AVX2 cap hides something (AVX-512, AMX):
# on an AVX2 CPU the portable check, one thread and no cap, is the notebooks' one run
# (scripts/portable_check.py, "On a CPU without AVX-512").
# Lane 2's log is printed when both are done; any part failing fails the target.
NBVAL        := -m pytest --nbval --nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider
NBVAL_LANE1  := notebooks/00_start_here.ipynb notebooks/01_float_formats.ipynb \
                notebooks/02_underflow_overflow.ipynb notebooks/03_loss_scaling.ipynb \
                notebooks/09_fp8_block_formats.ipynb notebooks/10_lowp_optimizers.ipynb \
                notebooks/11_clinic.ipynb notebooks/99_solutions.ipynb
NBVAL_LANE2  := $(filter-out $(NBVAL_LANE1),$(sort $(wildcard notebooks/*.ipynb)))
LANE2_LOG    := .portable-check.log

test: install  ## install everything: unit tests, nbval over every notebook, and the portable-truth check beside them
	@$(BIN)/python scripts/portable_check.py --cap-differs; case $$? in 0) native=yes;; 3) native=;; \
	   *) echo "scripts/portable_check.py --cap-differs failed: cannot tell whether to run nbval natively"; exit 2;; esac; \
	( $(BIN)/python scripts/portable_check.py; check=$$?; nbval=0; \
	   if [ -n "$$native" ]; then $(BIN)/python $(NBVAL) $(NBVAL_LANE2); nbval=$$?; \
	   else echo "== no native nbval: on this CPU the portable check above was it"; fi; \
	   echo "== lane 2: portable-truth check exit $$check; nbval (heavy notebooks) exit $$nbval"; \
	   test $$check = 0 && test $$nbval = 0 ) > $(LANE2_LOG) 2>&1 & lane2=$$!; \
	$(BIN)/python -m pytest tests labkit; unit=$$?; nbval=0; \
	if [ -n "$$native" ]; then $(BIN)/python $(NBVAL) $(NBVAL_LANE1); nbval=$$?; fi; \
	wait $$lane2; lane2=$$?; \
	echo "== lane 2, run beside: the portable-truth check (scripts/portable_check.py), then nbval on the heavy notebooks:"; \
	cat $(LANE2_LOG); \
	echo "== unit tests: exit $$unit; nbval (light notebooks): exit $$nbval; lane 2: exit $$lane2"; \
	test $$unit = 0 && test $$nbval = 0 && test $$lane2 = 0

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q "$(TORCH)"
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[$(EXTRAS)]"
	touch $@

unit: install  ## unit tests and labkit's >>> examples
	$(BIN)/python -m pytest tests labkit

nbval: install  ## notebooks only
	$(BIN)/python $(NBVAL) notebooks

portable: install  ## nbval again, as a CPU without AVX-512/bf16 and with one thread would run it
	$(BIN)/python scripts/portable_check.py

notebooks: install  ## re-execute every notebook top to bottom and store its outputs
	$(BIN)/python scripts/execute_notebooks.py notebooks/*.ipynb

doctor: install  ## what hardware is here, which precision to use
	$(BIN)/labkit doctor

bench: install  ## measured speed and memory on this machine (prints figures; asserts nothing)
	$(BIN)/labkit bench --framework torch,jax,tf --precision fp32,bf16,fp16 --model mlp,transformer
	$(BIN)/python benchmarks/scaler_replay.py
	$(BIN)/python benchmarks/bench_explorer.py
	$(BIN)/python benchmarks/bench_blocks.py

clean:
	rm -rf $(VENV) .pytest_cache
