"""Step time of stock Keras-Theano against the shim at one context.

Stock is ``KERAS_BACKEND=theano THEANO_MULTIGPU_COMPAT=1`` (the Python 3.11
fixes alone), the baseline of every benchmark.  Two long-lived workers, one
per side, train the same models (benchmarks/models.py, size 'bench'); the
driver asks them in turn for one step at a time, alternating which side goes
first, so both see the same machine noise.  Figure: median shim step over
median stock step, per model (goal <= 1.02).

    python benchmarks/one_context.py [--rounds 40] [--configurations cpu,pocl]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (MPIRUN, PYTHON, add_configurations_option, child_env,  # noqa: E402
                     chosen_configurations, median, record)
from models import MODELS  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'step_worker.py')
COMMAND = 'python benchmarks/one_context.py'

# configuration -> side -> (KERAS_BACKEND, THEANO_FLAGS, extra environment)
CONFIGURATIONS = {
    'cpu': {'stock': ('theano', '', {'THEANO_MULTIGPU_COMPAT': '1'}),
            'shim': ('theano_multigpu', '', None)},
    'pocl': {'stock': ('theano', 'device=opencl0:0', {'THEANO_MULTIGPU_COMPAT': '1'}),
             'shim': ('theano_multigpu', 'contexts=dev0->opencl0:0', None)},
}
DESCRIPTION = {'cpu': 'on the CPU (no contexts)',
               'pocl': 'on one pocl context (contexts=dev0->opencl0:0 against device=opencl0:0)'}


class Worker(object):
    """One long-lived child answering a JSON line per JSON request:
    step_worker.py, or ``script`` (under mpirun, with ``ranks``; with a
    pocl cache ``slot`` of its own, see harness.child_env)."""

    def __init__(self, home, backend, flags, extra, ranks=None, script=WORKER, slot=None):
        environment = child_env(home, flags, backend, dict(extra or {}, OPENBLAS_NUM_THREADS='1',
                                                            OMP_NUM_THREADS='1'), slot)
        self.log = open(os.path.join(home, 'worker.log'), 'w')
        launcher = MPIRUN + ['-np', str(ranks)] if ranks else []
        self.process = subprocess.Popen(launcher + [PYTHON, script], env=environment, cwd=home,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True)

    def ask(self, request):
        """The answer to ``request``."""
        self.send(request)
        return self.answer()

    def send(self, request):
        """Hand ``request`` over; ``answer`` waits for what it gives (two
        workers sent requests in turn work side by side)."""
        self.process.stdin.write(json.dumps(request) + '\n')
        self.process.stdin.flush()

    def answer(self):
        """The answer to the request sent last."""
        line = self.process.stdout.readline()
        if not line:
            self.log.flush()
            with open(self.log.name) as log:
                raise RuntimeError('worker exited (%s); its log ends:\n%s'
                                   % (self.process.wait(), log.read()[-4000:]))
        return json.loads(line)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.log.close()


def shim_workers(prefix, contexts, ranks=None):
    """{key: Worker} on the shim, one per THEANO_FLAGS in ``contexts``
    ({key: flags}); a key in ``ranks`` ({key: n}) runs under mpirun."""
    base = tempfile.mkdtemp(prefix=prefix)
    workers = {}
    for key, flags in contexts.items():
        home = os.path.join(base, 'worker_%s' % str(key).replace(' ', '_'))
        os.makedirs(home)
        workers[key] = Worker(home, 'theano_multigpu', flags, None, (ranks or {}).get(key))
    return workers


def time_in_turn(workers, names, rounds, label=str):
    """{name: {key: [step seconds]}}: each model of ``names`` built on each
    of ``workers`` ({key: Worker}, closed at the end), then one step of each
    timed on each, ``rounds`` times, the order of the models and of the
    workers rotated each round so all see the same machine noise.
    ``label(key)`` says which worker a progress line is about."""
    def rotated(items, by):
        return items[by % len(items):] + items[:by % len(items)]
    try:
        for name in names:
            for key, worker in workers.items():
                built = worker.ask({'build': name})
                print('  built %s on %s in %.1f s' % (name, label(key), built['seconds']),
                      flush=True)
        steps = dict((name, dict((key, []) for key in workers)) for name in names)
        for round_index in range(rounds):
            for name in rotated(list(names), round_index):
                for key in rotated(list(workers), round_index):
                    steps[name][key] += workers[key].ask({'time': name, 'steps': 1})['times']
        return steps
    finally:
        for worker in workers.values():
            worker.close()


def models_parser(doc, default_models):
    """The command line of a benchmark over models: --rounds, --models."""
    parser = argparse.ArgumentParser(description=doc.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=20,
                        help='steps timed per configuration and model (default 20)')
    parser.add_argument('--models', default=default_models,
                        help='comma-separated, from benchmarks/models.py (default %s)'
                        % default_models)
    return parser


def models_main(argv, doc, default_models, title, measure, figures_for):
    """The command line of a benchmark over models (--rounds, --models):
    measure, print, record the figures and return them."""
    args = models_parser(doc, default_models).parse_args(argv)
    print(title, flush=True)
    figures = figures_for(*measure(args.rounds, args.models.split(',')))
    record(figures)
    return figures


def measure(configuration, rounds, models=MODELS):
    """{model: {'stock': [seconds...], 'shim': [...]}} for ``configuration``."""
    base = tempfile.mkdtemp(prefix='one_context_')
    workers = {}
    for side, (backend, flags, extra) in CONFIGURATIONS[configuration].items():
        home = os.path.join(base, side)
        os.makedirs(home)
        workers[side] = Worker(home, backend, flags, extra)
    try:
        for name in models:
            for side, worker in workers.items():
                built = worker.ask({'build': name})
                print('  built %-10s %-5s in %.1f s' % (name, side, built['seconds']), flush=True)
        times = {name: {side: [] for side in workers} for name in models}
        for round_index in range(rounds):
            order = ['stock', 'shim'] if round_index % 2 == 0 else ['shim', 'stock']
            for name in models:
                for side in order:
                    times[name][side] += workers[side].ask({'time': name, 'steps': 1})['times']
        return times
    finally:
        for worker in workers.values():
            worker.close()


def figures_for(configuration, times):
    figures = []
    for name, by_side in times.items():
        stock, shim = median(by_side['stock']), median(by_side['shim'])
        print('  %-10s stock %8.3f ms  shim %8.3f ms  shim/stock %.3f  (median of %d steps each)'
              % (name, stock * 1e3, shim * 1e3, shim / stock, len(by_side['shim'])))
        figures.append({
            'name': 'one_context/%s/%s step time, shim over stock' % (configuration, name),
            'value': round(shim / stock, 4), 'unit': 'ratio', 'goal': '<= 1.02',
            'command': '%s --configurations %s' % (COMMAND, configuration),
            'detail': {'stock_ms': stock * 1e3, 'shim_ms': shim * 1e3,
                       'steps_each': len(by_side['shim']), 'where': DESCRIPTION[configuration]}})
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=40,
                        help='steps timed per side and model (default 40)')
    add_configurations_option(parser, CONFIGURATIONS, 'cpu,pocl')
    args = parser.parse_args(argv)
    figures = []
    for configuration in chosen_configurations(parser, args.configurations, CONFIGURATIONS):
        print('one context, %s:' % DESCRIPTION[configuration], flush=True)
        figures += figures_for(configuration, measure(configuration, args.rounds))
    record(figures)
    return figures


if __name__ == '__main__':
    main()
