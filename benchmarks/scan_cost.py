"""What recurrent layers cost through scan, with the compiled loop and the
Python loop.

Theano's own compiled scan loop does not build on Python 3.11; the
project's (theano_multigpu/compat/scan_loop.pyx) is built at first use,
and ``multigpu.scan_loop=python`` runs Theano's Python loop instead.  One
process per configuration; in it, training steps of the same layer
through scan with each loop, and of the same layer with ``unroll=True``
(no scan), same weights and data, alternated; the median of each.

- on the CPU, LSTM(64) and GRU(64) over 20 timesteps, batch 64: scan over
  unrolled with each loop (goal for the compiled loop and the LSTM:
  <= 1.15), and the compiled loop over the Python loop, with where a
  compiled step's time goes (the inner function, the loop's bookkeeping,
  the rest of the graph);
- on one pocl context, the LSTM: the compiled loop over the Python loop.

    python benchmarks/scan_cost.py [--steps 30] [--timesteps 20] [--configurations cpu,pocl]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PYTHON, child_env, median, record  # noqa: E402

COMMAND = 'python benchmarks/scan_cost.py'
GOAL = '<= 1.15'
CONFIGURATIONS = {'cpu': ('device=cpu', ['LSTM', 'GRU'], True),
                  'pocl': ('contexts=dev0->opencl0:0', ['LSTM'], False)}

CHILD = r'''
import gc, json, sys, time
import numpy as np
import theano
from theano.scan_module.scan_op import Scan
import keras.layers
from keras.layers import Dense
from keras.models import Sequential

layer_name, steps, timesteps, with_unrolled = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                               sys.argv[4] == 'yes')
# Where a step's time goes: Scan.execute (both loops go through it) and
# the inner function it calls.
spent = {'execute': 0.0, 'inner': 0.0}
dispatch = Scan.execute
def timed_execute(self, node, args, outs):
    started = time.perf_counter()
    try:
        return dispatch(self, node, args, outs)
    finally:
        spent['execute'] += time.perf_counter() - started
Scan.execute = timed_execute

rng = np.random.RandomState(0)
x = rng.rand(64, timesteps, 16).astype('float32')
y = np.eye(10, dtype='float32')[rng.randint(0, 10, 64)]
layer = getattr(keras.layers, layer_name)
models = {}
for unroll in ((False, True) if with_unrolled else (False,)):
    model = Sequential([layer(64, input_shape=(timesteps, 16), unroll=unroll),
                        Dense(10, activation='softmax')])
    model.compile(loss='categorical_crossentropy', optimizer='sgd')
    models['unrolled' if unroll else 'scan'] = model
weights = models['scan'].get_weights()
for model in models.values():
    model.set_weights(weights)
    model.train_on_batch(x, y)
for op in [o for o in gc.get_objects() if isinstance(o, Scan) and getattr(o, 'fn', None)]:
    def timed_inner(inner=op.fn.fn):
        started = time.perf_counter()
        try:
            return inner()
        finally:
            spent['inner'] += time.perf_counter() - started
    op.fn.fn = timed_inner

runs = [('compiled', 'scan'), ('python', 'scan')] + ([(None, 'unrolled')] if with_unrolled else [])
times = dict((loop or model, []) for loop, model in runs)
compiled_spent = {'execute': [], 'inner': []}
for step in range(steps):
    for loop, model in (runs if step % 2 == 0 else runs[::-1]):
        if loop:
            theano.config.multigpu.scan_loop = loop
        spent.update(execute=0.0, inner=0.0)
        started = time.perf_counter()
        models[model].train_on_batch(x, y)
        times[loop or model].append(time.perf_counter() - started)
        if loop == 'compiled':
            for key in compiled_spent:
                compiled_spent[key].append(spent[key])
print('RESULT ' + json.dumps({'times': times, 'compiled_spent': compiled_spent}))
'''


def _child(configuration, layer, steps, timesteps):
    flags, _, with_unrolled = CONFIGURATIONS[configuration]
    home = tempfile.mkdtemp(prefix='scan_cost_')
    environment = child_env(home, flags=flags,
                            extra={'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1'})
    result = subprocess.run([PYTHON, '-c', CHILD, layer, str(steps), str(timesteps),
                             'yes' if with_unrolled else 'no'],
                            env=environment, cwd=home, capture_output=True, text=True)
    lines = [l for l in result.stdout.splitlines() if l.startswith('RESULT ')]
    if result.returncode != 0 or not lines:
        raise RuntimeError('scan benchmark child (%s, %s) exited %d:\n%s'
                           % (configuration, layer, result.returncode, result.stderr[-4000:]))
    return json.loads(lines[-1][len('RESULT '):])


def _figure(name, value, detail, unit='ratio', goal=''):
    return {'name': name, 'value': round(value, 3), 'unit': unit, 'goal': goal,
            'command': COMMAND, 'detail': detail}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--timesteps', type=int, default=20)
    parser.add_argument('--configurations', default='cpu,pocl')
    args = parser.parse_args(argv)
    figures = []
    for configuration in args.configurations.split(','):
        for layer in CONFIGURATIONS[configuration][1]:
            out = _child(configuration, layer, args.steps, args.timesteps)
            ms = dict((key, median(values) * 1e3) for key, values in out['times'].items())
            spent = dict((key, median(values) * 1e3)
                         for key, values in out['compiled_spent'].items())
            detail = dict(('%s_ms' % key, round(value, 3)) for key, value in ms.items())
            bookkeeping, rest = spent['execute'] - spent['inner'], ms['compiled'] - spent['execute']
            detail.update(timesteps=args.timesteps, steps_each=args.steps,
                          compiled_step_inner_function_ms=round(spent['inner'], 3),
                          compiled_step_loop_bookkeeping_ms=round(bookkeeping, 3),
                          compiled_step_rest_of_graph_ms=round(rest, 3))
            where = 'CPU' if configuration == 'cpu' else 'one pocl context'
            print('%s(64) over %d timesteps, batch 64, %s: compiled loop %.1f ms, Python loop '
                  '%.1f ms%s per step (median of %d each)'
                  % (layer, args.timesteps, where, ms['compiled'], ms['python'],
                     ', unrolled %.1f ms' % ms['unrolled'] if 'unrolled' in ms else '',
                     args.steps))
            prefix = 'scan/%s/%s ' % (configuration, layer)
            figures.append(_figure(prefix + 'step time, compiled loop over Python loop',
                                   ms['compiled'] / ms['python'], detail))
            if 'unrolled' in ms:
                print('  scan/unrolled: compiled loop %.2f, Python loop %.2f; of a compiled '
                      'step: inner function %.1f ms, loop bookkeeping %.2f ms, rest of the '
                      'graph %.1f ms'
                      % (ms['compiled'] / ms['unrolled'], ms['python'] / ms['unrolled'],
                         spent['inner'], bookkeeping, rest))
                figures.append(_figure(prefix + 'step time, scan (compiled loop) over unrolled',
                                       ms['compiled'] / ms['unrolled'], detail,
                                       goal=GOAL if layer == 'LSTM' else ''))
                figures.append(_figure(prefix + 'step time, scan (Python loop) over unrolled',
                                       ms['python'] / ms['unrolled'], detail))
    record(figures)
    return figures


if __name__ == '__main__':
    main()
