"""What benchmarks and tests share: the child-process environment, and
benchmarks/results.json with its Markdown table.

Theano reads its flags once, at import, so every configuration runs in a
fresh Python with the venv's interpreter (the start-up hook installed), a
HOME of its own and the compile caches under .cache/ shared by all runs.
"""
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(REPO, '.cache')
PYTHON = sys.executable
RESULTS_JSON = os.path.join(REPO, 'benchmarks', 'results.json')
RESULTS_MD = os.path.join(REPO, 'benchmarks', 'results.md')

# Processes sharing a compile cache take turns compiling (Theano's lock on
# the cache); one that finds the lock taken sleeps 5 to 10 s by default
# before it looks again, while a module takes about a second to compile.
# Under the shim (or THEANO_MULTIGPU_COMPAT) a waiter looks again within
# 0.2 s (compat.theano_fixes); plain Theano children after 1 to 2 s.
COMPILE_WAIT = 'compile.wait=1'

# mpirun for the tests and benchmarks: Open MPI refuses root without the
# first option and more ranks than cores without the second; ranks on one
# machine talk through shared memory (vader), with no kernel-assisted copy
# (containers often forbid it), and are not pinned to cores.
MPIRUN = ['mpirun', '--allow-run-as-root', '--oversubscribe', '--bind-to', 'none',
          '--mca', 'btl', 'self,vader', '--mca', 'btl_vader_single_copy_mechanism', 'none']

# Before a command under mpirun: each rank's pocl cache is its own, its
# slot's suffixed with its rank (rank_slots names them).
EACH_RANK_ITS_POCL_CACHE = ['sh', '-c', 'POCL_CACHE_DIR="$POCL_CACHE_DIR-rank$OMPI_COMM_WORLD_RANK" '
                            'exec "$@"', 'rank']


def rank_slots(slot, ranks):
    """The slots whose pocl caches the ranks of a child in ``slot`` use
    (under EACH_RANK_ITS_POCL_CACHE)."""
    return ['%s-rank%d' % (slot, rank) for rank in range(ranks)]

__all__ = ['REPO', 'CACHE', 'PYTHON', 'MPIRUN', 'EACH_RANK_ITS_POCL_CACHE', 'rank_slots',
           'child_env', 'pocl_cache_dir', 'pocl_cache_of_this_worker', 'pocl_caches_side_by_side',
           'record', 'median', 'add_configurations_option', 'chosen_configurations',
           'package_at']


def child_env(home, flags='', backend='theano_multigpu', extra=None, slot=None):
    """Environment for a child Python: KERAS_BACKEND, THEANO_FLAGS, HOME.

    ``backend=None`` leaves KERAS_BACKEND unset; ``extra`` adds variables;
    a child running beside others takes a ``slot`` (see pocl_caches_side_by_side).
    """
    env = dict(os.environ)
    for key in ('KERAS_BACKEND', 'THEANO_FLAGS', 'THEANO_MULTIGPU_COMPAT', 'THEANORC'):
        env.pop(key, None)
    if backend is not None:
        env['KERAS_BACKEND'] = backend
    compiledir = 'base_compiledir=' + os.path.join(CACHE, 'theano')
    env['THEANO_FLAGS'] = ','.join(f for f in (compiledir, 'floatX=float32', COMPILE_WAIT, flags)
                                   if f)
    env['HOME'] = str(home)
    env['THEANORC'] = os.path.join(str(home), '.theanorc')
    env['POCL_CACHE_DIR'] = pocl_cache_dir(slot)
    env.setdefault('POCL_DEVICES', 'pthread pthread')
    env.setdefault('POCL_MAX_PTHREAD_COUNT', '1')
    env['PYTHONDONTWRITEBYTECODE'] = '1'
    # A child that crashes in C (a segfault) still shows its Python stack.
    env['PYTHONFAULTHANDLER'] = '1'
    if extra:
        env.update(extra)
    return env


def pocl_cache_dir(slot=None):
    """pocl's kernel cache: the shared one, or the one of ``slot``.  A worker
    of pytest-xdist (PYTEST_XDIST_WORKER) has its own of each, seeded from
    and merged into the shared one (``pocl_cache_of_this_worker``)."""
    worker = os.environ.get('PYTEST_XDIST_WORKER')
    base = os.path.join(CACHE, 'pocl', worker) if worker else os.path.join(CACHE, 'pocl')
    return os.path.join(base, 'shared' if slot is None else 'slot%s' % slot)


@contextlib.contextmanager
def pocl_cache_of_this_worker():
    """While a pytest-xdist worker runs, its children build kernels in a
    cache of its own (pocl's cache is not safe for processes that build the
    same program at once), seeded from the shared cache and merged into it
    after."""
    shared = os.path.join(CACHE, 'pocl', 'shared')
    own = pocl_cache_dir()
    if own == shared:
        yield
        return
    _merge_tree(shared, own)
    try:
        yield
    finally:
        _merge_tree(own, shared)


@contextlib.contextmanager
def pocl_caches_side_by_side(slots):
    """pocl's kernel cache is not safe for processes that build the same
    program at once (one can load the other's half-written kernel: pocl
    issue 1480), so children running side by side each use the cache of
    their slot, seeded from the shared cache before and merged into it after."""
    for slot in slots:
        _merge_tree(pocl_cache_dir(), pocl_cache_dir(slot))
    try:
        yield
    finally:
        for slot in slots:
            _merge_tree(pocl_cache_dir(slot), pocl_cache_dir())


def _merge_tree(source, target):
    """Hard-link (or copy) into ``target`` the files of ``source`` it lacks.
    Another process may merge into ``target`` at once: a file appears whole
    (a link, or a copy linked into place) and the first one stays; copies
    still being written (``.partial``) are not merged."""
    for root, _, files in os.walk(source):
        into = os.path.join(target, os.path.relpath(root, source))
        os.makedirs(into, exist_ok=True)
        for name in files:
            source_file, target_file = os.path.join(root, name), os.path.join(into, name)
            if name.endswith('.partial') or os.path.exists(target_file):
                continue
            try:
                os.link(source_file, target_file)
            except FileExistsError:
                pass
            except OSError:
                partial = '%s.%d.partial' % (target_file, os.getpid())
                shutil.copy2(source_file, partial)
                try:
                    os.link(partial, target_file)
                except FileExistsError:
                    pass
                finally:
                    os.unlink(partial)


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return 0.5 * (ordered[middle - 1] + ordered[middle])


def record(figures):
    """Merge ``figures`` (dicts with name, value, unit, goal, command) into
    benchmarks/results.json by name, and rewrite benchmarks/results.md."""
    try:
        with open(RESULTS_JSON) as f:
            known = {entry['name']: entry for entry in json.load(f)}
    except (OSError, ValueError):
        known = {}
    for figure in figures:
        known[figure['name']] = dict(figure, machine=figure.get('machine', _machine()))
    entries = [known[name] for name in sorted(known)]
    with open(RESULTS_JSON + '.tmp', 'w') as f:
        json.dump(entries, f, indent=1)
        f.write('\n')
    os.replace(RESULTS_JSON + '.tmp', RESULTS_JSON)
    lines = ['# Benchmark results', '',
             'Written by `make bench` (`benchmarks/run_all.py`); every ratio is',
             'measured side by side in one run.  The machine is in each figure\'s',
             '`machine` field of results.json (those measured since it was added).', '',
             '| figure | value | unit | goal | command |',
             '|---|---|---|---|---|']
    for entry in entries:
        lines.append('| %s | %s | %s | %s | `%s` |' % (
            entry['name'], _format(entry['value']), entry['unit'],
            entry.get('goal', ''), entry['command']))
    with open(RESULTS_MD, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def add_configurations_option(parser, known, default):
    """``--configurations``: comma-separated names from ``known``."""
    parser.add_argument('--configurations', default=default,
                        help='comma-separated, from %s' % ', '.join(known))


def chosen_configurations(parser, value, known):
    """The names of ``--configurations`` ``value``, each one of ``known``
    (else the parser's error)."""
    chosen = value.split(',')
    for configuration in chosen:
        if configuration not in known:
            parser.error('--configurations expects names from %s, but received %r'
                         % (', '.join(known), configuration))
    return chosen


def _machine():
    """'x86_64, 2 CPUs, Python 3.11.2': where a figure was measured."""
    return '%s, %d CPUs, Python %s' % (platform.machine(), os.cpu_count(),
                                        platform.python_version())


def _format(value):
    if isinstance(value, float):
        return '%.4g' % value
    return str(value)


def package_at(revision, directory):
    """A copy of theano_multigpu as it was at ``revision``, in ``directory``
    (for PYTHONPATH); None where this checkout has no git history."""
    try:
        archive = subprocess.run(['git', '-C', REPO, 'archive', revision, 'theano_multigpu'],
                                 check=True, capture_output=True, timeout=120).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        print('  no "before" side: cannot read %s from git (%s)' % (revision, error))
        return None
    os.makedirs(directory)
    try:
        subprocess.run(['tar', '-x', '-C', directory], input=archive, check=True,
                       capture_output=True, timeout=120)
    except (OSError, subprocess.CalledProcessError) as error:
        print('  no "before" side: cannot unpack %s into %s (%s)' % (revision, directory, error))
        return None
    return directory
