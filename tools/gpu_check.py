"""The GPU check (run through tools/gpu_check.sh, which sets up the stack).

    python tools/gpu_check.py OUTDIR [--device cuda0] [--models mlp,cnn,lstm,cnn_bn]
                              [--rounds 20] [--minutes 7.5]

On one device (``--device``; a pocl device, opencl0:0, stands in where
there is no GPU), writes into OUTDIR:

- ``libraries.txt``: the CUDA driver, NVRTC and cuBLAS libraries found
  (libgpuarray opens them by the names libcuda.so, libnvrtc.so and
  libcublas.so, which CUDA 12 and 13, and the pip packages nvidia-cuda-nvrtc
  and nvidia-cublas, do not carry: OUTDIR/cuda-libs links those names to
  what was found), or which are missing and where it looked;
- ``info.txt``: ``python -m theano_multigpu info``;
- for each configuration, the results of tests/children/train_models.py
  (its log and .npz): the CPU, one context, batch-wise on 2 and 4 names of
  the device (sharded and the master holding every weight), layer-wise on
  2 names; each compared with one context (the CPU for one context);
- ``steps``: the step time of benchmarks/models.py's MLP and CNN at 1, 2
  and 4 names (sharded batch-wise), and the bytes each context sent and
  received per step;
- ``summary.json`` and ``summary.md``: every figure.

Exits 0 when every comparison holds, 1 when one does not, 2 when the stack
is incomplete (a library missing).
"""
import argparse
import functools
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
from harness import PYTHON, child_env, median  # noqa: E402

CHILD = os.path.join(REPO, 'tests', 'children', 'train_models.py')
STEPS, BATCH = 5, 10
# The share of --minutes kept for the step times.
STEPS_SHARE = 0.25
# One context against the CPU (the kernels sum in other orders), several
# contexts against one (the tests' tolerances).
CPU_RTOL, CPU_ATOL = 1e-3, 1e-4
RTOL, ATOL = 1e-4, 1e-6
# Those of --models that one context is compared with the CPU on.
PARITY_MODELS = ('mlp', 'cnn', 'lstm')
# Theano's C code compiled without optimisation: compiling dominates.  From
# a bundle, gpu_check.sh adds its header and library folders.
COMPILE_FLAGS = 'gcc.cxxflags=%s,dnn.enabled=False' % ' '.join(
    ['-O0', '-g0'] + os.environ.get('GPU_CHECK_CXXFLAGS', '').split())

# (what, the name libgpuarray 0.7.6 opens); the CUDA versions tried, newest first.
CUDA_LIBRARIES = [('CUDA driver', 'libcuda.so'), ('NVRTC', 'libnvrtc.so'),
                  ('cuBLAS', 'libcublas.so')]
CUDA_MAJORS = (13, 12, 11)
# The file names that serve, CUDA's major version (None: unknown) with each.
_DRIVER_NAMES = [('libcuda.so.1', None), ('libcuda.so', None)]


def _toolkit_names(opened):
    names = [('%s.%d' % (opened, major) + ('.2' if opened == 'libnvrtc.so' and major == 11
                                           else ''), major) for major in CUDA_MAJORS]
    return names + [(opened, None)]


def library_folders(environ=os.environ, roots=('/',), loader_cache=True):
    """Folders that may hold the CUDA libraries, in the order searched:
    LD_LIBRARY_PATH, the dynamic loader's cache (ldconfig -p, 64-bit
    entries), the usual system and CUDA toolkit folders, WSL's, and the lib
    folders of pip's nvidia packages in every site-packages found (those
    GPU_CHECK_SITES names, which gpu_check.sh asks the machine's python3
    for, VIRTUAL_ENV's, and the system's, /usr/local's, users' and virtual
    environments' under /opt, /root, /workspace and the home folders), each
    under ``roots``."""
    folders = [f for f in environ.get('LD_LIBRARY_PATH', '').split(':') if f]
    if loader_cache:
        try:
            cache = subprocess.run(['ldconfig', '-p'], capture_output=True, text=True,
                                   timeout=30).stdout
            folders += [os.path.dirname(p) for p in re.findall(r'\(libc6,x86-64[^)]*\) => (\S+)',
                                                               cache)]
        except (OSError, subprocess.SubprocessError):
            pass
    sites = [f for f in environ.get('GPU_CHECK_SITES', '').split(':') if f]
    if environ.get('VIRTUAL_ENV'):
        sites += glob.glob(os.path.join(environ['VIRTUAL_ENV'], 'lib', 'python3*',
                                        'site-packages'))
    for root in roots:
        def under(*pattern):
            return sorted(glob.glob(os.path.join(root, *pattern)), reverse=True)
        folders += under('usr', 'lib', 'x86_64-linux-gnu') + under('usr', 'lib64')
        folders += under('usr', 'lib', 'wsl', 'lib')
        for cuda in under('usr', 'local', 'cuda*') + under('opt', 'cuda*'):
            folders += [os.path.join(cuda, 'lib64'),
                        os.path.join(cuda, 'targets', 'x86_64-linux', 'lib')]
        for base in (('usr', 'lib'), ('usr', 'local', 'lib'), ('root', '.local', 'lib'),
                     ('home', '*', '.local', 'lib'), ('opt', '*', 'lib'),
                     ('opt', '*', '*', 'lib'), ('root', '*', 'lib'), ('root', '*', '*', 'lib'),
                     ('workspace', '*', 'lib'), ('workspace', '*', '*', 'lib'),
                     ('home', '*', '*', 'lib'), ('home', '*', '*', '*', 'lib')):
            for packages in ('site-packages', 'dist-packages'):
                sites += under(*(base + ('python3*', packages)))
    for site in sites:
        folders += sorted(glob.glob(os.path.join(site, 'nvidia', '*', 'lib')), reverse=True)
    seen, ordered = set(), []
    for folder in folders:
        if folder not in seen and os.path.isdir(folder):
            seen.add(folder)
            ordered.append(folder)
    return ordered


def driver_cuda_version(path):
    """The CUDA version the driver at ``path`` supports (12040 for 12.4),
    or None where it cannot tell."""
    import ctypes
    try:
        version = ctypes.c_int()
        if ctypes.CDLL(path).cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value
    except (OSError, AttributeError):
        pass
    return None


def _first(folders, names):
    """(path, major) of the first name, in the first folder, that exists."""
    for name, major in names:
        for folder in folders:
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name), major
    return None, None


def find_cuda_libraries(folders, first=(), driver_version=None):
    """{what: path or None}, and the driver's CUDA version.  The driver
    first; then NVRTC and cuBLAS of one CUDA version, the newest the driver
    runs (``driver_version``, or what the driver found says), found in
    ``first`` (the user's LD_LIBRARY_PATH) before the other folders; where
    no version has both, each the best there is."""
    found = {'CUDA driver': _first(folders, _DRIVER_NAMES)[0]}
    if driver_version is None and found['CUDA driver']:
        driver_version = driver_cuda_version(found['CUDA driver'])
    runs = [m for m in CUDA_MAJORS if driver_version is None or m * 1000 <= driver_version]
    for searched in ([f for f in first if f in folders], folders):
        for major in runs:
            pair = [_first(searched, [n for n in _toolkit_names(opened) if n[1] == major])[0]
                    for _, opened in CUDA_LIBRARIES[1:]]
            if all(pair):
                found.update(zip([what for what, _ in CUDA_LIBRARIES[1:]], pair))
                return found, driver_version
    for what, opened in CUDA_LIBRARIES[1:]:
        names = [n for n in _toolkit_names(opened) if n[1] is None or n[1] in runs]
        found[what] = _first(folders, names)[0]
    return found, driver_version


def link_cuda_libraries(found, folder):
    """Links, in ``folder``, of the names libgpuarray opens to what was
    found; the found libraries' own folders (where NVRTC finds its
    builtins and cuBLAS its cublasLt), for LD_LIBRARY_PATH after it."""
    os.makedirs(folder, exist_ok=True)
    beside = []
    for what, opened in CUDA_LIBRARIES:
        link = os.path.join(folder, opened)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.realpath(found[what]), link)
        if os.path.dirname(found[what]) not in beside:
            beside.append(os.path.dirname(found[what]))
    return beside


def cuda_report(found, folders, driver_version=None):
    lines = []
    for what, opened in CUDA_LIBRARIES:
        if found[what]:
            lines.append('%-12s %s (opened as %s)' % (what, found[what], opened))
        else:
            names = _DRIVER_NAMES if what == 'CUDA driver' else _toolkit_names(opened)
            lines.append('%-12s MISSING: none of %s' % (what, ', '.join(n for n, _ in names)))
    if driver_version:
        lines.append('The driver runs CUDA %d.%d and older.'
                     % (driver_version // 1000, driver_version % 1000 // 10))
    missing = [what for what in found if not found[what]]
    if missing:
        lines.append('')
        lines.append('Missing: %s. Install the NVIDIA driver (libcuda.so.1) and CUDA 12 or 13 '
                     '(libnvrtc, libcublas), e.g. pip install nvidia-cuda-nvrtc-cu12 '
                     'nvidia-cublas-cu12, or point LD_LIBRARY_PATH at them.' % ', '.join(missing))
        lines.append('Searched: %s' % ', '.join(folders))
    return '\n'.join(lines) + '\n', missing


def context_names(device, n):
    """THEANO_FLAGS' contexts of ``n`` names of ``device``."""
    return 'contexts=' + ';'.join('dev%d->%s' % (i, device) for i in range(n))


def configurations(device):
    """{key: (THEANO_FLAGS, what it is compared with, tolerances)}."""
    contexts = functools.partial(context_names, device)
    return {
        'cpu': ('device=cpu', None, None),
        'one': (contexts(1), 'cpu', (CPU_RTOL, CPU_ATOL)),
        'batch 2': (contexts(2), 'one', (RTOL, ATOL)),
        'batch 2 master-only': (contexts(2) + ',multigpu.shard=False', 'one', (RTOL, ATOL)),
        'batch 4': (contexts(4), 'one', (RTOL, ATOL)),
        'batch 4 master-only': (contexts(4) + ',multigpu.shard=False', 'one', (RTOL, ATOL)),
        'layer 2': (contexts(2) + ',multigpu.mode=layer', 'one', (RTOL, ATOL)),
    }


def compared_keys(results, names):
    return sorted(k for k in results if k.split('/', 1)[0] in names
                  and (k.rsplit('/', 1)[1].startswith('w')
                       or k.rsplit('/', 1)[1] in ('loss', 'pred', 'eval')))


def largest_difference(mine, theirs, keys, rtol, atol):
    """(the largest |a - b| / (atol + rtol |b|) over ``keys``, the key):
    1 or less is within the tolerance."""
    import numpy as np
    worst, where = 0.0, None
    for key in keys:
        if key not in mine:
            return float('inf'), key
        a, b = np.asarray(mine[key], 'float64'), np.asarray(theirs[key], 'float64')
        if a.shape != b.shape:
            return float('inf'), key
        ratio = float(np.max(np.abs(a - b) / (atol + rtol * np.abs(b)))) if a.size else 0.0
        if not np.isfinite(ratio):   # NaN or infinity, in either run
            return float('inf'), key
        if ratio > worst:
            worst, where = ratio, key
    return worst, where


def placement_problems(results, key, models):
    """What the placement check flagged, every context of a batch-wise run
    computing (its heavy ops, per model), and every layer-wise weight where
    its layer is: a list of what does not hold."""
    problems = [str(m) for k, v in results.items() if k.endswith('/misplaced') for m in v]
    if key.startswith('batch'):
        n = int(key.split()[1])
        expected = set(['None'] + ['dev%d' % i for i in range(1, n)])
        for name in models:
            missing = expected - set(str(c) for c in results.get(name + '/contexts', []))
            if missing:
                problems.append('%s: no heavy op on %s' % (name, ', '.join(sorted(missing))))
    if key.startswith('layer'):
        problems += [str(e) for k, v in results.items() if k.endswith('/placement_errors')
                     for e in v]
    return problems


def train(outdir, key, flags, models, deadline, own_cache):
    """Run train_models.py for one configuration, in a folder of its own,
    with a compile cache of its own where children run side by side
    (``own_cache``: none waits on another's compile lock); its results, or
    the reason it failed."""
    import numpy as np
    home = os.path.join(outdir, key.replace(' ', '_'))
    os.makedirs(home, exist_ok=True)
    cache = os.path.join(home if own_cache else outdir, 'theano')
    flags = ','.join([COMPILE_FLAGS, flags, 'base_compiledir=' + cache])
    out = os.path.join(home, 'out.npz')
    start = time.time()
    with open(os.path.join(home, 'log.txt'), 'w') as log:
        try:
            code = subprocess.run([PYTHON, CHILD, out, str(STEPS), str(BATCH)] + list(models),
                                  env=child_env(home, flags), cwd=home, stdout=log,
                                  stderr=subprocess.STDOUT,
                                  timeout=max(10, deadline - time.time())).returncode
        except subprocess.TimeoutExpired:
            return {'error': 'past the deadline (see %s/log.txt)' % home}
    seconds = time.time() - start
    if code != 0 or not os.path.exists(out):
        with open(os.path.join(home, 'log.txt')) as log:
            return {'error': 'exited %d: %s' % (code, log.read()[-1500:]), 'seconds': seconds}
    return {'results': dict(np.load(out)), 'seconds': seconds}


def check_equivalence(outdir, device, models, deadline, parallel):
    configs = configurations(device)
    on_cpu = [name for name in models if name in PARITY_MODELS] or models[:1]
    jobs = dict((key, (flags, on_cpu if key == 'cpu' else models))
                for key, (flags, _, _) in configs.items())
    with ThreadPoolExecutor(parallel) as pool:
        futures = dict((key, pool.submit(train, outdir, key, flags, names, deadline,
                                         parallel > 1))
                       for key, (flags, names) in jobs.items())
        runs = dict((key, future.result()) for key, future in futures.items())
    figures = {}
    for key, (flags, reference, tolerance) in configs.items():
        run = runs[key]
        figure = {'flags': flags, 'seconds': round(run.get('seconds', 0), 1)}
        if reference is not None:
            figure['compared_with'] = reference
            if 'error' in run or 'error' in runs[reference]:
                figure['error'] = run.get('error') or 'its reference failed'
                figure['holds'] = False
            else:
                keys = compared_keys(runs[reference]['results'], jobs[reference][1])
                worst, where = largest_difference(run['results'], runs[reference]['results'],
                                                  keys, *tolerance)
                misplaced = placement_problems(run['results'], key, jobs[key][1])
                figure.update(compared=len(keys), worst=worst, worst_at=where,
                              rtol=tolerance[0], atol=tolerance[1], misplaced=misplaced,
                              holds=bool(keys) and worst <= 1 and not misplaced)
        elif 'error' in run:
            figure['error'] = run['error']
        figures[key] = figure
        print('  %-20s %s' % (key, _describe(figure)), flush=True)
    return figures


def _describe(figure):
    if 'error' in figure:
        return 'FAILED: ' + figure['error'].strip().splitlines()[-1][:200]
    if 'compared_with' not in figure:
        return 'ran (%.0f s)' % figure['seconds']
    return ('%s: %d arrays against %s, largest difference %.3g of the tolerance%s (%.0f s)'
            % ('holds' if figure['holds'] else 'DIFFERS', figure['compared'],
               figure['compared_with'], figure['worst'],
               '' if not figure['misplaced'] else ', misplaced: %s' % figure['misplaced'],
               figure['seconds']))


def measure_steps(outdir, device, rounds, cache, deadline, models=('mlp', 'cnn')):
    """Step seconds (median) at 1, 2 and 4 names, sharded batch-wise, and
    one step's traffic, per model, the workers asked in turn (``cache``:
    the compile cache).  Workers still running at ``deadline`` are stopped
    (RuntimeError)."""
    from one_context import Worker
    figures = {}
    for model in models:
        workers = {}
        timer = threading.Timer(max(1.0, deadline - time.time()),
                                lambda: [w.process.kill() for w in list(workers.values())])
        timer.start()
        try:
            for n in (1, 2, 4):
                home = os.path.join(outdir, 'steps', '%s_%d' % (model, n))
                os.makedirs(home, exist_ok=True)
                flags = ','.join([COMPILE_FLAGS, context_names(device, n),
                                  'base_compiledir=' + cache])
                workers[n] = Worker(home, 'theano_multigpu', flags, None)
                workers[n].ask({'build': model})
            traffic = dict((n, workers[n].ask({'traffic': model})) for n in (2, 4))
            times = dict((n, []) for n in workers)
            order = list(workers)
            for r in range(rounds):
                shift = r % len(order)
                for n in order[shift:] + order[:shift]:
                    times[n] += workers[n].ask({'time': model, 'steps': 1})['times']
        except RuntimeError:
            if time.time() >= deadline:
                raise RuntimeError('past the deadline (--minutes), building or timing %s' % model)
            raise
        finally:
            timer.cancel()
            for worker in workers.values():
                worker.close()
        step = dict((n, median(t)) for n, t in times.items())
        figures[model] = {
            'step_seconds': step,
            'over_one_context': dict((n, step[n] / step[1]) for n in step),
            'traffic': traffic,
            'busiest_bytes': dict((n, max(max(t['sent'].values()), max(t['received'].values())))
                                  for n, t in traffic.items()),
        }
        print('  %-4s step %s; bytes per step, busiest context: %s' % (
            model, ', '.join('%d: %.2f ms' % (n, 1e3 * s) for n, s in sorted(step.items())),
            ', '.join('%d: %d' % kv for kv in sorted(figures[model]['busiest_bytes'].items()))),
            flush=True)
    return figures


def write_summary(outdir, summary):
    with open(os.path.join(outdir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1, sort_keys=True, default=str)
    lines = ['# GPU check on %s' % summary['device'], '',
             '| configuration | compared with | arrays | largest difference / tolerance | '
             'holds | seconds |', '|---|---|---|---|---|---|']
    for key, figure in summary['equivalence'].items():
        if 'compared_with' in figure and 'error' not in figure:
            lines.append('| %s | %s | %d | %.3g | %s | %.0f |' % (
                key, figure['compared_with'], figure['compared'], figure['worst'],
                'yes' if figure['holds'] else 'NO', figure['seconds']))
        else:
            lines.append('| %s | %s | | %s | %s | %.0f |' % (
                key, figure.get('compared_with', ''), figure.get('error', 'reference')[:80],
                'NO' if 'error' in figure else '', figure['seconds']))
    for model, figure in summary.get('steps', {}).items():
        lines += ['', '%s: step time over one context: %s; busiest context\'s bytes per step '
                  '(sent or received): %s' % (
                      model, ', '.join('%s: %.3f' % kv for kv in sorted(
                          figure['over_one_context'].items())),
                      ', '.join('%s: %d' % kv for kv in sorted(figure['busiest_bytes'].items())))]
    lines += ['', 'Total: %.0f s.' % summary['seconds']]
    with open(os.path.join(outdir, 'summary.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('outdir')
    parser.add_argument('--device', default=os.environ.get('GPU_CHECK_DEVICE', 'cuda0'))
    parser.add_argument('--models', default='mlp,cnn,lstm,cnn_bn')
    parser.add_argument('--rounds', type=int, default=20)
    parser.add_argument('--minutes', type=float, default=7.5,
                        help='the deadline: the equivalence runs get the first three '
                        'quarters, the step times what is left')
    args = parser.parse_args(argv)
    start = time.time()
    deadline = start + 60 * args.minutes
    outdir = os.path.abspath(args.outdir)
    os.makedirs(outdir, exist_ok=True)
    summary = {'device': args.device, 'models': args.models.split(',')}
    if args.device.startswith('cuda'):
        folders = library_folders()
        users = [f for f in os.environ.get('GPU_CHECK_USER_LIBRARY_PATH', '').split(':') if f]
        found, driver_version = find_cuda_libraries(folders, users)
        text, missing = cuda_report(found, folders, driver_version)
        with open(os.path.join(outdir, 'libraries.txt'), 'w') as f:
            f.write(text)
        print(text, end='')
        if missing:
            return 2
        links = os.path.join(outdir, 'cuda-libs')
        beside = link_cuda_libraries(found, links)
        # The links first; the bundle's own libraries before the system's.
        os.environ['LD_LIBRARY_PATH'] = ':'.join(
            p for p in [links, os.environ.get('LD_LIBRARY_PATH', '')] + beside if p)
    info = subprocess.run([PYTHON, '-m', 'theano_multigpu', 'info'], capture_output=True,
                          text=True, env=child_env(outdir, COMPILE_FLAGS + ','
                                                   + context_names(args.device, 1)),
                          timeout=300)
    with open(os.path.join(outdir, 'info.txt'), 'w') as f:
        f.write(info.stdout + info.stderr)
    print(info.stdout, end='', flush=True)
    if info.returncode != 0:
        print(info.stderr[-3000:])
        return 2
    print('Equivalence (train_models.py, %d steps at batch %d):' % (STEPS, BATCH), flush=True)
    parallel = max(1, min(len(configurations(args.device)), (os.cpu_count() or 2) // 2))
    summary['equivalence'] = check_equivalence(outdir, args.device, summary['models'],
                                               deadline - STEPS_SHARE * 60 * args.minutes,
                                               parallel)
    summary['seconds'] = time.time() - start
    write_summary(outdir, summary)   # kept should the step times not end
    print('Step times (benchmarks/models.py, size bench, %d rounds):' % args.rounds, flush=True)
    try:
        # The compile cache of the run on 4 names, which built most of it.
        cache = os.path.join(outdir, 'batch_4' if parallel > 1 else '', 'theano')
        summary['steps'] = measure_steps(outdir, args.device, args.rounds, cache, deadline)
    except Exception as error:   # the figures above stand; say why these are missing
        summary['steps_error'] = '%s: %s' % (type(error).__name__, error)
        print('  FAILED: ' + summary['steps_error'][-1500:])
    summary['seconds'] = time.time() - start
    write_summary(outdir, summary)
    print('Written to %s (summary.md, summary.json) in %.0f s.' % (outdir, summary['seconds']))
    holds = all(f.get('holds', 'error' not in f) for f in summary['equivalence'].values())
    return 0 if holds and 'steps_error' not in summary else 1


if __name__ == '__main__':
    sys.exit(main())
