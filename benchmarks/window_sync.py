"""What synchronising the shared-memory window as MPI-3 specifies costs:
the fused gradient sum between 2 ranks with Win_sync, a barrier and
Win_sync between its steps, over the same sum with the barrier alone
(which is enough on x86, not on every machine), calls alternated in one
run; the median of each.

    python benchmarks/window_sync.py [--repeats 20]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MPIRUN, PYTHON, child_env, record  # noqa: E402

COMMAND = 'python benchmarks/window_sync.py'
SIZES_MB = (4, 100)

RANK = r'''
import json, sys, time
import numpy as np
from theano_multigpu.mpi.transport import FusedSum
from theano_multigpu.mpi.world import world
comm, rank, size = world()
repeats = int(sys.argv[1])
fused = FusedSum(comm, shared_memory=True)
synchronised = FusedSum._synchronise
def barrier_alone(self):
    self.node.Barrier()
results = {}
for mb in [int(m) for m in sys.argv[2:]]:
    arrays = [np.ones(mb * 2 ** 20 // 16, 'float32') for _ in range(4)]
    fused.sum(arrays)
    times = {'synchronised': [], 'barrier_alone': []}
    for repeat in range(repeats):
        order = [('synchronised', synchronised), ('barrier_alone', barrier_alone)]
        for name, synchronise in (order if repeat % 2 else order[::-1]):
            FusedSum._synchronise = synchronise
            comm.Barrier()
            started = time.perf_counter()
            fused.sum(arrays)
            times[name].append(time.perf_counter() - started)
    results[mb] = dict((name, float(np.median(t))) for name, t in times.items())
if rank == 0:
    print('RESULT ' + json.dumps(results))
'''


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--repeats', type=int, default=20)
    args = parser.parse_args(argv)
    home = tempfile.mkdtemp(prefix='window_sync_')
    result = subprocess.run(MPIRUN + ['-np', '2', PYTHON, '-c', RANK, str(args.repeats)]
                            + [str(mb) for mb in SIZES_MB],
                            env=child_env(home, extra={'OMP_NUM_THREADS': '1'}), cwd=home,
                            capture_output=True, text=True, timeout=900)
    lines = [l for l in result.stdout.splitlines() if l.startswith('RESULT ')]
    if result.returncode != 0 or not lines:
        raise RuntimeError('window benchmark exited %d:\n%s'
                           % (result.returncode, result.stderr[-4000:]))
    figures = []
    measured = json.loads(lines[-1][len('RESULT '):])
    for mb, times in sorted(measured.items(), key=lambda item: int(item[0])):
        ratio = times['synchronised'] / times['barrier_alone']
        print('  %3s MB: fused sum with Win_sync %.2f ms, barrier alone %.2f ms: %.3f'
              % (mb, times['synchronised'] * 1e3, times['barrier_alone'] * 1e3, ratio))
        figures.append({
            'name': 'mpi/cpu/fused sum of %s MB, Win_sync and barrier over barrier alone, '
                    '2 ranks' % mb,
            'value': round(ratio, 3), 'unit': 'ratio', 'goal': 'no measurable cost',
            'command': COMMAND,
            'detail': {'synchronised_ms': times['synchronised'] * 1e3,
                       'barrier_alone_ms': times['barrier_alone'] * 1e3,
                       'repeats_each': args.repeats}})
    record(figures)
    return figures


if __name__ == '__main__':
    main()
