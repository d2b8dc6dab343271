"""Several processes on the CPU: ``mpirun -np 2`` against one process at
the same global batch, one thread per process; the fused gradient sum
between two ranks against a copy of as many bytes; the cost of the
per-step guards (two ranks with and without them); and the scaling plot.

Step times: one long-lived worker per configuration (benchmarks/step_worker.py,
the two-rank one under mpirun); the driver asks them in turn for a few steps,
rotating the order, so both see the same machine noise, and a worker not
being timed sleeps (the first step of each ask is dropped: its ranks wake
at different moments).  The share of a two-rank step spent in the collectives
(gathering the rows the loss reads, summing the gradients) comes from the
ops' own clocks.  The scaling plot (benchmarks/scaling.png) draws the
speedup against processes (these figures) and against pocl contexts in one
process (pocl runs one device at a time, so contexts cannot speed it up
here: that line shows the split's cost), with the ideal line.

    python benchmarks/mpi.py [--rounds 10] [--batch 256] [--models mlp,cnn]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batchwise import CONTEXTS  # noqa: E402
from harness import REPO, median, record  # noqa: E402
from one_context import shim_workers  # noqa: E402

COMMAND = 'python benchmarks/mpi.py'
PLOT = os.path.join(REPO, 'benchmarks', 'scaling.png')
# Threads: one per process, so two ranks use two cores and one process one.
ONE_THREAD = 'openmp=False'
SUM_SIZES_MB = (4, 100)
# Two ranks with and without the per-step guards (the inputs' digests, the
# gather polled within multigpu.mpi_timeout): what the guards cost.
GUARDED, UNGUARDED = '2 ranks guarded', '2 ranks unguarded'
UNGUARDED_FLAGS = 'multigpu.mpi_check_inputs=False,multigpu.mpi_timeout=inf'
# Steps timed per ask; the first of each is dropped (the ranks of a
# worker that slept while another was timed wake up at different moments).
STEPS_PER_ASK = 20


def time_steps(workers, models, batch, rounds):
    """{model: {key: [step seconds]}}, and {model: [collective seconds per
    step]} of the worker '2 ranks' (when there is one)."""
    for name in models:
        for key, worker in workers.items():
            built = worker.ask({'build': name, 'batch': batch})
            print('  built %-4s on %-12s in %.1f s' % (name, key, built['seconds']), flush=True)
    steps = dict((name, dict((key, []) for key in workers)) for name in models)
    collectives = dict((name, []) for name in models)
    order = list(workers)
    for round_index in range(rounds):
        shift = round_index % len(order)
        for name in models:
            for key in order[shift:] + order[:shift]:
                answer = workers[key].ask({'time': name, 'steps': STEPS_PER_ASK + 1})
                steps[name][key] += answer['times'][1:]
                if key == '2 ranks':   # all steps of the ask, the first too
                    collectives[name].append(sum(answer['collectives'].values())
                                             / len(answer['times']))
    return steps, collectives


def measure_processes(models, batch, rounds):
    """Step times of one process and two ranks (and the fused sums), then,
    with workers of their own (idle workers' ranks add noise), of two ranks
    guarded and unguarded."""
    workers = shim_workers('mpi_', {'1 process': ONE_THREAD, '2 ranks': ONE_THREAD},
                           ranks={'2 ranks': 2})
    try:
        steps, collectives = time_steps(workers, models, batch, rounds)
        sums = dict((mb, workers['2 ranks'].ask({'fused_sum': mb * 2 ** 20, 'repeats': 10}))
                    for mb in SUM_SIZES_MB)
    finally:
        for worker in workers.values():
            worker.close()
    workers = shim_workers('mpi_guards_', {GUARDED: ONE_THREAD,
                                           UNGUARDED: ONE_THREAD + ',' + UNGUARDED_FLAGS},
                           ranks={GUARDED: 2, UNGUARDED: 2})
    try:
        guards, _ = time_steps(workers, models, batch, rounds)
    finally:
        for worker in workers.values():
            worker.close()
    return steps, collectives, sums, guards


def measure_contexts(batch, rounds):
    """{n: [step seconds]} of the MLP on n pocl contexts in one process."""
    workers = shim_workers('mpi_contexts_', CONTEXTS)
    try:
        steps, _ = time_steps(workers, ['mlp'], batch, rounds)
        return steps['mlp']
    finally:
        for worker in workers.values():
            worker.close()


def figures_for(steps, collectives, sums, guards, batch):
    figures = []
    for name in steps:
        one, two = median(steps[name]['1 process']), median(steps[name]['2 ranks'])
        guarded, unguarded = median(guards[name][GUARDED]), median(guards[name][UNGUARDED])
        share = median(collectives[name]) / two
        print('  %-4s step: 1 process %7.2f ms, 2 ranks %7.2f ms, speedup %.2f; '
              'collectives %.1f%% of a 2-rank step; 2 ranks guarded %7.2f ms, unguarded '
              '%7.2f ms (%.3f)' % (name, one * 1e3, two * 1e3, one / two, 100 * share,
                                   guarded * 1e3, unguarded * 1e3, guarded / unguarded))
        where = ('CPU, one thread per process, global batch %d, median of %d steps each'
                 % (batch, len(steps[name]['2 ranks'])))
        figures += [
            {'name': 'mpi/cpu/%s speedup, 2 ranks over 1 process' % name,
             'value': round(one / two, 3), 'unit': 'x', 'goal': '>= 1.85', 'command': COMMAND,
             'detail': {'one_ms': one * 1e3, 'two_ms': two * 1e3, 'where': where}},
            {'name': 'mpi/cpu/%s 2-rank step, guarded over unguarded' % name,
             'value': round(guarded / unguarded, 3), 'unit': 'ratio', 'command': COMMAND,
             'detail': {'guarded_ms': guarded * 1e3, 'unguarded_ms': unguarded * 1e3,
                        'guards': 'each input hashed and the digests compared; '
                                  'non-blocking collectives polled within '
                                  'multigpu.mpi_timeout',
                        'unguarded': UNGUARDED_FLAGS, 'where': where}},
            {'name': 'mpi/cpu/%s share of a 2-rank step in the collectives' % name,
             'value': round(share, 4), 'unit': 'fraction', 'command': COMMAND,
             'detail': {'collective_ms': share * two * 1e3, 'where': where}}]
    for mb, seconds in sums.items():
        copy, copy_new = median(seconds['memcpy']), median(seconds['memcpy_new'])
        fused, plain = median(seconds['fused_sum']), median(seconds['mpi_allreduce'])
        print('  %3d MB: fused sum %7.2f ms, MPI Allreduce %7.2f ms, copy %6.2f ms (into new '
              'memory %6.2f ms): fused sum / copy %.2f, MPI Allreduce / copy %.2f'
              % (mb, fused * 1e3, plain * 1e3, copy * 1e3, copy_new * 1e3, fused / copy,
                 plain / copy))
        where = ('2 ranks on one machine, float32 in 4 arrays; the copy: every rank '
                 'copies as many bytes at once into memory in use; median of %d'
                 % len(seconds['memcpy']))
        figures += [
            {'name': 'mpi/cpu/fused gradient sum of %d MB over a copy, 2 ranks' % mb,
             'value': round(fused / copy, 3), 'unit': 'ratio', 'goal': '<= 2.0',
             'command': COMMAND,
             'detail': {'fused_ms': fused * 1e3, 'copy_ms': copy * 1e3,
                        'copy_into_new_memory_ms': copy_new * 1e3, 'where': where}},
            {'name': 'mpi/cpu/MPI Allreduce of %d MB over a copy, 2 ranks' % mb,
             'value': round(plain / copy, 3), 'unit': 'ratio', 'command': COMMAND,
             'detail': {'allreduce_ms': plain * 1e3, 'copy_ms': copy * 1e3,
                        'where': where + "; Open MPI's own, for comparison"}}]
    return figures


def draw(steps, contexts, path=PLOT):
    """Speedup against workers: ranks (CPU), pocl contexts, ideal."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(6, 4.2), dpi=100)
    most = max(contexts)
    axes.plot([1, most], [1, most], '--', color='grey', label='ideal')
    for name in steps:
        one = median(steps[name]['1 process'])
        axes.plot([1, 2], [1, one / median(steps[name]['2 ranks'])], 'o-',
                  label='%s: MPI ranks, CPU, 1 thread each' % name)
    one = median(contexts[1])
    counts = sorted(contexts)
    axes.plot(counts, [one / median(contexts[n]) for n in counts], 's-',
              label='mlp: pocl contexts, one process\n(pocl runs one device at a time)')
    axes.set_xlabel('processes or contexts')
    axes.set_ylabel('speedup at the same global batch')
    axes.set_xticks(range(1, most + 1))
    axes.set_ylim(0, most + 0.2)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc='upper left')
    axes.set_title('theano_multigpu: scaling (benchmarks/mpi.py)', fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    print('  plot written to %s' % os.path.relpath(path, REPO))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=10,
                        help='rounds of %d steps per configuration and model (default 10)'
                        % STEPS_PER_ASK)
    parser.add_argument('--batch', type=int, default=256, help='global batch (default 256)')
    parser.add_argument('--models', default='mlp,cnn',
                        help='comma-separated, from benchmarks/models.py (default mlp,cnn)')
    args = parser.parse_args(argv)
    print('MPI on the CPU, one thread per process, global batch %d:' % args.batch, flush=True)
    steps, collectives, sums, guards = measure_processes(args.models.split(','), args.batch,
                                                         args.rounds)
    figures = figures_for(steps, collectives, sums, guards, args.batch)
    record(figures)
    print('pocl contexts in one process, for the plot:', flush=True)
    contexts = measure_contexts(args.batch, args.rounds)
    draw(steps, contexts)
    return figures


if __name__ == '__main__':
    main()
