"""Start-up cost of the installed hook with KERAS_BACKEND unset.

Every Python of the environment runs the hook's .pth line, which imports
the hook module only when KERAS_BACKEND=theano_multigpu (or
THEANO_MULTIGPU_COMPAT=1).  Figures, KERAS_BACKEND unset: the time of that
line (timeit, in this process), and whether a fresh ``python -c pass``
imported the hook module, Theano, Keras or theano_multigpu (it must not),
next to the median wall time of that ``python -c pass``.

    python benchmarks/startup.py [--runs 30]
"""
import argparse
import os
import site
import subprocess
import sys
import tempfile
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PYTHON, child_env, median, record  # noqa: E402

COMMAND = 'python benchmarks/startup.py'
PTH = 'theano_multigpu.pth'
CHECK = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "('theano', 'keras', 'theano_multigpu', '_theano_multigpu_startup')))")


def installed_pth_line():
    """The import line of the installed .pth, as site runs it."""
    for directory in site.getsitepackages():
        path = os.path.join(directory, PTH)
        if os.path.exists(path):
            with open(path) as f:
                return next(line for line in f if line.startswith('import'))
    raise RuntimeError('expected %s in %s; is theano_multigpu installed in this '
                       'environment (pip install .)?' % (PTH, site.getsitepackages()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--runs', type=int, default=30)
    args = parser.parse_args(argv)
    environment = child_env(tempfile.mkdtemp(prefix='startup_'), backend=None)
    environment.pop('PYTHONDONTWRITEBYTECODE')   # as users run: from .pyc files
    imported = subprocess.run([PYTHON, '-c', CHECK], env=environment, capture_output=True,
                              text=True, check=True).stdout.strip()
    if imported != '[]':
        raise RuntimeError('with KERAS_BACKEND unset, python -c pass imported %s' % imported)
    line = installed_pth_line()
    saved = {key: os.environ.pop(key, None) for key in ('KERAS_BACKEND', 'THEANO_MULTIGPU_COMPAT')}
    try:
        code = compile(line, PTH, 'exec')
        loops = 100000
        line_us = min(timeit.repeat(lambda: exec(code, {}), number=loops, repeat=5)) / loops * 1e6
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    wall = []
    for _ in range(args.runs):
        started = time.perf_counter()
        subprocess.run([PYTHON, '-c', 'pass'], env=environment, check=True)
        wall.append(time.perf_counter() - started)
    wall_ms = median(wall) * 1e3
    print('start-up hook, KERAS_BACKEND unset: its .pth line takes %.2f us of a %.1f ms '
          '`python -c pass` (median of %d); that Python imported none of Theano, Keras, '
          'theano_multigpu or the hook module' % (line_us, wall_ms, args.runs))
    figures = [
        {'name': 'startup/hook .pth line, KERAS_BACKEND unset', 'value': round(line_us, 3),
         'unit': 'us', 'goal': 'nothing measurable', 'command': COMMAND,
         'detail': {'imports_at_start': imported}},
        {'name': 'startup/python -c pass, hook installed', 'value': round(wall_ms, 2),
         'unit': 'ms', 'goal': '', 'command': COMMAND, 'detail': {'runs': args.runs}},
    ]
    record(figures)
    return figures


if __name__ == '__main__':
    main()
