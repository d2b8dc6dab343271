"""Micro-batches (multigpu.accumulate) against one step at the same whole
batch, on pocl.

For the MLP and the CNN on 2 contexts at batch 256, each in long-lived
workers (benchmarks/step_worker.py): the step as 4 micro-batches per
context (multigpu.accumulate=4) and at once (multigpu.accumulate=1):

- the step time of 4 micro-batches over one step (goal <= 1.15; the
  driver asks the workers in turn for one step at a time, rotating the
  order, so both see the same machine noise);
- the largest context's measured peak with 4 micro-batches over the one
  at once (multigpu.measure_peak, in workers of their own, not timed):
  what the micro-batches save.

    python benchmarks/accumulate.py [--rounds 20] [--models mlp,cnn]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import median  # noqa: E402
from one_context import models_main, shim_workers  # noqa: E402

COMMAND = 'python benchmarks/accumulate.py'
BATCH, MICRO_BATCHES = 256, 4
TWO = 'contexts=dev0->opencl0:0;dev1->opencl0:1,multigpu.mode=batch'
CONFIGURATIONS = dict(((k, peak), '%s,multigpu.accumulate=%d%s'
                       % (TWO, k, ',multigpu.measure_peak=True' if peak else ''))
                      for k in (1, MICRO_BATCHES) for peak in (False, True))


def measure(rounds, models):
    """({model: {micro-batches: [step seconds]}}, {model: {micro-batches:
    {context: measured peak bytes}}})."""
    steps, peaks = {}, {}
    for name in models:
        workers = shim_workers('accumulate_', dict(('%d %s' % key, flags)
                                                   for key, flags in CONFIGURATIONS.items()))
        workers = dict((key, workers['%d %s' % key]) for key in CONFIGURATIONS)
        try:
            for key, worker in workers.items():
                built = worker.ask({'build': name, 'batch': BATCH})
                print('  built %-5s as %d micro-batch(es)%s in %.1f s'
                      % (name, key[0], ', measuring' if key[1] else '', built['seconds']),
                      flush=True)
            peaks[name] = dict((k, workers[k, True].ask({'traffic': name})['peak'])
                               for k in (1, MICRO_BATCHES))
            steps[name] = dict((k, []) for k in (1, MICRO_BATCHES))
            for round_index in range(rounds):
                order = [1, MICRO_BATCHES][::1 if round_index % 2 == 0 else -1]
                for k in order:
                    steps[name][k] += workers[k, False].ask({'time': name, 'steps': 1})['times']
        finally:
            for worker in workers.values():
                worker.close()
    return steps, peaks


def figures_for(steps, peaks):
    figures = []
    where = 'pocl, 2 contexts, batch %d, one train step' % BATCH
    for name in steps:
        times = dict((k, median(seconds)) for k, seconds in steps[name].items())
        slower = times[MICRO_BATCHES] / times[1]
        largest = dict((k, max(peak.values())) for k, peak in peaks[name].items())
        smaller = float(largest[MICRO_BATCHES]) / largest[1]
        print('  %-5s step: at once %.2f ms, %d micro-batches %.2f ms: %.3f; largest measured '
              'peak: %d -> %d bytes: %.3f' % (name, times[1] * 1e3, MICRO_BATCHES,
                                              times[MICRO_BATCHES] * 1e3, slower, largest[1],
                                              largest[MICRO_BATCHES], smaller))
        figures.append({
            'name': 'accumulate/pocl/%s step time, %d micro-batches over one step'
                    % (name, MICRO_BATCHES),
            'value': round(slower, 4), 'unit': 'ratio', 'goal': '<= 1.15', 'command': COMMAND,
            'detail': {'at_once_ms': times[1] * 1e3,
                       'micro_batches_ms': times[MICRO_BATCHES] * 1e3,
                       'steps_each': len(steps[name][1]), 'where': where}})
        figures.append({
            'name': 'accumulate/pocl/%s largest measured peak, %d micro-batches over one step'
                    % (name, MICRO_BATCHES),
            'value': round(smaller, 4), 'unit': 'ratio', 'goal': '', 'command': COMMAND,
            'detail': {'peak_bytes': dict((str(k), p) for k, p in peaks[name].items()),
                       'where': where + '; the most bytes the step held on each context at '
                                        'once (multigpu.measure_peak)'}})
    return figures


def main(argv=None):
    return models_main(argv, __doc__, 'mlp,cnn',
                       'micro-batches against one step at the same batch, pocl, 2 contexts:',
                       measure, figures_for)


if __name__ == '__main__':
    main()
