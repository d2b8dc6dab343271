#!/usr/bin/env bash
# The demo behind `make demo` (the Makefile runs tools/setup.sh first).
#
# An unchanged Keras 1.2.2 script, examples/digits_mlp.py, trains through the
# shim on pocl's OpenCL devices, which stand in for GPUs on the CPU.  Each
# step says what it runs before it runs it.  Run some steps only with
#     DEMO_STEPS="info batch_wise" tools/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=.venv/bin/python
MIN_ACCURACY=0.95
ALL_STEPS="info one_context batch_wise layer_wise"

if [ ! -x "$PYTHON" ]; then
  echo "demo: expected the virtual environment $PYTHON, which is not there; run tools/setup.sh (or make demo)" >&2
  exit 1
fi

export KERAS_BACKEND=theano_multigpu
export POCL_DEVICES="${POCL_DEVICES:-pthread pthread}"
export POCL_MAX_PTHREAD_COUNT="${POCL_MAX_PTHREAD_COUNT:-1}"
# Compile caches shared with the tests; no ~/.theanorc, so that the flags
# below are all there is.
export POCL_CACHE_DIR="$PWD/.cache/pocl/shared"
export THEANORC=/dev/null
BASE_FLAGS="base_compiledir=$PWD/.cache/theano,floatX=float32"

say() {
  echo
  echo "== $*"
}

# Run examples/digits_mlp.py with THEANO_FLAGS "$BASE_FLAGS,$1"; check the
# test accuracy it prints.
train_digits() {
  local flags="$BASE_FLAGS,$1" output accuracy
  echo "   KERAS_BACKEND=$KERAS_BACKEND THEANO_FLAGS='$flags' $PYTHON examples/digits_mlp.py"
  output=$(THEANO_FLAGS="$flags" "$PYTHON" examples/digits_mlp.py)
  accuracy=$(printf '%s\n' "$output" | sed -n 's/^test accuracy: //p' | tail -n 1)
  if [ -z "$accuracy" ]; then
    echo "demo: expected a line 'test accuracy: ...' from examples/digits_mlp.py, but it printed:" >&2
    printf '%s\n' "$output" >&2
    return 1
  fi
  echo "   test accuracy: $accuracy (expected >= $MIN_ACCURACY)"
  LAST_ACCURACY=$accuracy
  if ! "$PYTHON" -c "import sys; sys.exit(float(sys.argv[1]) < float(sys.argv[2]))" "$accuracy" "$MIN_ACCURACY"; then
    echo "demo: test accuracy $accuracy is below $MIN_ACCURACY" >&2
    return 1
  fi
}

step_info() {
  say "Step info: python -m theano_multigpu info on two pocl contexts (dev0->opencl0:0, dev1->opencl0:1)"
  THEANO_FLAGS="$BASE_FLAGS,contexts=dev0->opencl0:0;dev1->opencl0:1" "$PYTHON" -m theano_multigpu info
}

step_one_context() {
  say "Step one_context: examples/digits_mlp.py (unchanged Keras 1.2.2) through the shim on one pocl context; about 2-3 minutes on pocl, less once compiled"
  train_digits "contexts=dev0->opencl0:0"
  ONE_CONTEXT_ACCURACY=$LAST_ACCURACY
}

step_batch_wise() {
  say "Step batch_wise: the same script, batch-wise on two pocl contexts, with the placement report of each function (multigpu.report=True) and the progress of each compile from its first second on (multigpu.progress=1)"
  train_digits "contexts=dev0->opencl0:0;dev1->opencl0:1,multigpu.report=True,multigpu.progress=1"
  echo "   test accuracy: one context ${ONE_CONTEXT_ACCURACY:-(step one_context not run)}, two contexts batch-wise $LAST_ACCURACY"
}

step_layer_wise() {
  local budget='dev0->1MiB;dev1->1MiB'
  local flags="contexts=dev0->opencl0:0;dev1->opencl0:1,multigpu.mode=layer,multigpu.device_memory=$budget"
  say "Step layer_wise: the same script, layer-wise on two pocl contexts with memory budgets ($budget, multigpu.device_memory; dev0 also holds Dropout's random generator state, 360 KiB) that one context alone cannot meet"
  echo "   First with every layer on dev0 (multigpu.layer_map='*->dev0'): it must stop before its first step."
  local output
  if output=$(THEANO_FLAGS="$BASE_FLAGS,$flags,multigpu.layer_map=*->dev0" "$PYTHON" examples/digits_mlp.py 2>&1); then
    echo "demo: expected a PlanError with every layer on dev0, but the script ran" >&2
    return 1
  fi
  printf '%s\n' "$output" | sed -n '/PlanError/,$p' | sed 's/^/   /'
  echo "   Then with the balanced plan, which spreads the layers, and the placement reports:"
  train_digits "$flags,multigpu.report=True"
  echo "   test accuracy: one context ${ONE_CONTEXT_ACCURACY:-(step one_context not run)}, two contexts layer-wise $LAST_ACCURACY"
}

for step in ${DEMO_STEPS:-$ALL_STEPS}; do
  case " $ALL_STEPS " in
    *" $step "*) "step_$step" ;;
    *) echo "demo: DEMO_STEPS expects steps from '$ALL_STEPS', but received '$step'" >&2; exit 2 ;;
  esac
done
say "Demo done"
