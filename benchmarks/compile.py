"""Where a compile's time goes: Keras's train, test and predict functions
of the bench models, batch-wise on pocl at 1, 2, 4 and 8 contexts, split
into the shim's rewrite, the gradients (theano.grad), Theano's optimiser
and linking (C modules loaded or built, thunks made, GPU kernels built), as
the progress lines (``multigpu.progress``) count them.

Each (model, contexts) is a fresh Python after one that filled Theano's C
cache and pocl's kernel cache with what it compiles: the times are those
of a warm cache, where the graph's size is what grows with the contexts.
The figure is the time of Keras's ``_make_train_function`` at N contexts
over one context's, the gradients included on both sides (on one context
Keras takes them there, batch-wise the rewrite does); goals of the compile
issue: 4 over 1 <= 1.3, 8 over 1 <= 1.6.

    python benchmarks/compile.py [--models mlp,cnn,lstm,resnet20] [--contexts 1,2,4,8]
"""
import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deep_models import contexts_flag  # noqa: E402
from harness import PYTHON, child_env, record  # noqa: E402

COMMAND = 'python benchmarks/compile.py'
MODELS = ('mlp', 'cnn', 'lstm', 'resnet20')
COUNTS = (1, 2, 4, 8)
FUNCTIONS = ('train', 'test', 'predict')
GOALS = {4: '<= 1.3', 8: '<= 1.6'}
# 'Compiled <title> (<contexts, nodes>) in <s> s (<phase> <s> s, ...; <m> C modules built)'
SUMMARY = re.compile(r"^Compiled Keras's (\w+) function \((?:(\d+) contexts?, )?([\d,]+) nodes\) "
                     r"in ([\d.]+) s \(([^;]*); (\d+) C modules? built\)$")


def child(model_name):
    """Compile ``model_name``'s three functions; print one JSON line:
    {function: {'nodes', 'seconds', phase: seconds, 'modules'}}."""
    import time
    if model_name == 'resnet20':
        from deep_bn import resnet
        model = resnet(20).model
    else:
        from models import build
        model = build(model_name, 'bench').model
    model = getattr(model, 'model', model)   # a Sequential's Model
    captured, stderr = io.StringIO(), sys.stderr
    sys.stderr = captured
    try:
        walls = {}
        for name in FUNCTIONS:
            start = time.time()
            getattr(model, '_make_%s_function' % name)()
            walls[name] = time.time() - start
    finally:
        sys.stderr = stderr
    found = {}
    for line in captured.getvalue().splitlines():
        match = SUMMARY.match(line)
        if match is None:
            continue
        name, _, nodes, seconds, phases, modules = match.groups()
        entry = {'nodes': int(nodes.replace(',', '')), 'seconds': float(seconds),
                 'wall': walls.get(name), 'modules': int(modules)}
        for phase in phases.split(', '):
            label, value, _ = phase.split(' ')
            entry[label] = float(value)
        found[name] = entry
    missing = [name for name in FUNCTIONS if name not in found]
    if missing:
        raise RuntimeError('no progress summary of the %s function(s) in:\n%s'
                           % (', '.join(missing), captured.getvalue()[-3000:]))
    print(json.dumps(found))


def run_child(model_name, n, base, key):
    home = os.path.join(base, key)
    os.makedirs(home, exist_ok=True)
    flags = contexts_flag(n) + ',multigpu.progress=0'
    result = subprocess.run([PYTHON, os.path.abspath(__file__), '--child', model_name],
                            env=child_env(home, flags), cwd=home, capture_output=True,
                            text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError('%s at %d contexts failed:\n%s' % (model_name, n,
                                                               result.stderr[-4000:]))
    return json.loads(result.stdout.strip().split('\n')[-1])


def measure(models, counts):
    with tempfile.TemporaryDirectory(prefix='compile_') as base:
        return _measure(models, counts, base)


def _measure(models, counts, base):
    runs = {}
    for name in models:
        for n in counts:
            run_child(name, n, base, '%s-%d-warm' % (name, n))
            runs[(name, n)] = found = run_child(name, n, base, '%s-%d' % (name, n))
            for function in FUNCTIONS:
                entry = found[function]
                split = ', '.join('%s %.1f s' % (phase, entry[phase])
                                  for phase in ('rewrite', 'gradients', 'optimise', 'link')
                                  if phase in entry)
                print('  %-8s %d context(s) %-7s: %6.1f s, %6d nodes (%s; %d C modules built)'
                      % (name, n, function, entry['wall'], entry['nodes'], split,
                         entry['modules']), flush=True)
    return runs


def figures_for(runs):
    figures = []
    for (name, n), many in sorted(runs.items()):
        one = runs.get((name, 1))
        if n == 1 or one is None:
            continue
        ratio = many['train']['wall'] / one['train']['wall']
        print('  %-8s train function at %d contexts over 1: %.2f' % (name, n, ratio))
        figures.append({
            'name': 'compile/pocl/%s train-function compile time, %d contexts over 1' % (name, n),
            'value': round(ratio, 3), 'unit': 'ratio', 'goal': GOALS.get(n, ''),
            'command': COMMAND,
            'detail': {'one_context': one, 'contexts': many,
                       'where': 'pocl, warm C and kernel caches; wall: _make_<name>_function; '
                                'seconds per phase of the progress lines'}})
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', default=','.join(MODELS))
    parser.add_argument('--contexts', default=','.join(str(n) for n in COUNTS))
    parser.add_argument('--child', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    models = args.models.split(',')
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error('--models expects names from %s, but received %s'
                     % (', '.join(MODELS), ', '.join(unknown)))
    counts = sorted(set([1] + [int(n) for n in args.contexts.split(',')]))
    print('compile: %s at %s contexts (warm caches)' % (', '.join(models), counts), flush=True)
    record(figures_for(measure(models, counts)))


if __name__ == '__main__':
    main()
