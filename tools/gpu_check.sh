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
case "$BUNDLE$OUTDIR" in
  *[,\ ]*) echo "Theano's flags cannot carry paths with commas or spaces: move the bundle" \
                 "and OUTDIR to paths without them" >&2; exit 2 ;;
esac
# Where the user points the loader, searched first for NVRTC and cuBLAS;
# the site-packages of the machine's own Python (pip's nvidia packages).
export GPU_CHECK_USER_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
if command -v python3 >/dev/null; then
  GPU_CHECK_SITES=$(python3 -c 'import site; print(":".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null || true)
  export GPU_CHECK_SITES
fi
unset PYTHONHOME PYTHONPATH

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
    python3 "$PROJECT/tools/bundle_unpack.py" "$BUNDLE" "$ROOT" || {
      echo "the bundle did not unpack (see above)" >&2; exit 2; }
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
  "$PYTHON" -c 'import numpy, pygpu, h5py, yaml, Cython, mako' \
    >/dev/null 2>"$BUNDLE/import-errors.txt" || {
    echo "The bundle's Python cannot import its packages:" >&2
    tail -5 "$BUNDLE/import-errors.txt" >&2
    exit 2; }
else
  PYTHON="$PROJECT/.venv/bin/python"
  [ -x "$PYTHON" ] || { echo "no bundle around $PROJECT and no .venv: run make setup" >&2; exit 2; }
  export GPU_CHECK_CXXFLAGS=""
fi

exec "$PYTHON" "$PROJECT/tools/gpu_check.py" "$OUTDIR" --device "$DEVICE" "$@"
