"""Batch-wise mode on pocl contexts: N contexts train as one does.

Each configuration (1, 2 and 4 contexts; the 4 are two names on each pocl
device) is one child Python that trains every model of
tests/children/train_models.py for 5 steps at the same global batch and
writes an .npz; the configurations run side by side.  Batch 10 splits
evenly over 2 contexts and unevenly over 4 (2, 3, 2, 3 rows); ``mlp@3``
trains on a batch smaller than the number of contexts (on 4).
"""
import json
import textwrap

import numpy as np
import pytest

from conftest import FOUR, ONE, TWO, needs_pocl, run_python, train_models

pytestmark = needs_pocl

# 2 and 4 contexts shard the weights (multigpu.shard, the default), every
# weight with a row per context split into blocks of rows
# (multigpu.shard_split=0); the others have one owner.
# 'local': multigpu.batchnorm=local, each replica normalising with its
# rows' statistics, and the master holding every weight (multigpu.shard=False).
SPLIT = ',multigpu.shard_split=0'
CONFIGURATIONS = {1: ONE, 2: TWO + SPLIT, 4: FOUR + SPLIT,
                  'local': TWO + ',multigpu.batchnorm=local,multigpu.shard=False'}
# The context names heavy ops run on (the master is Theano's default, None).
GRAPH_NAMES = {2: ['None', 'dev1'], 4: ['None', 'dev1', 'dev2', 'dev3'],
               'local': ['None', 'dev1']}

# Random draws too: each replica takes its rows of what one context draws,
# dropout masks and the VAE's noise, of a fixed or a symbolic batch shape.
# Stateful recurrent layers too: each replica carries its rows of the states;
# and BatchNormalization, with the whole batch's statistics (the default).
# cnn_bn has four of them, two in residual blocks; cnn_bn1 the first alone.
# And the layers whose graphs regroup the rows and put them back ('zoo'),
# and the shape of Keras's siamese example (a network shared by two inputs,
# K.maximum, whose OpenCL kernel once failed to build).
# And Lambdas whose ops make the batch's rows meet, computed over the whole
# batch ('rows_meet': at 3 rows, 1 and 2 on two contexts).
EXACT = ['mlp', 'cnn', 'lstm', 'gru', 'functional', 'mlp_dropout', 'mlp@3',
         'vae_fixed', 'vae_symbolic', 'stateful_lstm', 'cnn_bn', 'cnn_bn1', 'zoo', 'siamese',
         'rows_meet', 'rows_meet@3']
MODELS = EXACT
# To keep the suite short (compiling dominates), 4 contexts train the models
# whose split differs from 2 contexts': uneven slices (batch 10 as 2, 3, 2,
# 3 rows) and a batch smaller than the number of contexts (mlp@3); three of
# them (the functional API, a draw of a symbolic shape, one
# BatchNormalization) only there: the four-BatchNormalization model trains on
# 2 contexts.  The master alone holding the weights ('local') trains a model
# with dropout too.
ON_FOUR_ONLY = ['functional', 'vae_symbolic', 'cnn_bn1', 'rows_meet']
MODELS_ON = {1: MODELS, 2: [name for name in MODELS if name not in ON_FOUR_ONLY],
             4: ['mlp', 'cnn', 'functional', 'mlp@3', 'vae_symbolic', 'cnn_bn1', 'rows_meet'],
             'local': ['cnn_bn1', 'mlp_dropout']}
STEPS, BATCH = 5, 10
RTOL, ATOL = 1e-4, 1e-6


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """{number of contexts: {key: array}} of train_models.py's results."""
    return train_models(tmp_path_factory.mktemp('batchwise'), CONFIGURATIONS, MODELS_ON,
                        STEPS, BATCH)


def _keys(results, name, prefix=''):
    keys = [k for k in results if k.startswith(name + '/' + prefix)
            and k.rsplit('/', 1)[1].startswith('w')]
    return sorted(keys) + ([] if prefix else [name + '/loss', name + '/pred', name + '/eval'])


def _cases(names):
    return [(n, name) for n in (2, 4, 'local') for name in names
            if name in MODELS_ON[n] and (n, name) != ('local', 'cnn_bn1')]


@pytest.mark.parametrize('n,name', _cases(EXACT))
def test_same_weights_losses_predictions(runs, n, name):
    one, many = runs[1], runs[n]
    keys = _keys(one, name)
    assert len(keys) > 3
    for key in keys:
        np.testing.assert_allclose(many[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.parametrize('n,name', _cases(MODELS) + [('local', 'cnn_bn1')])
def test_every_context_computes_and_placement_holds(runs, n, name):
    assert set(GRAPH_NAMES[n]) <= set(runs[n][name + '/contexts']), runs[n][name + '/contexts']
    assert list(runs[n][name + '/misplaced']) == []


# The first model each child trains: the plan balances every weight of the
# process, so a model trained after others may go to one context (the
# least loaded one, e.g. away from a random generator's 360 KiB state).
SPREAD = ('mlp',)


@pytest.mark.parametrize('n,name', [case for case in _cases(MODELS) if case[0] != 'local'])
def test_sharded_weights_sit_where_the_plan_counted_them(runs, n, name):
    """Sharded, each context holds the bytes the plan counted there (every
    shared variable of the train function: weights, optimizer state,
    random generators' states), within 5%; and the first models' weights
    are spread: more than one context holds some."""
    memory = runs[n][name + '/memory']   # [[resident, planned] per context]
    assert memory.shape == (len(GRAPH_NAMES[n]), 2)
    for context, (resident, planned) in enumerate(memory):
        assert abs(int(resident) - int(planned)) <= 0.05 * max(int(planned), 1), (context, memory)
    if name in SPREAD:
        assert (memory[:, 0] > 0).sum() >= 2, memory


@pytest.mark.parametrize('n,name', [case for case in _cases(MODELS) if case[0] in (2, 4)])
def test_every_weight_with_a_row_per_context_is_split_and_read_through_the_shims_copies(
        runs, n, name):
    """multigpu.shard_split=0: each trainable weight with at least one row per
    context is split into one block per context, rows differing by at most
    one (the others stay whole); and the train function copies no weight's
    value between contexts with Theano's own op (GpuToGpu, which keeps no
    placement), only with the shim's: blocks read on the master through
    their host view once were."""
    for weight in runs[n][name + '/split']:
        rows, blocks = int(weight[0]), [int(r) for r in weight[1:] if r >= 0]
        # graph.rows.slice_bounds: contiguous, differing by at most one row
        expected = [(k + 1) * rows // n - k * rows // n for k in range(n)] if rows >= n else []
        assert blocks == expected, (rows, blocks)
    assert (runs[n][name + '/split'][:, 1:] > 0).any(), runs[n][name + '/split']
    assert int(runs[n][name + '/theano_copies']) == 0


def test_local_batch_normalisation_differs_but_its_running_statistics_are_the_batch(runs):
    """multigpu.batchnorm=local: each replica normalises with its rows'
    statistics, so the weights differ from one context's; the running mean
    and std come from the whole batch (the layer's inputs are gathered on
    the master), so after one step they equal one context's."""
    one, local = runs[1], runs['local']
    for index in (3, 4):   # BatchNormalization's running mean and std
        key = 'cnn_bn1/first/w%d' % index
        np.testing.assert_allclose(local[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)
    assert not np.allclose(local['cnn_bn1/w0'], one['cnn_bn1/w0'], rtol=1e-3)
    for key in [k for k in local if k.startswith('cnn_bn1/')]:
        if local[key].dtype.kind == 'f':
            assert np.all(np.isfinite(local[key])), key


def test_stateful_layer_refuses_a_batch_of_another_size(home):
    """A stateful layer's states hold the rows of the batch size it was
    built for; one device refuses a batch of another size, and so do the
    contexts, with an error that says why (a shorter batch would otherwise
    read the first rows of the states)."""
    result = run_python(home, flags=TWO, check=False, code='''
        import numpy as np
        from keras.models import Sequential
        from keras.layers import LSTM, Dense
        model = Sequential([LSTM(2, stateful=True, batch_input_shape=(4, 3, 2)), Dense(1)])
        model.compile(loss='mse', optimizer='sgd')
        model.train_on_batch(np.zeros((4, 3, 2), 'float32'), np.zeros((4, 1), 'float32'))
        print('4 rows trained')
        model.train_on_batch(np.zeros((2, 3, 2), 'float32'), np.zeros((2, 1), 'float32'))
    ''')
    assert '4 rows trained' in result.stdout
    assert result.returncode != 0
    assert ("batch-wise mode: a tensor made for a fixed batch size (a stateful layer's "
            "states, a random draw or a constant of the batch's shape) meets a batch of "
            "another size, which one device refuses too") in result.stderr


def test_placement_check_names_an_op_on_the_wrong_context(home):
    """A dot whose data is dev1's but which Theano put on dev0 (its first
    input, a weight, lives there) is flagged; the same dot with its inputs
    swapped runs on dev1 and is not.  Batch-wise, the inputs stay on the
    host until moved (each context's rows straight to it): an op that reads
    an input outside the layers (a function of no layer, an output beside
    the model's) runs on the master, and one left on the host is flagged."""
    result = run_python(home, flags=TWO, code='''
        import numpy as np
        import theano
        import theano.tensor as T
        from theano_multigpu.config import mesh
        from theano_multigpu.graph import placement, transfer
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
        on_host = T.matrix('on_host')
        on_host.tag.target = 'cpu'   # as batch-wise inputs are
        host = theano.function([on_host], T.nnet.softmax(on_host))
        print('host', placement.misplaced(host.maker.fgraph, mesh.current()))
        # Without contexts (MPI ranks on the CPU) the host is the place.
        from theano_multigpu.config.mesh import Mesh
        print('no contexts', placement.misplaced(host.maker.fgraph, Mesh([], {}, None, 'batch')))
        # A raw input Theano copies itself to where the data it meets lives.
        W1 = theano.shared(np.ones((4, 3), 'float32'), name='W1', target='dev1')
        layer = T.dot(on_dev1, transfer.host_from_gpu(W1))
        meets = theano.function([x], T.nnet.softmax(layer + x[:, :3]))
        print('meets', placement.misplaced(meets.maker.fgraph, mesh.current()))
        weight = theano.function([x], T.nnet.softmax(T.dot(W1.T, x.T)))
        print('meets a weight', placement.misplaced(weight.maker.fgraph, mesh.current()))

        from keras import backend as K
        from keras.layers import Dense, Input
        from keras.models import Model
        images = K.placeholder((None, 1, 4, 4))
        pooled = K.function([images], [K.pool2d(images, (2, 2), dim_ordering='th')])
        inputs = Input(shape=(4,))
        beside = K.function([inputs], [Model(inputs, Dense(3)(inputs)).output,
                                       K.softmax(inputs)])
        print('shapes', pooled([np.ones((2, 1, 4, 4), 'float32')])[0].shape,
              beside([value])[1].shape)
        for name, function in (('pooled', pooled), ('beside', beside)):
            counts = placement.heavy_op_counts(function.function.maker.fgraph, mesh.current())
            print(name, sorted(counts), placement.misplaced(function.function.maker.fgraph,
                                                            mesh.current()))
    ''')
    assert 'shapes (2, 1, 3, 3) (2, 4)' in result.stdout, result.stdout
    assert "host [('Softmax', 'cpu', 'dev0')]" in result.stdout
    assert 'no contexts []' in result.stdout and 'meets []' in result.stdout, result.stdout
    assert 'meets a weight []' in result.stdout, result.stdout
    assert "pooled ['dev0'] []" in result.stdout, result.stdout
    assert "beside ['dev0', 'dev1'] []" in result.stdout, result.stdout
    assert 'good []' in result.stdout
    assert "bad [('GpuDot22', 'dev0', 'dev1')]" in result.stdout
    assert 'raised: theano_multigpu: placement check of the bad function: 1 heavy op(s)' \
           in result.stdout
    assert 'GpuDot22 runs on dev0, expected on dev1' in result.stdout


def test_report_shows_each_context_share_ops_and_bytes(home):
    """The report of a train step at batch 10 on two contexts: 5 rows each,
    the dot products on both, the weights and their SGD moments sharded
    (resident where the plan counted them), the step's peak planned and
    measured (multigpu.measure_peak) within 10%, and the bytes moved
    measured:
    dev1 receives the weights it does not own, the gradients of those it
    owns, its 5 input rows (from the host) and the gradient of its 5 output
    rows, and sends as many weight and gradient bytes and its output rows,
    as many as the master sends it; then which
    layers ran where; and which layer ran over the whole batch, with the
    bytes copied for it."""
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
        import keras.backend as K
        from keras.layers import Lambda
        centred = Sequential([Dense(4, input_dim=8),
                              Lambda(lambda h: h - K.mean(h, axis=0), name='centre'),
                              Dense(3, activation='softmax')])
        centred.compile(loss='categorical_crossentropy', optimizer='sgd')
        centred.train_on_batch(x, y)
        # Rows moved off the first axis, then a reshape whose blocks only
        # the run can judge: each replica checks them as it runs.
        moved = Sequential([Dense(4, input_dim=8), Lambda(
            lambda h: K.reshape(K.permute_dimensions(h, (1, 0)), (-1, 4)), name='moved'),
            Dense(3, activation='softmax')])
        moved.compile(loss='categorical_crossentropy', optimizer='sgd')
        try:
            moved.train_on_batch(x, y)
        except AssertionError as error:   # Theano's Assert, as it ran
            print('moved:', str(error).splitlines()[0])
    '''))
    result = run_python(home, flags=TWO + ',multigpu.measure_peak=True',
                        args=['-m', 'theano_multigpu', 'report', str(script)])
    weight_bytes = int(result.stdout.split('weight bytes')[1].split()[0])
    assert weight_bytes == (8 * 16 + 16 + 16 * 3 + 3) * 4
    report = result.stderr.split("placement report: Keras's train function")[1]
    rows = {line.split()[0]: line for line in report.splitlines()[2:4]}
    assert ' 0-5 of 10 ' in rows['dev0*'] and ' 5-10 of 10 ' in rows['dev1']
    rows_in, rows_out = 5 * 8 * 4, 5 * 3 * 4   # dev1's input rows, output rows
    dev1_in, dev1_out = weight_bytes + rows_in + rows_out, weight_bytes + rows_out
    assert rows['dev1'].split()[13:17] == ['%d' % dev1_in, 'B', '%d' % dev1_out, 'B'], rows['dev1']
    # dev1's input rows come from the host, not through the master.
    assert rows['dev0*'].split()[15:17] == ['%d' % dev1_out, 'B'], rows['dev0*']
    for row in rows.values():
        assert 'GpuDot22' in row and 'GpuSoftmaxWithBias x1' in row
    resident = dict((name, row.split()[5:9]) for name, row in rows.items())
    for name, (held, unit, planned, planned_unit) in resident.items():
        assert (held, unit) == (planned, planned_unit), rows[name]
    held = dict((name, _bytes(n, unit)) for name, (n, unit, _, _) in resident.items())
    assert abs(held['dev0*'] + held['dev1'] - 2 * weight_bytes) < 0.1 * weight_bytes
    assert 0 < held['dev1'] < 2 * weight_bytes   # sharded
    # The peak, measured: what a context holds, plus during the step a copy
    # of the weights it does not own, its activations and gradients.
    peak = dict((name, _bytes(*row.split()[11:13])) for name, row in rows.items())
    for name in rows:
        assert held[name] + weight_bytes / 4 < peak[name] < held[name] + 4 * weight_bytes, (
            rows[name])
        planned_peak = _bytes(*rows[name].split()[9:11])   # before the step ran
        assert abs(planned_peak - peak[name]) <= 0.1 * peak[name], rows[name]
    where = [line for line in report.splitlines()
             if line.startswith(('  layers computed', '  on '))]
    assert where == ["  layers computed on each context's rows (dev0, dev1): dense_1, dense_2",
                     '  on the master (dev0), over the whole batch: the loss and metrics',
                     "  on each weight's owner (split: on each block's context): the sum of "
                     "its gradients and its update"], where
    # A layer whose rows meet (K.mean over them): its sum is summed on each
    # context and dev1's partial sum (4 floats) crosses to the master, the
    # mean back to dev1, and each one's gradient the other way: 4 x 16 B,
    # where joining dev1's 5 rows would move 80 B each way.
    centred = result.stderr.split("placement report: Keras's train function")[2]
    assert ("\n    centre: 64 B; Sum{axis=[0], acc_dtype=float64} reduces over the batch's "
            "rows (axis 0); Elemwise{true_div,no_inplace} computes a value of the whole batch "
            "with the number of rows") in centred, centred
    moved = result.stdout.split('moved:')[1]
    assert ("Reshape{2} in layer 'moved' reshapes the batch's rows across other axes" in moved
            and '(found as it ran: only the shapes of a batch tell)' in moved), moved


def _bytes(number, unit):
    """A report's size ('1.5', 'KiB') in bytes."""
    return float(number) * {'B': 1, 'KiB': 1 << 10, 'MiB': 1 << 20}[unit]


FITS_WHEN_SHARDED = '''
    import numpy as np
    from keras.layers import Dense
    from keras.models import Sequential
    from theano_multigpu.config import mesh
    from theano_multigpu.errors import PlanError
    from theano_multigpu.graph import report

    def mlp(width):
        model = Sequential([Dense(width, input_dim=width, activation='tanh')
                            for _ in range(4)])
        model.compile(loss='mse', optimizer='adam')
        return model

    rng = np.random.RandomState(0)
    x, y = rng.rand(8, 64).astype('float32'), rng.rand(8, 64).astype('float32')
    model = mlp(64)
    before = model.get_weights()
    from keras import backend as K
    first = K.eval(model.layers[0].W)   # compiled before the weights are placed
    losses = [float(model.train_on_batch(x, y)) for _ in range(2)]
    print('eval', np.array_equal(first, before[0]),
          np.array_equal(K.eval(model.layers[0].W), model.get_weights()[0]))
    resident = report.resident_bytes(model.model.train_function.function, mesh.current())
    try:   # a batch whose activations do not fit: stopped before the step runs
        model.train_on_batch(np.ones((4096, 64), 'float32'), np.ones((4096, 64), 'float32'))
    except PlanError as error:
        print('peak_refused', str(error).replace('\\n', ' | '))
    print('weights', sum(w.nbytes for w in before))
    print('resident', *[resident.get(name, 0) for name in mesh.current().names])
    print('moved', all(not np.allclose(a, b) for a, b in zip(before, model.get_weights())))
    try:
        mlp(128).train_on_batch(np.ones((8, 128), 'float32'), np.ones((8, 128), 'float32'))
    except PlanError as error:
        print('refused:', error)

    if len(mesh.current().names) == 4:
        # Predicted first, a model 1.3 times the first fits its blocks and a
        # copy of each weight; its fit adds Adam's states, which do not fit.
        wide, x72 = mlp(72), np.ones((8, 72), 'float32')
        print('predicted', wide.predict(x72).shape == (8, 72))
        try:
            wide.train_on_batch(x72, x72)
        except PlanError as error:
            print('refused_after_predict', error)

    # A trained recurrent layer called again, once its weights are placed
    # (an inference model): Scan builds its loop from the weights themselves.
    # (On two contexts alone: compiling dominates the suite's time.)
    if len(mesh.current().names) != 2:
        raise SystemExit
    from keras.layers import LSTM, Input
    from keras.models import Model
    rnn = Sequential([LSTM(4, input_shape=(3, 2)), Dense(1)])
    rnn.compile(loss='mse', optimizer='sgd')
    xs = rng.rand(4, 3, 2).astype('float32')
    rnn.train_on_batch(xs, rng.rand(4, 1).astype('float32'))
    built = Model(rnn.layers[0].input, rnn.layers[0].output).predict(xs)
    inputs = Input(shape=(3, 2))
    again = Model(inputs, rnn.layers[0](inputs)).predict(xs)
    print('recurrent', np.allclose(again, built, rtol=1e-5, atol=1e-6), np.abs(built).min() > 0)
'''


@pytest.mark.parametrize('flags', [TWO, FOUR + SPLIT], ids=['2 contexts', '4 contexts split'])
def test_a_model_one_context_cannot_hold_trains_sharded_and_a_bigger_one_stops(home, flags):
    """Weights plus Adam's two states take 3 times the weights' bytes; with a
    budget of 2.5 times, one context cannot hold them, the sharded contexts
    can (each holds its share and, during a step, a copy of every weight;
    on 4 contexts each weight split into blocks of rows, its share a
    quarter of each), and each holds no more than the budget.  A model 4
    times bigger fits no plan: it stops before compiling, with the bytes
    needed and available per context, and so does a step of 4096 rows,
    whose planned peak does not fit, before it runs (micro-batches off:
    test_accumulate tries them; a second compile here costs the suite
    minutes); so does (on 4
    contexts) the fit of one that its predict, compiled first, split and placed without the optimizer
    state.  ``K.eval`` of a weight before it is placed and after reads
    its value, and (on 2 contexts) a trained LSTM called again on a new
    input computes what it computed in the model it trained in."""
    weights = 4 * (64 * 64 + 64) * 4
    budget = int(2.5 * weights)
    result = run_python(home, FITS_WHEN_SHARDED,
                        flags=flags + ',multigpu.device_memory=%d,multigpu.accumulate=1'
                        % budget)
    lines = dict(line.split(' ', 1) for line in result.stdout.splitlines() if ' ' in line)
    assert int(lines['weights']) == weights and 3 * weights > budget
    resident = [int(n) for n in lines['resident'].split()]
    assert sum(resident) == 3 * weights and max(resident) <= budget, resident
    if flags != TWO:   # split: 64 rows in blocks of 16, every context the same bytes
        assert len(set(resident)) == 1, resident
    assert lines['moved'] == 'True'
    refused = lines['peak_refused']
    assert refused.startswith("Keras's train function expects each context to hold, at the "
                              "peak of its step"), refused
    assert ' |   dev0: peak ' in refused and ', has 162.5 KiB' in refused, refused
    assert lines['eval'] == 'True True'   # K.eval reads the placed weight, not its placeholder
    assert lines.get('recurrent', 'True True') == 'True True'
    assert ('recurrent' in lines) == (flags == TWO)
    refused = lines['refused:']
    assert refused.startswith('sharded batch-wise mode expects each context to hold the '
                              'weights it owns'), refused
    assert 'dev0: needs ' in result.stdout and ', has 162.5 KiB' in result.stdout   # the budget
    if flags != TWO:
        assert lines['predicted'] == 'True'
        assert lines['refused_after_predict'].startswith(
            'sharded batch-wise mode expects each context to hold'), result.stdout
