"""The step's peak per context, planned before a call (``peak_plan``) and
measured as it runs (multigpu.measure_peak): a function whose values are
known by hand peaks at what they hold together on each context, planned
and measured alike; a buffer read through views counts once; an op without
shape inference makes the plan say so; a Keras model with Dropout is
planned within 10% of its measured peak (one child Python, two pocl
contexts)."""
import json

from conftest import TWO, needs_pocl, run_python

CHILD = '''
    import json
    import numpy as np
    import pygpu
    import theano
    import theano.tensor as T
    import keras   # the shim's startup
    from theano.gpuarray.basic_ops import host_from_gpu
    from theano.gpuarray.type import get_context, gpuarray_shared_constructor
    from theano_multigpu.graph import peak, peak_plan

    out = {}
    # Two dot products in a row on each context: at the second, the
    # operand, the first product and the second are held together (the
    # first is freed after it, the sum's result is one float).
    n, m = 64, 32
    A = gpuarray_shared_constructor(np.ones((n, n), 'float32') / n, target='dev0', name='A')
    B = gpuarray_shared_constructor(np.ones((m, m), 'float32') / m, target='dev1', name='B')
    a, b = host_from_gpu(A), host_from_gpu(B)
    f = theano.function([], [T.dot(T.dot(a, a), a).sum(), T.dot(T.dot(b, b), b).sum()],
                        mode=peak.measuring_mode({'dev0': 'dev0', 'dev1': 'dev1'}))
    out['unmeasured'] = peak.peak_of(theano.function([], a.sum()))
    out['planned'] = peak_plan.planned_peak(f, [], {'dev0': 'dev0', 'dev1': 'dev1'})
    out['values'] = [float(v) for v in f()]
    out['peak'] = peak.peak_of(f)
    f()
    out['peak twice'] = peak.peak_of(f)

    # Views of one buffer count once, to the end of the furthest.
    meter = peak.PeakMeter({id(get_context('dev0')): 'dev0', id(get_context('dev1')): 'dev1'})
    x = pygpu.gpuarray.array(np.ones((4, 5), 'float32'), context=get_context('dev0'))
    y = pygpu.gpuarray.array(np.ones((3,), 'float32'), context=get_context('dev1'))
    out['views'] = meter.live_bytes([x, x[1:3], x.T, x[:1]])
    out['head'] = meter.live_bytes([x[:2]])
    out['two contexts'] = meter.live_bytes([x, y, np.ones(100)])

    # An op with no shape inference: its output's shape is known only once
    # it is computed, and the plan says so, naming it.
    @theano.compile.ops.as_op(itypes=[T.fmatrix], otypes=[T.fmatrix])
    def doubled(v):
        return v * 2
    c = T.fmatrix('c')
    g = theano.function([c], T.dot(doubled(c), a).sum())
    try:
        peak_plan.planned_peak(g, [np.ones((3, n), 'float32')], {'dev0': 'dev0'})
        out['not plannable'] = None
    except peak_plan.NotPlannable as error:
        out['not plannable'] = str(error)
    # A function of inputs: their shapes at the call decide.
    h = theano.function([c], T.dot(T.dot(c, a), a).sum())
    out['by the call'] = [peak_plan.planned_peak(h, [np.ones((rows, n), 'float32')],
                                                 {'dev0': 'dev0'})['dev0']
                          for rows in (1, 10)]

    # A Keras model with Dropout (a random generator and a branch on the
    # learning phase), planned before its first step, then measured.
    from keras.layers import Dense, Dropout
    from keras.models import Sequential
    from theano_multigpu.config import mesh
    model = Sequential([Dense(64, input_dim=32, activation='relu'), Dropout(0.5),
                        Dense(10, activation='softmax')])
    model.compile(loss='categorical_crossentropy', optimizer='adam')
    model.model._make_train_function()
    train = model.model.train_function.function
    x, y = np.ones((32, 32), 'float32'), np.eye(10)[np.arange(32) % 10].astype('float32')
    out['dropout planned'] = peak_plan.planned_peak(train, [x, y, np.ones(32, 'float32'),
                                                            np.uint8(1)],
                                                    mesh.current().names_by_graph_name())
    model.train_on_batch(x, y)
    out['dropout measured'] = peak.peak_of(train)
    print('RESULT ' + json.dumps(out))
'''


@needs_pocl
def test_the_peak_is_what_each_context_holds_at_once(home):
    result = run_python(home, code=CHILD, flags=TWO + ',multigpu.measure_peak=True')
    line = [l for l in result.stdout.splitlines() if l.startswith('RESULT ')][0]
    out = json.loads(line[len('RESULT '):])
    assert out['values'] == [64.0, 32.0]
    assert out['unmeasured'] is None
    assert out['peak'] == {'dev0': 3 * 64 * 64 * 4, 'dev1': 3 * 32 * 32 * 4}, out['peak']
    assert out['peak twice'] == out['peak']
    assert out['planned'] == out['peak']
    assert out['not plannable'].startswith('the shape of'), out['not plannable']
    assert 'FromFunctionOp{doubled}' in out['not plannable'], out['not plannable']
    # A and two of: the input's rows moved to dev0, their product with A,
    # its product with A (each freed after its last reader).
    assert out['by the call'] == [(64 + 2 * rows) * 64 * 4 for rows in (1, 10)], out['by the call']
    assert out['views'] == {'dev0': 4 * 5 * 4}
    assert out['head'] == {'dev0': 2 * 5 * 4}
    assert out['two contexts'] == {'dev0': 80, 'dev1': 12}
    planned, measured = out['dropout planned'], out['dropout measured']
    assert sorted(planned) == sorted(measured) == ['dev0', 'dev1']
    for name in planned:
        assert abs(planned[name] - measured[name]) <= 0.1 * measured[name], (planned, measured)
