"""Layers computed over the whole batch, batch-wise on pocl.

Where a layer's ops make the batch's rows meet, batch-wise mode computes
them over the whole batch on the master: the replicas' rows (or, for a sum
over the rows, their partial sums) cross to the master and the result
back, each step.  The figure is the step time of the mlp with one such
layer over the same mlp without it, at 2 and 4 contexts and the same
global batch: centring (``h - K.mean(h, axis=0)``: partial sums, a few
floats per context) and in-batch attention (``softmax(h h^T) h``: the
rows joined, the batch x batch products on the master).  One long-lived
worker per number of contexts, asked in turn with the order rotated, so
all see the same machine noise.  pocl runs one device at a time, so this is the cost
of the extra copies and ops, not of the wait.

    python benchmarks/whole_batch.py [--rounds 20] [--models mlp_centred,mlp_attention]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batchwise import CONTEXTS  # noqa: E402
from harness import median  # noqa: E402
from models import WHOLE_BATCH_MODELS  # noqa: E402
from one_context import models_main, shim_workers, time_in_turn  # noqa: E402

COMMAND = 'python benchmarks/whole_batch.py'
BASELINE = 'mlp'


def measure(rounds, models):
    """{model: {contexts: [step seconds]}}, the baseline mlp's included."""
    workers = shim_workers('whole_batch_', dict((n, CONTEXTS[n]) for n in (2, 4)))
    return (time_in_turn(workers, [BASELINE] + list(models), rounds,
                         lambda n: '%d contexts' % n),)


def figures_for(steps):
    figures = []
    for name in steps:
        if name == BASELINE:
            continue
        for n in (2, 4):
            with_it, without = median(steps[name][n]), median(steps[BASELINE][n])
            print('  %s on %d contexts: %.2f ms, without the layer %.2f ms, ratio %.3f'
                  % (name, n, with_it * 1e3, without * 1e3, with_it / without))
            figures.append({
                'name': 'whole_batch/pocl/%s step time over the mlp without its whole-batch '
                        'layer, %d contexts' % (name, n),
                'value': round(with_it / without, 4), 'unit': 'ratio', 'command': COMMAND,
                'detail': {'with_ms': with_it * 1e3, 'without_ms': without * 1e3,
                           'steps_each': len(steps[name][n]),
                           'where': 'pocl, batch 64, mlp 64-256-256-10'}})
    return figures


def main(argv=None):
    return models_main(argv, __doc__, ','.join(WHOLE_BATCH_MODELS),
                       'Layers over the whole batch on pocl, 2 and 4 contexts:',
                       measure, figures_for)


if __name__ == '__main__':
    main()
