# make demo / make test / make bench: each sets everything up first (tools/setup.sh).
PYTHON := .venv/bin/python
# Two pocl OpenCL devices stand in for GPUs when no CUDA GPU is present.
export POCL_DEVICES ?= pthread pthread
export POCL_MAX_PTHREAD_COUNT ?= 1

.PHONY: setup demo test sweep bench docs gpu-bundle gpu-check clean

setup:
	@tools/setup.sh

demo: setup
	@tools/demo.sh

# The test files run on TEST_WORKERS pytest-xdist workers, each file's tests
# in one worker (they share its module's fixtures), in the order
# tests/conftest.py gives them (the longest first).
TEST_WORKERS ?= 2

test: setup
	.venv/bin/lint-imports
	$(PYTHON) -m pytest -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadfile \
	    --no-loadscope-reorder \
	    --timeout 3600 tests $(PYTEST_ARGS)

# Keras 1.2.2's layers, objectives, metrics, activations, optimizers,
# constraints, regularizers and backend functions on the CPU, one context,
# batch-wise and layer-wise, and Keras 1.0.1's layers (about 30 minutes from
# a cold cache; make test runs the CPU and layer-wise alone).
sweep: setup
	SWEEP=1 $(PYTHON) -m pytest -p no:cacheprovider tests/test_sweep.py $(PYTEST_ARGS)

# The documentation in docs/ as HTML in docs/_build/html; a warning is an error.
docs: setup
	$(PYTHON) -m sphinx -W --keep-going -q -b html docs docs/_build/html

bench:
	@BENCH=1 tools/setup.sh
	$(PYTHON) benchmarks/run_all.py

# A folder (at most 64 MiB) that carries this stack to a machine with an
# NVIDIA GPU and no package index; there: bash dist/gpu-bundle/project/tools/gpu_check.sh OUTDIR
gpu-bundle:
	@tools/gpu_bundle.sh dist/gpu-bundle

# The GPU check from this checkout (GPU_CHECK_DEVICE=opencl0:0: pocl stands in)
gpu-check: setup
	tools/gpu_check.sh dist/gpu-check

clean:
	rm -rf .venv build dist *.egg-info
