"""Keras's backend entries as stock Keras takes them, in both modes:
``K.gradients(loss, x)`` with one tensor (an input or a weight) and
``K.function(ins, out)`` with one output, as Keras's
conv_filter_visualization, deep_dream and neural_style_transfer examples
call them, also with the weights split into blocks of rows (by a
``predict`` before the first step, and a constraint that reads across
rows); and a
layer-wise or split weight read by any Theano means (``.eval()``, a
user's ``theano.function``, pickling).  Each value is checked against
numpy from the trained weights.
"""
import pytest

from conftest import TWO, needs_pocl, run_python

SCRIPT = '''
import pickle
import numpy as np
import theano
import keras.backend as K
from keras.models import Sequential
from keras.layers import Dense
from keras.constraints import Constraint


class Centred(Constraint):
    """Each column's mean taken off: reads across the rows of a weight."""
    def __call__(self, p):
        return p - K.mean(p, axis=0, keepdims=True)


model = Sequential([Dense(4, input_dim=3, W_constraint=Centred()), Dense(2)])
model.compile(loss='mse', optimizer='adam')
x = np.arange(15, dtype='float32').reshape(5, 3) / 10
rng = np.random.RandomState(0)
model.set_weights([rng.randn(*w.shape).astype('float32') for w in model.get_weights()])
# Predict before fit: the weights are placed before any update is known.
first = model.predict(x)
w1, c1, w2, c2 = model.get_weights()
model.train_on_batch(x, np.ones((5, 2), 'float32'))
W1, b1, W2, b2 = model.get_weights()
# Adam's first step (its moments split, the centred W1 updated whole)
# on the mean squared error, W1 centred after.
h = x.dot(w1) + c1
d = 2 * (h.dot(w2) + c2 - 1) / 10
gradients = [x.T.dot(d.dot(w2.T)), d.dot(w2.T).sum(0), h.T.dot(d), d.sum(0)]
stepped = [w - 0.001 * np.sqrt(0.001) / 0.1 * (0.1 * g) / (np.sqrt(0.001 * g * g) + 1e-8)
           for w, g in zip([w1, c1, w2, c2], gradients)]
stepped[0] = stepped[0] - stepped[0].mean(axis=0)
hidden = x.dot(W1) + b1
out = hidden.dot(W2) + b2
loss = K.sum(K.square(model.output))
by_input = K.function([model.input], K.gradients(loss, model.input))([x])
by_weight = K.function([model.input], K.gradients(loss, model.layers[1].W))([x])
W = model.layers[1].W
np.savez('out.npz', by_input=by_input, by_weight=by_weight, eval=W.eval(),
         function=theano.function([], W * 2)(), pickled=pickle.loads(pickle.dumps(W)).get_value(),
         want_input=2 * out.dot(W2.T).dot(W1.T), want_weight=2 * hidden.T.dot(out), W2=W2,
         first=first, want_first=h.dot(w2) + c2,
         split=[getattr(w, 'blocks', None) is not None for w in model.trainable_weights],
         **dict(('trained%d' % k, w) for k, w in enumerate(model.get_weights())),
         **dict(('stepped%d' % k, w) for k, w in enumerate(stepped)))
'''


# 'split': batch-wise with every weight of a row per context split into
# blocks of rows (the gradient of a split weight, gathered from its blocks).
MODES = {'batch': 'multigpu.mode=batch', 'layer': 'multigpu.mode=layer',
         'split': 'multigpu.mode=batch,multigpu.shard_split=0'}


@needs_pocl
@pytest.mark.parametrize('mode', sorted(MODES))
def test_single_tensors_and_weights_read_by_theano(home, mode):
    import numpy as np
    run_python(home, flags=TWO + ',' + MODES[mode], code=SCRIPT)
    out = np.load(str(home / 'out.npz'))
    assert out['by_input'].shape == (5, 3) and out['by_weight'].shape == (4, 2)
    np.testing.assert_allclose(out['by_input'], out['want_input'], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out['by_weight'], out['want_weight'], rtol=1e-4, atol=1e-5)
    assert np.abs(out['W2']).sum() > 0
    np.testing.assert_array_equal(out['eval'], out['W2'])
    np.testing.assert_array_equal(out['function'], 2 * out['W2'])
    np.testing.assert_array_equal(out['pickled'], out['W2'])
    # Predicted before fit, then one step: a constraint reading across the
    # rows of a weight split before its update was known is computed whole.
    np.testing.assert_allclose(out['first'], out['want_first'], rtol=1e-4, atol=1e-5)
    for k in range(4):
        np.testing.assert_allclose(out['trained%d' % k], out['stepped%d' % k],
                                   rtol=1e-4, atol=1e-6)
    assert list(out['split']) == [mode == 'split'] * 4, out['split']
