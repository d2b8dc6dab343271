"""Child script: Keras 1.2.2's layers, objectives, metrics, activations,
optimizers, constraints, regularizers and backend functions in one
functional model, trained for one step and predicting, so that a
configuration (the CPU, one context, batch-wise or layer-wise on several)
can be compared with another.  Under Keras 1.0.1 (found first on
PYTHONPATH), the same model with the layers, objectives and metrics that
release has.

    python keras_sweep.py OUT.npz

Writes the weights after the step (w0, w1, ...), the step's losses, and
the predictions before and after it, and the recurrent layers' weights
(recurrent/...); then the same step, from the same state, with Scan's
Python loop (its losses and recurrent layers' weights: python_loop/...),
and how often the compiled loop ran in each (scan_calls/...).  Few functions compile: one train and
one predict function for the whole sweep.  Random layers (Dropout,
GaussianNoise, GaussianDropout, SpatialDropout) draw their noise in
training; their rates are 0 so that every configuration computes the same
numbers while their kernels still build.
"""
import os
import sys

import numpy as np

# The weights every backend starts from: benchmarks/models.py, shared with the benchmarks.
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'benchmarks'))
from models import set_random_weights  # noqa: E402

ROWS = 8
TH = {'dim_ordering': 'th'}

ACTIVATIONS = ['softmax', 'softplus', 'softsign', 'relu', 'tanh', 'sigmoid', 'hard_sigmoid',
               'linear']
# (objective, output units, target kind), one output each.
OBJECTIVES = [('mse', 3, 'real'), ('mae', 3, 'real'), ('mape', 3, 'positive'),
              ('msle', 3, 'positive'), ('squared_hinge', 3, 'sign'), ('hinge', 3, 'sign'),
              ('binary_crossentropy', 3, 'binary'), ('kld', 3, 'distribution'),
              ('poisson', 3, 'positive'), ('cosine_proximity', 3, 'real'),
              ('categorical_crossentropy', 3, 'onehot'),
              ('sparse_categorical_crossentropy', 3, 'sparse')]
# Each metric on one output (the sparse ones on the sparse output).
METRICS = ['accuracy', 'binary_accuracy', 'categorical_accuracy', 'top_k_categorical_accuracy',
           'mse', 'mae', 'mape', 'msle', 'hinge', 'squared_hinge', 'categorical_crossentropy',
           'binary_crossentropy', 'kullback_leibler_divergence', 'poisson', 'cosine_proximity',
           'fbeta_score', 'fmeasure', 'precision', 'recall', 'matthews_correlation']
SPARSE_METRICS = ['sparse_categorical_accuracy', 'sparse_categorical_crossentropy']


# Layers that Keras 1.0.1, the oldest release supported, lacks.  Under
# Keras 1.0.x each is left out (the identity), a global pooling becomes a
# Flatten and a Bidirectional wrapper its layer alone.
NEWER_LAYERS = ['AtrousConvolution1D', 'AtrousConvolution2D', 'Bidirectional', 'ConvLSTM2D',
                'Cropping1D', 'Cropping2D', 'Cropping3D', 'Deconvolution2D',
                'GlobalAveragePooling1D', 'GlobalAveragePooling2D', 'GlobalAveragePooling3D',
                'GlobalMaxPooling1D', 'GlobalMaxPooling2D', 'GlobalMaxPooling3D',
                'LocallyConnected1D', 'LocallyConnected2D', 'SpatialDropout1D',
                'SpatialDropout2D', 'SpatialDropout3D']


def keras_1_0():
    import keras
    return keras.__version__.startswith('1.0.')


def _newer(name):
    """keras.layers.<name>, or under Keras 1.0.x its stand-in."""
    import keras.layers
    if not keras_1_0():
        return getattr(keras.layers, name)
    if name.startswith('Global'):
        return lambda *args, **kwargs: keras.layers.Flatten()
    if name == 'Bidirectional':
        return lambda layer, **kwargs: layer
    return lambda *args, **kwargs: (lambda x: x)


def backend_functions(x):
    """Keras backend functions that layers and Keras's examples call, row
    by row on ``x`` (rows, 8); returns (rows, 8)."""
    import keras.backend as K
    h = K.sqrt(K.square(x) + K.epsilon()) + K.abs(x) * K.sign(x) + K.exp(-K.square(x))
    h = h + K.log(K.sigmoid(x) + 1.) + K.pow(K.clip(x, 0.1, 2.), 2) + K.cos(x) * K.sin(x)
    h = K.maximum(h, x) + K.minimum(h, 0.5) + K.switch(K.greater(x, 0.2), x, -x)
    h = K.l2_normalize(h, axis=1) + K.softmax(x) + K.softplus(x) + K.softsign(x)
    h = h + K.relu(x, alpha=0.1, max_value=2.) + K.elu(x) + K.hard_sigmoid(x) + K.tanh(x)
    reduced = K.concatenate([K.sum(h, axis=1, keepdims=True), K.mean(h, axis=1, keepdims=True),
                             K.max(h, axis=1, keepdims=True), K.min(h, axis=1, keepdims=True),
                             K.std(h, axis=1, keepdims=True), K.var(h, axis=1, keepdims=True),
                             K.prod(K.clip(h, 0.5, 1.5), axis=1, keepdims=True),
                             K.cast(K.argmax(h, axis=1), K.floatx()).dimshuffle(0, 'x')],
                            axis=1)
    grid = K.reshape(K.repeat_elements(K.expand_dims(h, 2), 2, axis=2), (-1, 4, 4))
    grid = K.permute_dimensions(grid, (0, 2, 1)) + K.repeat(h[:, :4], 4)
    flat = K.batch_flatten(grid)
    h = h * reduced + K.batch_dot(flat, flat, axes=1) * 0.01 + flat[:, ::2]
    mask = K.cast(K.any(K.greater_equal(h, 1.), axis=1, keepdims=True), K.floatx())
    h = h + mask * K.cast(K.all(K.not_equal(h, 0.), axis=1, keepdims=True), K.floatx())
    h = h + K.stop_gradient(K.round(h)) + K.in_train_phase(h * 0.1, h * 0.2)
    return K.squeeze(K.expand_dims(h, 1), 1)


def every_optimizer():
    """An optimizer that applies each of Keras's optimizers to some of the
    weights, so that one train function holds them all: SGD with momentum
    the body; the others, in turn, the output layers' weights (their
    gradients are far from zero: the adaptive ones scale float noise of
    near-zero gradients up to whole steps, which no tolerance could tell
    from an error)."""
    from keras import optimizers

    class EveryOptimizer(optimizers.Optimizer):
        def __init__(self):
            super(EveryOptimizer, self).__init__()
            self.body = optimizers.SGD(lr=0.01, momentum=0.5)
            self.heads = [optimizers.SGD(lr=0.01, momentum=0.9, decay=0.1, nesterov=True),
                          optimizers.RMSprop(clipnorm=1.), optimizers.Adagrad(clipvalue=0.5),
                          optimizers.Adadelta(), optimizers.Adam(), optimizers.Adamax()]
            if hasattr(optimizers, 'Nadam'):
                self.heads.append(optimizers.Nadam())

        def get_updates(self, params, constraints, loss):
            outputs = set(objective for objective, _, _ in OBJECTIVES)
            heads = [p for p in params if p.name.rsplit('_', 1)[0] in outputs]
            groups = [(self.body, [p for p in params if p not in heads])]
            groups += [(o, heads[k::len(self.heads)]) for k, o in enumerate(self.heads)]
            updates = []
            for optimizer, weights in groups:
                updates += optimizer.get_updates(weights, constraints, loss)
                self.weights += optimizer.weights
            return updates
    return EveryOptimizer()


def build():
    """(model, inputs, targets) of the sweep, deterministic."""
    import keras.backend as K
    from keras.constraints import maxnorm, nonneg, unitnorm
    from keras.layers import (ELU, GRU, LSTM, SReLU, Activation, ActivityRegularization,
                              AveragePooling1D, AveragePooling2D, AveragePooling3D,
                              BatchNormalization, Convolution1D, Convolution2D, Convolution3D,
                              Dense, Dropout, Embedding, Flatten, GaussianDropout,
                              GaussianNoise, Highway, Input, Lambda, LeakyReLU, Masking,
                              MaxoutDense, MaxPooling1D, MaxPooling2D, MaxPooling3D,
                              ParametricSoftplus, Permute, PReLU, RepeatVector, Reshape,
                              SimpleRNN, ThresholdedReLU, TimeDistributed, UpSampling1D,
                              UpSampling2D, UpSampling3D, ZeroPadding1D, ZeroPadding2D,
                              ZeroPadding3D, merge)
    (AtrousConvolution1D, AtrousConvolution2D, Bidirectional, ConvLSTM2D, Cropping1D,
     Cropping2D, Cropping3D, Deconvolution2D, GlobalAveragePooling1D, GlobalAveragePooling2D,
     GlobalAveragePooling3D, GlobalMaxPooling1D, GlobalMaxPooling2D, GlobalMaxPooling3D,
     LocallyConnected1D, LocallyConnected2D, SpatialDropout1D, SpatialDropout2D,
     SpatialDropout3D) = [_newer(name) for name in NEWER_LAYERS]
    from keras.models import Model
    from keras.regularizers import activity_l1l2, l1, l1l2, l2
    rng = np.random.RandomState(0)

    vector = Input(shape=(6,), name='vector')
    h = Dense(8, W_regularizer=l2(0.01), b_regularizer=l1(0.01),
              activity_regularizer=activity_l1l2(0.001, 0.001), W_constraint=maxnorm(2))(vector)
    for activation in ACTIVATIONS:
        if activation != 'softsign' or not keras_1_0():
            h = Activation(activation)(h)
    h = LeakyReLU()(PReLU()(ELU()(h)))
    h = ThresholdedReLU(0.1)(ParametricSoftplus()(SReLU()(h)))
    h = Dropout(0.)(GaussianNoise(0.)(GaussianDropout(0.)(ActivityRegularization(0.01)(h))))
    h = Highway(W_constraint=unitnorm())(MaxoutDense(8, nb_feature=2,
                                                     W_regularizer=l1l2(0.01, 0.01))(h))
    sequence = Permute((2, 1))(RepeatVector(4)(h))               # (8, 4)
    flat = Reshape((32,) if keras_1_0() else (-1,))   # 1.0.1 cannot infer a -1
    h = Flatten()(Reshape((4, 8))(flat(sequence)))
    if not keras_1_0():   # Keras 1.0.1's backend lacks some of them
        h = Lambda(backend_functions, output_shape=(8,))(Dense(8)(h))
    dense_out = Dense(3, W_constraint=nonneg())(h)

    image = Input(shape=(2, 8, 8), name='image')
    c = ZeroPadding2D(**TH)(image)
    c = Convolution2D(3, 3, 3, activation='relu', **TH)(c)
    c = AtrousConvolution2D(3, 3, 3, atrous_rate=(2, 2), border_mode='same', **TH)(c)
    c = SpatialDropout2D(0., **TH)(c)
    # Keras 1.0's computes its statistics with K.mean over the rows, which
    # batch-wise mode computes over the whole batch; 1.2's with Theano's
    # batch normalisation, which it synchronises.
    c = BatchNormalization(axis=1)(c)
    c = UpSampling2D(**TH)(MaxPooling2D(**TH)(c))
    c = Cropping2D(((1, 1), (1, 1)), **TH)(AveragePooling2D(**TH)(c))
    c = Deconvolution2D(2, 3, 3, output_shape=(None, 2, 4, 4), **TH)(c)
    c = LocallyConnected2D(2, 2, 2, **TH)(c)
    image_out = merge([GlobalAveragePooling2D(**TH)(c), GlobalMaxPooling2D(**TH)(c)],
                      mode='concat')

    volume = Input(shape=(1, 4, 4, 4), name='volume')
    v = Convolution3D(2, 2, 2, 2, border_mode='same', **TH)(ZeroPadding3D(**TH)(volume))
    v = UpSampling3D(**TH)(MaxPooling3D(**TH)(SpatialDropout3D(0., **TH)(v)))
    v = Cropping3D(((1, 1), (1, 1), (1, 1)), **TH)(AveragePooling3D(**TH)(v))
    volume_out = merge([GlobalAveragePooling3D(**TH)(v), GlobalMaxPooling3D(**TH)(v)],
                       mode='sum')

    tokens = Input(shape=(10,), dtype='int32', name='tokens')
    t = Embedding(12, 4, input_length=10)(tokens)
    t = Convolution1D(3, 3, border_mode='same')(ZeroPadding1D()(t))
    t = AtrousConvolution1D(3, 3, atrous_rate=2)(SpatialDropout1D(0.)(t))
    t = UpSampling1D()(MaxPooling1D()(t))
    t = LocallyConnected1D(3, 2)(Cropping1D((1, 1))(AveragePooling1D()(t)))
    tokens_out = merge([GlobalAveragePooling1D()(t), GlobalMaxPooling1D()(t)], mode='mul')

    series = Input(shape=(5, 3), name='series')
    r = Masking()(series)
    r = SimpleRNN(4, return_sequences=True)(r)
    r = GRU(4, return_sequences=True, go_backwards=True)(r)
    r = LSTM(4, return_sequences=True, consume_less='gpu')(r)
    r = TimeDistributed(Dense(3))(r)
    series_out = Bidirectional(LSTM(2), merge_mode='concat')(r)

    frames = Input(shape=(2, 1, 4, 4), name='frames')
    frames_out = Flatten()(ConvLSTM2D(2, 2, 2, border_mode='same', **TH)(frames))

    joined = merge([dense_out, image_out, volume_out, tokens_out, series_out, frames_out],
                   mode='concat')
    column = Lambda(lambda x: K.reshape(x, (-1, 1)), output_shape=(1,))
    pair = column(merge([Dense(3)(joined), Dense(3)(joined)], mode='cos', dot_axes=1))
    dot = column(merge([dense_out, dense_out], mode='dot', dot_axes=1))
    joined = merge([joined, pair, dot], mode='concat')
    joined = merge([Dense(3)(joined), Dense(3)(joined)], mode='ave')
    joined = merge([joined, Dense(3)(joined)], mode='ave' if keras_1_0() else 'max')
    joined = Lambda(lambda x: x * 0.5 + 0.1, output_shape=lambda s: s)(joined)

    # Keras 1.0.1 lacks kld and every metric but accuracy, and checks
    # sparse targets against the output's shape (one column cannot pass).
    objectives = [o for o in OBJECTIVES if o[0] not in ('kld', 'sparse_categorical_crossentropy')
                  or not keras_1_0()]
    outputs, targets, losses = [], [], []
    for objective, units, kind in objectives:
        activation = 'softmax' if kind in ('onehot', 'sparse', 'distribution') else (
            'sigmoid' if kind == 'binary' else 'softplus' if kind == 'positive' else 'tanh')
        outputs.append(Dense(units, activation=activation, name=objective)(joined))
        targets.append(_targets(kind, units, rng))
        losses.append(objective)
    model = Model([vector, image, volume, tokens, series, frames], outputs)
    dense_targets = [name for name, _, kind in objectives if kind != 'sparse']
    metrics = dict((name, METRICS[k::len(dense_targets)]) for k, name in enumerate(dense_targets))
    metrics['sparse_categorical_crossentropy'] = SPARSE_METRICS
    if keras_1_0():
        metrics = {'categorical_crossentropy': ['accuracy'], 'binary_crossentropy': ['accuracy']}
    model.compile(optimizer=every_optimizer(), loss=losses, metrics=metrics)
    set_random_weights(model, rng, 0.2)
    inputs = [rng.rand(ROWS, 6), rng.rand(ROWS, 2, 8, 8), rng.rand(ROWS, 1, 4, 4, 4),
              rng.randint(0, 12, (ROWS, 10)), rng.rand(ROWS, 5, 3), rng.rand(ROWS, 2, 1, 4, 4)]
    inputs = [x.astype('int32' if x.dtype.kind == 'i' else 'float32') for x in inputs]
    inputs[4][:2, :2] = 0.   # masked steps
    return model, inputs, targets


def _targets(kind, units, rng):
    if kind == 'onehot':
        return np.eye(units, dtype='float32')[rng.randint(0, units, ROWS)]
    if kind == 'sparse':
        return rng.randint(0, units, (ROWS, 1)).astype('float32')
    if kind == 'binary':
        return rng.randint(0, 2, (ROWS, units)).astype('float32')
    if kind == 'sign':
        return (rng.randint(0, 2, (ROWS, units)) * 2 - 1).astype('float32')
    if kind == 'distribution':
        values = rng.rand(ROWS, units) + 0.1
        return (values / values.sum(1, keepdims=True)).astype('float32')
    if kind == 'positive':
        return (rng.rand(ROWS, units) + 0.5).astype('float32')
    return rng.randn(ROWS, units).astype('float32')


# The layers whose weights' updates go through scans.  (The other weights'
# need not be equal bit for bit between two runs on pocl: Embedding's
# gradient there adds its rows with atomics, in no fixed order.)
RECURRENT = ('SimpleRNN', 'GRU', 'LSTM', 'Bidirectional', 'ConvLSTM2D')


def _shared_variables():
    import gc
    import theano
    return [v for v in gc.get_objects() if isinstance(v, theano.compile.SharedVariable)]


def main():
    import theano
    out = sys.argv[1]
    from scan_calls import count_compiled_calls
    counter = count_compiled_calls()
    model, inputs, targets = build()
    results = {}
    for k, p in enumerate(model.predict(inputs, batch_size=ROWS)):
        results['before/%d' % k] = p
    model._make_train_function()
    variables = _shared_variables()
    start = [v.get_value() for v in variables]
    counter['calls'] = 0
    results['losses'] = np.array(model.train_on_batch(inputs, targets), 'float64')
    results['scan_calls/compiled'] = np.array(counter['calls'])
    for k, w in enumerate(model.get_weights()):
        results['w%d' % k] = w
    recurrent = [w for layer in model.layers if type(layer).__name__ in RECURRENT
                 for w in layer.trainable_weights]
    for k, w in enumerate(recurrent):
        results['recurrent/%d' % k] = w.get_value()
    for k, p in enumerate(model.predict(inputs, batch_size=ROWS)):
        results['after/%d' % k] = p
    # The same step from the same state with Scan's Python loop.
    for variable, value in zip(variables, start):
        variable.set_value(value)
    theano.config.multigpu.scan_loop = 'python'
    counter['calls'] = 0
    results['python_loop/losses'] = np.array(model.train_on_batch(inputs, targets), 'float64')
    results['scan_calls/python'] = np.array(counter['calls'])
    for k, w in enumerate(recurrent):
        results['python_loop/recurrent/%d' % k] = w.get_value()
    np.savez(out, **results)
    import keras
    print('sweep under Keras %s: %d weights, %d losses and metrics'
          % (keras.__version__, len(model.get_weights()), len(results['losses'])))


if __name__ == '__main__':
    main()
