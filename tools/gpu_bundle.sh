#!/usr/bin/env bash
# make gpu-bundle: a folder (at most 64 MiB) that carries this stack to a
# machine with an NVIDIA GPU and no package index, for tools/gpu_check.sh.
#
#   tools/gpu_bundle.sh [OUT]        (default dist/gpu-bundle)
#
# Built here, where Debian's archive and PyPI are reachable:
#   debs/     Debian's python3.11 (with its headers, for Theano's C code, and
#             distutils and pkg_resources, which Theano and Keras import),
#             python3-pygpu, libgpuarray3 and libgpuarray-dev
#   wheels/   cp311 wheels of the pinned packages the check imports (numpy,
#             h5py, pyyaml, six, cython, mako and markupsafe for pygpu, Theano,
#             Keras) and of this project;
#             not scipy (36 MB: Theano and Keras import without it), nor the
#             MPI, test and lint tools
#   project/  this repository's committed files (git archive HEAD)
# On the target, tools/gpu_check.sh unpacks debs and wheels under
# OUT/root, never over /.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist/gpu-bundle}
LIMIT_MIB=64
DEBS="python3.11 python3.11-minimal libpython3.11 libpython3.11-minimal libpython3.11-stdlib
      libpython3.11-dev python3-distutils python3-lib2to3 python3-pkg-resources python3-pygpu libgpuarray3 libgpuarray-dev"
WHEELS="numpy h5py pyyaml six cython mako markupsafe"
SOURCE_ONLY="theano keras"   # sdists on PyPI: built into wheels here

pinned() {   # the version requirements.txt or constraints.txt pins for package $1
  local line
  line=$(grep -ih "^$1==" requirements.txt constraints.txt | head -1)
  [ -n "$line" ] || { echo "$1 is not pinned in requirements.txt or constraints.txt" >&2; exit 1; }
  echo "$line"
}

if [ ! -x .venv/bin/pip ]; then
  tools/setup.sh
fi
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "note: the bundle carries the last commit; uncommitted changes are left out" >&2
fi

rm -rf "$OUT"
mkdir -p "$OUT/debs" "$OUT/wheels" "$OUT/project"
echo "Debian packages:"
(cd "$OUT/debs" && apt-get download $DEBS 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
for pkg in $DEBS; do
  ls "$OUT/debs/${pkg}_"*.deb >/dev/null 2>&1 || { echo "apt-get download $pkg failed" >&2; exit 1; }
done

echo "Wheels (cp311, manylinux):"
specs=""
for pkg in $WHEELS; do specs="$specs $(pinned "$pkg")"; done
.venv/bin/pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.11 --implementation cp --abi cp311 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$OUT/wheels" $specs
specs=""
for pkg in $SOURCE_ONLY; do specs="$specs $(pinned "$pkg")"; done
.venv/bin/pip wheel -q --disable-pip-version-check --no-deps -w "$OUT/wheels" $specs
# The project's wheel from the same commit as project/ (not the working tree).
git archive HEAD | tar -x -C "$OUT/project"
staging=$(mktemp -d)
cp -r "$OUT/project/." "$staging"
.venv/bin/pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  -w "$OUT/wheels" "$staging"
rm -rf "$staging"
# Figures and plots are not needed there.
rm -f "$OUT"/project/benchmarks/*.png

size_kib=$(du -sk "$OUT" | cut -f1)
ls -1 "$OUT/debs" "$OUT/wheels" | grep -v ':$' | grep -v '^$' > "$OUT/MANIFEST"
echo "$size_kib KiB in all" >> "$OUT/MANIFEST"
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
  echo "the bundle is $size_kib KiB, over $LIMIT_MIB MiB" >&2
  exit 1
fi
echo "Bundle: $OUT ($((size_kib / 1024)) MiB of at most $LIMIT_MIB)."
echo "On the GPU machine: bash $OUT/project/tools/gpu_check.sh OUTDIR"
