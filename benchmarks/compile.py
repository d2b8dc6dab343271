"""Where a compile's time goes: Keras's train, test and predict functions
of the bench models, batch-wise on pocl at 1, 2, 4 and 8 contexts, split
into the shim's rewrite, the gradients (theano.grad), Theano's optimiser
and linking (C modules loaded or built, thunks made, GPU kernels built), as
the progress lines (``multigpu.progress``) count them; the optimiser's
time split by Theano's passes (the top-level passes of its profile, on the
function's own graph); and the part of linking spent in the OpenCL
compiler (``cl_counter``'s preloaded library: each context builds each
GPU kernel's program for itself).

Each (model, contexts) is a fresh Python after one that filled Theano's C
cache and pocl's kernel cache with what it compiles: the times are those
of a warm cache, where the graph's size is what grows with the contexts.
The figure is the time of Keras's ``_make_train_function`` at N contexts
over one context's, the gradients included on both sides (on one context
Keras takes them there, batch-wise the rewrite does); goals of the compile
issue: 4 over 1 <= 1.3, 8 over 1 <= 1.6.

Then the time to the first step, end to end (warm caches likewise): a
fresh Python per (model, contexts) calls ``fit`` with validation data (Keras compiles the train and
test functions before the first batch) on 8 batches for one epoch, then
``predict`` (its compile); the figures are the seconds from ``fit`` to the
end of the first batch and to the end of the epoch (validation included)
at 4 contexts over one's (goal of the issue: <= 1.3).

And the train function's compile as it was at ``--before`` (that commit's
package first on the children's PYTHONPATH; by default the last commit
before each context built a GPU kernel once per compiled module rather
than once per node), at 1 and 4 contexts: its time and OpenCL programs
(it has no progress lines to split it by).

    python benchmarks/compile.py [--models mlp,cnn,lstm,resnet20] [--contexts 1,2,4,8]
                                 [--before REV]
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
import cl_counter  # noqa: E402
from harness import PYTHON, child_env, package_at, record  # noqa: E402

COMMAND = 'python benchmarks/compile.py'
MODELS = ('mlp', 'cnn', 'lstm', 'resnet20')
COUNTS = (1, 2, 4, 8)
FUNCTIONS = ('train', 'test', 'predict')
GOALS = {4: '<= 1.3', 8: '<= 1.6'}
# The time to the first step: at these counts, on this many batches.
FIRST_STEP_COUNTS = (1, 4)
FIRST_STEP_BATCHES = 8
# The "before" side: its revision and counts.
BEFORE = '4842217'
BEFORE_COUNTS = (1, 4)
# 'Compiled <title> (<contexts, nodes>) in <s> s (<phase> <s> s, ...; <m> C modules built)'
# Passes of the optimiser shown, the longest first; the rest are summed.
PASSES_SHOWN = 6
SUMMARY = re.compile(r"^Compiled Keras's (\w+) function \((?:(\d+) contexts?, )?([\d,]+) nodes\) "
                     r"in ([\d.]+) s \(([^;]*); (\d+) C modules? built\)$")


def child(model_name, summaries=True):
    """Compile ``model_name``'s three functions; print one JSON line:
    {function: {'wall', 'passes': {pass: seconds}, 'opencl_programs',
    'opencl_compiler', and from the progress lines' summary (unless not
    ``summaries``): 'nodes', 'seconds', phase: seconds, 'modules'}}."""
    import time
    model = _case(model_name).model
    model = getattr(model, 'model', model)   # a Sequential's Model
    profiles = OptimiserProfiles()
    captured, stderr = io.StringIO(), sys.stderr
    sys.stderr = captured
    try:
        walls, opencl = {}, {}
        for name in FUNCTIONS:
            profiles.function = name
            programs, compiler = cl_counter.programs(), cl_counter.compiler_seconds()
            start = time.time()
            getattr(model, '_make_%s_function' % name)()
            walls[name] = time.time() - start
            opencl[name] = (cl_counter.programs() - programs,
                            cl_counter.compiler_seconds() - compiler)
    finally:
        sys.stderr = stderr
    found = dict((name, {'wall': walls[name], 'passes': profiles.passes.get(name, {}),
                         'opencl_programs': opencl[name][0],
                         'opencl_compiler': round(opencl[name][1], 3)}) for name in FUNCTIONS)
    summarised = set()
    for line in captured.getvalue().splitlines():
        match = SUMMARY.match(line)
        if match is None:
            continue
        name, _, nodes, seconds, phases, modules = match.groups()
        entry = found[name]
        entry.update(nodes=int(nodes.replace(',', '')), seconds=float(seconds),
                     modules=int(modules))
        for phase in phases.split(', '):
            label, value, _ = phase.split(' ')
            entry[label] = float(value)
        summarised.add(name)
    missing = [name for name in FUNCTIONS if name not in summarised]
    if summaries and missing:
        raise RuntimeError('no progress summary of the %s function(s) in:\n%s'
                           % (', '.join(missing), captured.getvalue()[-3000:]))
    print(json.dumps(found))


def first_step_child(model_name):
    """Time ``fit`` (validation data, one epoch of FIRST_STEP_BATCHES
    batches) to its first batch's end and to its epoch's end, then
    ``predict``; print them as one JSON line."""
    import time
    import numpy as np
    from keras.callbacks import Callback
    case = _case(model_name)
    times = {}

    class Clock(Callback):
        def on_batch_end(self, batch, logs=None):
            times.setdefault('first_step', time.time() - start)

        def on_epoch_end(self, epoch, logs=None):
            times.setdefault('first_epoch', time.time() - start)

    def tiled(data):
        if isinstance(data, list):
            return [tiled(part) for part in data]
        return np.concatenate([data] * FIRST_STEP_BATCHES)
    rows = len(case.y[0] if isinstance(case.y, list) else case.y)
    x, y = tiled(case.x), tiled(case.y)
    start = time.time()
    case.model.fit(x, y, batch_size=rows, nb_epoch=1, verbose=0, shuffle=False,
                   validation_data=(case.x, case.y), callbacks=[Clock()])
    times['fit'] = time.time() - start
    start = time.time()
    case.model.predict(case.x, batch_size=rows, verbose=0)
    times['predict'] = time.time() - start
    print(json.dumps(times))


def _case(model_name):
    if model_name == 'resnet20':
        from deep_bn import resnet
        return resnet(20)
    from models import build
    return build(model_name, 'bench')


class OptimiserProfiles(object):
    """Theano's optimiser by pass: the seconds of each top-level pass
    (``SeqOptimizer.apply``'s profile) on the largest graph optimised while
    ``function`` is compiled (the function's own, not Scan's inner ones)."""

    def __init__(self):
        from theano.gof import opt
        from theano_multigpu.patch_targets import Parameters, wrap
        self.function, self.passes, self._largest, self._depth = None, {}, {}, 0
        wrap(Parameters('theano.gof.opt.SeqOptimizer.apply', ('self', 'fgraph'),
                        "wrapped: its profile gives each pass's time"),
             opt.SeqOptimizer, 'apply', self._profiling)

    def _profiling(self, apply):
        profiles = self

        def profiled_apply(optimiser, fgraph):
            nodes = len(fgraph.apply_nodes)
            profiles._depth += 1
            try:
                profile = apply(optimiser, fgraph)
            finally:
                profiles._depth -= 1
            if profiles._depth == 0 and nodes > profiles._largest.get(profiles.function, -1):
                profiles._largest[profiles.function] = nodes
                profiles.passes[profiles.function] = profiles._top(optimiser, profile[1])
            return profile
        return profiled_apply

    @staticmethod
    def _top(optimiser, seconds):
        if len(seconds) != len(optimiser):
            # (a pass that failed and was skipped left no time: the times
            # cannot be told to their passes)
            return {'(not split: a pass failed)': round(sum(seconds), 3)}
        named = sorted(((s, getattr(o, 'name', None) or type(o).__name__)
                        for o, s in zip(optimiser, seconds)), reverse=True)
        shown = dict((name, round(s, 3)) for s, name in named[:PASSES_SHOWN])
        shown['(the other %d)' % len(named[PASSES_SHOWN:])] = round(
            sum(s for s, _ in named[PASSES_SHOWN:]), 3)
        return shown


def run_child(model_name, n, base, key, mode='--child', package=None):
    """The JSON line of a child (``mode``) at ``n`` contexts; ``package``:
    the theano_multigpu it imports (the installed one if None)."""
    home = os.path.join(base, key)
    os.makedirs(home, exist_ok=True)
    # (The progress lines show from the first second; a package from
    # before them has no such setting.)
    flags = contexts_flag(n) + ('' if package else ',multigpu.progress=0')
    env = child_env(home, flags)
    env['LD_PRELOAD'] = cl_counter.build(base)
    if package:
        env['PYTHONPATH'] = os.pathsep.join([package] + [p for p in [env.get('PYTHONPATH')] if p])
    extra = ['--no-summary'] if package else []
    result = subprocess.run([PYTHON, os.path.abspath(__file__), mode, model_name] + extra,
                            env=env, cwd=home, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError('%s at %d contexts failed:\n%s' % (model_name, n,
                                                               result.stderr[-4000:]))
    return json.loads(result.stdout.strip().split('\n')[-1])


def measure(models, counts, before):
    with tempfile.TemporaryDirectory(prefix='compile_') as base:
        old = package_at(before, os.path.join(base, 'before')) if before else None
        return _measure(models, counts, base, old)


def _measure(models, counts, base, old):
    runs, first, earlier = {}, {}, {}
    for name in models:
        for n in counts:
            run_child(name, n, base, '%s-%d-warm' % (name, n))
            runs[(name, n)] = found = run_child(name, n, base, '%s-%d' % (name, n))
            for function in FUNCTIONS:
                entry = found[function]
                split = ', '.join('%s %.1f s' % (phase, entry[phase])
                                  for phase in ('rewrite', 'gradients', 'optimise', 'link')
                                  if phase in entry)
                print('  %-8s %d context(s) %-7s: %6.1f s, %6d nodes (%s; %d C modules built; '
                      'OpenCL compiler %.1f s, %d programs)'
                      % (name, n, function, entry['wall'], entry['nodes'], split,
                         entry['modules'], entry['opencl_compiler'], entry['opencl_programs']),
                      flush=True)
            passes = found['train']['passes']
            print('  %-8s %d context(s) train optimiser: %s' % (name, n, ', '.join(
                '%s %.2f s' % item for item in passes.items())), flush=True)
            if n in FIRST_STEP_COUNTS:
                # (the first run fills pocl's cache of kernels specialised
                # for their launch, which compiling alone does not)
                for key in ('%s-%d-warm' % (name, n), '%s-%d' % (name, n)):
                    first[(name, n)] = times = run_child(name, n, base, key, '--first-step')
                print('  %-8s %d context(s) fit: first step at %.1f s, first epoch at %.1f s; '
                      'predict %.1f s' % (name, n, times['first_step'], times['first_epoch'],
                                          times['predict']), flush=True)
            if old and n in BEFORE_COUNTS:
                for key in ('%s-%d-before-warm' % (name, n), '%s-%d-before' % (name, n)):
                    earlier[(name, n)] = run_child(name, n, base, key, package=old)
                entry = earlier[(name, n)]['train']
                print('  %-8s %d context(s) train, before: %6.1f s (OpenCL compiler %.1f s, '
                      '%d programs)' % (name, n, entry['wall'], entry['opencl_compiler'],
                                        entry['opencl_programs']), flush=True)
    return runs, first, earlier


def figures_for(runs, first, earlier, before):
    figures = []
    for (name, n), then in sorted(earlier.items()):
        now = runs[(name, n)]['train']
        ratio = now['wall'] / then['train']['wall']
        print('  %-8s train function at %d contexts, now over before (%s): %.2f'
              % (name, n, before, ratio))
        figures.append({
            'name': 'compile/pocl/%s train-function compile time at %d contexts, now over before'
                    % (name, n),
            'value': round(ratio, 3), 'unit': 'ratio', 'goal': '', 'command': COMMAND,
            'detail': {'now': now, 'before': then['train'], 'before_revision': before,
                       'where': 'pocl, warm C and kernel caches; wall: _make_train_function'}})
    for (name, n), many in sorted(first.items()):
        one = first.get((name, 1))
        if n == 1 or one is None:
            continue
        for key, what in (('first_step', 'the first step'), ('first_epoch', 'the first epoch')):
            ratio = many[key] / one[key]
            print('  %-8s time from fit to the end of %s, %d contexts over 1: %.2f'
                  % (name, what, n, ratio))
            figures.append({
                'name': 'compile/pocl/%s time from fit to the end of %s, %d contexts over 1'
                        % (name, what, n),
                'value': round(ratio, 3), 'unit': 'ratio', 'goal': '<= 1.3', 'command': COMMAND,
                'detail': {'one_context': one, 'contexts': many,
                           'where': 'pocl, warm C and kernel caches; fit with validation data, '
                                    '%d batches, one epoch, then predict; seconds'
                                    % FIRST_STEP_BATCHES}})
    for (name, n), many in sorted(runs.items()):
        one = runs.get((name, 1))
        if n == 1 or one is None:
            continue
        ratio = many['train']['wall'] / one['train']['wall']
        # What grows where each context does not run the compiler again
        # (libgpuarray's CUDA backend loads compiled kernels from its disk
        # cache; its OpenCL backend compiles each program per context).
        without = ((many['train']['wall'] - many['train']['opencl_compiler'])
                   / (one['train']['wall'] - one['train']['opencl_compiler']))
        print('  %-8s train function at %d contexts over 1: %.2f (less the OpenCL compiler: %.2f)'
              % (name, n, ratio, without))
        figures.append({
            'name': 'compile/pocl/%s train-function compile time, %d contexts over 1' % (name, n),
            'value': round(ratio, 3), 'unit': 'ratio', 'goal': GOALS.get(n, ''),
            'command': COMMAND,
            'detail': {'less_the_opencl_compiler': round(without, 3),
                       'one_context': one, 'contexts': many,
                       'where': 'pocl, warm C and kernel caches; wall: _make_<name>_function; '
                                'seconds per phase of the progress lines'}})
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', default=','.join(MODELS))
    parser.add_argument('--contexts', default=','.join(str(n) for n in COUNTS))
    parser.add_argument('--child', help=argparse.SUPPRESS)
    parser.add_argument('--before', default=BEFORE,
                        help='the revision of the "before" side (default %s; "" for none)'
                        % BEFORE)
    parser.add_argument('--first-step', help=argparse.SUPPRESS)
    parser.add_argument('--no-summary', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, summaries=not args.no_summary)
    if args.first_step:
        return first_step_child(args.first_step)
    models = args.models.split(',')
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error('--models expects names from %s, but received %s'
                     % (', '.join(MODELS), ', '.join(unknown)))
    counts = sorted(set([1] + [int(n) for n in args.contexts.split(',')]))
    print('compile: %s at %s contexts (warm caches)' % (', '.join(models), counts), flush=True)
    record(figures_for(*measure(models, counts, args.before), before=args.before))


if __name__ == '__main__':
    main()
