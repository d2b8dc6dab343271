"""Capacity: the largest model whose step fits one per-context memory
budget, on N contexts over on one, on pocl.

The model is benchmarks/models.py's deep MLP (64 inputs, DEPTH hidden
layers of W units, 10 classes; Adam) at a batch of 64: most of its bytes
in layers of one size, as in the models FSDP and ZeRO are measured on.  Each
context count runs in a long-lived worker (benchmarks/step_worker.py)
with the budget as ``multigpu.device_memory`` and the step's peak measured
(``multigpu.measure_peak``); the defaults otherwise (sharded batch-wise,
``multigpu.accumulate=auto``; one context runs as plain Keras does, with
no plan).  A width fits when the plan takes it and every context's planned
and measured peak stay within the budget.  The driver
doubles W until a width does not fit, then bisects to the largest width
that fits (within 2%):

- the parameters of the largest model that fits N contexts over those of
  the largest that fits one (goal >= 0.8 N at 2 and 4 contexts);
- per context, the bytes resident, the planned peak and the measured
  peak of the largest model that fits one context, run on each count:
  drawn in benchmarks/memory.png.

    python benchmarks/capacity.py [--budget-mib 16] [--counts 2,4]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, record  # noqa: E402
from one_context import shim_workers  # noqa: E402

COMMAND = 'python benchmarks/capacity.py'
NAMES = ['dev0->opencl0:0', 'dev1->opencl0:1', 'dev2->opencl0:0', 'dev3->opencl0:1']
BATCH, INPUTS, DEPTH, CLASSES = 64, 64, 4, 10
# Bisection stops when the widths that fit and do not fit are this close.
RESOLUTION = 1.02
PLOT = os.path.join(REPO, 'benchmarks', 'memory.png')


def flags_for(count, budget):
    return 'contexts=%s,multigpu.device_memory=%d,multigpu.measure_peak=True' % (
        ';'.join(NAMES[:count]), budget)


def probe(worker, width, budget, alone):
    """The worker's answer for the MLP of ``width`` units, with 'fits'
    False where a context's measured peak exceeds ``budget``, or (``alone``:
    one context, which has no plan to refuse) its planned peak."""
    answer = worker.ask({'capacity': 'deep_mlp', 'dims': [INPUTS, width, DEPTH, CLASSES],
                         'batch': BATCH})
    if 'error' in answer:
        raise SystemExit('capacity: the step of width %d failed: %s' % (width, answer['error']))
    # (With several contexts the plan refused what did not fit, as
    # micro-batches too; 'planned' is the step's at once.)
    over = [what for what in (('planned', 'peak') if alone else ('peak',))
            if answer['fits'] and max(answer[what].values()) > budget]
    if over:
        answer = dict(answer, fits=False, why='%s peak %d B over the budget'
                      % (over[0], max(answer[over[0]].values())))
    print('    width %5d: %s' % (width, 'fits, %d parameters, largest measured peak %d B'
                                 % (answer['parameters'], max(answer['peak'].values()))
                                 if answer['fits'] else 'does not fit (%s)' % answer['why']),
          flush=True)
    return answer


def largest_fitting(worker, budget, alone):
    """(width, answer) of the largest width that fits (see the module
    docstring)."""
    low, found = None, None
    width = 64
    while True:
        answer = probe(worker, width, budget, alone)
        if not answer['fits']:
            break
        low, found, width = width, answer, width * 2
    if low is None:
        raise SystemExit('capacity: even %d units do not fit %d bytes; raise --budget-mib'
                         % (width, budget))
    high = width
    while high > low * RESOLUTION and high - low > 1:
        middle = (low + high) // 2
        answer = probe(worker, middle, budget, alone)
        if answer['fits']:
            low, found = middle, answer
        else:
            high = middle
    return low, found


def measure(counts, budget):
    """{count: (largest width, its answer)} and {count: the answer for the
    width largest on one context}."""
    workers = shim_workers('capacity_', dict((n, flags_for(n, budget)) for n in (1,) + counts))
    try:
        largest, same = {}, {}
        for n, worker in workers.items():
            print('  %d context(s):' % n, flush=True)
            largest[n] = largest_fitting(worker, budget, n == 1)
        for n, worker in workers.items():
            same[n] = probe(worker, largest[1][0], budget, False) if n != 1 else largest[1][1]
        return largest, same
    finally:
        for worker in workers.values():
            worker.close()


def figures_for(largest, same, budget):
    figures = []
    one = largest[1][1]['parameters']
    where = ('pocl, MLP of %d inputs, %d hidden layers of W units and %d classes, Adam, '
             'batch %d, multigpu.device_memory %d bytes per context, sharded batch-wise, '
             'multigpu.accumulate=auto' % (INPUTS, DEPTH, CLASSES, BATCH, budget))
    for n in sorted(largest):
        if n == 1:
            continue
        width, answer = largest[n]
        ratio = float(answer['parameters']) / one
        print('  %d contexts: largest width %d (%d parameters) over one context\'s %d (%d): '
              '%.3f (goal >= %.1f)' % (n, width, answer['parameters'], largest[1][0], one,
                                       ratio, 0.8 * n))
        figures.append({
            'name': 'capacity/pocl/deep_mlp largest model under one per-context budget, '
                    '%d contexts over 1' % n,
            'value': round(ratio, 4), 'unit': 'ratio', 'goal': '>= %.1f' % (0.8 * n),
            'command': COMMAND,
            'detail': {'widths': dict((str(k), w) for k, (w, _) in largest.items()),
                       'parameters': dict((str(k), a['parameters'])
                                          for k, (_, a) in largest.items()),
                       'memory_of_the_one_context_model': dict(
                           (str(k), dict((what, a[what]) for what in
                                         ('resident', 'planned', 'peak')))
                           for k, a in same.items() if a['fits']),
                       'where': where}})
    return figures


def draw(same, budget, width, path=PLOT):
    """Per context, resident bytes, planned and measured peak of the model
    largest on one context, on each count."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(9, 4))
    labels, position = [], 0
    kinds = (('resident', 'resident'), ('planned', 'planned peak'), ('peak', 'measured peak'))
    for n in sorted(same):
        answer = same[n]
        if not answer['fits']:
            continue
        for name in sorted(answer['peak']):
            for k, (key, label) in enumerate(kinds):
                axes.bar(position + (k - 1) * 0.27, answer[key].get(name, 0) / 2.0 ** 20, 0.27,
                         color='C%d' % k, label=label if position == 0 else None)
            labels.append((position, '%d ctx\n%s' % (n, name)))
            position += 1
        position += 0.5
    axes.axhline(budget / 2.0 ** 20, color='k', linestyle='--', linewidth=1,
                 label='budget per context')
    axes.set_xticks([p for p, _ in labels])
    axes.set_xticklabels([text for _, text in labels], fontsize=7)
    axes.set_ylabel('MiB')
    axes.set_title('theano_multigpu: memory per context, MLP of %d hidden layers of %d units, '
                   'batch %d '
                   '(benchmarks/capacity.py)' % (DEPTH, width, BATCH), fontsize=9)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print('  wrote %s' % path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--budget-mib', type=float, default=16)
    parser.add_argument('--counts', default='2,4')
    args = parser.parse_args(argv)
    budget = int(args.budget_mib * 2 ** 20)
    counts = tuple(int(n) for n in args.counts.split(','))
    print('capacity: the largest deep MLP whose step fits %d bytes per context, pocl:' % budget,
          flush=True)
    largest, same = measure(counts, budget)
    figures = figures_for(largest, same, budget)
    draw(same, budget, largest[1][0])
    record(figures)
    return figures


if __name__ == '__main__':
    main()
