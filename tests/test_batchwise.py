"""Batch-wise mode on pocl contexts: N contexts train as one does.

Each configuration (1, 2 and 4 contexts; the 4 are two names on each pocl
device) is one child Python that trains every model of
tests/children/train_models.py for 5 steps at the same global batch and
writes an .npz; the configurations run side by side.  Batch 10 splits
evenly over 2 contexts and unevenly over 4 (2, 3, 2, 3 rows); ``mlp@3`` and
``mlp@1`` train on batches smaller than the number of contexts.
"""
import os
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import REPO, needs_pocl, run_python

pytestmark = needs_pocl

CHILDREN = os.path.join(REPO, 'tests', 'children')
ONE = 'contexts=dev0->opencl0:0'
TWO = 'contexts=dev0->opencl0:0;dev1->opencl0:1'
FOUR = 'contexts=dev0->opencl0:0;dev1->opencl0:1;dev2->opencl0:0;dev3->opencl0:1'
CONFIGURATIONS = {1: ONE, 2: TWO, 4: FOUR}
# The context names heavy ops run on (the master is Theano's default, None).
GRAPH_NAMES = {2: ['None', 'dev1'], 4: ['None', 'dev1', 'dev2', 'dev3']}

# Dropout too: each replica takes its rows of the masks drawn for the batch.
EXACT = ['mlp', 'cnn', 'lstm', 'gru', 'functional', 'mlp_dropout', 'mlp@3', 'mlp@1']
MODELS = EXACT + ['cnn_bn']
# The recurrent models are the slow ones on pocl (a Python loop over small
# kernels, compiled once per context), so 4 contexts train the others.
RECURRENT = ('lstm', 'gru')
MODELS_ON = {1: MODELS, 2: MODELS, 4: [m for m in MODELS if m not in RECURRENT]}
STEPS, BATCH = 5, 10
RTOL, ATOL = 1e-4, 1e-6


def _train(base, n):
    home = base / ('home%d' % n)
    home.mkdir()
    out = str(home / 'out.npz')
    run_python(home, flags=CONFIGURATIONS[n], timeout=1500,
               args=[os.path.join(CHILDREN, 'train_models.py'), out, str(STEPS), str(BATCH)]
               + MODELS_ON[n])
    return dict(np.load(out))


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """{number of contexts: {key: array}} of train_models.py's results."""
    base = tmp_path_factory.mktemp('batchwise')
    with ThreadPoolExecutor(len(CONFIGURATIONS)) as pool:
        futures = {n: pool.submit(_train, base, n) for n in CONFIGURATIONS}
        return {n: future.result() for n, future in futures.items()}


def _keys(results, name, prefix=''):
    keys = [k for k in results if k.startswith(name + '/' + prefix)
            and k.rsplit('/', 1)[1].startswith('w')]
    return sorted(keys) + ([] if prefix else [name + '/loss', name + '/pred', name + '/eval'])


def _cases(names):
    return [(n, name) for n in (2, 4) for name in names if name in MODELS_ON[n]]


@pytest.mark.parametrize('n,name', _cases(EXACT))
def test_same_weights_losses_predictions(runs, n, name):
    one, many = runs[1], runs[n]
    keys = _keys(one, name)
    assert len(keys) > 3
    for key in keys:
        np.testing.assert_allclose(many[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.parametrize('n,name', _cases(MODELS))
def test_every_context_computes_and_placement_holds(runs, n, name):
    assert set(GRAPH_NAMES[n]) <= set(runs[n][name + '/contexts']), runs[n][name + '/contexts']
    assert list(runs[n][name + '/misplaced']) == []


@pytest.mark.parametrize('n', [2, 4])
def test_batch_normalisation_running_statistics_are_the_full_batch(runs, n):
    """Each replica normalises with its slice's statistics, so weights
    differ from one context's; the running mean and std are computed from
    the whole batch, gathered, so after one step they equal one context's."""
    one, many = runs[1], runs[n]
    for index in (4, 5):   # BatchNormalization's running mean and std
        key = 'cnn_bn/first/w%d' % index
        np.testing.assert_allclose(many[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.parametrize('n', [2, 4])
def test_batch_normalisation_trains(runs, n):
    for key in [k for k in runs[n] if k.startswith('cnn_bn/')]:
        if runs[n][key].dtype.kind == 'f':
            assert np.all(np.isfinite(runs[n][key])), key


def test_stateful_recurrent_layer_stops_with_a_clear_error(home):
    result = run_python(home, flags=TWO, check=False, code='''
        import numpy as np
        from keras.models import Sequential
        from keras.layers import LSTM, Dense
        model = Sequential([LSTM(4, stateful=True, batch_input_shape=(4, 3, 2)), Dense(1)])
        model.compile(loss='mse', optimizer='sgd')
        model.train_on_batch(np.zeros((4, 3, 2), 'float32'), np.zeros((4, 1), 'float32'))
    ''')
    assert result.returncode != 0
    assert 'batch-wise mode expects layers without state carried between batches, but ' \
           'received the stateful recurrent layer' in result.stderr
    assert 'stateful=False' in result.stderr


def test_placement_check_names_an_op_on_the_wrong_context(home):
    """A dot whose data is dev1's but which Theano put on dev0 (its first
    input, a weight, lives there) is flagged; the same dot with its inputs
    swapped runs on dev1 and is not."""
    result = run_python(home, flags=TWO, code='''
        import numpy as np
        import theano
        import theano.tensor as T
        from theano_multigpu import mesh, placement, transfer
        from theano_multigpu.errors import PlacementError
        W = theano.shared(np.arange(12, dtype='float32').reshape(4, 3), name='W')
        x = T.matrix('x')
        on_dev1 = transfer.on_context(x, 'dev1')
        good = theano.function([x], T.dot(on_dev1, W))
        bad = theano.function([x], T.dot(W.T, on_dev1.T))
        value = np.ones((2, 4), dtype='float32')
        assert np.allclose(good(value), value.dot(W.get_value()))
        assert np.allclose(bad(value), W.get_value().T.dot(value.T))
        print('good', placement.misplaced(good.maker.fgraph, mesh.current()))
        print('bad', placement.misplaced(bad.maker.fgraph, mesh.current()))
        try:
            placement.check(bad, mesh.current(), 'error', 'the bad function')
        except PlacementError as error:
            print('raised:', error)
    ''')
    assert 'good []' in result.stdout
    assert "bad [('GpuDot22', 'dev0', 'dev1')]" in result.stdout
    assert 'raised: theano_multigpu: placement check of the bad function: 1 heavy op(s)' \
           in result.stdout
    assert 'GpuDot22 runs on dev0, expected on dev1' in result.stdout


def test_report_shows_each_context_share_ops_and_bytes(home):
    """The report of a train step at batch 10 on two contexts: 5 rows each,
    the dot products on both, all weights resident on the master, and the
    bytes moved measured: dev1 receives the weights, its 5 input rows and the
    gradient of its 5 output rows, and sends back as many gradient and
    output bytes."""
    script = home / 'train.py'
    script.write_text(textwrap.dedent('''
        import numpy as np
        from keras.models import Sequential
        from keras.layers import Dense
        model = Sequential([Dense(16, input_dim=8, activation='relu'),
                            Dense(3, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer='sgd')
        x = np.ones((10, 8), 'float32')
        y = np.eye(3)[np.arange(10) % 3].astype('float32')
        model.train_on_batch(x, y)
        print('weight bytes', sum(w.nbytes for w in model.get_weights()))
    '''))
    result = run_python(home, flags=TWO, args=['-m', 'theano_multigpu', 'report', str(script)])
    weight_bytes = int(result.stdout.split('weight bytes')[1])
    assert weight_bytes == (8 * 16 + 16 + 16 * 3 + 3) * 4
    report = result.stderr.split("placement report: Keras's train function")[1]
    rows = {line.split()[0]: line for line in report.splitlines()[2:4]}
    assert ' 0-5 of 10 ' in rows['dev0*'] and ' 5-10 of 10 ' in rows['dev1']
    rows_in, rows_out = 5 * 8 * 4, 5 * 3 * 4   # dev1's input rows, output rows
    dev1_in, dev1_out = weight_bytes + rows_in + rows_out, weight_bytes + rows_out
    assert rows['dev1'].split()[7:11] == ['%d' % dev1_in, 'B', '%d' % dev1_out, 'B'], rows['dev1']
    for row in rows.values():
        assert 'GpuDot22' in row and 'GpuSoftmaxWithBias x1' in row
    assert rows['dev1'].split()[5:7] == ['0', 'B']   # nothing resident on a replica


@pytest.fixture(scope='module')
def fits(tmp_path_factory):
    """fit_digits.py's results on 1 and 2 contexts, and the 2-context run's
    files loaded by plain Keras-Theano (no shim, on the CPU)."""
    base = tmp_path_factory.mktemp('fits')

    def fit(n):
        home = base / ('home%d' % n)
        home.mkdir()
        run_python(home, flags=CONFIGURATIONS[n], timeout=1500,
                   args=[os.path.join(CHILDREN, 'fit_digits.py'), 'train', str(home)])
        return home

    with ThreadPoolExecutor(2) as pool:
        homes = dict(zip((1, 2), pool.map(fit, (1, 2))))
    run_python(homes[2], backend='theano', extra_env={'THEANO_MULTIGPU_COMPAT': '1'},
               args=[os.path.join(CHILDREN, 'fit_digits.py'), 'load', str(homes[2])])
    return ({n: dict(np.load(str(home / 'results.npz'))) for n, home in homes.items()},
            dict(np.load(str(homes[2] / 'loaded.npz'))))


def test_fit_with_callbacks_matches_one_context(fits):
    results, _ = fits
    one, two = results[1], results[2]
    assert sorted(one) == sorted(two)
    assert int(two['epochs']) == int(one['epochs'])
    assert 1 < int(one['epochs']) < 6   # EarlyStopping stopped it
    for key in sorted(one):
        np.testing.assert_allclose(two[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)


def test_weights_are_never_stale(fits):
    results, _ = fits
    two = results[2]
    assert not np.allclose(two['pred_half'], two['pred'], atol=1e-3)
    assert not np.allclose(two['pred_zero_kernel'], two['pred_half'], atol=1e-3)
    np.testing.assert_allclose(two['pred_reloaded'], two['pred'], rtol=1e-6, atol=1e-7)
    assert two['pred_checkpoint'].shape == two['pred'].shape


def test_files_saved_batch_wise_load_in_plain_keras(fits):
    results, loaded = fits
    np.testing.assert_allclose(loaded['pred_model'], results[2]['pred'], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loaded['pred_weights'], results[2]['pred'], rtol=1e-5, atol=1e-6)
