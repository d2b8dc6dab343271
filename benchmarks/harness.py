"""What benchmarks and tests share: the child-process environment, and
benchmarks/results.json with its Markdown table.

Theano reads its flags once, at import, so every configuration runs in a
fresh Python with the venv's interpreter (the start-up hook installed), a
HOME of its own and the compile caches under .cache/ shared by all runs.
"""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(REPO, '.cache')
PYTHON = sys.executable
RESULTS_JSON = os.path.join(REPO, 'benchmarks', 'results.json')
RESULTS_MD = os.path.join(REPO, 'benchmarks', 'results.md')

# Processes sharing a compile cache take turns compiling (Theano's lock on
# the cache); one that finds the lock taken sleeps 5 to 10 s by default
# before it looks again, so children run side by side mostly slept while
# a module took 2 s to compile.  They look again after 1 to 2 s.
COMPILE_WAIT = 'compile.wait=1'

# mpirun for the tests and benchmarks: Open MPI refuses root without the
# first option and more ranks than cores without the second; ranks on one
# machine talk through shared memory (vader), with no kernel-assisted copy
# (containers often forbid it), and are not pinned to cores.
MPIRUN = ['mpirun', '--allow-run-as-root', '--oversubscribe', '--bind-to', 'none',
          '--mca', 'btl', 'self,vader', '--mca', 'btl_vader_single_copy_mechanism', 'none']

__all__ = ['REPO', 'CACHE', 'PYTHON', 'MPIRUN', 'child_env', 'record', 'median']


def child_env(home, flags='', backend='theano_multigpu', extra=None):
    """Environment for a child Python: KERAS_BACKEND, THEANO_FLAGS, HOME.

    ``backend=None`` leaves KERAS_BACKEND unset; ``extra`` adds variables.
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
    env['POCL_CACHE_DIR'] = os.path.join(CACHE, 'pocl')
    env.setdefault('POCL_DEVICES', 'pthread pthread')
    env.setdefault('POCL_MAX_PTHREAD_COUNT', '1')
    env['PYTHONDONTWRITEBYTECODE'] = '1'
    # A child that crashes in C (a segfault) still shows its Python stack.
    env['PYTHONFAULTHANDLER'] = '1'
    if extra:
        env.update(extra)
    return env


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
        known[figure['name']] = figure
    entries = [known[name] for name in sorted(known)]
    with open(RESULTS_JSON + '.tmp', 'w') as f:
        json.dump(entries, f, indent=1)
        f.write('\n')
    os.replace(RESULTS_JSON + '.tmp', RESULTS_JSON)
    lines = ['# Benchmark results', '',
             'Written by `make bench` (`benchmarks/run_all.py`); every ratio is',
             'measured side by side in one run.  The machine is in each figure\'s',
             '`machine` field of results.json.', '',
             '| figure | value | unit | goal | command |',
             '|---|---|---|---|---|']
    for entry in entries:
        lines.append('| %s | %s | %s | %s | `%s` |' % (
            entry['name'], _format(entry['value']), entry['unit'],
            entry.get('goal', ''), entry['command']))
    with open(RESULTS_MD, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def _format(value):
    if isinstance(value, float):
        return '%.4g' % value
    return str(value)
