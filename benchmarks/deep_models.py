"""Deep models with a BatchNormalization per convolution, batch-wise on
pocl: the train graph's size, the compile time and the compiling process's
peak memory at 1, 2, 4 and 8 contexts, against one context, and the
numbers against one context's.

Models (benchmarks/deep_bn.py): ``resnet20``, 20 convolution +
BatchNormalization blocks with residual sums; ``cnn13``, 13 blocks of 8 to
24 filters on 3x16x16 inputs, batch 16, Adam.  Each configuration is a
fresh Python (its peak memory is its own), run one after another after a
one-context run that fills the compile cache: the compile time is then
Theano's optimiser and linker, not C compiles the first run pays for all.

- nodes: of the train graph as Theano's function is handed it, before its
  optimiser (linear in blocks x contexts: tests/test_deep_models.py);
- compile: seconds to make the train function (Keras's
  ``_make_train_function``), over one context's (goal <= 3; the compile
  issue aims at 1.3);
- peak memory: the child's maximum resident set after compiling and
  training, over one context's (goal <= 2); on pocl the devices' buffers
  are the process's memory too, so also the growth of the maximum while
  the train function compiles, over one context's;
- equal: the losses and weights after STEPS steps against one context's,
  rtol 1e-4 (synchronised BatchNormalization; local normalises each
  context's rows with their own statistics, so only its compile is timed).

    python benchmarks/deep_models.py [--models resnet20,cnn13] [--contexts 2,4,8]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PYTHON, child_env, record  # noqa: E402

COMMAND = 'python benchmarks/deep_models.py'
STEPS = 3
RTOL, ATOL = 1e-4, 1e-6
DEVICES = ('opencl0:0', 'opencl0:1')


def contexts_flag(n):
    """n context names over pocl's two devices, alternating."""
    return 'contexts=' + ';'.join('dev%d->%s' % (k, DEVICES[k % 2]) for k in range(n))


def child(model_name, out):
    """Build, count, compile and train ``model_name``; write the numbers
    to ``out`` (.npz) and print one JSON line."""
    import resource
    import time
    from deep_bn import cnn13, resnet, train_graph_sizes
    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    case = cnn13() if model_name == 'cnn13' else resnet(20)
    sizes = train_graph_sizes(case)
    before = peak_mb()
    start = time.time()
    case.model._make_train_function()
    compile_seconds = time.time() - start
    compiled = peak_mb()
    losses = [float(case.model.train_on_batch(case.x, case.y)) for _ in range(STEPS)]
    np.savez(out, losses=np.array(losses), *case.model.get_weights())
    print(json.dumps({'nodes': sizes['theano'], 'compile_s': compile_seconds,
                      'peak_mb': peak_mb(), 'compile_mb': compiled - before}))


def run_child(model_name, flags, base, key):
    home = os.path.join(base, key)
    os.makedirs(home, exist_ok=True)
    out = os.path.join(base, key + '.npz')
    result = subprocess.run([PYTHON, os.path.abspath(__file__), '--child', model_name, out],
                            env=child_env(home, flags), cwd=home, capture_output=True,
                            text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError('%s (%s) failed:\n%s' % (model_name, flags, result.stderr[-4000:]))
    figures = json.loads(result.stdout.strip().split('\n')[-1])
    with np.load(out) as saved:
        figures['arrays'] = [saved[k] for k in sorted(saved.files)]
    return figures


def largest_difference(got, want):
    """The largest |got - want| / (ATOL + RTOL |want|) over all arrays: <= 1 is equal."""
    return max(float(np.max(np.abs(g - w) / (ATOL + RTOL * np.abs(w))))
               for g, w in zip(got, want))


def measure(models, counts):
    base = tempfile.mkdtemp(prefix='deep_models_')
    runs = {}
    for name in models:
        # Fill the compile cache with what one context and the joins compile.
        run_child(name, contexts_flag(2), base, name + '-warm')
        runs[(name, 1, 'sync')] = run_child(name, contexts_flag(1), base, name + '-1')
        for n in counts:
            for mode in ('sync', 'local'):
                flags = contexts_flag(n) + ',multigpu.batchnorm=' + mode
                runs[(name, n, mode)] = run_child(name, flags, base, '%s-%d-%s' % (name, n, mode))
                one, many = runs[(name, 1, 'sync')], runs[(name, n, mode)]
                print('  %-8s %d contexts %-5s: nodes %6d (one: %d), compile %6.1f s '
                      '(%.2fx), peak %5.0f MB (%.2fx), compiling took %4.0f MB (%.2fx)%s' % (
                          name, n, mode, many['nodes'], one['nodes'], many['compile_s'],
                          many['compile_s'] / one['compile_s'], many['peak_mb'],
                          many['peak_mb'] / one['peak_mb'], many['compile_mb'],
                          many['compile_mb'] / max(one['compile_mb'], 1),
                          '' if mode == 'local' else ', difference %.3f of tolerance'
                          % largest_difference(many['arrays'], one['arrays'])), flush=True)
    return runs


def figures_for(runs):
    figures = []
    for (name, n, mode), many in sorted(runs.items()):
        if n == 1:
            continue
        one = runs[(name, 1, 'sync')]
        where = 'pocl, %d contexts on 2 devices, multigpu.batchnorm=%s' % (n, mode)
        prefix = 'deep_models/pocl/%s, %d contexts, batchnorm=%s: ' % (name, n, mode)
        detail = {'nodes': many['nodes'], 'nodes_one_context': one['nodes'],
                  'compile_s': round(many['compile_s'], 2),
                  'compile_s_one_context': round(one['compile_s'], 2),
                  'peak_mb': round(many['peak_mb']), 'peak_mb_one_context': round(one['peak_mb']),
                  'compile_mb': round(many['compile_mb']),
                  'compile_mb_one_context': round(one['compile_mb']), 'where': where}
        figures.append({'name': prefix + 'compile time over one context',
                        'value': round(many['compile_s'] / one['compile_s'], 3), 'unit': 'ratio',
                        'goal': '<= 3', 'command': COMMAND, 'detail': detail})
        figures.append({'name': prefix + 'peak memory over one context',
                        'value': round(many['peak_mb'] / one['peak_mb'], 3), 'unit': 'ratio',
                        'goal': '<= 2', 'command': COMMAND, 'detail': detail})
        figures.append({'name': prefix + "the compile's memory over one context's",
                        'value': round(many['compile_mb'] / max(one['compile_mb'], 1), 3),
                        'unit': 'ratio', 'command': COMMAND, 'detail': detail})
        if mode == 'sync':
            figures.append({
                'name': prefix + 'largest difference from one context, in tolerances',
                'value': round(largest_difference(many['arrays'], one['arrays']), 4),
                'unit': 'ratio', 'goal': '<= 1 (rtol 1e-4, atol 1e-6, %d steps)' % STEPS,
                'command': COMMAND, 'detail': detail})
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', default='resnet20,cnn13',
                        help='comma-separated: resnet20, cnn13 (default both)')
    parser.add_argument('--contexts', default='2,4,8',
                        help='comma-separated numbers of contexts (default 2,4,8)')
    parser.add_argument('--child', nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    print('Deep BatchNormalization models, batch-wise on pocl, against one context:',
          flush=True)
    figures = []
    for name in args.models.split(','):   # each model's figures recorded once measured
        figures += figures_for(measure([name], [int(n) for n in args.contexts.split(',')]))
        record(figures)
    return figures


if __name__ == '__main__':
    main()
