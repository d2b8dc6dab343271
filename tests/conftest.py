"""Shared test helpers.

Theano reads its flags once, at import, so every configuration runs in a
fresh Python process: ``run_python`` starts one with the venv's interpreter
(the start-up hook installed), a fresh HOME (Keras writes keras.json there)
and the Theano/pocl compile caches shared between tests
(``benchmarks/harness.py``, which the benchmarks share).
"""
import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'benchmarks'))
from harness import CACHE, EACH_RANK_ITS_POCL_CACHE, MPIRUN, PYTHON, REPO  # noqa: E402,F401
from harness import pocl_cache_of_this_worker, pocl_caches_side_by_side, rank_slots  # noqa: E402
from harness import child_env  # noqa: E402


CHILDREN = os.path.join(REPO, 'tests', 'children')
# Keras 1.0.1, the oldest release supported, which tools/setup.sh installs
# here (the venv keeps 1.2.2); a child finds it first through PYTHONPATH.
KERAS_101 = os.path.join(REPO, '.cache', 'keras-1.0.1')
# Contexts on the two pocl devices; three and four reuse each device.
ONE = 'contexts=dev0->opencl0:0'
TWO = 'contexts=dev0->opencl0:0;dev1->opencl0:1'
THREE = 'contexts=dev0->opencl0:0;dev1->opencl0:1;dev2->opencl0:0'
FOUR = 'contexts=dev0->opencl0:0;dev1->opencl0:1;dev2->opencl0:0;dev3->opencl0:1'

# Theano's C code for the tests is compiled without optimisation: the tests'
# models are tiny, so compiling dominates a cold run, and g++ -O0 takes half
# the time of Theano's -O3.  Its own compile-cache key keeps these modules
# apart from the -O3 ones that benchmarks and users load.
TEST_COMPILE_FLAGS = 'gcc.cxxflags=-O0 -g0'


def python_env(home, flags='', backend='theano_multigpu', extra=None, slot=None):
    """benchmarks/harness.py's child environment, compiling with
    TEST_COMPILE_FLAGS (``slot``: see child_env)."""
    return child_env(home, ','.join(f for f in (TEST_COMPILE_FLAGS, flags) if f), backend, extra,
                     slot)


def side_by_side(keys, ranks=None):
    """The pocl caches of children running side by side, one per key (a
    slot each, its index; one per rank for keys in ``ranks``):
    ({key: slot}, context manager)."""
    ranks = ranks or {}
    slots = dict((key, slot) for slot, key in enumerate(keys))
    caches = []
    for key in keys:
        caches += rank_slots(slots[key], ranks[key]) if key in ranks else [slots[key]]
    return slots, pocl_caches_side_by_side(caches)


def run_side_by_side(keys, run, ranks=None, at_once=None):
    """{key: run(key, slot)} for each of ``keys``: the children side by side,
    ``at_once`` at a time (all by default), each in the pocl cache of its
    slot (``side_by_side``; one per rank for keys in ``ranks``)."""
    keys = list(keys)
    slots, caches = side_by_side(keys, ranks)
    with caches:
        pool = ThreadPoolExecutor(at_once or max(len(keys), 1))
        try:
            futures = dict((key, pool.submit(run, key, slots[key])) for key in keys)
            return dict((key, future.result()) for key, future in futures.items())
        finally:
            # After a child failed, the children not yet started never start;
            # those running finish (or end by their timeouts) before their
            # caches are merged.
            pool.shutdown(wait=True, cancel_futures=True)


def train_models(base, flags, models, steps, batch, ranks=None):
    """{configuration: {key: array}}: tests/children/train_models.py's
    results for each configuration (a key of ``flags`` and ``models``),
    the children running side by side.  A configuration in ``ranks``
    ({configuration: number of MPI ranks}) runs under mpirun; its results
    are rank 0's, and rank r's under the key (configuration, r)."""
    import numpy as np
    ranks = ranks or {}

    def train(key, slot):
        home = base / ('home_%s' % key)
        home.mkdir()
        out = str(home / 'out_{rank}.npz')
        run_python(home, flags=flags[key], timeout=3600, ranks=ranks.get(key), slot=slot,
                   args=[os.path.join(CHILDREN, 'train_models.py'), out, str(steps),
                         str(batch)] + list(models[key]))
        return [dict(np.load(out.replace('{rank}', str(r)))) for r in range(ranks.get(key, 1))]

    results = {}
    for key, per_rank in run_side_by_side(flags, train, ranks).items():
        results[key] = per_rank[0]
        results.update(((key, r), out) for r, out in enumerate(per_rank) if r)
    return results


def have_pocl_devices(n=2):
    """True when pocl shows at least ``n`` OpenCL devices (POCL_DEVICES)."""
    try:
        import pygpu.gpuarray as gpuarray
        return (gpuarray.count_platforms('opencl') > 0
                and gpuarray.count_devices('opencl', 0) >= n)
    except Exception:
        return False


def requires(present, reason):
    """A mark: the test skips where ``present`` is false, with ``reason``,
    but fails under CI=true, where tools/setup.sh installed everything."""
    return pytest.mark.requires(present=bool(present), reason=reason)


def missing(reason):
    """Skip the running test or fixture for ``reason``, or fail under CI=true."""
    if os.environ.get('CI') == 'true':
        pytest.fail('CI=true, where every part is installed, but: %s' % reason)
    pytest.skip(reason)


def pytest_configure(config):
    config.addinivalue_line('markers', 'requires(present, reason): see conftest.requires')


# The files that take longest cold, longest first: pytest-xdist hands the
# files to its workers in this order (the rest after, in their own order),
# so no long file starts last.
LONGEST_FIRST = ['test_batchwise.py', 'test_sweep.py', 'test_mpi.py', 'test_compat.py',
                 'test_against_the_cpu.py', 'test_layerwise.py', 'test_deep_models.py']


def pytest_collection_modifyitems(items):
    def rank(item):
        name = os.path.basename(str(item.fspath))
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)


def pytest_runtest_setup(item):
    for mark in item.iter_markers('requires'):
        if not mark.kwargs['present']:
            missing(mark.kwargs['reason'])


@pytest.fixture(scope='session', autouse=True)
def pocl_cache_of_this_test_worker():
    """Under pytest-xdist each worker's children build kernels in a pocl
    cache of its own (harness.pocl_cache_of_this_worker)."""
    with pocl_cache_of_this_worker():
        yield


needs_pocl = requires(
    have_pocl_devices(2),
    'needs pygpu and two pocl OpenCL devices (POCL_DEVICES="pthread pthread")')
needs_mpirun = requires(shutil.which('mpirun'), 'needs mpirun (Debian openmpi-bin)')


def run_python(home, code=None, flags='', backend='theano_multigpu', args=(),
               extra_env=None, timeout=900, check=True, cwd=None, ranks=None, slot=None):
    """Run ``code`` (a string, dedented) or ``args`` in a fresh Python, or
    with ``ranks`` in that many, started by mpirun.  A child running beside
    others takes a ``slot`` (``side_by_side``); ranks take one each.

    Returns the CompletedProcess; with ``check`` a non-zero exit fails the
    test and shows the child's output.
    """
    command = [PYTHON] + (['-c', textwrap.dedent(code)] if code is not None else []) + list(args)
    caches = contextlib.nullcontext()
    if ranks is not None:
        command = MPIRUN + ['-np', str(ranks)] + EACH_RANK_ITS_POCL_CACHE + command
        if slot is None:
            slots, caches = side_by_side([0], {0: ranks})
            slot = slots[0]
    with caches:
        result = subprocess.run(command, env=python_env(home, flags, backend, extra_env, slot),
                                cwd=cwd or str(home), capture_output=True, text=True,
                                timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail('child Python exited %d\n--- stdout\n%s\n--- stderr\n%s'
                    % (result.returncode, result.stdout, result.stderr[-6000:]))
    return result


@pytest.fixture
def home(tmp_path):
    """A fresh HOME for one child Python."""
    path = tmp_path / 'home'
    path.mkdir()
    return path
