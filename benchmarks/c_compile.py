"""Theano's C modules compiled with and without precompiled headers.

Each side is a fresh Python with a fresh compile cache that compiles the
train, test and predict functions of the bench models (benchmarks/models.py,
``mlp`` and ``cnn``) on the CPU and on one pocl context, with
``multigpu.precompiled_headers`` True or False, with Theano's g++ flags
and with the test suite's (-O0); the sides run in turn.
Figures: the seconds g++ took over all modules (the time inside Theano's
GCC_compiler.compile_str, headers built included) and the modules
compiled, per side; the ratio with over without.

    python benchmarks/c_compile.py [--configurations "cpu,pocl,cpu -O0"]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (PYTHON, add_configurations_option, child_env, chosen_configurations,  # noqa: E402
                     record)

COMMAND = 'python benchmarks/c_compile.py'
# Theano's own g++ flags (-O3) on the CPU and on one pocl context, and the
# test suite's (-O0, tests/conftest.py) on the CPU.
CONFIGURATIONS = {'cpu': '', 'pocl': 'contexts=dev0->opencl0:0',
                  'cpu -O0': 'gcc.cxxflags=-O0 -g0'}
# At -O0 g++ mostly reads headers; at -O3 it mostly optimises.
GOALS = {'cpu -O0': '<= 0.6'}
MODELS = ('mlp', 'cnn')

CHILD = r'''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import theano.gof.cmodule as cmodule
spent = {'seconds': 0.0, 'modules': 0}
compile_str = cmodule.GCC_compiler.compile_str
def timed(*args, **kwargs):
    started = time.perf_counter()
    try:
        return compile_str(*args, **kwargs)
    finally:
        spent['seconds'] += time.perf_counter() - started
        spent['modules'] += 1
cmodule.GCC_compiler.compile_str = staticmethod(timed)
from models import build
started = time.perf_counter()
for name in sys.argv[2].split(','):
    case = build(name, size='bench')
    case.model.train_on_batch(case.x, case.y)
    case.model.test_on_batch(case.x, case.y)
    case.model.predict_on_batch(case.x)
spent['wall'] = time.perf_counter() - started
print(json.dumps(spent))
'''


def compile_once(configuration, use_headers):
    """{'seconds', 'modules', 'wall'} of a fresh Python and compile cache."""
    base = tempfile.mkdtemp(prefix='c_compile_')
    flags = ','.join(f for f in ('base_compiledir=' + os.path.join(base, 'theano'),
                                 'multigpu.precompiled_headers=%s' % use_headers,
                                 CONFIGURATIONS[configuration]) if f)
    environment = child_env(base, flags)
    # The caller's base_compiledir (child_env's shared cache) gives way to
    # this run's own: the last flag wins.
    done = subprocess.run([PYTHON, '-c', CHILD, os.path.dirname(os.path.abspath(__file__)),
                           ','.join(MODELS)], env=environment, capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise RuntimeError('the compile child exited %d:\n%s' % (done.returncode,
                                                                done.stderr[-4000:]))
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    add_configurations_option(parser, CONFIGURATIONS, ','.join(CONFIGURATIONS))
    args = parser.parse_args(argv)
    figures = []
    for configuration in chosen_configurations(parser, args.configurations, CONFIGURATIONS):
        without = compile_once(configuration, False)
        with_headers = compile_once(configuration, True)
        ratio = with_headers['seconds'] / without['seconds']
        print('C modules of %s, %s, cold cache: g++ %.1f s for %d modules with precompiled '
              'headers, %.1f s for %d without: %.2f; compile wall %.1f s against %.1f s'
              % ('+'.join(MODELS), configuration, with_headers['seconds'],
                 with_headers['modules'], without['seconds'], without['modules'], ratio,
                 with_headers['wall'], without['wall']), flush=True)
        figures.append({
            'name': 'c_compile/%s: g++ time with precompiled headers over without' % configuration,
            'value': round(ratio, 3), 'unit': 'ratio', 'goal': GOALS.get(configuration, ''),
            'command': COMMAND,
            'detail': {'with': with_headers, 'without': without, 'models': list(MODELS)}})
    record(figures)
    return figures


if __name__ == '__main__':
    main()
