"""Batch-wise mode on pocl: 2 and 4 contexts against 1 at the same global batch.

pocl runs one device at a time (one Theano function driving two pocl
devices took as long as driving one), so N contexts cannot be faster
than one here: the step-time ratio measures what the split costs (the
slices, the weight copies, the gathers and the gradient sum), which is the
shim's overhead (goal <= 1.10 at 2 contexts).  One long-lived worker per
configuration (benchmarks/step_worker.py); the driver asks them in turn for
one step at a time, rotating the order, so all see the same machine noise.
Also: the train function's compile time at 4 contexts over 1 (warm Theano
cache, so this is graph building and optimisation; goal <= 2.0), and the
bytes moved per step against the model's parameter bytes.

    python benchmarks/batchwise.py [--rounds 20] [--models mlp,cnn]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import median  # noqa: E402
from one_context import models_main, shim_workers  # noqa: E402

COMMAND = 'python benchmarks/batchwise.py'
CONTEXTS = {1: 'contexts=dev0->opencl0:0',
            2: 'contexts=dev0->opencl0:0;dev1->opencl0:1',
            4: 'contexts=dev0->opencl0:0;dev1->opencl0:1;dev2->opencl0:0;dev3->opencl0:1'}
COMPILES = 3


def measure(rounds, models):
    """(step seconds, compile seconds, moved bytes) per model and count."""
    workers = shim_workers('batchwise_', CONTEXTS)
    try:
        steps = {name: {n: [] for n in workers} for name in models}
        compiles = {name: {n: [] for n in workers} for name in models}
        moved = {name: {} for name in models}
        for name in models:
            for n, worker in workers.items():
                built = worker.ask({'build': name})
                print('  built %-5s on %d context(s) in %.1f s' % (name, n, built['seconds']),
                      flush=True)
                moved[name][n] = worker.ask({'moved': name})
                for _ in range(COMPILES):
                    compiles[name][n].append(worker.ask({'compile': name})['seconds'])
        order = list(workers)
        for round_index in range(rounds):
            rotated = order[round_index % len(order):] + order[:round_index % len(order)]
            for name in models:
                for n in rotated:
                    steps[name][n] += workers[n].ask({'time': name, 'steps': 1})['times']
        return steps, compiles, moved
    finally:
        for worker in workers.values():
            worker.close()


def figures_for(steps, compiles, moved):
    figures = []
    for name in steps:
        one = median(steps[name][1])
        for n in (2, 4):
            many = median(steps[name][n])
            print('  %-5s step: 1 context %8.2f ms, %d contexts %8.2f ms, ratio %.3f'
                  % (name, one * 1e3, n, many * 1e3, many / one))
            figures.append({
                'name': 'batchwise/pocl/%s step time, %d contexts over 1' % (name, n),
                'value': round(many / one, 4), 'unit': 'ratio',
                'goal': '<= 1.10' if n == 2 else '', 'command': COMMAND,
                'detail': {'one_ms': one * 1e3, 'many_ms': many * 1e3,
                           'steps_each': len(steps[name][n]),
                           'where': 'pocl, same global batch (64); pocl runs one device '
                                    'at a time, so this is the overhead of the split'}})
        compile_one, compile_four = median(compiles[name][1]), median(compiles[name][4])
        print('  %-5s compile: 1 context %.2f s, 4 contexts %.2f s, ratio %.2f'
              % (name, compile_one, compile_four, compile_four / compile_one))
        figures.append({
            'name': 'batchwise/pocl/%s train-function compile time, 4 contexts over 1' % name,
            'value': round(compile_four / compile_one, 3), 'unit': 'ratio', 'goal': '<= 2.0',
            'command': COMMAND,
            'detail': {'one_s': compile_one, 'four_s': compile_four, 'compiles_each': COMPILES,
                       'where': 'warm Theano cache: graph building and optimisation'}})
        for n in (2, 4):
            moved_bytes = moved[name][n]['bytes']
            parameter_bytes = moved[name][n]['parameter_bytes']
            print('  %-5s moved per step on %d contexts: %d bytes = %.2f x the %d parameter bytes'
                  % (name, n, moved_bytes, moved_bytes / parameter_bytes, parameter_bytes))
            figures.append({
                'name': 'batchwise/pocl/%s bytes moved per step over parameter bytes, '
                        '%d contexts' % (name, n),
                'value': round(moved_bytes / parameter_bytes, 3), 'unit': 'ratio',
                'command': COMMAND,
                'detail': {'moved_bytes': moved_bytes, 'parameter_bytes': parameter_bytes,
                           'where': 'measured by the ToContext transfers of one step, batch 64; '
                                    'ideal is 2 x (N-1) (weights out, gradients back) plus '
                                    'the activations at the slice edges'}})
    return figures


def main(argv=None):
    return models_main(argv, __doc__, 'mlp,cnn', 'batch-wise on pocl, 1, 2 and 4 contexts, same global batch:', measure, figures_for)


if __name__ == '__main__':
    main()
