"""Where a training step's time goes, in one process or in each MPI rank:
a model of benchmarks/models.py (size 'bench') trained for a few hundred
steps; Theano's profiler, when asked for, prints each op's share at exit.

    export KERAS_BACKEND=theano_multigpu OPENBLAS_NUM_THREADS=1
    export THEANO_FLAGS=floatX=float32,openmp=False,profile=True
    python benchmarks/mpi_profile.py [--model mlp] [--batch 256] [--steps 400]
    mpirun -np 2 python benchmarks/mpi_profile.py

Each process prints its median step (train_on_batch), the compiled
function's own median, and under MPI the seconds per step inside the
collectives (waiting for the other ranks included).
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import build  # noqa: E402


def median_ms(call, steps):
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return float(np.median(times)) * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default='mlp', help='from benchmarks/models.py (default mlp)')
    parser.add_argument('--batch', type=int, default=256, help='global batch (default 256)')
    parser.add_argument('--steps', type=int, default=400, help='steps timed (default 400)')
    args = parser.parse_args(argv)
    case = build(args.model, 'bench', batch=args.batch)
    model = getattr(case.model, 'model', case.model)
    for _ in range(5):   # compiles, then warms up
        model.train_on_batch(case.x, case.y)
    inputs = [case.x, case.y, np.ones(len(case.x), 'float32')]
    figures = {'train_on_batch ms': median_ms(lambda: model.train_on_batch(case.x, case.y),
                                              args.steps),
               'compiled function ms': median_ms(lambda: model.train_function(inputs),
                                                 args.steps)}
    rank = os.environ.get('OMPI_COMM_WORLD_RANK')
    if rank is not None:
        from theano_multigpu.mpi import ops
        before = sum(ops.collective_seconds.values())
        median_ms(lambda: model.train_function(inputs), args.steps)
        figures['collectives ms per step'] = ((sum(ops.collective_seconds.values()) - before)
                                              / args.steps * 1e3)
    print('%s %s, batch %d: %s' % ('rank %s:' % rank if rank else 'one process:', args.model,
                                   args.batch, ', '.join('%s %.3f' % item
                                                         for item in figures.items())),
          flush=True)


if __name__ == '__main__':
    main()
