"""Layer-wise mode on pocl: how evenly the plan spreads the memory, and what
it costs per step.

- Balance: for the balanced plan of a deep MLP (9 dense layers) and a
  deeper CNN (4 convolutions, 2 dense) on 2 and 3 contexts, the largest
  context's resident bytes (weights + optimizer state, read off the
  compiled train function) over the mean (total / N); goal <= 1.10.  Also
  the same ratio for the bytes the plan balances (weights, state and
  activations at the batch), with equal budgets on every context.
- Step time: layer-wise on 2 contexts over 1 context at the same batch
  (goal <= 1.05).  pocl runs one device at a time, so this is the cost of
  the activation copies between contexts and of the rewrite.  Workers are
  asked in turn, rotating the order, so both see the same machine noise.

    python benchmarks/layerwise.py [--rounds 20] [--models deep_mlp,deep_cnn]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import median  # noqa: E402
from one_context import models_main, shim_workers  # noqa: E402

COMMAND = 'python benchmarks/layerwise.py'
# Equal budgets: pocl's free memory would give dev0 and dev2, which share
# a device, half a budget each, and the plan balances shares of budgets.
LAYER = ',multigpu.mode=layer,multigpu.device_memory=1GiB'
CONTEXTS = {1: 'contexts=dev0->opencl0:0',
            2: 'contexts=dev0->opencl0:0;dev1->opencl0:1' + LAYER,
            3: 'contexts=dev0->opencl0:0;dev1->opencl0:1;dev2->opencl0:0' + LAYER}


def measure(rounds, models):
    """(step seconds {model: {n: [...]}}, placement {model: {n: answer}})."""
    workers = shim_workers('layerwise_', CONTEXTS)
    try:
        steps = {name: {n: [] for n in (1, 2)} for name in models}
        placements = {name: {} for name in models}
        for name in models:
            for n, worker in workers.items():
                built = worker.ask({'build': name})
                print('  built %-8s on %d context(s) in %.1f s' % (name, n, built['seconds']),
                      flush=True)
                if n > 1:
                    placements[name][n] = worker.ask({'placement': name})
        for round_index in range(rounds):
            order = [1, 2] if round_index % 2 == 0 else [2, 1]
            for name in models:
                for n in order:
                    steps[name][n] += workers[n].ask({'time': name, 'steps': 1})['times']
        return steps, placements
    finally:
        for worker in workers.values():
            worker.close()


def _largest_over_mean(per_context):
    values = list(per_context.values())
    return max(values) / (float(sum(values)) / len(values))


def figures_for(steps, placements):
    figures = []
    for name in steps:
        for n, answer in sorted(placements[name].items()):
            resident, planned = answer['resident'], answer['planned']
            ratio = _largest_over_mean(resident)
            print('  %-8s %d contexts: resident %s bytes, largest over mean %.3f; '
                  'planned %s, %.3f' % (name, n, resident, ratio, planned,
                                        _largest_over_mean(planned)))
            figures.append({
                'name': 'layerwise/pocl/%s largest resident bytes over mean, %d contexts'
                        % (name, n),
                'value': round(ratio, 4), 'unit': 'ratio', 'goal': '<= 1.10',
                'command': COMMAND,
                'detail': {'resident_bytes': resident, 'planned_bytes': planned,
                           'planned_largest_over_mean': round(_largest_over_mean(planned), 4),
                           'where': 'balanced plan at batch 64; resident = weights + Adam '
                                    'state read by the compiled train function; planned = '
                                    'what the plan balances (plus activations)'}})
        one, two = median(steps[name][1]), median(steps[name][2])
        print('  %-8s step: 1 context %8.2f ms, 2 contexts layer-wise %8.2f ms, ratio %.3f'
              % (name, one * 1e3, two * 1e3, two / one))
        figures.append({
            'name': 'layerwise/pocl/%s step time, 2 contexts over 1' % name,
            'value': round(two / one, 4), 'unit': 'ratio', 'goal': '<= 1.05',
            'command': COMMAND,
            'detail': {'one_ms': one * 1e3, 'two_ms': two * 1e3,
                       'steps_each': len(steps[name][2]),
                       'where': 'pocl, batch 64; pocl runs one device at a time'}})
    return figures


def main(argv=None):
    return models_main(argv, __doc__, 'deep_mlp,deep_cnn', 'layer-wise on pocl, 2 and 3 contexts against 1:', measure, figures_for)


if __name__ == '__main__':
    main()
