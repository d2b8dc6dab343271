"""The Python 3.11 fixes (theano_multigpu.compat), proved on real models.

Every test runs twice, in a fresh Python each time: under the shim
(KERAS_BACKEND=theano_multigpu) and with the fixes alone
(THEANO_MULTIGPU_COMPAT=1 KERAS_BACKEND=theano), on the CPU.  The child
prints one JSON line that the test checks.  Models share one small shape
so that Theano's compile cache serves most tests.
"""
import json
import os
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import CHILDREN, REPO, TWO, needs_pocl, requires, run_python
import cl_counter  # noqa: E402 (benchmarks/, which conftest puts on sys.path)

CONFIGS = {
    'shim': dict(backend='theano_multigpu', extra_env={}),
    'compat': dict(backend='theano', extra_env={'THEANO_MULTIGPU_COMPAT': '1'}),
}

# Helpers every child gets: report() prints the JSON line; digits() is
# scikit-learn's 8x8 digits; mlp() is the model most tests use.
PRELUDE = '''
import json, os, sys
import numpy as np

def report(**values):
    print(json.dumps(values))

def digits(n=400):
    from sklearn.datasets import load_digits
    data = load_digits()
    x = (data.data[:n] / 16.0).astype('float32')
    y = np.eye(10, dtype='float32')[data.target[:n]]
    return x, y

def mlp(seed=0, names=('hidden', 'out')):
    np.random.seed(seed)
    from keras.models import Sequential
    from keras.layers import Dense
    return Sequential([Dense(32, input_dim=64, activation='relu', name=names[0]),
                       Dense(10, activation='softmax', name=names[1])])

def same_weights(a, b):
    return all(np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights()))
'''


def run(home, config, code, extra_env=None, **kwargs):
    """Run ``code`` (after PRELUDE) under ``config``; return its last JSON line."""
    env = dict(CONFIGS[config]['extra_env'], **(extra_env or {}))
    result = run_python(home, PRELUDE + textwrap.dedent(code),
                        backend=CONFIGS[config]['backend'], extra_env=env, **kwargs)
    lines = result.stdout.strip().splitlines()
    assert lines, 'child printed nothing; stderr:\n' + result.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.fixture(params=sorted(CONFIGS))
def config(request):
    """'compat' (the fixes alone) or 'shim' (KERAS_BACKEND=theano_multigpu)."""
    return request.param


def test_each_configuration_is_what_it_claims(home, config):
    out = run(home, config, '''
        import keras.backend as K
        report(backend=K.backend(), entry=K.variable.__module__,
               compat='theano_multigpu.compat' in sys.modules)
    ''')
    assert out['backend'] == 'theano'
    assert out['compat'] is True
    expected = 'theano_multigpu.keras_adapter' if config == 'shim' else 'keras.backend.theano_backend'
    assert out['entry'] == expected


# 1. BLAS flags ---------------------------------------------------------

def _openblas_linkable():
    try:
        found = subprocess.run(['g++', '-print-file-name=libopenblas.so'],
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return False
    return os.path.isabs(found)


@requires(_openblas_linkable(), 'needs g++ and libopenblas-dev')
def test_blas_ldflags_default_to_openblas_and_theano_links_it(home, config):
    out = run(home, config, '''
        import theano, theano.tensor as T
        a, b = T.matrices('a', 'b')
        f = theano.function([a, b], T.dot(a, b))
        rng = np.random.RandomState(0)
        x, y = rng.rand(50, 40).astype('float32'), rng.rand(40, 30).astype('float32')
        error = float(np.abs(f(x, y) - x.dot(y)).max())
        with open('/proc/self/maps') as maps:
            libs = sorted({l.split()[-1] for l in maps if 'libopenblas' in l})
        report(ldflags=theano.config.blas.ldflags, error=error, libs=libs,
               ops=[type(n.op).__name__ for n in f.maker.fgraph.toposort()])
    ''')
    assert out['ldflags'] == '-lopenblas'
    assert out['ops'] == ['Dot22']
    assert out['error'] < 1e-4
    # Theano's compiled module loaded the system OpenBLAS, not only numpy's own copy.
    assert [lib for lib in out['libs'] if 'numpy' not in lib], out['libs']


@pytest.mark.parametrize('source,value', [('flag', '-lblas'), ('theanorc', '-lblas'),
                                          ('flag', '')])
def test_users_own_blas_ldflags_win(home, config, source, value):
    flags = ''
    if source == 'flag':
        flags = 'blas.ldflags=' + value
    else:
        (home / '.theanorc').write_text('[blas]\nldflags = %s\n' % value)
    out = run(home, config, '''
        import theano
        report(ldflags=theano.config.blas.ldflags)
    ''', flags=flags)
    assert out['ldflags'] == value


# 2. Names Python 3.10/3.11 removed; theano.ifelse ----------------------

def test_removed_names_work_in_a_keras_model(home, config):
    out = run(home, config, '''
        import collections, collections.abc, inspect
        import theano
        ifelse_after_import_theano = callable(getattr(getattr(theano, 'ifelse', None), 'ifelse', None))
        missing = [n for n in collections.abc.__all__
                   if getattr(collections, n, None) is not getattr(collections.abc, n)]
        def sample(a, b=2, *rest, **options):
            pass
        spec = inspect.getargspec(sample)

        from keras.models import Sequential
        from keras.layers import Dense, Dropout, Lambda
        from keras.callbacks import CSVLogger   # imports collections.Iterable
        x, y = digits()
        np.random.seed(0)
        model = Sequential([Dense(32, input_dim=64, activation='relu'),
                            Dropout(0.5),         # K.in_train_phase: theano.ifelse
                            Lambda(lambda t, scale: t * scale, arguments={'scale': 3.0}),
                            Dense(10, activation='softmax')])  # Lambda: inspect.getargspec
        model.compile('adam', 'categorical_crossentropy')
        model.fit(x, y, nb_epoch=2, batch_size=50, verbose=0,
                  callbacks=[CSVLogger('log.csv')])
        W1, b1, W2, b2 = model.get_weights()
        logits = np.maximum(x.dot(W1) + b1, 0) * 3.0
        logits = logits.dot(W2) + b2
        expected = np.exp(logits - logits.max(1, keepdims=True))
        expected /= expected.sum(1, keepdims=True)
        error = float(np.abs(model.predict(x, verbose=0) - expected).max())
        report(ifelse=ifelse_after_import_theano, missing=missing, spec=list(spec),
               spec_names=list(spec._fields), error=error,
               log_lines=len(open('log.csv').read().strip().splitlines()))
    ''')
    assert out['ifelse'] is True
    assert out['missing'] == []
    assert out['spec'] == [['a', 'b'], 'rest', 'options', [2]]
    assert out['spec_names'] == ['args', 'varargs', 'keywords', 'defaults']
    assert out['error'] < 1e-5   # Dropout is off at test time; Lambda scaled by 3
    assert out['log_lines'] == 3  # header and two epochs


# 3. Recurrent layers (Scan) --------------------------------------------

def test_recurrent_layers_train_with_the_compiled_scan_loop(home, config):
    """Under the shim the loop is built first, into a directory of the
    test's own (a first run once fell back to the Python loop: the built
    module did not load from where it was moved)."""
    out = run(home, config, '''
        if %r == 'shim':
            from theano_multigpu.compat import compiled_scan
            fresh = os.path.join(os.getcwd(), 'scan_loop_build')
            compiled_scan.build_directory = lambda: fresh
        from keras.models import Sequential
        from keras.layers import SimpleRNN, LSTM, Dense
        from keras.optimizers import Adam
        rng = np.random.RandomState(0)
        x = rng.rand(64, 5, 3).astype('float32')
        y = 2 * x[:, :, :1].sum(axis=1) - 5         # a sum over time
        losses, error = {}, None
        for layer in (SimpleRNN, LSTM):   # GRU: in scan_loops.py and the sweep
            np.random.seed(1)
            model = Sequential([layer(8, input_shape=(5, 3)), Dense(1)])
            model.compile(Adam(lr=0.02), 'mse')
            history = model.fit(x, y, nb_epoch=6, batch_size=16, verbose=0)
            losses[layer.__name__] = history.history['loss']
            if layer is SimpleRNN:
                W, U, b, V, c = model.get_weights()
                h = np.zeros((64, 8), 'float32')
                for t in range(5):
                    h = np.tanh(x[:, t].dot(W) + h.dot(U) + b)
                error = float(np.abs(model.predict(x) - (h.dot(V) + c)).max())
        from theano_multigpu.compat import compiled_scan
        report(losses=losses, rnn_error=error, loop=compiled_scan.loop_description(),
               scan_ext=repr(sys.modules.get('theano.scan_module.scan_perform_ext', 'absent')))
    ''' % config)
    assert out['scan_ext'] == 'None'   # not Theano's loop, which fails to build,
    assert out['loop'].startswith('compiled (Cython, ')  # but the project's
    assert ('scan_loop_build' in out['loop']) == (config == 'shim'), out['loop']
    assert out['rnn_error'] < 1e-5     # and computed what numpy computes
    for name, losses in out['losses'].items():
        assert losses[-1] < 0.75 * losses[0], (name, losses)  # measured: 0.41 to 0.51


def test_every_recurrent_layer_gives_the_same_numbers_with_either_scan_loop(home):
    """tests/children/scan_loops.py: SimpleRNN, GRU and LSTM (each
    consume_less mode) with a mask, go_backwards, return_sequences,
    stacking, dropout in the step, stateful layers and TimeDistributed, in
    one model; three training steps with the compiled loop and with the
    Python loop from the same state give the same losses and weights, bit
    for bit.
    (On contexts: tests/test_sweep.py, every configuration.)"""
    result = run_python(home, args=[os.path.join(CHILDREN, 'scan_loops.py')], timeout=900)
    line = [l for l in result.stdout.splitlines() if l.startswith('RESULT ')][-1]
    out = json.loads(line[len('RESULT '):])
    assert out['loop'].startswith('compiled (Cython, '), out['loop']
    assert out['calls']['compiled'] >= 6 and out['calls']['python'] == 0, out['calls']
    assert out['weights_moved'] > 0   # every weight trained
    assert out['arrays'] >= 40 and out['unequal_arrays'] == 0, out
    assert out['losses']['compiled'] == out['losses']['python']


def test_backward_loops_read_the_forward_products_with_the_same_numbers(home):
    """tests/children/scan_reuse.py: scan_loops.py's model (every kind of
    recurrent layer) trained from the same start with multigpu.scan_reuse
    on and off: the same losses and weights (rtol 1e-5); on, the forward
    loops run once (as many scans, as many products in them) and the
    backward loops compute fewer matrix products (they read the
    forward's)."""
    result = run_python(home, args=[os.path.join(CHILDREN, 'scan_reuse.py')], timeout=900)
    line = [l for l in result.stdout.splitlines() if l.startswith('RESULT ')][-1]
    out = json.loads(line[len('RESULT '):])
    reused, own = out['losses']
    assert np.allclose(reused, own, rtol=1e-5), out
    assert out['arrays'] >= 40 and out['not_close'] == 0, out
    # One forward: a forward computed twice (the two scans merged by
    # Theano) would compute its products twice.
    assert out['scans'][0] == out['scans'][1], out
    assert out['forward_products'][0] == out['forward_products'][1], out
    # The GRUs (consume_less 'mem': three products, 'gpu': two) and the
    # LSTMs ('gpu': one, 'mem' and the default: four) read them; a
    # SimpleRNN's backward needs none (it reads its state, the tanh).
    assert out['backward_products'][0] <= out['backward_products'][1] - 7, out


def test_scans_keras_does_not_make_give_theanos_numbers_with_either_loop(home):
    """tests/children/scan_cases.py: while loops (stopping early or not),
    taps -3 and -1, outputs kept in part (ring buffers), scalar and vector
    outputs per step, backwards, gradients (truncated, of several taps,
    second order) and random updates inside the loop: the compiled loop
    and the shim's Python loop give what Theano 1.0.5's own loop gives, bit
    for bit, twice in a row."""
    result = run_python(home, args=[os.path.join(CHILDREN, 'scan_cases.py')], timeout=900)
    line = [l for l in result.stdout.splitlines() if l.startswith('RESULT ')][-1]
    out = json.loads(line[len('RESULT '):])
    assert out['compared'] == 13 and out['differ'] == [], out
    assert out['compiled_calls'] >= 26, out


# A Cython that fails: its command line exits with an error.
BROKEN_CYTHON = {'Cython/__init__.py': "__version__ = '3-broken'\n",
                 'cython.py': "import sys\nsys.exit('this Cython fails on purpose')\n"}


@pytest.mark.parametrize('why,flags,cython', [
    ('Cython is not installed', '', 'hidden'),
    ('Theano has no C++ compiler', 'cxx=', 'installed'),
    ('Cython failed on ', '', 'broken')])
def test_scan_runs_its_python_loop_after_one_warning_when_the_compiled_one_cannot_build(
        home, why, flags, cython):
    extra_env = {}
    if cython == 'broken':
        for name, text in BROKEN_CYTHON.items():
            (home / 'broken' / name).parent.mkdir(parents=True, exist_ok=True)
            (home / 'broken' / name).write_text(text)
        extra_env['PYTHONPATH'] = str(home / 'broken')
    out = run(home, 'shim', flags=flags, extra_env=extra_env, code='''
        import warnings
        if %r == 'hidden':
            sys.modules['Cython'] = None   # import Cython fails
        import theano, theano.tensor as T
        from theano_multigpu.compat import compiled_scan
        x = T.fmatrix()
        sums, _ = theano.scan(lambda row, total: total + row, sequences=x,
                              outputs_info=T.zeros_like(x[0]))
        f = theano.function([x], sums)
        a = np.arange(12, dtype='float32').reshape(4, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            results = [f(a).tolist() for _ in range(3)]
        report(results=results, right=a.cumsum(0).tolist(), loop=compiled_scan.loop_description(),
               warnings=[str(w.message) for w in caught if 'scan' in str(w.message).lower()])
    ''' % cython)
    assert out['results'] == [out['right']] * 3
    assert len(out['warnings']) == 1, out['warnings']
    assert 'Scan runs its Python loop' in out['warnings'][0] and why in out['warnings'][0]
    if cython == 'broken':
        assert 'this Cython fails on purpose' in out['warnings'][0]
    assert out['loop'].startswith('Python, the compiled loop is not available: ' + why)


@needs_pocl
def test_sums_on_pocl_use_small_work_groups_and_stay_exact(home, config):
    """Sums over rows, columns and everything, of shapes that do not divide
    by the work-group: the numbers numpy gives, with the kernel's
    work-group capped (Theano launched 4096 work-items per sum on pocl)."""
    out = run(home, config, flags='device=opencl0:0', code='''
        import theano, theano.tensor as T
        from theano.gpuarray.elemwise import GpuCAReduceCPY
        x3 = T.tensor3('x3')
        f = theano.function([x3], [x3.sum(axis=0), x3.sum(axis=1), x3.sum(axis=2),
                                   x3.sum(axis=(0, 2)), x3.sum()])
        sizes = [node.op.get_kernel_cache(node).init_local_size
                 for node in f.maker.fgraph.toposort() if isinstance(node.op, GpuCAReduceCPY)]
        errors = []
        for shape in [(37, 3, 300), (1, 64, 5), (5, 17, 1)]:
            v = np.random.RandomState(0).rand(*shape).astype('float32')
            expected = [v.sum(0), v.sum(1), v.sum(2), v.sum((0, 2)), v.sum()]
            errors += [float(np.max(np.abs(r - e) / np.abs(e))) for r, e in zip(f(v), expected)]
        report(sizes=sizes, error=max(errors))
    ''')
    assert len(out['sizes']) == 5 and set(out['sizes']) == {16}, out['sizes']
    assert out['error'] < 1e-5


@needs_pocl
def test_a_gemv_with_beta_zero_ignores_what_its_output_held_on_pocl(home, config):
    """A dot with a dimension of 1 (a one-feature input's gradient,
    dot(x.T, g)) is a gemv with beta 0 into fresh memory, which CLBlast's
    gemv reads (0 x NaN is NaN).  On OpenCL that gemv reads zeros, and the
    product is numpy's even right after NaN-filled buffers of its size were
    freed (the allocator hands their memory out again)."""
    out = run(home, config, flags='device=opencl0:0', code='''
        import pygpu, theano, theano.tensor as T
        from theano.gpuarray.blas import GpuGemv
        from theano.gpuarray.type import get_context
        x, g = T.matrix('x'), T.matrix('g')
        f = theano.function([x, g], T.dot(x.reshape((-1, 1)).T, g))
        reads = [type(node.inputs[0].owner.op).__name__
                 for node in f.maker.fgraph.toposort() if isinstance(node.op, GpuGemv)]
        rng = np.random.RandomState(0)
        xv, gv = rng.rand(24, 1).astype('float32'), rng.rand(24, 8).astype('float32')
        wrong = 0
        for _ in range(30):
            freed = [pygpu.gpuarray.array(np.full(8, np.nan, 'float32'), context=get_context(None))
                     for _ in range(50)]
            del freed
            wrong += not np.allclose(f(xv, gv), xv.T.dot(gv), rtol=1e-5)
        report(reads=reads, wrong=wrong)
    ''')
    assert out['reads'] == ['GpuAlloc'], out['reads']
    assert out['wrong'] == 0, out


@needs_pocl
def test_the_stateful_lstm_example_on_two_contexts_builds_nothing_per_step(home, tmp_path):
    """Keras's stateful_lstm example's model (two stateful LSTM(50) on one
    feature, RMSprop) batch-wise on two pocl contexts, 12 batches and a
    prediction: every gemv with beta 0 of its train function, the
    replicas' included, reads zeros; after each function's first call no
    OpenCL program is built (a zero fill built one at every call, 23 a
    step); and the losses and predictions are finite and the CPU's."""
    code = '''
        sys.path.insert(0, os.path.join(%r, 'examples'))
        sys.path.insert(0, os.path.join(%r, 'benchmarks'))
        from stateful_lstm import BATCH_SIZE, build_model, gen_cosine_amp
        np.random.seed(1)
        model = build_model()
        x = gen_cosine_amp(xn=12 * BATCH_SIZE).astype('float32')
        y = np.roll(x[:, 0], -1, axis=0)
        counted = os.environ.get('LD_PRELOAD')
        if counted:
            import cl_counter

        def built():
            if not counted:
                return 0
            return cl_counter.programs()

        losses, programs = [], []
        for b in range(12):
            before = built()
            batch = slice(b * BATCH_SIZE, (b + 1) * BATCH_SIZE)
            losses.append(float(model.train_on_batch(x[batch], y[batch])))
            programs.append(built() - before)
        model.reset_states()
        predictions = []
        for _ in range(2):
            before = built()
            predictions.append(model.predict(x, batch_size=BATCH_SIZE)[:, 0].tolist())
            programs.append(built() - before)
            model.reset_states()
        reads = []
        if counted:
            from theano.gpuarray.blas import GpuGemv
            nodes = model.model.train_function.function.maker.fgraph.toposort()
            reads = sorted(set((str(n.inputs[0].type.context_name),
                                type(n.inputs[0].owner.op).__name__)
                               for n in nodes if isinstance(n.op, GpuGemv)
                               and getattr(n.inputs[4], 'data', None) == 0))
        report(losses=losses, predictions=predictions, programs=programs, reads=reads)
    ''' % (REPO, REPO)
    counter = cl_counter.build(str(tmp_path))
    with ThreadPoolExecutor(2) as pool:
        pocl = pool.submit(run, home, 'shim', code, flags=TWO,
                           extra_env={'LD_PRELOAD': counter})
        cpu = pool.submit(run, str(tmp_path), 'shim', code)
        pocl, cpu = pocl.result(), cpu.result()
    assert pocl['reads'] == [['None', 'GpuAlloc'], ['dev1', 'GpuAlloc']], pocl['reads']
    # Programs: the train function's first call builds its kernels, then
    # nothing; the predict function's first call builds, the second not.
    assert pocl['programs'][0] > 0 and pocl['programs'][1:12] == [0] * 11, pocl['programs']
    assert pocl['programs'][13] == 0, pocl['programs']
    # The predictions run 300 stateful steps on inputs up to 100 (gates
    # near saturation): pocl's and the CPU's exp and tanh differ in their
    # last bits and the state carries that along (0.3% at most, at the end).
    for key, rtol in (('losses', 1e-3), ('predictions', 5e-3)):
        got, expected = np.array(pocl[key]), np.array(cpu[key])
        assert np.all(np.isfinite(got)), (key, got)
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-4, err_msg=key)


def test_k_function_takes_its_updates_from_an_iterator(home):
    """K.function(..., updates=zip(...)) applies every update, with the
    progress lines on (multigpu.progress=0): the shim reads the updates more
    than once (an iterator was read up sizing the graph, and the weights
    never moved)."""
    out = run(home, 'shim', flags='multigpu.progress=0', code='''
        import keras.backend as K
        w, v = K.variable(np.ones(2)), K.variable(np.zeros(3))
        x = K.placeholder(ndim=0)
        step = K.function([x], [K.sum(w)], updates=zip([w, v], [w - x, v + 2 * x]))
        step([np.float32(0.5)])
        report(w=K.get_value(w).tolist(), v=K.get_value(v).tolist())
    ''')
    assert out == {'w': [0.5, 0.5], 'v': [1.0, 1.0, 1.0]}, out


def test_a_compile_watcher_is_told_each_op_of_the_function_linked_once(home):
    """compile_watch: a function with a scan (whose inner function Theano
    compiles, folding constants, while the scan's op is linked) and an
    ifelse tells its watcher that linking starts over its ops, then each of
    them once (Scan's and IfElse's included, the inner ones not); a function
    compiled outside the block tells it nothing."""
    out = run(home, 'compat', code='''
        import theano, theano.tensor as T
        from theano.ifelse import ifelse
        from theano_multigpu.compat import compile_watch

        class Counter(object):
            def __init__(self):
                self.told = []
            def linking(self, ops):
                self.told.append(('linking', ops))
            def linked(self):
                self.told.append('linked')
            def module_built(self):
                pass

        x, c = T.matrix('x'), T.scalar('c')
        h, _ = theano.scan(lambda r, acc: T.tanh(r + acc * 2 + T.constant(1.) * 3),
                           sequences=x, outputs_info=T.zeros_like(x[0]))
        counter = Counter()
        with compile_watch.watching(counter):
            f = theano.function([x, c], [ifelse(T.gt(c, 0), h.sum(), h.mean()), h])
        theano.function([x], T.exp(x))
        nodes = f.maker.fgraph.apply_nodes
        report(told=counter.told, ops=len(nodes),
               kinds=sorted(set(type(n.op).__name__ for n in nodes)))
    ''')
    assert 'Scan' in out['kinds'] and 'IfElse' in out['kinds'], out
    assert out['told'] == [['linking', out['ops']]] + ['linked'] * out['ops'], out


@needs_pocl
def test_the_nodes_of_one_module_on_one_context_share_its_kernels(home, tmp_path):
    """Four elemwise nodes and four softmaxes of one signature on each of two
    pocl contexts (GpuElemwise and GpuKernelBase): the function builds one
    program per module and context, not one per node; a second function of
    the same graph builds none while the first lives; each computes
    numpy's numbers, the second after the first was freed; and after both
    were freed a third builds again (the last user freed the kernels)."""
    code = '''
        import gc
        import pygpu
        import theano, theano.tensor as T
        from theano.gpuarray.type import GpuArrayType, get_context
        sys.path.insert(0, os.path.join(%r, 'benchmarks'))
        import cl_counter

        contexts = ('dev0', 'dev1')
        scales = [T.scalar('s%%d' %% k) for k in range(4)]

        def compiled():
            inputs, outs = [], []
            for context in contexts:
                v = GpuArrayType('float32', (False, False), context_name=context)()
                inputs.append(v)
                outs += [T.nnet.softmax(T.exp(v) * s + 1).transfer('cpu') for s in scales]
            before = cl_counter.programs()
            f = theano.function(inputs + scales, outs)
            nodes = [n for n in f.maker.fgraph.toposort()
                     if type(n.op).__name__ in ('GpuElemwise', 'GpuSoftmax')]
            return f, cl_counter.programs() - before, len(nodes)

        a = np.random.RandomState(0).rand(3, 5).astype('float32')
        on = [pygpu.gpuarray.array(a, context=get_context(c)) for c in contexts]
        s = [np.float32(k + 0.5) for k in range(4)]
        e = [np.exp(np.exp(a) * k + 1) for k in s]
        expected = [v / v.sum(axis=1, keepdims=True) for v in e] * 2

        def error(f):
            return max(float(np.max(np.abs(g - w))) for g, w in zip(f(*(on + s)), expected))

        first, built_first, nodes = compiled()
        second, built_second, _ = compiled()
        errors = [error(first)]
        del first
        gc.collect()
        errors.append(error(second))
        del second
        gc.collect()
        third, built_third, _ = compiled()
        errors.append(error(third))
        report(built=[built_first, built_second, built_third], nodes=nodes, errors=errors)
    ''' % REPO
    out = run(home, 'compat', code, flags=TWO, extra_env={'LD_PRELOAD': cl_counter.build(str(tmp_path))})
    assert max(out['errors']) < 1e-5, out
    # Each node built its kernels (22 programs for 18 nodes); shared, the
    # four alike on a context build once (10).
    assert out['nodes'] >= 16 and 0 < 3 * out['built'][0] <= 2 * out['nodes'], out
    assert out['built'][1] == 0 and out['built'][2] == out['built'][0], out


@needs_pocl
def test_a_kernel_that_fails_to_build_is_an_error_not_a_crash(home, config):
    """A scalar op whose C code calls a function no compiler knows: its GPU
    kernel fails to build, and compiling raises KernelBuildError naming
    the op, the context, its device and the compiler's complaint; the
    process carries on (Theano freed a NULL kernel handle and died).  And
    maximum and minimum, whose kernels OpenCL refused (nan("")), build and
    propagate NaN as numpy does."""
    out = run(home, config, flags='device=opencl0:0', code='''
        import theano, theano.tensor as T
        from theano import scalar
        from theano_multigpu.errors import KernelBuildError

        class Broken(scalar.UnaryScalarOp):
            def impl(self, x):
                return x

            def c_code(self, node, name, inputs, outputs, sub):
                return '%s = no_such_function(%s);' % (outputs[0], inputs[0])

            def c_code_cache_version(self):
                return (1,)

        x, y = T.fmatrix(), T.fmatrix()
        broken = T.elemwise.Elemwise(Broken(scalar.upgrade_to_float, name='broken'))
        try:
            theano.function([x], broken(x * 2) + 1)
            error = None
        except KernelBuildError as caught:
            error = str(caught)
        f = theano.function([x, y], [T.maximum(x, y), T.minimum(x, y)])
        a = np.array([[1, np.nan, 3]], 'float32')
        b = np.array([[2, 0, np.nan]], 'float32')
        got = f(a, b)
        same = all(np.array_equal(g, e, equal_nan=True)
                   for g, e in zip(got, [np.maximum(a, b), np.minimum(a, b)]))
        report(error=error, same=same, gpu=[type(n.op).__name__ for n in f.maker.fgraph.toposort()])
    ''')
    error = out['error']
    assert error is not None and error.startswith('the GPU kernel of GpuElemwise{'), error
    assert 'broken(' in error.split(' failed to build')[0], error
    assert 'failed to build on context None (the default context) (pthread' in error, error
    assert "use of undeclared identifier 'no_such_function'" in error, error
    assert out['same'] and 'GpuElemwise' in out['gpu'], out


@needs_pocl
def test_elemwise_kernels_for_strided_operands_are_built_when_first_called(home):
    """GpuElemwise builds its kernel for contiguous operands with the
    function, and one for strided operands of a rank (broadcast,
    transposed, sliced) when a call first needs it, not 1 + 2*ndim kernels
    up front.  Ranks 1, 2, 4 and 9 (past libgpuarray's 8, where its buffers
    grow) give numpy's numbers, contiguous and strided, called twice; the
    programs built are counted in a pocl kernel cache of the test's own."""
    out = run(home, 'shim', flags='device=opencl0:0', extra_env={
        'POCL_CACHE_DIR': str(home / 'pocl')}, code='''
        import glob, os
        import theano, theano.tensor as T

        def programs():
            return len(glob.glob(os.path.join(os.environ['POCL_CACHE_DIR'], '*', '*', '')))

        rng = np.random.RandomState(0)
        errors, built, called = [], [], []
        for rank in (1, 2, 4, 9):
            x = T.TensorType('float32', (False,) * rank)()
            b = T.TensorType('float32', (True,) + (False,) * (rank - 1))()
            before = programs()
            f = theano.function([x, b], [T.exp(x) * 2 + b, T.tanh(x[::2]) - 1,
                                         x.dimshuffle(*range(rank)[::-1]) * 3])
            built.append(programs() - before)
            shape = (4, 3) + (2,) * (rank - 2) if rank > 1 else (4,)
            a = rng.rand(*shape).astype('float32')
            c = rng.rand(*((1,) + shape[1:])).astype('float32')
            before = programs()
            for _ in range(2):
                got = f(a, c)
                expected = [np.exp(a) * 2 + c, np.tanh(a[::2]) - 1, a.transpose() * 3]
                errors.append(max(float(np.max(np.abs(g - e))) for g, e in zip(got, expected)))
            called.append(programs() - before)
        report(errors=errors, built=built, called=called)
    ''')
    assert len(out['errors']) == 8 and max(out['errors']) < 1e-5, out['errors']
    # The contiguous kernels do not depend on the rank: after the first
    # function, compiling builds nothing (up front it built 2 strided
    # kernels per rank and op); the strided ones are built by the calls.
    assert out['built'][1:] == [0, 0, 0] and out['built'][0] <= 6, out
    assert min(out['called']) > 0, out


@needs_pocl
def test_average_pooling_gradients_on_pocl_are_right(home):
    """The gradient of average pooling, 2-D and 3-D, in Theano's three
    modes, with and without padding (Keras's AveragePooling with
    border_mode='same' pads, average_exc_pad), on a pocl context: each
    input gets each window's output gradient over the window's size, the
    size the forward pass divides by (computed here with numpy).  Theano's
    kernels read the first image's gradient for every 3-D window and
    counted the padding in the size; Theano's CPU op refuses padding."""
    out = run(home, 'shim', flags='device=opencl0:0', code='''
        import itertools
        import theano, theano.tensor as T
        from theano.tensor.signal.pool import pool_2d, pool_3d

        def expected_gradient(x, gy, ws, stride, pad, mode):
            gx = np.zeros_like(x)
            spatial = x.shape[2:]
            for window in itertools.product(*[range(n) for n in gy.shape[2:]]):
                start = [i * s - p for i, s, p in zip(window, stride, pad)]
                end = [min(a + w, n + p) for a, w, n, p in zip(start, ws, spatial, pad)]
                inside = [(max(a, 0), min(e, n)) for a, e, n in zip(start, end, spatial)]
                if mode == 'sum':
                    size = 1
                elif mode == 'average_inc_pad':
                    size = np.prod([e - a for a, e in zip(start, end)])
                else:
                    size = np.prod([e - a for a, e in inside])
                region = (slice(None), slice(None)) + tuple(slice(a, e) for a, e in inside)
                g = gy[(slice(None), slice(None)) + window]
                gx[region] += g.reshape(g.shape + (1,) * len(ws)) / size
            return gx

        rng = np.random.RandomState(0)
        x2, x3 = T.tensor4(), T.TensorType('float32', (False,) * 5)()
        values = {x2: rng.rand(2, 3, 7, 6).astype('float32'),
                  x3: rng.rand(2, 2, 5, 4, 6).astype('float32')}
        cases, outputs = [], []
        for mode, padded in (('average_exc_pad', 0), ('average_exc_pad', 1),
                             ('average_inc_pad', 0), ('sum', 0)):
            for x, pool, ws in ((x2, pool_2d, (3, 2)), (x3, pool_3d, (2, 3, 2))):
                stride, pad = (2,) * len(ws), (padded,) * len(ws)
                y = pool(x, ws=ws, stride=stride, pad=pad, ignore_border=True, mode=mode)
                cases.append((x, ws, stride, pad, mode))
                outputs += [y, theano.grad((y ** 2).sum(), x)]   # each window's own 2 y
        f = theano.function([x2, x3], outputs)
        got = f(values[x2], values[x3])
        errors = []
        for k, (x, ws, stride, pad, mode) in enumerate(cases):
            y, gx = got[2 * k], got[2 * k + 1]
            expected = expected_gradient(values[x], 2 * y, ws, stride, pad, mode)
            errors.append(float(np.max(np.abs(gx - expected))))
        report(errors=errors, ops=sorted(set(type(n.op).__name__ for n in f.maker.fgraph.toposort())))
    ''')
    assert 'GpuAveragePoolGrad' in out['ops'], out['ops']
    assert len(out['errors']) == 8 and max(out['errors']) < 1e-5, out['errors']


@needs_pocl
def test_keras_pooling_on_pocl_equals_the_cpu_for_windows_larger_than_the_input(home):
    """Keras's pool2d and pool3d on a pocl context, over pool sizes 1, 2 and
    5, strides 1 and 2, both border modes, both dim orderings, max and
    average, forward and gradient, and Theano's pool_2d with
    ignore_border=False and max pooling's R-op: the shapes and numbers of
    Theano's CPU ops.  Windows of 5 over 4 or 1 input columns have no output
    (0 columns); GpuPool computed that shape in size_t, got 2**64 - 1 and
    failed to allocate."""
    out = run(home, 'compat', flags='device=opencl0:0', code='''
        import itertools
        import theano, theano.tensor as T
        import keras.backend as K

        rng = np.random.RandomState(0)
        x2, x3 = T.tensor4(), T.TensorType('float32', (False,) * 5)()
        values = [rng.rand(2, 4, 11, 4).astype('float32') - 0.5,
                  rng.rand(1, 4, 5, 1, 3).astype('float32') - 0.5]
        cases, outputs = [], []
        for ordering, border, size, stride, mode in itertools.product(
                ('th', 'tf'), ('valid', 'same'), (1, 2, 5), (1, 2), ('max', 'avg')):
            for x, y in ((x2, K.pool2d(x2, (size, size), (stride, stride), border, ordering,
                                       mode)),
                         (x3, K.pool3d(x3, (size, 2, size), (stride, 1, stride), border,
                                       ordering, mode))):
                if mode == 'avg' and border == 'same':
                    # Theano's CPU op refuses the gradient of padded
                    # averages (the test above checks pocl's); and Keras
                    # 1.2.2 pads a 'same' window of 1 by -1, which the CPU's
                    # average turns into NaN.
                    if size == 1 and x is x3:
                        continue
                    outputs += [y, T.zeros_like(x)]
                else:
                    outputs += [y, theano.grad((y * y).sum(), x)]
                cases.append('%s %s %s %s %s %d-D' % (ordering, border, size, stride, mode,
                                                     x.ndim - 2))
        # Theano's own pool_2d with ignore_border=False (Keras never asks for
        # it), strides below and above the window, and max pooling's R-op
        # (GpuDownsampleFactorMaxGradGrad; GpuMaxPoolRop's kernel is CUDA C).
        from theano.tensor.signal.pool import pool_2d
        direction = T.tensor4()
        values.append(rng.rand(*values[0].shape).astype('float32') - 0.5)
        for ws, stride in (((5, 5), (2, 2)), ((5, 5), (6, 6)), ((3, 2), (1, 1))):
            y = pool_2d(x2, ws=ws, stride=stride, ignore_border=False, mode='max')
            outputs += [y, theano.grad((y * y).sum(), x2)]
            cases.append('pool_2d ignore_border=False %s %s' % (ws, stride))
        for ignore_border in (True, False):
            y = pool_2d(x2, ws=(5, 5), stride=(2, 2), ignore_border=ignore_border, mode='max')
            outputs += [T.Rop(y, x2, direction), T.zeros_like(x2)]
            cases.append('R-op ignore_border=%s' % ignore_border)
        on_pocl_function = theano.function([x2, x3, direction], outputs)
        on_pocl = on_pocl_function(*values)
        cpu_mode = theano.compile.mode.get_default_mode().excluding('gpuarray')
        on_cpu = theano.function([x2, x3, direction], outputs, mode=cpu_mode)(*values)
        wrong, empty = [], 0
        for k, case in enumerate(cases):
            for what, got, expected in zip(('output', 'gradient'), on_pocl[2 * k:2 * k + 2],
                                          on_cpu[2 * k:2 * k + 2]):
                got = np.asarray(got)
                empty += got.size == 0
                if got.shape != expected.shape or not np.allclose(got, expected, atol=1e-5):
                    wrong.append('%s %s: %s against %s' % (case, what, got.shape,
                                                           expected.shape))
        ops = set(type(n.op).__name__ for n in on_pocl_function.maker.fgraph.toposort())
        report(cases=len(cases), wrong=wrong, empty=int(empty), ops=sorted(ops))
    ''')
    assert out['cases'] == 97 and out['wrong'] == [], out
    assert out['empty'] >= 8, out   # windows larger than the input were drawn
    assert {'GpuPool', 'GpuDownsampleFactorMaxGradGrad'} <= set(out['ops']), out['ops']


@needs_pocl
def test_an_allocation_read_on_several_contexts_is_made_on_each(home):
    """One allocation (Theano merges the replicas' equal zeros into one)
    read by ops on two contexts, directly and through ops that read
    nothing else: each context's ops run on their own context, on an
    allocation of their own, and give numpy's numbers.  A single
    allocation on either context took the other's product there."""
    out = run(home, 'shim', flags='contexts=dev0->opencl0:0;dev1->opencl0:1;dev2->opencl0:0',
              code='''
        import theano, theano.tensor as T
        from theano.gpuarray.type import GpuArrayType

        rng = np.random.RandomState(0)
        values = [rng.rand(3, 3).astype('float32') for _ in range(2)]
        weights = [theano.shared(v, target=t) for v, t in zip(values, ('dev1', 'dev2'))]
        n = T.iscalar()
        a = T.alloc(np.float32(0.5), n, 3)
        outputs = [T.dot(a, w) + 1 for w in weights]
        outputs += [a.T.sum(axis=1) * w.sum(axis=0) for w in weights]
        f = theano.function([n], outputs)
        got = f(4)
        host = np.full((4, 3), 0.5, dtype='float32')
        expected = [host.dot(v) + 1 for v in values] + [host.T.sum(axis=1) * v.sum(axis=0)
                                                        for v in values]
        wrong = []
        for node in f.maker.fgraph.toposort():
            reads = set(v.type.context_name for v in theano.gof.graph.inputs([node.outputs[0]])
                        if isinstance(v.type, GpuArrayType))
            if (len(reads) == 1 and isinstance(node.outputs[0].type, GpuArrayType)
                    and node.outputs[0].type.context_name not in reads):
                wrong.append('%s on %s, reads %s' % (node, node.outputs[0].type.context_name,
                                                     reads.pop()))
        report(errors=[float(np.max(np.abs(g - e))) for g, e in zip(got, expected)],
               wrong=wrong, ops=[type(nd.op).__name__ for nd in f.maker.fgraph.toposort()])
    ''')
    assert len(out['errors']) == 4 and max(out['errors']) < 1e-5, out['errors']
    assert out['wrong'] == [], out
    assert 'GpuGemm' in str(out['ops']) or 'GpuDot22' in str(out['ops']), out['ops']


# 4. h5py 3: weights and models round trip, old files load ---------------

def test_save_weights_load_weights_round_trip(home, config):
    out = run(home, config, '''
        import h5py
        x, y = digits()
        model = mlp(seed=0)
        model.save_weights('w.h5')
        fresh = mlp(seed=1)
        differed = not same_weights(model, fresh)
        fresh.load_weights('w.h5')
        # by name: the layers are found by name, an unknown layer keeps its weights
        from keras.models import Sequential
        from keras.layers import Dense
        np.random.seed(2)
        extra = Dense(64, input_dim=64, name='extra')
        renamed = Sequential([extra,
                              Dense(32, activation='relu', name='hidden'),
                              Dense(10, activation='softmax', name='out')])
        extra_before = extra.get_weights()
        renamed.load_weights('w.h5', by_name=True)
        with h5py.File('w.h5', 'r') as f:
            stored = type(f.attrs['layer_names'][0]).__name__
        report(differed=differed, same=same_weights(model, fresh),
               by_name=all(np.array_equal(a, b) for a, b in
                           zip(model.get_weights(), renamed.get_weights()[2:])),
               extra_kept=all(np.array_equal(a, b) for a, b in
                              zip(extra_before, extra.get_weights())),
               stored=stored, file_class=h5py.File.__name__)
    ''')
    assert out['differed'] is True
    assert out['same'] is True
    assert out['by_name'] is True
    assert out['extra_kept'] is True
    assert out['stored'] == 'str'          # h5py 3 reads what Keras wrote as str ...
    assert out['file_class'] == 'File'     # ... and h5py.File is itself again


def test_model_save_load_model_round_trip(home, config):
    out = run(home, config, '''
        import keras.models
        x, y = digits()
        model = mlp()
        model.compile('adam', 'categorical_crossentropy', metrics=['accuracy'])
        model.fit(x, y, nb_epoch=1, batch_size=50, verbose=0)
        model.save('m.h5')
        loaded = keras.models.load_model('m.h5')
        same_prediction = bool(np.array_equal(model.predict(x), loaded.predict(x)))
        optimizer_state = all(np.array_equal(a, b) for a, b in
                              zip(model.optimizer.get_weights(), loaded.optimizer.get_weights()))
        model.train_on_batch(x[:50], y[:50])
        loaded.train_on_batch(x[:50], y[:50])
        report(same_prediction=same_prediction, optimizer_state=optimizer_state,
               n_optimizer_weights=len(loaded.optimizer.get_weights()),
               after_a_step=same_weights(model, loaded))
    ''')
    assert out['same_prediction'] is True
    assert out['n_optimizer_weights'] > 0
    assert out['optimizer_state'] is True
    assert out['after_a_step'] is True    # Adam's moments came back too


def test_files_written_under_h5py2_load(home, config):
    """Keras 1.x under h5py 2 wrote fixed-length bytes attributes."""
    out = run(home, config, '''
        import h5py, keras.models
        rng = np.random.RandomState(3)
        values = {'hidden': [rng.rand(64, 32), rng.rand(32)],
                  'out': [rng.rand(32, 10), rng.rand(10)]}
        with h5py.File('old_weights.h5', 'w') as f:
            f.attrs['layer_names'] = np.array([b'hidden', b'out'], dtype='S6')
            f.attrs['keras_version'] = np.bytes_(b'1.2.2')
            f.attrs['backend'] = np.bytes_(b'theano')
            for layer, arrays in values.items():
                names = [('%s_W' % layer).encode(), ('%s_b' % layer).encode()]
                g = f.create_group(layer)
                g.attrs['weight_names'] = np.array(names, dtype='S8')
                for name, value in zip(names, arrays):
                    g[name] = value.astype('float32')
        expected = values['hidden'] + values['out']
        def loaded(model):
            return all(np.allclose(a, b) for a, b in zip(model.get_weights(), expected))
        model = mlp()
        model.load_weights('old_weights.h5')
        by_name = mlp(seed=1)
        by_name.load_weights('old_weights.h5', by_name=True)

        # A whole model file, every string attribute rewritten as h5py 2 wrote it.
        model.compile('sgd', 'categorical_crossentropy')
        model.save('new_model.h5')
        with h5py.File('new_model.h5', 'r+') as f:
            def to_fixed_bytes(name, item):
                for key, value in list(item.attrs.items()):
                    if isinstance(value, str):
                        item.attrs[key] = np.bytes_(value.encode())
                    elif isinstance(value, np.ndarray) and value.dtype == object:
                        item.attrs[key] = np.array([v.encode() for v in value])
            to_fixed_bytes('/', f)
            f.visititems(to_fixed_bytes)
            still_str = []
            f.visititems(lambda n, i: still_str.extend(
                k for k, v in i.attrs.items() if isinstance(v, str)))
        old_model = keras.models.load_model('new_model.h5')
        x, _ = digits()
        report(weights=loaded(model), by_name=loaded(by_name), still_str=still_str,
               model=bool(np.array_equal(old_model.predict(x), model.predict(x))))
    ''')
    assert out['weights'] is True
    assert out['by_name'] is True
    assert out['still_str'] == []
    assert out['model'] is True


# 5. PyYAML 6 -----------------------------------------------------------

def test_to_yaml_model_from_yaml_round_trip(home, config):
    out = run(home, config, '''
        import yaml
        from keras.models import Sequential, model_from_yaml
        from keras.layers import Dense, Lambda
        original_load = yaml.load
        np.random.seed(0)
        model = Sequential([Dense(32, input_dim=64, activation='relu', name='hidden'),
                            Lambda(lambda t: t * 2.0, output_shape=(32,)),
                            Dense(10, activation='softmax', name='out')])
        text = model.to_yaml()
        rebuilt = model_from_yaml(text)
        rebuilt.set_weights(model.get_weights())
        x, _ = digits()
        report(tuples='!!python/tuple' in text,
               same_layers=[(type(l).__name__, l.name, l.output_shape) for l in rebuilt.layers]
                           == [(type(l).__name__, l.name, l.output_shape) for l in model.layers],
               same_prediction=bool(np.allclose(model.predict(x), rebuilt.predict(x))),
               yaml_load_restored=yaml.load is original_load)
    ''')
    assert out['tuples'] is True           # the tags a safe loader alone refuses
    assert out['same_layers'] is True
    assert out['same_prediction'] is True  # the Lambda's function came back
    assert out['yaml_load_restored'] is True


def test_model_from_yaml_refuses_python_objects(home, config):
    marker = home / 'ran'
    out = run(home, config, '''
        import yaml
        from keras.models import model_from_yaml
        documents = [
            '!!python/object/apply:os.system ["touch %(marker)s"]',
            'config: !!python/object/apply:subprocess.call [["touch", "%(marker)s"]]',
            'class_name: !!python/name:os.system',
            '!!python/object/new:os.system ["touch %(marker)s"]',
        ]
        errors = []
        for document in documents:
            try:
                model_from_yaml(document)
                errors.append(None)
            except yaml.YAMLError as e:
                errors.append(type(e).__name__)
        report(errors=errors)
    ''' % {'marker': marker})
    assert out['errors'] == ['ConstructorError'] * 4
    assert not marker.exists()


# 6. keras.json in a fresh HOME -----------------------------------------

def test_first_keras_import_writes_theano_keras_json(home, config):
    out = run(home, config, '''
        import keras.backend as K
        report(ordering=K.image_dim_ordering(), epsilon=K.epsilon())
    ''')
    written = json.loads((home / '.keras' / 'keras.json').read_text())
    assert written['backend'] == 'theano'
    assert written['image_dim_ordering'] == 'th'
    assert out['ordering'] == 'th'
    assert [p.name for p in (home / '.keras').iterdir()] == ['keras.json']  # no temp file left


def test_existing_keras_json_is_left_alone(home, config):
    path = home / '.keras' / 'keras.json'
    path.parent.mkdir()
    mine = json.dumps({'floatx': 'float32', 'epsilon': 1e-05, 'backend': 'theano',
                       'image_dim_ordering': 'tf'})
    path.write_text(mine)
    out = run(home, config, '''
        import keras.backend as K
        report(ordering=K.image_dim_ordering(), epsilon=K.epsilon())
    ''')
    assert path.read_text() == mine
    assert out == {'ordering': 'tf', 'epsilon': 1e-05}


# 7. Theano's compile cache, shared between processes ----------------------

def test_modules_of_ops_without_parameters_are_versioned_and_built_once(home, tmp_path):
    """Dot22 and SoftmaxWithBias have ``__props__ == ()``; Theano 1.0.5
    took that for a missing version and left their C modules unversioned
    (no key.pkl, deleted at exit), so every process compiled them again.
    In a fresh compile cache, every module the function needs has a
    key.pkl, and a second process builds none.  Each child lists the cache
    before it exits, when Theano deletes the unversioned modules."""
    code = '''
        import theano, theano.tensor as T
        def modules():
            return dict((name, os.path.exists(os.path.join(theano.config.compiledir, name,
                                                           'key.pkl')))
                        for name in os.listdir(theano.config.compiledir)
                        if name.startswith('tmp'))   # Theano's module directories
        before = modules()
        x, y = T.fmatrices('x', 'y')
        W = theano.shared(np.ones((4, 3), 'float32'))
        b = theano.shared(np.zeros(3, 'float32'))
        cost = (T.nnet.softmax(T.dot(x, W) + b) * y).sum()
        f = theano.function([x, y], [cost] + T.grad(cost, [W, b]))
        f(np.ones((2, 4), 'float32'), np.eye(3, dtype='float32')[:2])
        report(ops=sorted(set(type(n.op).__name__ for n in f.maker.fgraph.toposort())),
               before=before, after=modules())
    '''
    flags = 'device=cpu,base_compiledir=' + str(tmp_path / 'theano')
    first = run(home, 'compat', code, flags=flags)
    assert {'Dot22', 'SoftmaxWithBias', 'SoftmaxGrad'} <= set(first['ops']), first['ops']
    assert first['before'] == {}
    assert first['after'], 'the function compiled no C module'
    unversioned = sorted(name for name, keyed in first['after'].items() if not keyed)
    assert unversioned == [], 'modules without key.pkl: %s of %d' % (unversioned,
                                                                   len(first['after']))
    second = run(home, 'compat', code, flags=flags)
    assert second['before'] == first['after']
    assert second['after'] == second['before'], 'the second process compiled modules again'


def test_a_cache_key_file_is_replaced_whole(home, tmp_path):
    """Theano's processes read a module's key.pkl without the compile lock
    and delete a module whose key.pkl does not load.  While a key is added
    (the file written again), key.pkl still loads, with the keys it had;
    after, it has the new key, and nothing else is left beside it."""
    code = '''
        import pickle
        from theano.gof.cmodule import KeyData
        path = %r
        seen = []

        class Peek(object):
            """Pickled while the key file is written: reads it as another
            process would."""
            def __reduce__(self):
                try:
                    with open(path, 'rb') as f:
                        seen.append(sorted(pickle.load(f).keys))
                except Exception as error:
                    seen.append(type(error).__name__)
                return (str, ('peeked',))

        os.makedirs(os.path.dirname(path))
        data = KeyData({('v1', 'first')}, 'hash', path, os.path.join(os.path.dirname(path), 'm.so'))
        data.save_pkl()
        data.add_key(('v1', Peek()))
        with open(path, 'rb') as f:
            after = pickle.load(f)
        report(seen=seen, after=sorted(map(str, after.keys)),
               files=sorted(os.listdir(os.path.dirname(path))))
    ''' % str(tmp_path / 'module' / 'key.pkl')
    found = run(home, 'compat', code)
    assert found['seen'] == [[['v1', 'first']]], found
    assert found['after'] == ["('v1', 'first')", "('v1', 'peeked')"], found
    assert found['files'] == ['key.pkl'], found
