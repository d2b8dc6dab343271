"""What recurrent layers cost on Python 3.11, where Scan runs its Python loop.

Theano's Cython scan (scan_perform) does not build on Python 3.11, so the
compatibility fixes let Scan run its inner loop in Python (Scan.execute).
The figure: an LSTM's training step through scan over the same LSTM with
``unroll=True`` (no scan), same weights and data, on the CPU, steps
alternated in one process; median of each.

    python benchmarks/scan_cost.py [--steps 30] [--timesteps 20]
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

CHILD = r'''
import json, sys, time
import numpy as np
from keras.layers import LSTM, Dense
from keras.models import Sequential
steps, timesteps = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.RandomState(0)
x = rng.rand(64, timesteps, 16).astype('float32')
y = np.eye(10, dtype='float32')[rng.randint(0, 10, 64)]
models = {}
for unroll in (False, True):
    model = Sequential([LSTM(64, input_shape=(timesteps, 16), unroll=unroll),
                        Dense(10, activation='softmax')])
    model.compile(loss='categorical_crossentropy', optimizer='sgd')
    models['unrolled' if unroll else 'scan'] = model
weights = models['scan'].get_weights()
models['unrolled'].set_weights(weights)
for model in models.values():
    model.train_on_batch(x, y)
times = {name: [] for name in models}
for step in range(steps):
    for name in (('scan', 'unrolled') if step % 2 == 0 else ('unrolled', 'scan')):
        started = time.perf_counter()
        models[name].train_on_batch(x, y)
        times[name].append(time.perf_counter() - started)
print('RESULT ' + json.dumps(times))
'''


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--timesteps', type=int, default=20)
    args = parser.parse_args(argv)
    home = tempfile.mkdtemp(prefix='scan_cost_')
    environment = child_env(home, extra={'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1'})
    result = subprocess.run([PYTHON, '-c', CHILD, str(args.steps), str(args.timesteps)],
                            env=environment, cwd=home, capture_output=True, text=True)
    lines = [l for l in result.stdout.splitlines() if l.startswith('RESULT ')]
    if result.returncode != 0 or not lines:
        raise RuntimeError('scan benchmark child exited %d:\n%s'
                           % (result.returncode, result.stderr[-4000:]))
    times = json.loads(lines[-1][len('RESULT '):])
    scan, unrolled = median(times['scan']), median(times['unrolled'])
    print('LSTM(64) over %d timesteps, batch 64, CPU: scan (Python loop) %.1f ms, unrolled '
          '%.1f ms per step: scan/unrolled %.2f (median of %d each)'
          % (args.timesteps, scan * 1e3, unrolled * 1e3, scan / unrolled, args.steps))
    figures = [{'name': 'scan/LSTM step time, scan (Python loop) over unrolled',
                'value': round(scan / unrolled, 3), 'unit': 'ratio', 'goal': '',
                'command': COMMAND,
                'detail': {'scan_ms': scan * 1e3, 'unrolled_ms': unrolled * 1e3,
                           'timesteps': args.timesteps, 'steps_each': args.steps}}]
    record(figures)
    return figures


if __name__ == '__main__':
    main()
