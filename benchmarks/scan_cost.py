"""What recurrent layers cost through scan, with the compiled loop and the
Python loop.

Theano's own compiled scan loop does not build on Python 3.11; the
project's (theano_multigpu/compat/scan_loop.pyx) is built at first use,
and ``multigpu.scan_loop=python`` runs Theano's Python loop instead.  One
process per configuration; in it, training steps of the same layer
through scan with each loop, and of the same layer with ``unroll=True``
(no scan), same weights and data, alternated; the median of each.

- LSTM(64), GRU(64) and two stacked LSTM(64) (``LSTMx2``: the first
  returns its sequences), over 20 and 100 timesteps, batch 64, on the CPU
  and on one pocl context: scan over unrolled with each loop (goal for the
  compiled loop, LSTM and GRU on the CPU: <= 1.15), and the compiled loop
  over the Python loop, with where a compiled step's time goes (the inner
  function, the loop's bookkeeping, the rest of the graph); and the
  compiled loop with ``multigpu.scan_reuse=True`` (the backward loop reads
  the forward's products) over the unrolled layers.

    python benchmarks/scan_cost.py [--steps 30] [--timesteps 20,100]
                                   [--layers LSTM,GRU,LSTMx2] [--configurations cpu,pocl]
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
CONFIGURATIONS = {'cpu': 'device=cpu', 'pocl': 'contexts=dev0->opencl0:0'}
# A layer's name, or two of them stacked (``LSTMx2``).
LAYERS = ('LSTM', 'GRU', 'LSTMx2')
GOAL_LAYERS = ('LSTM', 'GRU')

CHILD = r'''
import gc, json, sys, time
import numpy as np
import theano
from theano.scan_module.scan_op import Scan
import keras.layers
from keras.layers import Dense
from keras.models import Sequential

layer_name, steps, timesteps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# (theano.grad recurses through the unrolled layer: a few frames per op
# of each of its steps)
sys.setrecursionlimit(max(sys.getrecursionlimit(), 2000 * timesteps))
layer_name, _, stacked = layer_name.partition('x')
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
# (the scan whose backward loop reads the forward's products:
# multigpu.scan_reuse=True when the train function is made)
for key, unroll in (('scan', False), ('unrolled', True), ('scan_reuse', False)):
    recurrent = [layer(64, input_shape=(timesteps, 16), unroll=unroll,
                       return_sequences=k + 1 < int(stacked or 1))
                 for k in range(int(stacked or 1))]
    model = Sequential(recurrent + [Dense(10, activation='softmax')])
    model.compile(loss='categorical_crossentropy', optimizer='sgd')
    models[key] = model
weights = models['scan'].get_weights()
for key, model in models.items():
    model.set_weights(weights)
    theano.config.multigpu.scan_reuse = key == 'scan_reuse'
    model.train_on_batch(x, y)
theano.config.multigpu.scan_reuse = False
for op in [o for o in gc.get_objects() if isinstance(o, Scan) and getattr(o, 'fn', None)]:
    def timed_inner(inner=op.fn.fn):
        started = time.perf_counter()
        try:
            return inner()
        finally:
            spent['inner'] += time.perf_counter() - started
    op.fn.fn = timed_inner

runs = [('compiled', 'scan'), ('python', 'scan'), (None, 'unrolled'),
        ('compiled', 'scan_reuse')]
def run_name(loop, model):
    return model if model != 'scan' else loop
times = dict((run_name(loop, model), []) for loop, model in runs)
compiled_spent = {'execute': [], 'inner': []}
for step in range(steps):
    for loop, model in (runs if step % 2 == 0 else runs[::-1]):
        if loop:
            theano.config.multigpu.scan_loop = loop
        spent.update(execute=0.0, inner=0.0)
        started = time.perf_counter()
        models[model].train_on_batch(x, y)
        times[run_name(loop, model)].append(time.perf_counter() - started)
        if (loop, model) == ('compiled', 'scan'):
            for key in compiled_spent:
                compiled_spent[key].append(spent[key])
print('RESULT ' + json.dumps({'times': times, 'compiled_spent': compiled_spent}))
'''


def _child(configuration, layer, steps, timesteps):
    home = tempfile.mkdtemp(prefix='scan_cost_')
    environment = child_env(home, flags=CONFIGURATIONS[configuration],
                            extra={'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1'})
    result = subprocess.run([PYTHON, '-c', CHILD, layer, str(steps), str(timesteps)],
                            env=environment, cwd=home, capture_output=True, text=True,
                            timeout=3600)
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
    parser.add_argument('--timesteps', default='20,100')
    parser.add_argument('--layers', default=','.join(LAYERS))
    parser.add_argument('--configurations', default='cpu,pocl')
    args = parser.parse_args(argv)
    layers = args.layers.split(',')
    configurations = args.configurations.split(',')
    for given, known, what in ((layers, LAYERS, '--layers'),
                               (configurations, tuple(CONFIGURATIONS), '--configurations')):
        unknown = [name for name in given if name not in known]
        if unknown:
            parser.error('%s expects names from %s, but received %s'
                         % (what, ', '.join(known), ', '.join(unknown)))
    figures = []
    for configuration in configurations:
        for timesteps in [int(t) for t in args.timesteps.split(',')]:
            for layer in layers:
                figures += _measure(configuration, layer, args.steps, timesteps)
    record(figures)
    return figures


def _measure(configuration, layer, steps, timesteps):
    out = _child(configuration, layer, steps, timesteps)
    ms = dict((key, median(values) * 1e3) for key, values in out['times'].items())
    spent = dict((key, median(values) * 1e3) for key, values in out['compiled_spent'].items())
    detail = dict(('%s_ms' % key, round(value, 3)) for key, value in ms.items())
    bookkeeping, rest = spent['execute'] - spent['inner'], ms['compiled'] - spent['execute']
    detail.update(timesteps=timesteps, steps_each=steps,
                  compiled_step_inner_function_ms=round(spent['inner'], 3),
                  compiled_step_loop_bookkeeping_ms=round(bookkeeping, 3),
                  compiled_step_rest_of_graph_ms=round(rest, 3))
    where = 'CPU' if configuration == 'cpu' else 'one pocl context'
    print('%s(64) over %d timesteps, batch 64, %s: compiled loop %.1f ms, Python loop %.1f ms, '
          'unrolled %.1f ms per step (median of %d each)'
          % (layer, timesteps, where, ms['compiled'], ms['python'], ms['unrolled'], steps))
    print('  scan/unrolled: compiled loop %.2f, Python loop %.2f; of a compiled step: inner '
          'function %.1f ms, loop bookkeeping %.2f ms, rest of the graph %.1f ms'
          % (ms['compiled'] / ms['unrolled'], ms['python'] / ms['unrolled'], spent['inner'],
             bookkeeping, rest), flush=True)
    prefix = 'scan/%s/%s, %d timesteps: ' % (configuration, layer, timesteps)
    goal = GOAL if configuration == 'cpu' and layer in GOAL_LAYERS else ''
    print('  with multigpu.scan_reuse=True: %.1f ms, over unrolled %.2f'
          % (ms['scan_reuse'], ms['scan_reuse'] / ms['unrolled']), flush=True)
    return [_figure(prefix + 'step time, compiled loop over Python loop',
                    ms['compiled'] / ms['python'], detail),
            _figure(prefix + 'step time, scan (compiled loop) over unrolled',
                    ms['compiled'] / ms['unrolled'], detail, goal=goal),
            _figure(prefix + 'step time, scan (Python loop) over unrolled',
                    ms['python'] / ms['unrolled'], detail),
            _figure(prefix + 'step time, scan with multigpu.scan_reuse (compiled loop) '
                    'over unrolled', ms['scan_reuse'] / ms['unrolled'], detail)]


if __name__ == '__main__':
    main()
