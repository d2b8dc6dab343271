"""Sharded batch-wise mode, weights split into blocks of rows and whole on
owners, against the master holding every weight, on pocl.

For the MLP and the CNN at 2 and 4 contexts, in four layouts, each in a
long-lived worker (benchmarks/step_worker.py): ``split``, the default
(multigpu.shard_split's default size: weights of that size or more split
into one block of rows per context); ``split_all``, every weight with a
row per context split (multigpu.shard_split=0); ``whole``, each weight on
one owner (multigpu.shard_split=off); ``master``, the master holding every
weight (multigpu.shard=False):

- the busiest context's bytes per step, sent or received (whichever is
  more) between contexts, over the ring all-reduce's 2(N-1)/N x the
  parameter bytes, each way (goal <= 1.15 split; a master holding every
  weight moves about N/2, plus the activations);
- the largest context's resident bytes over the mean (goal <= 1.10
  split; the master alone holds everything);
- the largest context's measured peak during a step over the mean (goal
  <= 1.10), split and whole, each in a worker of its own that measures
  (multigpu.measure_peak) and is not timed;
- the step time split over whole and over master-only (the driver asks
  the workers in turn for one step at a time, rotating the order, so all
  see the same machine noise; pocl runs one device at a time, so this is
  the cost of the bookkeeping, not of the links).

The busiest-link figures are drawn in benchmarks/sharding.png.

    python benchmarks/sharding.py [--rounds 20] [--models mlp,cnn]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, median  # noqa: E402
from one_context import models_main, shim_workers  # noqa: E402

COMMAND = 'python benchmarks/sharding.py'
sys.path.insert(0, REPO)
from theano_multigpu.config.settings import SETTINGS  # noqa: E402
DEFAULT_SPLIT = [s.default for s in SETTINGS if s.name == 'multigpu.shard_split'][0]
NAMES = ['dev0->opencl0:0', 'dev1->opencl0:1', 'dev2->opencl0:0', 'dev3->opencl0:1']
COUNTS = (2, 4)
# The layouts and their settings, compared in this order; the figures'
# value is the default's.
LAYOUTS = (('split', 'multigpu.shard_split=%s' % DEFAULT_SPLIT),
           ('split_all', 'multigpu.shard_split=0'), ('whole', 'multigpu.shard_split=off'),
           ('master', 'multigpu.shard=False'))
# Measured apart (multigpu.measure_peak runs the steps on Theano's Python
# VM, not to be timed): the step's peak per context, split and whole.
PEAK_LAYOUTS = tuple(('%s peak' % layout, flags + ',multigpu.measure_peak=True')
                     for layout, flags in LAYOUTS if layout in ('split', 'whole'))
CONFIGURATIONS = dict(
    ((n, layout), 'contexts=%s,multigpu.mode=batch,%s' % (';'.join(NAMES[:n]), flags))
    for n in COUNTS for layout, flags in LAYOUTS + PEAK_LAYOUTS)
TIMED = [key for key in sorted(CONFIGURATIONS) if not key[1].endswith(' peak')]
PLOT = os.path.join(REPO, 'benchmarks', 'sharding.png')


def measure(rounds, models):
    """(step seconds, traffic) per model and configuration.  Each model
    trains in workers of its own: the plan balances every weight of the
    process, and a model built before would weigh on where this one goes."""
    steps, traffic = {}, {}
    for name in models:
        steps[name], traffic[name] = _measure_one(rounds, name)
    return steps, traffic


def _measure_one(rounds, name):
    workers = shim_workers('sharding_', dict(('%d %s' % key, flags)
                                             for key, flags in CONFIGURATIONS.items()))
    workers = dict((key, workers['%d %s' % key]) for key in CONFIGURATIONS)
    try:
        steps, traffic = dict((key, []) for key in TIMED), {}
        for key, worker in workers.items():
            built = worker.ask({'build': name})
            print('  built %-5s on %d contexts (%s) in %.1f s'
                  % (name, key[0], key[1], built['seconds']), flush=True)
            traffic[key] = worker.ask({'traffic': name})
        order = list(TIMED)
        for round_index in range(rounds):
            shift = round_index % len(order)
            for key in order[shift:] + order[:shift]:
                steps[key] += workers[key].ask({'time': name, 'steps': 1})['times']
        return steps, traffic
    finally:
        for worker in workers.values():
            worker.close()


def busiest_link(traffic, n):
    """The busiest context's bytes sent or received, over 2(N-1)/N x P."""
    optimum = 2.0 * (n - 1) / n * traffic['parameter_bytes']
    return max(max(traffic['sent'][c], traffic['received'][c]) for c in traffic['sent']) / optimum


def resident_spread(traffic):
    """The largest context's resident bytes over the mean."""
    resident = list(traffic['resident'].values())
    return max(resident) / (float(sum(resident)) / len(resident))


def peak_spread(traffic):
    """The largest context's measured peak over the mean."""
    peak = list(traffic['peak'].values())
    return max(peak) / (float(sum(peak)) / len(peak))


def figures_for(steps, traffic):
    figures = []
    where = 'pocl, batch 64, one train step; bytes between contexts (the host\'s copies ' \
            'of the batch left out), measured by the shim\'s transfers'
    for name in steps:
        for n in COUNTS:
            layouts = dict((layout, traffic[name][(n, layout)]) for layout, _ in LAYOUTS)
            for label, measure, goal in (
                    ('busiest context\'s bytes per step over 2(N-1)/N x parameter bytes',
                     lambda t: busiest_link(t, n), '<= 1.15'),
                    ('largest resident bytes over the mean', resident_spread, '<= 1.10')):
                values = dict((layout, measure(t)) for layout, t in layouts.items())
                print('  %-5s %d contexts, %s: %s' % (name, n, label, ', '.join(
                    '%s %.3f' % (layout, values[layout]) for layout, _ in LAYOUTS)))
                figures.append({
                    'name': 'sharding/pocl/%s %s, %d contexts' % (name, label, n),
                    'value': round(values['split'], 3), 'unit': 'ratio', 'goal': goal,
                    'command': COMMAND,
                    'detail': {'split_all': round(values['split_all'], 3),
                               'whole_owners': round(values['whole'], 3),
                               'master_only': round(values['master'], 3),
                               'traffic': dict((layout, layouts[layout]) for layout in layouts),
                               'where': where + '; value: the default shard_split (%s)'
                                        % DEFAULT_SPLIT}})
            peaks = dict((layout, traffic[name][(n, '%s peak' % layout)]['peak'])
                         for layout in ('split', 'whole'))
            spreads = dict((layout, peak_spread({'peak': p})) for layout, p in peaks.items())
            print('  %-5s %d contexts, largest measured peak over the mean: split %.3f, '
                  'whole %.3f (peaks: %s)' % (name, n, spreads['split'], spreads['whole'], peaks))
            figures.append({
                'name': 'sharding/pocl/%s largest measured peak over the mean, %d contexts'
                        % (name, n),
                'value': round(spreads['split'], 3), 'unit': 'ratio', 'goal': '<= 1.10',
                'command': COMMAND,
                'detail': {'whole_owners': round(spreads['whole'], 3), 'peak_bytes': peaks,
                           'where': 'pocl, batch 64, one train step; the most bytes the '
                                    'arrays of the step held on each context at once '
                                    '(multigpu.measure_peak); value: the default '
                                    'shard_split (%s)' % DEFAULT_SPLIT}})
            times = dict((layout, median(steps[name][(n, layout)])) for layout, _ in LAYOUTS)
            print('  %-5s %d contexts, step: %s; split over whole %.3f (all split %.3f), '
                  'over master-only %.3f'
                  % (name, n, ', '.join('%s %.2f ms' % (layout, times[layout] * 1e3)
                                        for layout, _ in LAYOUTS),
                     times['split'] / times['whole'], times['split_all'] / times['whole'],
                     times['split'] / times['master']))
            figures.append({
                'name': 'sharding/pocl/%s step time, every weight split, over whole on owners, '
                        '%d contexts' % (name, n),
                'value': round(times['split_all'] / times['whole'], 4), 'unit': 'ratio',
                'goal': '', 'command': COMMAND,
                'detail': {'where': 'pocl, batch 64; multigpu.shard_split=0'}})
            for other, label, goal in (('whole', 'weights whole on owners', '<= 1.05'),
                                       ('master', 'master-only', '')):
                figures.append({
                    'name': 'sharding/pocl/%s step time split over %s, %d contexts'
                            % (name, label, n),
                    'value': round(times['split'] / times[other], 4), 'unit': 'ratio',
                    'goal': goal, 'command': COMMAND,
                    'detail': dict([('%s_ms' % layout, times[layout] * 1e3)
                                    for layout, _ in LAYOUTS],
                                   steps_each=len(steps[name][(n, 'split')]),
                                   where='pocl, batch 64; pocl runs one device at a time')})
    draw(traffic)
    return figures


def draw(traffic, path=PLOT):
    """The busiest context's bytes over the ring optimum, per model and count."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
    labels, positions = [], []
    for k, (name, n) in enumerate((name, n) for name in traffic for n in COUNTS):
        for offset, layout, colour, label in (
                (-0.3, 'master', 'tab:grey', 'master holds all'),
                (-0.1, 'whole', 'tab:orange', 'each weight on one owner'),
                (0.1, 'split', 'tab:blue', 'weights of %s or more split (default)'
                 % DEFAULT_SPLIT),
                (0.3, 'split_all', 'tab:cyan', 'every weight split')):
            axes.bar(k + offset, busiest_link(traffic[name][(n, layout)], n), 0.2,
                     color=colour, label=label if k == 0 else None)
        labels.append('%s, %d contexts' % (name, n))
        positions.append(k)
    axes.axhline(1.0, linestyle='--', color='black', linewidth=1, label='ring all-reduce')
    axes.set_xticks(positions)
    axes.set_xticklabels(labels, fontsize=8)
    axes.set_ylabel("busiest context's bytes per step\nover 2(N-1)/N x parameter bytes")
    axes.grid(alpha=0.3, axis='y')
    axes.legend(fontsize=8)
    axes.set_title('theano_multigpu: traffic of the busiest link (benchmarks/sharding.py)',
                   fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    print('  plot written to %s' % os.path.relpath(path, REPO))


def main(argv=None):
    return models_main(argv, __doc__, 'mlp,cnn',
                       'sharded batch-wise, weights split and whole, against the master '
                       'holding every weight, pocl, 2 and 4 contexts:', measure, figures_for)


if __name__ == '__main__':
    main()
