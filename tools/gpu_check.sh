#!/usr/bin/env bash
# The GPU check in one command, on a machine with an NVIDIA GPU and its
# driver (see tools/gpu_check.py for what it runs and writes):
#
#   bash gpu-bundle/project/tools/gpu_check.sh OUTDIR
#
# From a bundle (make gpu-bundle), it first unpacks the bundle's Debian
# packages and wheels under gpu-bundle/root (never over /) with the
# machine's python3, and runs Debian's python3.11 from there; from a
# checkout, the checkout's .venv (make setup).  GPU_CHECK_DEVICE (cuda0)
# picks the device; GPU_CHECK_DEVICE=opencl0:0 lets a pocl device stand in.
# Other options go to gpu_check.py (--models, --rounds, --minutes).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUTDIR [gpu_check.py options]" >&2
  exit 2
fi
OUTDIR=$1
shift
PROJECT=$(cd "$(dirname "$0")/.." && pwd)
BUNDLE=$(dirname "$PROJECT")
DEVICE=${GPU_CHECK_DEVICE:-cuda0}

command -v g++ >/dev/null || {
  echo "Theano compiles its ops with g++, which this machine lacks: install it" \
       "(apt-get install g++, or your distribution's C++ compiler)." >&2
  exit 2
}

if [ -d "$BUNDLE/debs" ] && [ -d "$BUNDLE/wheels" ]; then
  ROOT="$BUNDLE/root"
  if [ ! -f "$ROOT/.unpacked" ]; then
    command -v python3 >/dev/null || { echo "python3 is needed to unpack the bundle" >&2; exit 2; }
    rm -rf "$ROOT"
    python3 "$PROJECT/tools/bundle_unpack.py" "$BUNDLE" "$ROOT"
  fi
  PYTHON="$ROOT/usr/bin/python3.11"
  export LD_LIBRARY_PATH="$ROOT/usr/lib:$ROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$ROOT/usr/bin:$PATH"
  export PYTHONNOUSERSITE=1
  # Theano's C code: the bundle's Python and libgpuarray headers (Debian's
  # pyconfig.h includes <x86_64-linux-gnu/python3.11/pyconfig.h>) and libraries.
  export GPU_CHECK_CXXFLAGS="-I$ROOT/usr/include -L$ROOT/usr/lib -L$ROOT/usr/lib/x86_64-linux-gnu"
  missing=$(ldd "$PYTHON" "$ROOT"/usr/lib/libgpuarray.so.3* \
                "$ROOT"/usr/lib/python3/dist-packages/pygpu/*.so \
                "$ROOT"/usr/lib/python3.11/lib-dynload/_ctypes*.so 2>/dev/null \
            | grep "not found" | sort -u || true)
  if [ -n "$missing" ]; then
    echo "The bundle's Python needs libraries this machine lacks:" >&2
    echo "$missing" >&2
    exit 2
  fi
else
  PYTHON="$PROJECT/.venv/bin/python"
  [ -x "$PYTHON" ] || { echo "no bundle around $PROJECT and no .venv: run make setup" >&2; exit 2; }
  export GPU_CHECK_CXXFLAGS=""
fi

exec "$PYTHON" "$PROJECT/tools/gpu_check.py" "$OUTDIR" --device "$DEVICE" "$@"
