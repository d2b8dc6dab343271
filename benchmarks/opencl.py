"""OpenCL contexts at their speed: a training step on one pocl context over
the same step on the CPU, now and before the fills were fixed, and the
OpenCL programs built per step.

Three long-lived workers (step_worker.py, under the shim) train the same
models (benchmarks/models.py at size 'bench', and Keras's stateful_lstm
example): on the CPU; on one pocl context; and on one pocl context with
theano_multigpu as it was at ``--before`` (that commit's package, first on
the worker's PYTHONPATH), when a zero fill built an OpenCL program at every
call.  The pocl workers preload cl_counter's library, which counts the
programs built.  The driver asks the workers in turn for one step at a time,
in an order that alternates, so all see the same machine noise.

Then Keras's example itself (examples/stateful_lstm.py, one epoch: 2000
steps) on two pocl contexts: its seconds and its final loss.

    python benchmarks/opencl.py [--rounds 20] [--models mlp,...] [--before REV]
"""
import math
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cl_counter  # noqa: E402
from harness import PYTHON, REPO, child_env, median, package_at, record  # noqa: E402
from models import EXAMPLE_MODELS, MODELS  # noqa: E402
from one_context import Worker, models_parser  # noqa: E402

COMMAND = 'python benchmarks/opencl.py'
# The last commit whose zero fills built a program at every call.
BEFORE = '3802721'
ONE = 'contexts=dev0->opencl0:0'
TWO = 'contexts=dev0->opencl0:0;dev1->opencl0:1'
DEFAULT_MODELS = ','.join(MODELS + EXAMPLE_MODELS)


def measure(rounds, models, before):
    """{model: {side: {'times': [...], 'programs': [...]}}}."""
    base = tempfile.mkdtemp(prefix='opencl_')
    counter = cl_counter.build(base)
    sides = {'cpu': ('', {}), 'pocl': (ONE, {'LD_PRELOAD': counter})}
    old = package_at(before, os.path.join(base, 'before')) if before else None
    if old:
        sides['pocl_before'] = (ONE, {'LD_PRELOAD': counter, 'PYTHONPATH': old})
    workers = {}
    try:
        for side, (flags, extra) in sides.items():
            home = os.path.join(base, side)
            os.makedirs(home)
            workers[side] = Worker(home, 'theano_multigpu', flags, extra)
        for name in models:
            for side, worker in workers.items():
                built = worker.ask({'build': name})
                print('  built %-14s %-12s in %.1f s' % (name, side, built['seconds']),
                      flush=True)
        results = dict((name, dict((side, {'times': [], 'programs': []}) for side in workers))
                       for name in models)
        order = list(workers)
        for round_index in range(rounds):
            for name in models:
                for side in (order if round_index % 2 == 0 else order[::-1]):
                    answer = workers[side].ask({'time': name, 'steps': 1})
                    results[name][side]['times'] += answer['times']
                    if 'programs' in answer:
                        results[name][side]['programs'].append(answer['programs'])
        return results
    finally:
        for worker in workers.values():
            worker.close()


def figures_for(results, rounds, before):
    figures = []
    for name, by_side in results.items():
        cpu = median(by_side['cpu']['times'])
        detail = {'cpu_ms': cpu * 1e3, 'steps_each': rounds,
                  'where': 'one pocl context (contexts=dev0->opencl0:0) and the CPU, the shim'}
        line = '  %-14s cpu %8.2f ms' % (name, cpu * 1e3)
        for side in ('pocl', 'pocl_before'):
            if side not in by_side:
                continue
            pocl = median(by_side[side]['times'])
            programs = by_side[side]['programs']
            per_step = sum(programs) / float(len(programs)) if programs else None
            detail.update({side + '_ms': pocl * 1e3, side + '_programs_per_step': per_step})
            line += '  %s %8.2f ms (x%.1f, %s programs a step)' % (
                side, pocl * 1e3, pocl / cpu, per_step)
        print(line, flush=True)
        after = detail['pocl_ms'] / detail['cpu_ms']
        figures.append({
            'name': 'opencl/%s step time, one pocl context over the CPU' % name,
            'value': round(after, 2), 'unit': 'ratio', 'goal': 'as low as pocl allows',
            'command': COMMAND, 'detail': dict(detail, before_revision=before, before_ratio=(
                round(detail['pocl_before_ms'] / detail['cpu_ms'], 2)
                if 'pocl_before_ms' in detail else None))})
        figures.append({
            'name': 'opencl/%s programs built per step, one pocl context' % name,
            'value': detail['pocl_programs_per_step'], 'unit': 'programs', 'goal': '0',
            'command': COMMAND,
            'detail': {'before': detail.get('pocl_before_programs_per_step'),
                       'before_revision': before, 'steps': rounds}})
    return figures


def example_epoch():
    """Keras's stateful_lstm example, one epoch on two pocl contexts:
    (the epoch's seconds, its loss, the whole run's seconds: start-up,
    compiling and the prediction over the data included)."""
    home = tempfile.mkdtemp(prefix='opencl_example_')
    started = time.time()
    result = subprocess.run([PYTHON, os.path.join(REPO, 'examples', 'stateful_lstm.py'),
                             '--epochs', '1'], env=child_env(home, TWO), cwd=home,
                            capture_output=True, text=True, timeout=3600)
    whole = time.time() - started
    epoch = re.search(r'epoch 1/1: loss (\S+), ([0-9.]+) s', result.stdout)
    if result.returncode != 0 or not epoch:
        raise RuntimeError('examples/stateful_lstm.py failed (exit status %d):\n%s'
                           % (result.returncode, (result.stdout + result.stderr)[-3000:]))
    loss, seconds = float(epoch.group(1)), float(epoch.group(2))
    if not math.isfinite(loss):
        raise RuntimeError('examples/stateful_lstm.py on two pocl contexts: the loss after '
                           'one epoch is %r, expected a finite number' % loss)
    return seconds, loss, whole


def main(argv=None):
    parser = models_parser(__doc__, DEFAULT_MODELS)
    parser.add_argument('--before', default=BEFORE,
                        help='the revision of the "before" side (default %s; "" for none)'
                        % BEFORE)
    parser.add_argument('--no-example', action='store_true',
                        help="skip the example's epoch on two contexts")
    args = parser.parse_args(argv)
    print('OpenCL: one pocl context over the CPU, now and at %s:' % (args.before or '-'),
          flush=True)
    models = [name for name in args.models.split(',') if name]   # '' for the example alone
    figures = figures_for(measure(args.rounds, models, args.before), args.rounds,
                          args.before) if models else []
    if not args.no_example:
        seconds, loss, whole = example_epoch()
        print("  Keras's stateful_lstm example, one epoch (2000 steps) on two pocl contexts: "
              '%.0f s, loss %.4f (the whole run %.0f s)' % (seconds, loss, whole), flush=True)
        figures.append({
            'name': "opencl/stateful_lstm example, one epoch on two pocl contexts",
            'value': round(seconds, 1), 'unit': 's', 'goal': 'minutes, a finite loss',
            'command': COMMAND, 'detail': {'loss': loss, 'steps': 2000, 'whole_run_s': whole,
                                           'whole_run': 'start-up, compiling, the epoch and '
                                                        'the prediction over the data'}})
    record(figures)
    return figures


if __name__ == '__main__':
    main()
