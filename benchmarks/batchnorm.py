"""Synchronised against local BatchNormalization, batch-wise on pocl.

multigpu.batchnorm=sync (the default) normalises each replica's rows with
the whole batch's statistics: every BatchNormalization layer joins the
replicas' inputs on the master and sends the mean and 1/std back, a wait
for every context.  multigpu.batchnorm=local uses each replica's rows.  The
figure is the step time of sync over local on a CNN with two
BatchNormalization layers, at 2 and 4 contexts and the same global batch;
one long-lived worker per configuration, asked in turn with the order
rotated, so all see the same machine noise.  pocl runs one device at a
time, so this is the cost of the extra copies and ops, not of the wait.

    python benchmarks/batchnorm.py [--rounds 20] [--models cnn_bn]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batchwise import CONTEXTS  # noqa: E402
from harness import median  # noqa: E402
from one_context import models_main, shim_workers, time_in_turn  # noqa: E402

COMMAND = 'python benchmarks/batchnorm.py'
CONFIGURATIONS = dict(((mode, n), CONTEXTS[n] + ',multigpu.batchnorm=' + mode)
                      for mode in ('sync', 'local') for n in (2, 4))


def measure(rounds, models):
    """{model: {(mode, contexts): [step seconds]}}."""
    return (time_in_turn(shim_workers('batchnorm_', CONFIGURATIONS), models, rounds,
                         lambda key: 'batchnorm=%s, %d contexts' % key),)


def figures_for(steps):
    figures = []
    for name in steps:
        for n in (2, 4):
            sync, local = median(steps[name][('sync', n)]), median(steps[name][('local', n)])
            print('  %s on %d contexts: sync %.2f ms, local %.2f ms, ratio %.3f'
                  % (name, n, sync * 1e3, local * 1e3, sync / local))
            figures.append({
                'name': 'batchnorm/pocl/%s step time, synchronised over local '
                        'BatchNormalization, %d contexts' % (name, n),
                'value': round(sync / local, 4), 'unit': 'ratio', 'command': COMMAND,
                'detail': {'sync_ms': sync * 1e3, 'local_ms': local * 1e3,
                           'steps_each': len(steps[name][('sync', n)]),
                           'where': 'pocl, batch 64, two BatchNormalization layers'}})
    return figures


def main(argv=None):
    return models_main(argv, __doc__, 'cnn_bn',
                       'BatchNormalization on pocl, synchronised and local, 2 and 4 contexts:',
                       measure, figures_for)


if __name__ == '__main__':
    main()
