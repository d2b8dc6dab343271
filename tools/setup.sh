#!/usr/bin/env bash
# Set up everything `make test`/`make demo`/`make bench` need; skip what is there.
# 1. Debian packages (installed when root, else the exact apt-get line is printed)
# 2. .venv from /usr/bin/python3 --system-site-packages (pygpu comes from Debian)
# 3. pinned pip packages, and this package itself (with its start-up hook)
#    (BENCH=1, for `make bench`: also requirements-bench.txt)
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS="python3-venv python3-pygpu libgpuarray-dev pocl-opencl-icd libclblast-dev libopenblas-dev openmpi-bin"
missing=""
for pkg in $DEBS; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "Missing Debian packages:$missing. Install them, then run make again:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y$missing" >&2
    exit 1
  fi
  echo "Installing Debian packages:$missing"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
fi

if [ ! -x .venv/bin/python ]; then
  echo "Creating .venv (Debian's Python with its site packages, for pygpu)"
  /usr/bin/python3 -m venv --system-site-packages .venv
fi

stamp=.venv/.requirements-installed
if [ ! -f "$stamp" ] || [ requirements.txt -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  echo "Installing pinned pip packages"
  .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -r requirements.txt
  touch "$stamp"
fi

bench_stamp=.venv/.bench-requirements-installed
if [ "${BENCH:-}" = 1 ] && { [ ! -f "$bench_stamp" ] || [ requirements-bench.txt -nt "$bench_stamp" ]; }; then
  echo "Installing pinned pip packages for the benchmarks"
  .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -r requirements-bench.txt
  touch "$bench_stamp"
fi

pkg_stamp=.venv/.package-installed
if [ ! -f "$pkg_stamp" ] || [ -n "$(find setup.py theano_multigpu.pth _theano_multigpu_startup.py theano_multigpu -newer "$pkg_stamp" -name '*.py*' -print -quit)" ]; then
  echo "Installing theano_multigpu into .venv"
  rm -rf build
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation .
  rm -rf build theano_multigpu.egg-info
  touch "$pkg_stamp"
fi

# Keras 1.0.1, the oldest release the shim supports, for tests/test_keras101.py
# (used through PYTHONPATH; the venv keeps Keras 1.2.2).
if [ ! -f .cache/keras-1.0.1/keras/__init__.py ]; then
  echo "Installing keras==1.0.1 into .cache/keras-1.0.1"
  rm -rf .cache/keras-1.0.1
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --target .cache/keras-1.0.1 keras==1.0.1
fi
